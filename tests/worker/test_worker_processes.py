"""The table allocator across real processes: 64 at once, SIGKILL, SIGSTOP/SIGCONT, fork after
use (gunicorn --preload), and a load run with leases renewing. PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
import traceback
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.exc import OperationalError

import snowflake_db
from snowflake_db import (
    Layout,
    LeaseExpiredError,
    MonotonicClock,
    SnowflakeError,
    SnowflakeGenerator,
    WorkerIdExhaustedError,
)
from snowflake_db.worker import (
    DEFAULT_LEASE_SECONDS,
    TableLease,
    TableWorkerAllocator,
    _process_hooks,
)
from snowflake_db.worker._engine import idle_transaction_seconds
from snowflake_db.worker._store import db_now_ms

from ..plugins.core_support import is_stopped, wait_forked
from ..plugins.databases import ScratchDatabase
from ..plugins.outage_support import STEADY_LEASE_SECONDS
from ..plugins.scheduler_delay import SchedulerDelay
from ..plugins.worker_support import allocator, read_slots

FORK = multiprocessing.get_context("fork")
SINGLE_SLOT = Layout(worker_bits=0)


def _lease(gen: SnowflakeGenerator) -> TableLease:
    lease = gen.lease
    assert isinstance(lease, TableLease)
    return lease


# -- 64 processes acquiring at once --------------------------------------------------------------


def _acquire_at_once(url: str, barrier: Any, results: Any, finish: Any) -> None:
    try:
        alloc = TableWorkerAllocator(url, lease_seconds=30)
        barrier.wait(timeout=120)
        lease = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        results.put((os.getpid(), lease.worker_id, lease.token, None))
    except BaseException:
        results.put((os.getpid(), None, None, traceback.format_exc()))
    finish.wait(timeout=180)


@pytest.mark.timing(seconds=2)  # see tests/conftest.py
@pytest.mark.slow
def test_64_processes_acquiring_at_once_get_distinct_committed_slots(
    any_db: ScratchDatabase,
) -> None:
    # SQLite serialises writers, and its lock waits are not fair: beside a second test suite,
    # 64 at once outlasted the 10 s busy timeout. 16 still contend on one file.
    count = 16 if any_db.backend == "sqlite" else 64
    barrier, results, finish = FORK.Barrier(count), FORK.Queue(), FORK.Event()
    children = [
        FORK.Process(target=_acquire_at_once, args=(any_db.url_string, barrier, results, finish))
        for _ in range(count)
    ]
    for child in children:
        child.start()
    try:
        got = [results.get(timeout=180) for _ in range(count)]
        errors = [error for *_, error in got if error]
        assert not errors, errors[0]
        worker_ids = [worker_id for _, worker_id, _, _ in got]
        assert len(set(worker_ids)) == count
        rows = read_slots(any_db.url)
        for _, worker_id, token, _ in got:
            assert rows[worker_id].lease_token == token and rows[worker_id].state == "live"
    finally:
        finish.set()
        for child in children:
            child.join(60)


# -- SIGKILL and SIGSTOP ---------------------------------------------------------------------


def _issue_forever(
    url: str, lease_seconds: float, ready: Any, log: Any, stop: Any, *, freeze: Any = None,
    issuing: Any = None,
) -> None:
    """Hold the single slot and issue IDs until told to stop; report every ID and error.
    ``freeze``: see :func:`_freeze_in_the_next_renewal`; ``issuing``: an event set once the
    loop below has issued its first ID."""
    alloc = TableWorkerAllocator(url, lease_seconds=lease_seconds)
    if freeze is not None:
        _freeze_in_the_next_renewal(alloc._engine, freeze)
    gen = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT)
    ids: list[tuple[int, int]] = []
    errors: list[tuple[str, int]] = []
    first = _first_id(gen)
    ready.put((first, _lease(gen).token))
    while not stop.is_set():
        try:
            ids.append((gen.next_id(), time.time_ns()))
        except SnowflakeError as error:
            errors.append((type(error).__name__, time.time_ns()))
        if issuing is not None and ids:
            issuing.set()
        time.sleep(0.001)  # a steady stream of IDs, not a wait for anything
    log.put({"ids": [(first, 0), *ids], "errors": errors})


def _first_id(gen: SnowflakeGenerator) -> int:
    """The holder's first ID, however slow the machine: a lease whose acquiring round trip took
    longer than the lease is past its local deadline at once and refuses (LeaseExpiredError,
    rightly) until the heartbeat renews it; seen with a 1.5 s lease acquired in 1.9 s beside
    two other suites. The tests judge what happens after the first ID, not how soon it came."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return gen.next_id()
        except LeaseExpiredError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_sigkilled_holder_frees_its_slot_only_after_expiry(any_db: ScratchDatabase) -> None:
    ready, log, stop = FORK.Queue(), FORK.Queue(), FORK.Event()
    # A 6 s lease: the first refusal must come before it runs out, on a loaded machine too.
    child = FORK.Process(target=_issue_forever, args=(any_db.url_string, 6.0, ready, log, stop))
    child.start()
    first_id, token = ready.get(timeout=60)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(10)
    dead = read_slots(any_db.url)[0]
    assert dead.lease_token == token and dead.expires_at_ms is not None
    refused = 0
    # The taker's lease must outlast the checks below (at load 15 the default 2 s one lapsed
    # between the claim and the first ID): its length is not what this test judges.
    with allocator(any_db, lease_seconds=6.0) as alloc:
        deadline = time.monotonic() + 30
        while True:
            try:
                lease = alloc.acquire(layout=SINGLE_SLOT, clock=MonotonicClock())
                break
            except WorkerIdExhaustedError:
                refused += 1
                assert time.monotonic() < deadline
                time.sleep(0.1)
        taken = read_slots(any_db.url)[0]
        assert refused > 0  # the dead holder's lease was honoured until it expired
        assert taken.acquired_at_ms is not None and taken.acquired_at_ms > dead.expires_at_ms
        assert lease.floor_ms == dead.high_water_ms
        gen = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT)
        gen._take_lease(lease)  # use the lease just claimed
        assert SINGLE_SLOT.decode(gen.next_id()).timestamp_ms > dead.high_water_ms
        assert gen.next_id() > first_id


def _holds_no_lock(db: ScratchDatabase) -> bool:
    """Can another connection lock the slot row (SQLite: the file) without waiting?"""
    if db.backend == "sqlite":
        connection = sqlite3.connect(str(db.url.database), timeout=0.2)
        try:
            connection.execute("BEGIN EXCLUSIVE")
            connection.rollback()
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            connection.close()
    return _row_free_at_ms(db) is not None


def _row_free_at_ms(db: ScratchDatabase) -> int | None:
    """The database's clock (ms) just after another connection locked the slot row without
    waiting, or None if it is still locked."""
    engine = create_engine(db.url)
    try:
        with engine.connect() as connection, connection.begin():
            connection.execute(
                text("SELECT worker_id FROM snowflake_worker_slots WHERE worker_id = 0 "
                     "FOR UPDATE NOWAIT")
            ).all()
            return int(connection.execute(select(db_now_ms())).scalar_one())
    except OperationalError:
        return None
    finally:
        engine.dispose()


def _sigstop_between_writes(pid: int, db: ScratchDatabase) -> int:
    """SIGSTOP ``pid`` and return the time just before, in ms; only at a moment it holds no
    lock. A process stopped inside a transaction keeps its locks until it runs again: the SQLite
    file for everyone ("database is locked"), the slot row on PostgreSQL and MariaDB until the
    server ends the session a lease later (tested below), longer than this 1.5 s lease's
    takeover, which is what is judged here."""
    deadline = time.monotonic() + 20
    while True:
        stopped_ms = time.time_ns() // 1_000_000
        os.kill(pid, signal.SIGSTOP)
        while not is_stopped(pid):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        if _holds_no_lock(db):
            return stopped_ms
        os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "the holder never stopped outside a transaction"
        time.sleep(0.05)


@pytest.mark.timing(seconds=5)  # see tests/conftest.py
def test_sigstopped_holder_stops_issuing_and_ids_stay_disjoint(any_db: ScratchDatabase) -> None:
    lease_seconds = 1.5
    ready, log, stop, issuing = FORK.Queue(), FORK.Queue(), FORK.Event(), FORK.Event()
    child = FORK.Process(
        target=_issue_forever, args=(any_db.url_string, lease_seconds, ready, log, stop),
        kwargs={"issuing": issuing},
    )
    child.start()
    ready.get(timeout=60)
    assert issuing.wait(60), "the holder never issued in its loop"  # stopped mid-stream
    assert child.pid is not None
    stopped_ms = _sigstop_between_writes(child.pid, any_db)
    _next_holder_takes_over(any_db, child, lease_seconds, stopped_ms, log=log, stop=stop)


#: How long a stopped holder runs again beside the next one: its lease passed its local deadline
#: while it was stopped, so its first call after resuming must already refuse.
RESUMED_RUN_S = 3.0


def _next_holder_takes_over(
    db: ScratchDatabase, child: Any, lease_seconds: float, stopped_ms: int, *, log: Any, stop: Any
) -> None:
    """The stopped holder's lease expires in the database, a new holder claims the slot, then the
    stopped one runs again: it issues nothing new, and the two holders' IDs are disjoint."""
    try:
        deadline = time.monotonic() + 30
        # Waited out, not set in the table: real time is the subject (the stopped holder's
        # local deadline must pass before the database lets the next holder in).
        while read_slots(db.url)[0].state == "live":  # wait for the database to expire it
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # The next holder's own lease is the default 30 s: it must keep issuing on a loaded
        # machine, and its length is not what is judged here (with 6 s, beside make test and
        # the lease benchmark at load 25, neither its heartbeat nor its caller renewed it for
        # 4.8 s, and it was fenced mid-test).
        with allocator(db, lease_seconds=DEFAULT_LEASE_SECONDS) as alloc:
            second = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT)
            second_ids = second.next_ids(1000)
            floor = _lease(second).floor_ms
            resumed_ns = time.time_ns()
            os.kill(child.pid, signal.SIGCONT)
            until = time.monotonic() + RESUMED_RUN_S
            while time.monotonic() < until:  # the new holder keeps working meanwhile
                second_ids.extend(second.next_ids(100))
                time.sleep(0.01)
            stop.set()
            report = log.get(timeout=60)
    finally:
        _resume_and_stop(child, stop)
    first_ids = [snowflake_id for snowflake_id, _ in report["ids"]]
    after_resume = [i for i, returned_ns in report["ids"] if returned_ns > resumed_ns]
    # At most one call in flight at SIGSTOP may complete, with a timestamp from before the stop.
    assert len(after_resume) <= 1
    assert all(SINGLE_SLOT.decode(i).timestamp_ms <= stopped_ms for i in after_resume)
    assert any(returned_ns > resumed_ns for _, returned_ns in report["errors"])
    assert floor is not None
    assert max(SINGLE_SLOT.decode(i).timestamp_ms for i in first_ids) <= floor
    assert min(SINGLE_SLOT.decode(i).timestamp_ms for i in second_ids) > floor
    assert not set(first_ids) & set(second_ids)


def _resume_and_stop(child: Any, stop: Any) -> None:
    """Let a stopped holder run again, tell it to stop, and wait for it to end."""
    os.kill(child.pid, signal.SIGCONT)
    stop.set()
    child.join(30)


def _freeze_in_the_next_renewal(engine: Any, freeze: Any) -> None:
    """Once ``freeze.value`` is 0, the next renewal stops this whole process (SIGSTOP) between
    its UPDATE of the slot row and its commit, as a paused VM or a debugger would; ``freeze``
    then holds the database's clock (ms) read on that connection just before the stop: the
    server starts timing the idle transaction no earlier, whatever the scheduler did."""

    @event.listens_for(engine, "after_cursor_execute")
    def _stop_here(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if freeze.value == 0.0 and statement.lstrip().upper().startswith("UPDATE"):
            clock = cursor.connection.cursor()  # the renewal's own cursor keeps its rowcount
            clock.execute(str(select(db_now_ms()).compile(dialect=conn.dialect)))
            freeze.value = float(clock.fetchone()[0])
            clock.close()
            # To this thread: it stops on leaving the call. Sent to the process, the signal
            # goes to the main thread, and on a loaded machine this one committed before the
            # main thread ran to stop them all.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


@pytest.mark.slow  # waits 6 s on the server's limit; 6 s leases: not a `timing` test
@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])  # SQLite: the file stays locked
def test_a_holder_frozen_inside_its_renewal_frees_the_slot_a_lease_later(
    backend: str,
    database_factory: Callable[[str], ScratchDatabase],
    scheduler_delay: SchedulerDelay,
) -> None:
    """A holder stopped between its renewal's UPDATE and its commit keeps the slot row locked;
    the server ends that session once it has idled in its transaction for a whole lease, so the
    next holder's claim goes through instead of waiting out its bound on the lock."""
    db = database_factory(backend)
    lease_seconds = STEADY_LEASE_SECONDS
    ready, log, stop = FORK.Queue(), FORK.Queue(), FORK.Event()
    freeze = FORK.Value("d", -1.0)  # -1: not yet; 0: at the next renewal; then the DB's ms
    child = FORK.Process(
        target=_issue_forever,
        args=(db.url_string, lease_seconds, ready, log, stop),
        kwargs={"freeze": freeze},
    )
    child.start()
    ready.get(timeout=60)
    assert child.pid is not None
    freeze.value = 0.0
    deadline = time.monotonic() + 3 * lease_seconds
    while not is_stopped(child.pid):  # at its next renewal, a third of a lease away
        assert time.monotonic() < deadline, "the holder never renewed"
        time.sleep(0.005)
    stopped_ms = time.time_ns() // 1_000_000  # just after the stop
    idle_limit = idle_transaction_seconds(lease_seconds)
    try:
        # The row stays locked until the server ends the session at its limit, then it is free.
        # Both ends are read on the database's clock: the frozen connection's just before the
        # stop, another connection's once it could lock the row. A loaded machine only makes a
        # look later (at load 20, one look took 1.3 s, and the row, free 6.8 s after on the
        # server's clock, looked free 5.5 s after when timed from before that look).
        looks, started = 0, time.monotonic()
        while (free_at_ms := _row_free_at_ms(db)) is None:
            looks += 1
            waited = time.monotonic() - started
            assert waited < scheduler_delay.widen(idle_limit + 10, started, time.monotonic()), (
                f"the row stayed locked {waited:.1f} s"
            )
            time.sleep(0.1)
        free_after = (free_at_ms - freeze.value) / 1000
        assert free_after >= idle_limit - 0.5, f"free {free_after:.2f} s after, {looks} looks"
    except BaseException:
        _resume_and_stop(child, stop)
        raise
    _next_holder_takes_over(db, child, lease_seconds, stopped_ms, log=log, stop=stop)


# -- fork after use (gunicorn --preload) ----------------------------------------------------------


def _forked_worker(out: Path) -> None:
    """Runs in a child made by os.fork(): use the inherited process-wide generator."""
    try:
        ids = [snowflake_db.snowflake_default() for _ in range(20_000)]
        gen = snowflake_db.get_generator()
        lease = _lease(gen)
        payload = {"worker": gen.worker_id, "token": lease.token, "ids": ids}
        _process_hooks._at_exit()  # what a clean exit runs: release this child's own slot only
        out.write_text(json.dumps(payload))
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))


@pytest.mark.timing(seconds=1)  # see tests/conftest.py
def test_fork_after_use_gives_each_child_its_own_slot(
    any_db: ScratchDatabase, tmp_path: Path
) -> None:
    # A 30 s lease (the default): on SQLite the parent's renewals wait for the file's one write
    # lock while eight children acquire theirs, and under load a 2 s lease, then the 6 s steady
    # one ("last renewed 6.8 s ago", at load 14), fenced the parent: a safe refusal, but not
    # what is judged here, which needs no renewal at all.
    alloc = allocator(any_db, lease_seconds=DEFAULT_LEASE_SECONDS)
    gen = snowflake_db.configure(allocator=alloc)
    try:
        parent_ids = [snowflake_db.snowflake_default() for _ in range(5000)]
        parent_lease = _lease(gen)
        pids = []
        for index in range(8):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                try:
                    _forked_worker(tmp_path / f"child{index}.json")
                finally:
                    os._exit(0)
            pids.append(pid)
        parent_ids.extend(snowflake_db.snowflake_default() for _ in range(5000))
        for pid in pids:
            assert wait_forked(pid, 300) == 0
        reports = [json.loads((tmp_path / f"child{i}.json").read_text()) for i in range(8)]
        errors = [report["error"] for report in reports if "error" in report]
        assert not errors, errors[0]
        workers = [report["worker"] for report in reports]
        assert len({*workers, parent_lease.worker_id}) == 9
        all_ids = parent_ids + [i for report in reports for i in report["ids"]]
        assert len(all_ids) == len(set(all_ids)) == 5000 * 2 + 8 * 20_000
        rows = read_slots(any_db.url)
        # The children released their own slots, never the parent's.
        assert rows[parent_lease.worker_id].lease_token == parent_lease.token
        assert rows[parent_lease.worker_id].state == "live"
        assert all(rows[worker].state == "free" for worker in workers)
        assert snowflake_db.snowflake_default() > max(parent_ids)
        assert gen.lease is parent_lease and not parent_lease.lost
    finally:
        snowflake_db.reset()
        alloc.close()


# -- load: 8 processes x 2 threads, leases renewing -----------------------------------------------


#: How much longer than its ``seconds`` a load child issues while its lease has not been
#: renewed twice yet: on SQLite the 8 processes' renewals queue on one file lock, and beside a
#: second suite one process renewed fewer than twice in 6 s. The judge is the renewals seen,
#: not how soon; a lease that never renews still fails, after this bound.
RENEWALS_GRACE_S = 30.0


def _load_child(out: str, seconds: float, per_thread_cap: int) -> None:
    started = time.monotonic()
    ids = [array("q") for _ in range(2)]
    fenced = [0, 0]

    def renewed_enough() -> bool:
        lease = _lease(snowflake_db.get_generator())
        return lease.renewals >= 2 and lease.renewed_at - started > 1.0

    def work(slot: int) -> None:
        deadline = time.monotonic() + seconds
        while (now := time.monotonic()) < deadline + RENEWALS_GRACE_S and (
            now < deadline or not renewed_enough()
        ):
            if len(ids[slot]) >= per_thread_cap:
                time.sleep(0.05)
                continue
            try:
                for _ in range(500):
                    ids[slot].append(snowflake_db.snowflake_default())
            except snowflake_db.WorkerLeaseError:
                fenced[slot] += 1
                time.sleep(0.05)
            time.sleep(0.005)

    try:
        threads = [threading.Thread(target=work, args=(slot,)) for slot in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        gen = snowflake_db.get_generator()
        lease = _lease(gen)
        Path(out + ".ids").write_bytes(ids[0].tobytes() + ids[1].tobytes())
        report = {
            "fenced": sum(fenced),
            "worker": gen.worker_id,
            "renewals": lease.renewals,
            "last_renewal_after_s": lease.renewed_at - started,
        }
        Path(out + ".json").write_text(json.dumps(report))
    except BaseException:
        Path(out + ".json").write_text(json.dumps({"error": traceback.format_exc()}))


@pytest.mark.timing(seconds=8)  # see tests/conftest.py
@pytest.mark.slow
def test_load_8_processes_x_2_threads_with_renewing_leases(
    any_db: ScratchDatabase, tmp_path: Path
) -> None:
    # 6 s, longer while a lease has not renewed twice (RENEWALS_GRACE_S). On SQLite the
    # leases are 3 s (renewed every second): with 1.2 s leases, 20 commits a second on one file.
    seconds = 6.0
    lease_seconds = 3.0 if any_db.backend == "sqlite" else 1.2  # renewed every third of it
    alloc = allocator(any_db, lease_seconds=lease_seconds)
    snowflake_db.configure(allocator=alloc)  # configured before the fork, used only after
    try:
        children = [
            FORK.Process(target=_load_child, args=(str(tmp_path / f"c{i}"), seconds, 600_000))
            for i in range(8)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(120)
            assert child.exitcode == 0
    finally:
        snowflake_db.reset()
        alloc.close()
    reports = [json.loads((tmp_path / f"c{i}.json").read_text()) for i in range(8)]
    errors = [report["error"] for report in reports if "error" in report]
    assert not errors, errors[0]
    # Each lease was renewed several times while IDs were being issued.
    assert all(report["renewals"] >= 2 for report in reports), reports
    assert all(report["last_renewal_after_s"] > 1.0 for report in reports), reports
    total = array("q")
    for i in range(8):
        total.frombytes((tmp_path / f"c{i}.ids").read_bytes())
    assert len(total) > 8 * 2 * 1000
    assert len(set(total)) == len(total)
    assert len({report["worker"] for report in reports}) == 8


# -- inherited connections -----------------------------------------------------------------------


def _backend_id(alloc: TableWorkerAllocator, backend: str) -> int:
    query = "SELECT pg_backend_pid()" if backend == "postgresql" else "SELECT CONNECTION_ID()"
    with alloc._engine.connect() as connection:
        return int(connection.exec_driver_sql(query).scalar_one())


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_forked_child_never_uses_or_closes_inherited_connections(
    backend: str, database_factory: Any, tmp_path: Path
) -> None:
    database = database_factory(backend)
    alloc = allocator(database, lease_seconds=30)  # no renewal competes for the pooled connection
    gen = SnowflakeGenerator(allocator=alloc)
    try:
        gen.next_id()
        parent_backend = _backend_id(alloc, backend)  # the pooled connection, checked back in
        out = tmp_path / "child.json"
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                gen.next_id()  # leases its own worker ID on a fresh connection
                report = {"backend": _backend_id(alloc, backend), "worker": gen.worker_id}
                _process_hooks._at_exit()  # closes the child's pool: must not close the parent's
                out.write_text(json.dumps(report))
            except BaseException:
                out.write_text(json.dumps({"error": traceback.format_exc()}))
            finally:
                os._exit(0)
        wait_forked(pid)
        report = json.loads(out.read_text())
        assert "error" not in report, report.get("error")
        assert report["backend"] != parent_backend
        assert report["worker"] != gen.worker_id
        # The parent's pooled connection is the same server session, alive and unshared.
        assert _backend_id(alloc, backend) == parent_backend
    finally:
        gen.close()
        alloc.close()
