"""The process-wide generator in tests.

``fresh_process_default``: no process-wide generator or environment set-up leaks between tests.
Modules that configure the process default use it for every test::

    pytestmark = pytest.mark.usefixtures("fresh_process_default")

``static_worker``: tests that only need ``snowflake_default()`` to work mark themselves (or their
module) with the worker ID to configure, and find nothing configured after them::

    pytestmark = pytest.mark.static_worker(41)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import snowflake_db
from snowflake_db import process


@pytest.fixture
def fresh_process_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start unconfigured, with no worker ID or URL in the environment and the core's own
    not-configured help (the Django app, once ready, installs its own); leave nothing behind."""
    monkeypatch.delenv("SNOWFLAKE_WORKER_ID", raising=False)
    monkeypatch.delenv("SNOWFLAKE_WORKER_URL", raising=False)
    process.set_not_configured_help(None)
    snowflake_db.reset()
    yield
    snowflake_db.reset()
    process.set_not_configured_help(None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "static_worker(worker_id): the process-wide generator is configured with this static "
        "worker ID for the test and reset after it",
    )


@pytest.fixture(autouse=True)
def static_worker(
    request: pytest.FixtureRequest,
) -> Iterator[snowflake_db.SnowflakeGenerator | None]:
    """For a test marked ``static_worker(worker_id)``: the process-wide generator on that worker
    ID (the fixture's value), reset after the test. Unmarked tests are left alone (``None``)."""
    marker = request.node.get_closest_marker("static_worker")
    if marker is None:
        yield None
        return
    generator = snowflake_db.configure(worker_id=marker.args[0])
    yield generator
    snowflake_db.reset()
