"""Django routing by the control database's shard map, on PostgreSQL and SQLite files.

Django settings are process-global and the main run's belong to tests/django, so the tests of
``shard_map_django_scenario.py`` run in a subprocess with the demo shop's settings
(``example_project.settings``): a control database and three shard databases from the
environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.plugins.databases import ScratchDatabase
from tests.sharding.test_sharding_django import REPO, outcomes

SCENARIO = "tests/sharding/shard_map_django_scenario.py"
#: The fence is a PostgreSQL trigger: deselected elsewhere, never skipped.
POSTGRESQL_ONLY = "test_a_fenced_write_is_retried_on_the_new_target"


def run_scenario(
    databases: list[ScratchDatabase], *, deselect: tuple[str, ...], expected: dict[str, int]
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "SHOP_CONTROL_URL": databases[0].url_string,
        "SHOP_SHARD_URLS": ",".join(d.url_string for d in databases[1:]),
    }
    command = [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider",
               "-q", "-rs", SCENARIO, *(f"--deselect={SCENARIO}::{name}" for name in deselect)]
    result = subprocess.run(command, check=False, env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes(result.stdout) == expected, result.stdout


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_django_routes_by_the_shard_map(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    databases = [database_factory(backend) for _ in range(4)]
    if backend == "postgresql":
        run_scenario(databases, deselect=(), expected={"passed": 7})
    else:
        run_scenario(databases, deselect=(POSTGRESQL_ONLY,),
                     expected={"passed": 6, "deselected": 1})
