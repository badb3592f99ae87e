"""``snowflake-db bench``: the share of the physical limit it reports is never above 100%.

``next_ids`` fills ticks its caller left unused (up to ``MAX_BACKFILL_MS`` back); the command
used to time only the calls and not the freeing of each batch between them, so those IDs were
counted against too little time: 102-104% of the limit on the default layout.
"""

from __future__ import annotations

import re

import pytest

from snowflake_db import Layout
from snowflake_db.cli import main


@pytest.mark.parametrize(("options", "layout"), [
    ([], Layout()),
    (["--tick-ms", "10"], Layout(tick_ms=10)),
    (["--sequence-bits", "4"], Layout(sequence_bits=4)),
], ids=["default", "10ms-ticks", "16-per-tick"])
def test_bench_never_reports_more_than_the_physical_limit(
    options: list[str], layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--seconds", "0.5", *options]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (
        f"physical limit of the layout: {layout.max_ids_per_second:,} IDs/s per worker"
    )
    rows = {}
    for line in lines[1:-1]:
        match = re.fullmatch(r"(\S+)\s+([\d,]+)\s+([\d.]+)%", line)
        assert match, line
        rows[match[1]] = (int(match[2].replace(",", "")), float(match[3]))
    assert set(rows) == {"next_id()", "next_ids(n)"}
    for name, (rate, percent) in rows.items():
        assert 0 < percent <= 100.0, (name, rate, percent)
        assert rate <= layout.max_ids_per_second * 1.0005, (name, rate)  # rounding of the limit
        assert abs(rate / layout.max_ids_per_second * 100 - percent) < 0.2, (name, rate, percent)


def test_bench_refuses_a_window_of_no_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--seconds", "0"]) == 2
    assert capsys.readouterr().err == (
        "snowflake-db bench: error: --seconds 0.0 must be above 0\n"
    )
