"""A fork never copies SQLite mid-call: it waits (bounded) until the allocator's SQLite engines
have no connect or checked-out connection under way in another thread, and new calls wait for
the fork. (A child that inherits SQLite's process-wide mutex held by a thread it does not have
blocks for good in its first ``sqlite3.connect``: billiard's pool forks from a thread.)"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from snowflake_db.worker import _process_hooks
from snowflake_db.worker._engine import make_engine

from ..plugins.core_support import run_in_fork
from ..plugins.databases import ScratchDatabase

HOLD_S = 0.6


def _hold_a_connection(engine: object, seconds: float) -> tuple[threading.Thread, list[float]]:
    """Check a connection out in another thread, use it, keep it ``seconds``, check it in."""
    checked_in: list[float] = []
    using = threading.Event()

    def hold() -> None:
        with engine.connect() as connection:  # type: ignore[attr-defined]
            connection.exec_driver_sql("SELECT 1")
            using.set()
            time.sleep(seconds)
            checked_in.append(time.monotonic())  # the checkin follows at once

    thread = threading.Thread(target=hold)
    thread.start()
    assert using.wait(10)
    return thread, checked_in


def _sqlite_works_in_the_child(path: str) -> int:
    with sqlite3.connect(path, timeout=5) as connection:
        return int(connection.execute("SELECT 1").fetchone()[0])


def test_a_fork_waits_for_sqlite_calls_under_way(sqlite_db: ScratchDatabase) -> None:
    engine = make_engine(sqlite_db.url, timeout_seconds=5)
    try:
        thread, checked_in = _hold_a_connection(engine, HOLD_S)
        started = time.monotonic()
        answer = run_in_fork(lambda: _sqlite_works_in_the_child(str(sqlite_db.url.database)))
        forked_after = time.monotonic() - started
        thread.join(10)
        assert answer == {"result": 1}
        assert checked_in and checked_in[0] <= started + forked_after
        assert forked_after >= HOLD_S * 0.8  # the fork waited for the checkin
        with engine.connect() as connection:  # the parent goes on using SQLite afterwards
            assert connection.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()


def test_a_fork_waits_at_most_fork_wait_s(
    sqlite_db: ScratchDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_process_hooks, "FORK_WAIT_S", 0.3)
    engine = make_engine(sqlite_db.url, timeout_seconds=5)
    try:
        thread, checked_in = _hold_a_connection(engine, 3.0)
        started = time.monotonic()
        forked_at = run_in_fork(time.monotonic)["result"]  # one monotonic clock for both
        thread.join(10)
        # Bounded: the child ran before the connection was checked in, after the wait.
        assert started + 0.3 <= forked_at < checked_in[0]
    finally:
        engine.dispose()


def test_postgresql_engines_are_not_gated(postgres_db: ScratchDatabase) -> None:
    engine = make_engine(postgres_db.url, timeout_seconds=5)
    try:
        thread, checked_in = _hold_a_connection(engine, 2.0)
        forked_at = run_in_fork(time.monotonic)["result"]
        thread.join(10)
        assert forked_at < checked_in[0]  # the child ran while the connection was checked out
    finally:
        engine.dispose()
