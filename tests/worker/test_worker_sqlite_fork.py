"""A fork never copies SQLite mid-call: it waits (bounded) until the allocator's SQLite engines
have no connect or checked-out connection under way in another thread, and new calls wait for
the fork. (A child that inherits SQLite's process-wide mutex held by a thread it does not have
blocks for good in its first ``sqlite3.connect``: billiard's pool forks from a thread.)"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sqlite3
import threading
import time
from collections.abc import Callable

import pytest

import snowflake_db
from snowflake_db.worker import _process_hooks
from snowflake_db.worker._engine import make_engine

from ..plugins.core_support import run_in_fork
from ..plugins.databases import ScratchDatabase
from ..plugins.hookless_fork_support import LIBC_FORK
from ..plugins.worker_support import allocator

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


#: ``SQLITE_MUTEX_STATIC_VFS1``: the unix VFS's process-wide lock, which every open takes.
_SQLITE_VFS_MUTEX = 11


def _hold_sqlite_vfs_lock() -> tuple[Callable[[], None], threading.Thread]:
    """A thread that holds SQLite's own process-wide VFS lock (through the library the
    ``sqlite3`` module is linked to) until the returned callable is called: what a thread of
    the parent holds while it opens or closes a SQLite file."""
    library = ctypes.CDLL(ctypes.util.find_library("sqlite3"))
    library.sqlite3_mutex_alloc.restype = ctypes.c_void_p
    library.sqlite3_mutex_alloc.argtypes = [ctypes.c_int]
    library.sqlite3_mutex_enter.argtypes = library.sqlite3_mutex_leave.argtypes = [
        ctypes.c_void_p]
    mutex = library.sqlite3_mutex_alloc(_SQLITE_VFS_MUTEX)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        library.sqlite3_mutex_enter(mutex)
        held.set()
        done.wait(60)
        library.sqlite3_mutex_leave(mutex)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return done.set, thread


@pytest.mark.usefixtures("fresh_process_default")
@pytest.mark.parametrize("fork", [os.fork, LIBC_FORK], ids=["os.fork", "libc-fork"])
def test_a_child_forked_holding_a_sqlite_lock_is_told_not_hung(
    sqlite_db: ScratchDatabase, monkeypatch: pytest.MonkeyPatch, fork: Callable[[], int]
) -> None:
    """A fork the gate cannot see (here SQLite's VFS lock held by a thread outside any
    allocator call; in life a hook-less fork beside the heartbeat, or one landing in the pool's
    ping) leaves the child a SQLite lock nobody will release: its first connect must end in a
    clear error after ``FORK_CONNECT_WAIT_S``, not hang (it hung for good before)."""
    monkeypatch.setattr(_process_hooks, "FORK_CONNECT_WAIT_S", 2.0)
    # A long lease: the parent's heartbeat must not wait on the held lock meanwhile.
    generator = snowflake_db.configure(allocator=allocator(sqlite_db, lease_seconds=120))
    assert snowflake_db.snowflake_default() > 0  # the parent holds a lease
    release, holder = _hold_sqlite_vfs_lock()
    try:
        answer = run_in_fork(snowflake_db.snowflake_default, fork)
    finally:
        release()
        holder.join(10)
    assert answer.get("error") == "AllocatorUnavailableError", answer
    assert "copied a process-wide SQLite lock" in answer["message"], answer
    assert snowflake_db.snowflake_default() > 0  # the parent's SQLite works on
    generator.close()
