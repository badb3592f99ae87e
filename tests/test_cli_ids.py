"""The offline CLI commands, run as a user would: through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snowflake_db import Layout
from snowflake_db.cli import main

SCRIPT = shutil.which("snowflake-db", path=str(Path(sys.executable).parent))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the snowflake-db console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, *args], check=False, capture_output=True, text=True, timeout=60
    )


def test_generate_then_parse_round_trip() -> None:
    generated = run("generate", "-n", "5", "--worker-id", "7")
    assert generated.returncode == 0, generated.stderr
    ids = [int(line) for line in generated.stdout.split()]
    assert len(ids) == 5 and ids == sorted(set(ids))
    parsed = run("parse", "--json", *map(str, ids))
    assert parsed.returncode == 0, parsed.stderr
    rows = json.loads(parsed.stdout)
    assert [row["id"] for row in rows] == [str(i) for i in ids]  # strings: safe for JavaScript
    assert {row["worker_id"] for row in rows} == {7}
    for row, snowflake_id in zip(rows, ids, strict=True):
        assert row["timestamp_ms"] == Layout().decode(snowflake_id).timestamp_ms


def test_parse_human_table_shows_datetime_and_worker() -> None:
    snowflake_id = Layout().encode(timestamp_ms=1_700_000_000_123, worker_id=9, sequence=4)
    result = run("parse", str(snowflake_id))
    assert result.returncode == 0
    header, row = result.stdout.splitlines()
    assert header.split() == ["id", "timestamp_ms", "datetime", "worker_id", "sequence", "shard"]
    assert row.split() == [str(snowflake_id), "1700000000123", "2023-11-14T22:13:20.123000+00:00",
                           "9", "4", "0"]


def test_parse_with_custom_layout_and_datacenter_split() -> None:
    layout = Layout(datacenter_bits=5, epoch_ms=1_288_834_974_657)
    snowflake_id = layout.encode(
        timestamp_ms=1_600_000_000_000,
        worker_id=layout.worker_id_for(datacenter_id=3, machine_id=17),
        sequence=1,
    )
    result = run("parse", "--json", "--datacenter-bits", "5", "--epoch", "1288834974657",
                 str(snowflake_id))
    row = json.loads(result.stdout)[0]
    parts = (row["datacenter_id"], row["machine_id"], row["timestamp_ms"])
    assert parts == (3, 17, 1_600_000_000_000)


def test_layout_command_reports_capacity_and_end() -> None:
    result = run("layout", "--json")
    described = json.loads(result.stdout)
    assert described["exhausted_at"] == "2089-09-06T15:47:35.552000+00:00"
    assert described["max_ids_per_second_per_worker"] == 4_096_000
    custom = json.loads(run("layout", "--json", "--tick-ms", "10", "--epoch",
                            "2024-01-01T00:00:00Z").stdout)
    assert custom["epoch_ms"] == 1_704_067_200_000
    assert custom["max_ids_per_second_per_worker"] == 409_600


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["parse", "abc"], "'abc' is not a decimal integer ID"),
        (["parse", str(2**63)], "exceeds the maximum 9223372036854775807"),
        (["generate", "--worker-id", "1024"], "worker_id=1024 exceeds the maximum 1023"),
        (["generate", "--worker-id", "x"], "invalid int value: 'x'"),
        (["generate", "-n", "0", "--worker-id", "1"], "-n 0 is outside"),
        (["layout", "--time-bits", "60"], "exceeds the 63 bits"),
        (["layout", "--epoch", "2999-01-01T00:00:00Z"], "must not lie in the future"),
        (["layout", "--epoch", "soon"], "neither Unix milliseconds nor an ISO 8601 time"),
        (["layout", "--epoch", "2024-01-01T00:00:00"], "naive datetime"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args: list[str], expected: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]


def test_main_returns_status_instead_of_exiting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", "--", "-1"]) == 2
    assert "below the minimum 0" in capsys.readouterr().err


def test_bench_command_reports_both_methods_against_the_limit() -> None:
    result = run("bench", "--seconds", "0.05", "--tick-ms", "10")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["method", "IDs/s"]
    assert [line.split()[0] for line in lines[1:3]] == ["next_id()", "next_ids(n)"]
    for line in lines[1:3]:
        assert int(line.split()[1].replace(",", "")) > 0
        assert line.endswith("%")
    assert lines[3] == "physical limit of the layout: 409,600 IDs/s per worker"
