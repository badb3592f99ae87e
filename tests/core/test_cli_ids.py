"""The offline CLI commands, run as a user would: through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
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
    ("args", "env", "expected"),
    [
        (["parse", "abc"], {}, "'abc' is not a decimal integer ID"),
        (["parse", str(2**63)], {}, "exceeds the maximum 9223372036854775807"),
        (["generate", "--worker-id", "1024"], {}, "--worker-id 1024 is outside 0..1023"),
        (["generate", "--worker-id", "x"], {}, "invalid int value: 'x'"),
        (["generate"], {}, "give --worker-id W (or set SNOWFLAKE_WORKER_ID)"),
        (["generate"], {"SNOWFLAKE_WORKER_ID": "5000"},
         "SNOWFLAKE_WORKER_ID=5000 is outside 0..1023 (10 worker bits)"),
        (["generate"], {"SNOWFLAKE_WORKER_ID": "five"}, "SNOWFLAKE_WORKER_ID='five' is not an"),
        (["generate", "-n", "0", "--worker-id", "1"], {}, "-n 0 is outside"),
        (["layout", "--time-bits", "60"], {}, "exceeds the 63 bits"),
        (["layout", "--time-bits", "-3"], {}, "--time-bits -3 is below the minimum 1"),
        (["layout", "--time-bits", "0"], {}, "--time-bits 0 is below the minimum 1"),
        (["layout", "--worker-bits", "-1"], {}, "--worker-bits -1 is below the minimum 0"),
        (["layout", "--tick-ms", "0"], {}, "--tick-ms 0 is below the minimum 1"),
        (["layout", "--epoch", "-5"], {}, "--epoch -5 lies before 1970-01-01T00:00:00Z"),
        (["layout", "--epoch", "2999-01-01T00:00:00Z"], {}, "must not lie in the future"),
        (["layout", "--epoch", "2999-01-01"], {}, "--epoch 2999-01-01 must not lie in the future"),
        (["layout", "--epoch", "soon"], {}, "--epoch 'soon' is neither Unix milliseconds nor"),
        (["nonsense"], {}, "invalid choice"),
        (["parse"], {}, "the following arguments are required: ID"),
        (["parse", "-"], {"STDIN": ""}, "no ID given"),
        (["parse", "-"], {"STDIN": "12 x"}, "'x' is not a decimal integer ID"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(
    args: list[str], env: dict[str, str], expected: str
) -> None:
    variables = dict(os.environ)
    variables.pop("SNOWFLAKE_WORKER_ID", None)
    stdin = env.pop("STDIN", "") if "STDIN" in env else None
    variables.update(env)
    assert SCRIPT
    result = subprocess.run([SCRIPT, *args], check=False, capture_output=True, text=True,
                            timeout=60, env=variables, input=stdin)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("epoch", ["2020-01-01", "2020-01-01T00:00:00", "2020-01-01T00:00:00Z",
                                   "2020-01-01T01:00:00+01:00", "1577836800000"])
def test_epoch_without_a_zone_means_utc(epoch: str) -> None:
    result = run("layout", "--json", "--epoch", epoch)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["epoch_ms"] == 1_577_836_800_000


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"snowflake-db {version('snowflake-db')}"


def test_closed_stdout_pipe_ends_quietly() -> None:
    """``snowflake-db generate -n 1000000 | head -1``: no BrokenPipeError traceback."""
    assert SCRIPT
    shell = (f"'{SCRIPT}' generate -n 1000000 --worker-id 1 | head -1; "
             'echo "status ${PIPESTATUS[0]}"')
    result = subprocess.run(["bash", "-c", shell], check=False, capture_output=True, text=True,
                            timeout=60)
    first, status = result.stdout.splitlines()
    assert int(first) > 0
    assert status == "status 141"  # 128 + SIGPIPE, as for a process the pipe killed
    assert result.stderr == ""


def test_parse_reads_ids_from_stdin() -> None:
    assert SCRIPT
    generated = run("generate", "-n", "3", "--worker-id", "4").stdout
    result = subprocess.run([SCRIPT, "parse", "--json", "-"], input=generated, check=False,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [row["id"] for row in json.loads(result.stdout)] == generated.split()
    assert result.stderr == ""  # IDs made now, by this layout: nothing suspicious


@pytest.mark.parametrize(
    ("snowflake_id", "warning"),
    [
        ("1600000000000000000", "decodes to 2032-"),  # a 2022 Twitter ID read with our epoch
        ("12345", "decodes to the epoch itself"),  # a small auto-increment key, not a Snowflake
    ],
)
def test_parse_warns_about_ids_from_another_layout(snowflake_id: str, warning: str) -> None:
    result = run("parse", snowflake_id)
    assert result.returncode == 0
    assert snowflake_id in result.stdout
    [line] = result.stderr.splitlines()
    assert line.startswith(f"snowflake-db parse: warning: ID {snowflake_id} {warning}")
    assert "wrong layout or epoch?" in line


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
