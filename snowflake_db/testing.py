"""Deterministic IDs for your own test suite.

``FakeClock`` is a clock you move by hand; ``deterministic_ids()`` points ``snowflake_default()``
at a generator with a fixed worker ID and a fake clock, and restores the previous set-up after.
With pytest, add ``pytest_plugins = ["snowflake_db.testing"]`` to ``conftest.py`` for the
``snowflake_ids`` fixture (it yields the :class:`FakeClock`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from . import process
from ._validate import require_int
from .generator import SnowflakeGenerator
from .layout import Layout

#: 2024-01-01T00:00:00Z: where fake clocks start unless told otherwise.
DEFAULT_FAKE_START_MS = 1_704_067_200_000


class FakeClock:
    """A thread-safe clock returning ``now_ms``; it moves only by ``advance``/``set``
    (or by ``step_ms`` on every read, to simulate time passing)."""

    def __init__(self, start_ms: int = DEFAULT_FAKE_START_MS, *, step_ms: int = 0) -> None:
        self.now_ms = require_int("start_ms", start_ms, minimum=0)
        self.step_ms = require_int("step_ms", step_ms)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            value = self.now_ms
            self.now_ms = value + self.step_ms
            return value

    def advance(self, ms: int) -> None:
        """Move the clock by ``ms`` (negative moves it back, to simulate a rollback)."""
        require_int("ms", ms)
        with self._lock:
            self.now_ms += ms

    def set(self, now_ms: int) -> None:
        with self._lock:
            self.now_ms = require_int("now_ms", now_ms, minimum=0)


@contextmanager
def deterministic_ids(
    *,
    worker_id: int = 1,
    start_ms: int | None = None,
    layout: Layout | None = None,
) -> Iterator[FakeClock]:
    """Make ``snowflake_default()`` return the same IDs on every run, then restore the set-up.

    The clock stands still (at ``start_ms``: 2024-01-01, or the layout's epoch if later): IDs
    count up the sequence of one tick; call ``clock.advance(ms)`` to move on (a tick holds
    ``layout.ids_per_tick`` IDs).
    """
    if start_ms is None:
        start_ms = max(DEFAULT_FAKE_START_MS, layout.epoch_ms if layout else 0)
    clock = FakeClock(start_ms)
    generator = SnowflakeGenerator(worker_id, layout=layout, clock=clock, max_wait_ms=0)
    try:
        with process.overridden(generator):
            yield clock
    finally:
        generator.close()


try:
    import pytest
except ImportError:  # pragma: no cover - the fixture is only offered where pytest is installed
    pass
else:

    @pytest.fixture
    def snowflake_ids() -> Iterator[FakeClock]:
        """``snowflake_default()`` gives deterministic IDs (worker 1) for the test's duration."""
        with deterministic_ids() as clock:
            yield clock
