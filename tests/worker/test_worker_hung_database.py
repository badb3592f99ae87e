"""A control database that answers nothing within the bound: another connection holds a lock
on the slots table. Acquisition must raise ``AllocatorUnavailableError`` within the documented
bound (``snowflake_db.worker._engine``: a third of the lease, 1 to 10 s per statement; SQLite's
busy timeout at least 5 s), however
long the lock is held, on PostgreSQL (``LOCK TABLE``), MariaDB (``LOCK TABLES ... WRITE``) and
SQLite (``BEGIN EXCLUSIVE``); a lock released within the bound (a slow database that answers)
only delays it. Before the fix, a fresh ``ensure_worker()`` waited as long as the lock was held.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import create_engine, event

from snowflake_db import AllocatorUnavailableError, SnowflakeGenerator
from snowflake_db.worker import TableLease, TableWorkerAllocator
from snowflake_db.worker._engine import MIN_CONNECT_SECONDS, bound_seconds

from ..plugins.databases import ScratchDatabase
from ..plugins.scheduler_delay import SchedulerDelay
from ..plugins.worker_support import read_slots

LEASE_SECONDS = 3.0  # statement bound: 1 s (SQLite: 5 s)
#: What a call may take beyond the bound (connect, the statements before the lock), besides the
#: scheduler delay the test measures while it runs (``scheduler_delay``): a loaded database
#: server is slower to start a session too.
SLACK_S = 2.5
SLOTS = "snowflake_worker_slots"
REGISTRATIONS = "snowflake_worker_registrations"


@contextmanager
def slots_locked(database: ScratchDatabase) -> Iterator[Any]:
    """Hold an exclusive lock on the slots table from another connection until the block ends
    (yields a callable that releases it early)."""
    if database.backend == "sqlite":
        connection = sqlite3.connect(
            database.url.database or "", timeout=30, check_same_thread=False
        )
        connection.isolation_level = None
        connection.execute("BEGIN EXCLUSIVE")
        release = threading.Lock()

        def unlock() -> None:
            with release:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")

        try:
            yield unlock
        finally:
            unlock()
            connection.close()
        return
    engine = create_engine(database.url)
    connection = engine.connect()
    raw = connection.connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    if database.backend == "postgresql":
        cursor.execute(f"LOCK TABLE {SLOTS} IN ACCESS EXCLUSIVE MODE")
        unlock_sql = "ROLLBACK"
    else:
        cursor.execute(f"LOCK TABLES {SLOTS} WRITE")
        unlock_sql = "UNLOCK TABLES"
    done = threading.Event()

    def unlock_early() -> None:
        if not done.is_set():
            done.set()
            cursor.execute(unlock_sql)

    try:
        yield unlock_early
    finally:
        unlock_early()
        connection.close()
        engine.dispose()


def _prepared(database: ScratchDatabase) -> None:
    """Create the tables and the layout record, as a first process would have."""
    with TableWorkerAllocator(database.url_string, lease_seconds=LEASE_SECONDS) as first:
        first.check(layout=SnowflakeGenerator(0).layout)


@pytest.mark.timing(seconds=5)  # see tests/conftest.py
def test_a_locked_slots_table_costs_an_error_within_the_bound(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    bound = bound_seconds(any_db.backend, LEASE_SECONDS)
    _prepared(any_db)
    alloc = TableWorkerAllocator(any_db.url_string, lease_seconds=LEASE_SECONDS)
    generator = SnowflakeGenerator(allocator=alloc)
    try:
        with slots_locked(any_db):  # held for as long as the test waits: "hung"
            started = time.monotonic()
            with pytest.raises(AllocatorUnavailableError) as caught:
                generator.ensure_worker()
            ended = time.monotonic()
            elapsed = ended - started
            # Before the fix the same call waited as long as the lock was held.
            allowed = scheduler_delay.widen(bound + SLACK_S, started, ended)
            assert bound * 0.8 <= elapsed <= allowed, (elapsed, allowed)
            assert "cannot lease a worker ID" in str(caught.value)
            # A second attempt is bounded the same way (no connection left stuck).
            started = time.monotonic()
            with pytest.raises(AllocatorUnavailableError):
                generator.next_id()
            ended = time.monotonic()
            assert ended - started <= scheduler_delay.widen(bound + SLACK_S, started, ended)
        # The lock is gone: the same generator leases at once.
        generator.next_id()
        lease = generator.lease
        assert isinstance(lease, TableLease)
        assert read_slots(any_db.url)[lease.worker_id].lease_token == lease.token
    finally:
        generator.close()
        alloc.close()


@pytest.mark.timing(seconds=1)  # see tests/conftest.py
def test_a_slow_database_that_answers_within_the_bound_still_works(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    _prepared(any_db)
    alloc = TableWorkerAllocator(any_db.url_string, lease_seconds=LEASE_SECONDS)
    generator = SnowflakeGenerator(allocator=alloc)
    hold = bound_seconds(any_db.backend, LEASE_SECONDS) / 2
    try:
        with slots_locked(any_db) as unlock:
            timer = threading.Timer(hold, unlock)
            started = time.monotonic()  # before the timer: a late start would shorten the wait
            timer.start()
            try:
                generator.ensure_worker()  # waits for the lock, then leases
            finally:
                timer.join()
            ended = time.monotonic()
        elapsed = ended - started
        allowed = scheduler_delay.widen(hold + SLACK_S, started, ended)
        assert hold * 0.8 <= elapsed <= allowed, (elapsed, allowed)
        assert generator.next_id() > 0
    finally:
        generator.close()
        alloc.close()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_each_session_carries_the_statement_lock_and_idle_transaction_limits(
    backend: str, database_factory: Any
) -> None:
    database = database_factory(backend)
    alloc = TableWorkerAllocator(database.url_string, lease_seconds=LEASE_SECONDS)
    with alloc, alloc._engine.connect() as connection:
        if backend == "postgresql":
            settings = {
                name: connection.exec_driver_sql(f"SHOW {name}").scalar_one()
                for name in (
                    "statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"
                )
            }
            assert settings == {
                "statement_timeout": "1s",
                "lock_timeout": "1s",
                "idle_in_transaction_session_timeout": "5s",  # the floor: a lease, at least 5 s
            }
        else:
            row = connection.exec_driver_sql(
                "SELECT @@session.lock_wait_timeout, @@session.innodb_lock_wait_timeout, "
                "@@session.max_statement_time, @@session.idle_transaction_timeout"
            ).one()
            assert (int(row[0]), int(row[1]), float(row[2]), int(row[3])) == (1, 1, 1.0, 5)


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_first_process_stalled_mid_acquisition_holds_no_other_past_the_bound(
    backend: str, database_factory: Any, scheduler_delay: SchedulerDelay
) -> None:
    """Processes starting together on new tables: the first records the layout, then stalls
    (descheduled on a loaded machine) with its claim's transaction open. The others must not
    wait on it: before the fix its uncommitted layout row held them until their statement
    bound (1 s here) cancelled the wait, and they failed with ``AllocatorUnavailableError``.
    (SQLite has one writer at a time: a stalled transaction there holds every other writer,
    within the busy timeout.)"""
    database = database_factory(backend)
    with TableWorkerAllocator(database.url_string, lease_seconds=LEASE_SECONDS) as setup:
        setup.create_tables()
    stall = bound_seconds(backend, LEASE_SECONDS) + 2.0
    first = TableWorkerAllocator(database.url_string, lease_seconds=LEASE_SECONDS)
    second = TableWorkerAllocator(database.url_string, lease_seconds=LEASE_SECONDS)
    stalled, resume = threading.Event(), threading.Event()

    @event.listens_for(first._engine, "before_cursor_execute")
    def _stall(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith(f"INSERT INTO {REGISTRATIONS}") and not stalled.is_set():
            stalled.set()  # the layout is checked (and recorded): the client stops here
            resume.wait(stall)

    first_generator = SnowflakeGenerator(allocator=first)
    second_generator = SnowflakeGenerator(allocator=second)
    failures: list[BaseException] = []

    def start_first() -> None:
        try:
            first_generator.ensure_worker()
        except BaseException as error:
            failures.append(error)

    starter = threading.Thread(target=start_first)
    starter.start()
    try:
        assert stalled.wait(10)
        started = time.monotonic()
        second_generator.ensure_worker()  # before the fix: AllocatorUnavailableError
        ended = time.monotonic()
        assert ended - started < scheduler_delay.widen(stall, started, ended)
        resume.set()
        starter.join(20)
        assert not starter.is_alive() and failures == []
        leases = [first_generator.lease, second_generator.lease]
        assert all(isinstance(lease, TableLease) for lease in leases)
        slots = read_slots(database.url)
        worker_ids = {lease.worker_id for lease in leases}  # type: ignore[union-attr]
        assert len(worker_ids) == 2
        assert {slots[w].lease_token for w in worker_ids} == {
            lease.token for lease in leases  # type: ignore[union-attr]
        }
        assert first.recorded_layout() is not None
    finally:
        resume.set()
        starter.join(20)
        for generator, alloc in ((first_generator, first), (second_generator, second)):
            generator.close()
            alloc.close()


@contextmanager
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a server too loaded to
    start a session); yields the port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        for connection in accepted:
            connection.close()
        listener.close()


@pytest.mark.parametrize(
    ("url", "seconds"),
    [("postgresql+psycopg://postgres@127.0.0.1:{port}/test", MIN_CONNECT_SECONDS),
     ("mysql+pymysql://root@127.0.0.1:{port}/test", 3)],
    ids=["postgresql", "mariadb"],
)  # fmt: skip
def test_a_server_that_never_starts_the_session_costs_a_clear_error_in_time(
    url: str, seconds: float, scheduler_delay: SchedulerDelay
) -> None:
    """A 6 s lease bounds statements at 2 s. libpq's connect (the whole session start) gets
    MIN_CONNECT_SECONDS instead: a loaded PostgreSQL once took longer than 2 s to start four
    sessions. PyMySQL's handshake is a read, bounded by the read timeout (2 s + 1 s)."""
    with silent_server() as port:
        alloc = TableWorkerAllocator(url.format(port=port), lease_seconds=6.0)
        generator = SnowflakeGenerator(allocator=alloc)
        try:
            started = time.monotonic()
            with pytest.raises(AllocatorUnavailableError) as caught:
                generator.ensure_worker()
            ended = time.monotonic()
        finally:
            generator.close()
            alloc.close()
    elapsed, allowed = ended - started, scheduler_delay.widen(seconds + SLACK_S, started, ended)
    assert seconds * 0.9 <= elapsed <= allowed, (elapsed, allowed)
    assert f"127.0.0.1:{port}" in str(caught.value)
