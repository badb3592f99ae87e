"""Django tests: one pytest process, three backends as three aliases of one settings module.

How it fits the single ``pytest`` run of the whole suite:

* pytest-django is active for every test, but with ``DJANGO_SETTINGS_MODULE`` unset it leaves
  non-Django tests alone. This conftest is only imported when pytest collects ``tests/django``;
  it points ``DJANGO_SETTINGS_MODULE`` at ``tests.django_project.settings`` and sets Django up.
  Those settings use ``WORKER_SOURCE = "manual"``, so setting Django up never configures the
  process-wide generator that other tests in the same run use.
* The settings hold ``default`` (a SQLite file) plus ``postgresql`` and ``mariadb`` when their
  servers answer. pytest-django creates test databases only for the aliases that collected tests
  ask for, with names unique to this process (concurrent runs never share one).
* The ``backend`` fixture runs a test once per alias: its parameter carries the
  ``django_db(databases=[alias])`` mark, and a context variable makes the test router send every
  query to that alias. A missing server skips the test with the reason (fails under CI=true).
* Tests that need separate processes (forked children, switching ``DEFAULT_AUTO_FIELD``) fork or
  start subprocesses from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_project.settings"
django.setup()

from django.conf import settings  # noqa: E402

from tests.django_project.routers import use_alias  # noqa: E402
from tests.plugins.databases import unavailable  # noqa: E402

HERE = Path(__file__).parent

#: test id -> database alias
BACKEND_ALIASES = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mariadb"}


def _params(*, transaction: bool) -> list[Any]:
    """One ``pytest.param`` per backend, marked for pytest-django where the alias exists."""
    params: list[Any] = []
    for name, alias in BACKEND_ALIASES.items():
        marks = (
            [pytest.mark.django_db(databases=[alias], transaction=transaction)]
            if alias in settings.DATABASES
            else []
        )
        params.append(pytest.param(alias, marks=marks, id=name))
    return params


def backends(*names: str, transaction: bool = False) -> pytest.MarkDecorator:
    """Run a test only on the named backends (rather than skipping it on the others)."""
    fixture = "tx_backend" if transaction else "backend"
    chosen = [param for param in _params(transaction=transaction) if param.id in names]
    return pytest.mark.parametrize(fixture, chosen, indirect=True)


def _require(alias: str) -> None:
    if alias in settings.DATABASES:
        return
    unavailable(settings.UNAVAILABLE.get(alias, f"no database alias {alias!r}"))


@pytest.fixture(params=_params(transaction=False))
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database alias, once per backend; the test runs in a transaction rolled back after."""
    _require(request.param)
    with use_alias(request.param):
        yield request.param


@pytest.fixture(params=_params(transaction=True))
def tx_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Like ``backend`` but with real commits (other connections and processes see the rows)."""
    _require(request.param)
    with use_alias(request.param):
        yield request.param


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every Django test starts with worker 1 configured and leaves nothing configured (the
    ``static_worker`` fixture of tests/plugins/process_default.py)."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.static_worker(1))
