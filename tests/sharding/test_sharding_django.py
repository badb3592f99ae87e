"""The Django database router and ShardedManager on 4 real shard databases plus a control one.

Django settings are process-global and pytest-django configures them for the whole run (the
tests/django suite owns that configuration), so the tests of ``sharding_django_scenario.py`` run
in a subprocess with the demo shop's own settings module (``example_project.settings``) and URLs
from the environment.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.plugins.databases import ScratchDatabase

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "tests/sharding/sharding_django_scenario.py"
#: Runs on PostgreSQL only (deselected elsewhere, never skipped).
POSTGRESQL_ONLY = ("test_partition_operations_create_partitions",)


def scenario_tests() -> list[str]:
    """The scenario's test functions, read from its source: a test the nested run did not
    collect or pass is then missing from its count."""
    tree = ast.parse((REPO / SCENARIO).read_text())
    return [node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def outcomes(stdout: str) -> dict[str, int]:
    """The counts of pytest -q's last line ("11 passed, 1 deselected in 2.1s"), warnings aside."""
    summary = stdout.strip().splitlines()[-1].rsplit(" in ", 1)[0]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    counts.pop("warnings", None)
    counts.pop("warning", None)
    return counts


def run_scenario(control: str, shards: list[str], *, postgresql: bool) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "SHOP_CONTROL_URL": control,
        "SHOP_SHARD_URLS": ",".join(shards),
    }
    deselected = () if postgresql else POSTGRESQL_ONLY
    # -p no:django: pytest-django would configure the main run's settings and block the database.
    command = [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider",
               "-q", "-rs", SCENARIO, *(f"--deselect={SCENARIO}::{name}" for name in deselected)]
    result = subprocess.run(command, check=False, env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = {"passed": len(scenario_tests()) - len(deselected)}
    if deselected:
        expected["deselected"] = len(deselected)
    assert outcomes(result.stdout) == expected, result.stdout


def test_django_router_on_four_postgresql_databases(
    database_factory: Callable[[str], ScratchDatabase],
) -> None:
    databases = [database_factory("postgresql") for _ in range(5)]
    run_scenario(databases[0].url_string, [d.url_string for d in databases[1:]], postgresql=True)


def test_django_router_on_sqlite_files(database_factory: Callable[[str], ScratchDatabase]) -> None:
    databases = [database_factory("sqlite") for _ in range(5)]
    run_scenario(databases[0].url_string, [d.url_string for d in databases[1:]], postgresql=False)


@pytest.mark.parametrize("url", ["mongodb://x/y"])
def test_settings_reject_unknown_url_schemes(url: str) -> None:
    from example_project.settings import database_from_url

    with pytest.raises(ValueError, match="unsupported database URL scheme"):
        database_from_url(url)


def test_partition_operations_keep_every_layout_field() -> None:
    from snowflake_db import Layout
    from snowflake_db.django.operations import (
        AddTimePartitions,
        CreateShardPartitionedTable,
        CreateTimePartitionedTable,
    )

    layout = Layout(sequence_bits=8, shard_bits=4, datacenter_bits=3, tick_ms=2)
    ops = [
        CreateShardPartitionedTable("by_shard", "id bigint NOT NULL", layout),
        CreateTimePartitionedTable("by_time", "id bigint PRIMARY KEY", layout, start="2026-01-01"),
        AddTimePartitions("by_time", layout),
    ]
    for op in ops:
        _, args, _ = op.deconstruct()
        frozen = next(arg for arg in args if isinstance(arg, dict))
        assert Layout(**frozen) == layout, type(op).__name__
