"""The ``fresh_process_default`` fixture: no process-wide generator or environment set-up leaks
between tests. Modules that configure the process default use it for every test::

    pytestmark = pytest.mark.usefixtures("fresh_process_default")
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
