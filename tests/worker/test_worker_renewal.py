"""Renewal by the caller: a late (stopped or starved) heartbeat never fences a generator whose
database answers; a database that does not answer still fences it before the lease's deadline.

The heartbeat is made late for real: its thread is stopped, or the lock it sleeps on is held
by another thread. The database is made unreachable as in tests/worker/test_worker_outage.py, or
made to hang (another transaction holds the slot row's lock, or SQLite's file lock). PostgreSQL,
MariaDB and SQLite, with real threads, spawned processes and connections.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time
import traceback
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from snowflake_db import (
    LeaseExpiredError,
    SnowflakeError,
    SnowflakeGenerator,
    WorkerLease,
)
from snowflake_db.lease import SelfRenewingLease
from snowflake_db.testing import DEFAULT_FAKE_START_MS, FakeClock
from snowflake_db.worker import TableLease, TableWorkerAllocator

from ..plugins.core_support import FakeAllocator, FakeLease
from ..plugins.databases import ScratchDatabase
from ..plugins.outage_support import STEADY_LEASE_SECONDS, Outage
from ..plugins.scheduler_delay import SchedulerDelay, lapse_excuse
from ..plugins.worker_support import allocator, read_slots, wait_for

#: renew_every 0.5 s, safety margin 0.3 s (local deadline 1.2 s after a renewal starts);
#: callers step in 0.175 s after a missed renewal and wait at most 0.125 s for one.
LEASE_SECONDS = 1.5
#: Calls longer than this are recorded, to be judged against the bound on a caller's wait.
LONG_CALL_S = 0.1
#: What a call may take beyond the caller's wait for a renewal, besides scheduler delay.
CALL_SLACK_S = 1.0
SPAWN = multiprocessing.get_context("spawn")
T0 = DEFAULT_FAKE_START_MS


def _wait_for(condition: Callable[[], object], seconds: float) -> bool:
    """:func:`wait_for`, polled every 20 ms: these tests time renewals of 1.5 s leases."""
    return wait_for(condition, seconds, poll=0.02)


def _lease(gen: SnowflakeGenerator) -> TableLease:
    lease = gen.lease
    assert isinstance(lease, TableLease)
    return lease


@dataclass
class Callers:
    """``threads`` threads calling ``next_id()``; every ID and error recorded, and every call
    longer than :data:`LONG_CALL_S` (when it began and ended).

    Each ID keeps when its call began and when it returned: the generator checks the deadline
    somewhere in between (a thread preempted before its return must not look late, and a call
    that waited for a renewal may return after it)."""

    gen: SnowflakeGenerator
    threads: int = 3
    #: Between two calls of a thread: 0.2 ms keeps the callers at nearly full speed (they compete
    #: with the renewal for the CPU and the GIL); a test that needs calls, not pressure, waits more.
    pause_s: float = 0.0002
    ids: list[array[int]] = field(default_factory=list)
    called_at: list[array[float]] = field(default_factory=list)
    returned_at: list[array[float]] = field(default_factory=list)
    errors: list[tuple[type[BaseException], float]] = field(default_factory=list)
    long_calls: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, slot: int) -> None:
        ids, called_at, returned_at = self.ids[slot], self.called_at[slot], self.returned_at[slot]
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                ids.append(self.gen.next_id())
                ended = time.monotonic()
                called_at.append(started)
                returned_at.append(ended)
            except SnowflakeError as error:
                ended = time.monotonic()
                self.errors.append((type(error), ended))
                time.sleep(0.005)
            if ended - started > LONG_CALL_S:
                self.long_calls.append((started, ended))
            time.sleep(self.pause_s)

    def calls_longer_than(self, bound: float, delay: SchedulerDelay) -> list[str]:
        """The calls that took longer than ``bound`` plus the scheduler delay measured while
        they ran: a caller's wait for a renewal is bounded, however loaded the machine."""
        return [
            f"{ended - began:.2f} s where {allowed:.2f} s were allowed"
            for began, ended in self.long_calls
            if ended - began > (allowed := delay.widen(bound, began, ended))
        ]

    def issued_between(self, start: float, end: float) -> int:
        """IDs from calls that began at ``start`` or later and returned by ``end``."""
        return sum(
            1
            for began, returned in zip(self.called_at, self.returned_at, strict=True)
            for called, done in zip(began, returned, strict=True)
            if start <= called and done <= end
        )

    def all_ids(self) -> list[int]:
        return [i for ids in self.ids for i in ids]


@contextmanager
def calling(
    gen: SnowflakeGenerator, threads: int = 3, *, pause_s: float = 0.0002
) -> Iterator[Callers]:
    callers = Callers(gen, threads, pause_s)
    callers.ids = [array("q") for _ in range(threads)]
    callers.called_at = [array("d") for _ in range(threads)]
    callers.returned_at = [array("d") for _ in range(threads)]
    workers = [threading.Thread(target=callers.run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield callers
    finally:
        callers.stop.set()
        for worker in workers:
            worker.join(30)


def _assert_unique_and_increasing_per_thread(callers: Callers) -> None:
    for ids in callers.ids:
        assert all(a < b for a, b in pairwise(ids))
    every = callers.all_ids()
    assert len(every) == len(set(every))


# -- the heartbeat is late, the database answers -----------------------------------------------




@pytest.mark.slow  # sleep-bound: started early, beside the busy tests
def test_callers_keep_the_lease_when_the_heartbeat_thread_is_stopped(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    """Judged from recorded events: the monotonic start of every renewal (the time the lease's
    deadline is timed from), the callers' errors with their times, and the slot row. A loaded
    scheduler may start a renewal late, or (kept from running for much of the lease) let the
    lease lapse; only the delay measured while it happened excuses either."""
    with allocator(any_db, lease_seconds=STEADY_LEASE_SECONDS) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        gen.ensure_worker()
        lease = _lease(gen)
        alloc._heartbeat.stop()
        before = read_slots(any_db.url)[lease.worker_id]
        renewals = lease.renewals
        caller_grace = lease.schedule.caller_grace
        # Each successful renewal's start (as the renewer keeps it: the deadline is timed from
        # it) and when its statement returned; recorded by an observer that changes nothing.
        starts, returns = array("d", [lease.renewed_at]), array("d", [lease.renewed_at])
        renewer = alloc._renewer
        renew = renewer.renew

        def observed(renewed: TableLease) -> None:
            done = renewed.renewals
            renew(renewed)
            if renewed is lease and renewed.renewals > done:
                starts.append(renewed.renewed_at)
                returns.append(time.monotonic())

        setattr(renewer, "renew", observed)  # noqa: B010 - on this instance only
        seconds = 6 * alloc.renew_every  # two lease lengths: only callers can renew
        try:
            calling_since = time.monotonic()
            with calling(gen) as callers:
                time.sleep(seconds)
                ended = time.monotonic()
        finally:
            delattr(renewer, "renew")
        _assert_unique_and_increasing_per_thread(callers)
        # Every renewal since the stop came through the caller path, and each was recorded.
        assert lease.renewals - renewals == len(starts) - 1 >= 1
        assert lease.caller_renewals == lease.renewals - renewals
        # Each renewal started once it was due (renew_every after the previous one started, plus
        # the callers' grace; not before the previous one returned, nor before the callers
        # began), within half the slack left before the local deadline; and the window ended
        # before the next one was that late. The callers call every 0.2 ms, so a renewal starts
        # within milliseconds on an idle machine; a loaded scheduler (the callers' threads and the
        # renewal's are each its own) excuses only the delay the probe measured in between.
        slack = (alloc.lease_seconds - alloc.safety_margin - alloc.renew_every - caller_grace) / 2
        late = []
        for i, start in enumerate([*starts[1:], ended]):
            due = max(starts[i] + alloc.renew_every + caller_grace, returns[i], calling_since)
            allowed = due + scheduler_delay.widen(slack, due, start)
            if start > allowed:
                what = "the window's end" if i == len(starts) - 1 else f"renewal {i + 1}"
                late.append(f"{what}: {start - due:.2f} s after it was due, "
                            f"{allowed - due:.2f} s allowed")
        assert late == [], (late, list(starts), gen.metrics())
        # No call was refused: the lease never lapsed, unless the process was kept from running
        # for much of the lease before the refusal.
        excuse = lapse_excuse(alloc.lease_seconds)
        for error, at in callers.errors:
            delayed = scheduler_delay.during(at - alloc.lease_seconds, at)
            assert delayed >= excuse, (
                f"{error.__name__} with the database answering (kept from running "
                f"{delayed:.2f} s of the lease)", gen.metrics())
        after = read_slots(any_db.url)[lease.worker_id]
        assert after.lease_token == before.lease_token and after.state == "live"
        assert after.renewed_at_ms is not None and before.renewed_at_ms is not None
        assert after.renewed_at_ms > before.renewed_at_ms
        assert after.high_water_ms > before.high_water_ms
        assert not lease.lost and gen.lease is lease
        gen.close()


@pytest.mark.timing(seconds=17)  # see tests/conftest.py
@pytest.mark.slow
def test_callers_keep_the_lease_while_the_heartbeat_is_starved(any_db: ScratchDatabase) -> None:
    """The heartbeat thread is alive but cannot run: another thread holds the lock it waits on
    (as a thread starved of the CPU or the GIL would be late); callers renew meanwhile, and the
    heartbeat takes over again once it runs."""
    with allocator(any_db, lease_seconds=STEADY_LEASE_SECONDS) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        gen.ensure_worker()
        lease = _lease(gen)
        heartbeat = alloc._heartbeat
        release = threading.Event()
        held = threading.Event()

        def starve() -> None:
            with heartbeat._condition:
                held.set()
                release.wait(30)

        starver = threading.Thread(target=starve, daemon=True)
        with calling(gen) as callers:
            starver.start()
            assert held.wait(10)
            by_callers = lease.caller_renewals
            # Two lease lengths in real time (the subject: who renews while they pass): only
            # callers can renew.
            time.sleep(6 * alloc.renew_every)
            starved_renewals = lease.caller_renewals - by_callers
            release.set()
            starver.join(10)
            renewals = lease.renewals
            assert _wait_for(lambda: lease.renewals >= renewals + 3, 10)
        assert callers.errors == [], gen.metrics()
        assert starved_renewals >= 6 * alloc.renew_every / alloc.lease_seconds  # one a lease
        # Once it runs again, the heartbeat renews on time and the callers stay out of it.
        assert lease.caller_renewals - by_callers <= starved_renewals + 1
        _assert_unique_and_increasing_per_thread(callers)
        assert read_slots(any_db.url)[lease.worker_id].lease_token == lease.token
        gen.close()


def test_one_renewal_at_a_time_however_many_callers(postgres_db: ScratchDatabase) -> None:
    """Eight threads on one generator, heartbeat stopped: renewal statements never overlap and
    come about once per renewal period, not once per caller or per tick."""
    # The steady lease: a caller's renewal may take 1.9 s before the deadline passes (a 1.5 s
    # lease leaves 0.7 s, which a machine running two suites can take from a thread).
    with allocator(postgres_db, lease_seconds=STEADY_LEASE_SECONDS) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        gen.ensure_worker()
        lease = _lease(gen)
        alloc._heartbeat.stop()
        running, overlap, statements = [0], [0], [0]
        lock = threading.Lock()

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE SNOWFLAKE_WORKER_SLOTS"):
                with lock:
                    running[0] += 1
                    statements[0] += 1
                    overlap[0] = max(overlap[0], running[0])

        def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE SNOWFLAKE_WORKER_SLOTS"):
                with lock:
                    running[0] -= 1

        event.listen(alloc._engine, "before_cursor_execute", before)
        event.listen(alloc._engine, "after_cursor_execute", after)
        seconds = 6.0  # four and a half renewal periods
        with calling(gen, threads=8) as callers:
            time.sleep(seconds)
        assert _wait_for(lambda: lease.renewal_in_flight() is None, 10)
        assert callers.errors == []
        assert overlap[0] == 1
        periods = seconds / alloc.renew_every
        assert periods / 2 <= statements[0] <= periods + 2, statements[0]
        assert lease.caller_renewals == statements[0]
        gen.close()


# -- the database does not answer --------------------------------------------------------------


@pytest.mark.timing(seconds=17)  # see tests/conftest.py
@pytest.mark.slow
def test_callers_fence_before_the_deadline_and_recover_when_the_database_is_unreachable(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    """Heartbeat stopped (callers are the only renewers); the database is cut off for longer
    than a lease: no ID past the local deadline, which is before the database's; IDs again
    once it is back, on the same lease."""
    outage = Outage(any_db)
    # A steady lease: before the cut the database answers, so no caller may be fenced, and
    # on a loaded machine a caller's renewal can take a good part of a 1.5 s lease (beside a
    # second suite, one was fenced 0.14 s before the cut).
    alloc = TableWorkerAllocator(outage.url, lease_seconds=STEADY_LEASE_SECONDS)
    gen = SnowflakeGenerator(allocator=alloc)
    try:
        gen.ensure_worker()
        lease = _lease(gen)
        alloc._heartbeat.stop()
        with calling(gen) as callers:
            assert _wait_for(lambda: lease.caller_renewals >= 2, 20)
            cut_at = time.monotonic()
            outage.cut()
            cut_done = time.monotonic()
            assert _wait_for(lambda: any(e is LeaseExpiredError for e, _ in callers.errors), 20)
            # Any renewal in flight at the cut has ended (one runs at a time: the one running now
            # is it, or began after the cut, which a cut connection fails).
            running = lease.renewal_in_flight()
            assert running is None or running.wait(20), "a renewal never ended"
            deadline = lease.valid_until  # that of the last renewal the database accepted
            restored_at = time.monotonic()
            outage.restore()
            assert _wait_for(lambda: callers.issued_between(restored_at, 1e12) > 0, 20)
            time.sleep(0.3)
        # The last renewal that succeeded started before the cut was complete (on a loaded
        # machine one may start after cut_at and still get through); its local deadline is
        # lease - margin after that start, and the database's is a full lease after it.
        assert deadline <= cut_done + alloc.lease_seconds - alloc.safety_margin
        # The generator asks the lease when it moves to a new tick, not per ID: a call within a
        # tick opened before the deadline may still return an ID just after it (1 ms ticks).
        assert callers.issued_between(deadline + 0.002, restored_at) == 0
        fenced = [at for error, at in callers.errors if error is LeaseExpiredError]
        assert cut_at < min(fenced) < restored_at
        assert {error for error, _ in callers.errors} == {LeaseExpiredError}
        # Waiting for a renewal never held a caller longer than the renewer's bounds: its
        # wait, or near the deadline until the deadline (SQLite's renewal hangs on the file
        # lock for its busy timeout, 5 s; PostgreSQL's and MariaDB's fail at once).
        assert callers.calls_longer_than(_caller_wait_bound(alloc), scheduler_delay) == []
        _assert_unique_and_increasing_per_thread(callers)
        assert gen.lease is lease and not lease.lost
    finally:
        gen.close()
        alloc.close()
        outage.close()


def _caller_wait_bound(alloc: TableWorkerAllocator) -> float:
    """The longest a call may take while a renewal runs: the renewer's wait, or near the
    deadline its hold until the deadline, plus the call's own slack."""
    renewer = alloc._renew_for_caller
    return max(renewer.wait_seconds, renewer.hold_seconds) + CALL_SLACK_S


@contextmanager
def slot_row_locked(database: ScratchDatabase, worker_id: int) -> Iterator[None]:
    """Another client holds the lease row's lock: renewals hang in the database (no error)."""
    if database.backend == "sqlite":
        connection = sqlite3.connect(database.url.database or "", timeout=30)
        connection.isolation_level = None
        connection.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")
            connection.close()
        return
    engine = create_engine(database.url)
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            connection.execute(
                text(
                    "SELECT worker_id FROM snowflake_worker_slots WHERE worker_id = :w "
                    "FOR UPDATE"
                ),
                {"w": worker_id},
            ).all()
            try:
                yield
            finally:
                transaction.rollback()
    finally:
        engine.dispose()


def test_callers_wait_for_the_heartbeats_running_renewal_once_it_is_due(
    any_db: ScratchDatabase,
) -> None:
    """The heartbeat's renewal is due and running (on time): a caller waits for it, bounded,
    rather than issue beside it and compete with it for the CPU and the GIL."""
    # A 30 s lease renewed every second: callers' grace 5.75 s, their wait 0.25 s.
    with allocator(any_db, lease_seconds=30.0, renew_every=1.0) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        gen.ensure_worker()
        lease = _lease(gen)
        assert _wait_for(lambda: lease.renewals >= 1, 10)
        with slot_row_locked(any_db, lease.worker_id):
            assert _wait_for(lambda: lease.renewal_in_flight() is not None, 10)
            # Fixed while the renewal hangs; the renewal moves it once the row is unlocked.
            due, grace = lease.schedule.next_renewal_at, lease.schedule.caller_grace
            called_at = time.monotonic()
            gen.next_id()
            returned_at = time.monotonic()
        # The heartbeat's turn, not yet late: a caller used to issue here without waiting.
        assert due <= called_at < due + grace
        assert lease.caller_waits == 1
        assert returned_at - called_at >= alloc._renew_for_caller.wait_seconds
        assert lease.caller_renewals == 0  # it waited for the heartbeat's, started none


def test_a_hanging_renewal_holds_callers_only_briefly(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    """The renewal statement blocks in the database: callers wait at most the bound, keep
    issuing while the lease is valid and its renewal not late, fence at its deadline, and go
    on when it is unblocked."""
    with allocator(any_db, lease_seconds=LEASE_SECONDS) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        gen.ensure_worker()
        lease = _lease(gen)
        with calling(gen) as callers:
            assert _wait_for(lambda: lease.renewals >= 1, 10)
            with slot_row_locked(any_db, lease.worker_id):
                locked_at = time.monotonic()
                # Until the renewal due next is late, callers issue (from when it is due, in
                # bounded waits for it); from then on (all of this short lease's slack after the
                # callers' grace) they hold off for it.
                late_at = lease.schedule.next_renewal_at + lease.schedule.caller_grace
                assert _wait_for(
                    lambda: any(e is LeaseExpiredError for e, _ in callers.errors), 15
                )
                time.sleep(0.5)
                unlocked_at = time.monotonic()
            assert _wait_for(lambda: callers.issued_between(unlocked_at, 1e12) > 0, 20)
            time.sleep(0.3)
        local_deadline = locked_at + alloc.lease_seconds - alloc.safety_margin
        assert callers.issued_between(local_deadline, unlocked_at) == 0
        # Valid and not late: callers kept issuing, judged whenever this process ran for 0.1 s
        # of that window; only a loaded machine (the lock taken late, the callers not run)
        # leaves it unjudged.
        ran = (late_at - locked_at) - scheduler_delay.during(locked_at, late_at)
        if ran > 0.1:
            assert callers.issued_between(locked_at, late_at) > 0
        else:
            assert scheduler_delay.during(locked_at - LEASE_SECONDS, late_at) > 0.1, ran
        assert callers.calls_longer_than(_caller_wait_bound(alloc), scheduler_delay) == []
        assert {error for error, _ in callers.errors} == {LeaseExpiredError}
        _assert_unique_and_increasing_per_thread(callers)
        assert gen.lease is lease and not lease.lost
        gen.close()


# -- processes ---------------------------------------------------------------------------------


#: SQLite's leases in the heartbeat-less processes below: beside a second suite, one caller's
#: renewal (4 processes taking SQLite's one write lock, each starved of CPU) took 2.8 s where a
#: 6 s lease leaves a caller 2.1 s, and that process fenced; a 10 s lease leaves 3.5 s.
SQLITE_CALLER_LEASE_SECONDS = 10.0


def _process_without_heartbeat(url: str, seconds: float, out: str, lease_seconds: float) -> None:
    """A spawned process: lease, stop the heartbeat, issue from 2 threads; write a report."""
    try:
        alloc = TableWorkerAllocator(url, lease_seconds=lease_seconds)
        gen = SnowflakeGenerator(allocator=alloc)
        gen.ensure_worker()
        alloc._heartbeat.stop()
        # Calls, not pressure, are the subject: 4 processes at full speed for 12 s would take both
        # cores from the rest of the timing pass for the whole test.
        with calling(gen, threads=2, pause_s=0.002) as callers:
            time.sleep(seconds)
        lease = _lease(gen)
        Path(out + ".ids").write_bytes(b"".join(ids.tobytes() for ids in callers.ids))
        report = {
            "errors": [error.__name__ for error, _ in callers.errors][:3],
            "renewal_max_seconds": gen.metrics().lease_renewal_max_seconds,
            "worker": lease.worker_id,
            "caller_renewals": lease.caller_renewals,
            "renewals": lease.renewals,
        }
        gen.close()
        alloc.close()
    except BaseException:
        report = {"error": traceback.format_exc()}
    Path(out + ".json").write_text(json.dumps(report))


@pytest.mark.timing(seconds=14)  # see tests/conftest.py
@pytest.mark.slow
def test_processes_without_heartbeats_issue_without_fencing(
    any_db: ScratchDatabase, tmp_path: Path
) -> None:
    lease_seconds = (
        SQLITE_CALLER_LEASE_SECONDS if any_db.backend == "sqlite" else STEADY_LEASE_SECONDS
    )
    count, seconds = 4, 2 * STEADY_LEASE_SECONDS  # longer than a SQLite lease too
    children = [
        SPAWN.Process(
            target=_process_without_heartbeat,
            args=(any_db.url_string, seconds, str(tmp_path / f"p{i}"), lease_seconds),
        )
        for i in range(count)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    reports = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(count)]
    assert not [report["error"] for report in reports if "error" in report]
    assert all(report["errors"] == [] for report in reports), reports
    # Every renewal was a caller's (no heartbeat), and there were enough to outlive the first
    # lease. A caller renews once the heartbeat is late by the grace: about every 2.7 s of a
    # 6 s lease (4 in 12 s when nothing delays it), every 4.5 s of a 10 s one (2 in 12 s).
    assert all(
        report["caller_renewals"] == report["renewals"] >= seconds / lease_seconds
        for report in reports
    ), reports
    assert len({report["worker"] for report in reports}) == count
    total = array("q")
    for i in range(count):
        total.frombytes((tmp_path / f"p{i}.ids").read_bytes())
    assert len(total) > count * 1000
    assert len(set(total)) == len(total)


# -- the generator's side of the contract (no database) -----------------------------------------


@dataclass
class SelfRenewingFakeLease(FakeLease):
    """A fake lease that renews itself whenever asked (its allocator's "database" answers)."""

    renew_calls: int = 0

    def renew_if_due(self) -> None:
        self.renew_calls += 1
        self.valid_until = time.monotonic() + 3600


@dataclass
class SelfRenewingFakeAllocator(FakeAllocator):
    def acquire(self, *, layout: Any, clock: Any) -> SelfRenewingFakeLease:
        lease = SelfRenewingFakeLease(
            worker_id=self.worker_ids[len(self.leases)],
            floor_ms=None,
            high_water_ms=clock() + 3_600_000,
            valid_until=time.monotonic() + 3600,
        )
        self.leases.append(lease)
        return lease


def test_the_generator_asks_a_lease_to_renew_once_per_tick_before_fencing() -> None:
    clock = FakeClock(T0)
    fakes = SelfRenewingFakeAllocator([4])
    generator = SnowflakeGenerator(allocator=fakes, clock=clock)
    ids = generator.next_ids(100)  # acquires a fresh lease: nothing to renew yet
    lease = fakes.leases[0]
    assert isinstance(lease, SelfRenewingLease) and isinstance(lease, WorkerLease)
    assert lease.renew_calls == 0
    lease.valid_until = time.monotonic() - 1  # past its deadline: only a renewal saves it
    clock.advance(1)
    ids += generator.next_ids(100)  # a new tick: one slow path, which renews before checking
    assert lease.renew_calls == 1
    ids += [generator.next_id() for _ in range(100)]
    assert lease.renew_calls == 1  # same tick: the hot path never asks
    clock.advance(1)
    ids.append(generator.next_id())
    assert lease.renew_calls == 2
    assert ids == sorted(set(ids))
    # A lease without renew_if_due is not a SelfRenewingLease and is fenced as before.
    plain = FakeAllocator([5])
    other = SnowflakeGenerator(allocator=plain, clock=clock)
    other.ensure_worker()
    assert not isinstance(plain.leases[0], SelfRenewingLease)
    plain.leases[0].valid_until = time.monotonic() - 0.001
    clock.advance(1)
    with pytest.raises(LeaseExpiredError):
        other.next_id()
