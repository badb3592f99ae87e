"""A fork that skips Python's fork hooks (uWSGI without ``py-call-uwsgi-fork-hooks``): libc's
``fork()`` called directly, so no ``os.register_at_fork`` hook runs in the child.

The child's first call must run the same after-fork reset as the hook, exactly once: a fresh
lock, the parent's ID window never used, the parent's lease and pooled connections left alone, a
new heartbeat. Then the child leases its own slot on its own connections and renews it. Core
checks need no database; the rest run on PostgreSQL, MariaDB and SQLite.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from array import array
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

import snowflake_db
from snowflake_db import (
    ClockStalledError,
    ForkedWorkerIdError,
    Layout,
    SnowflakeError,
    SnowflakeGenerator,
    forks,
)
from snowflake_db.testing import FakeClock
from snowflake_db.worker import TableLease, TableWorkerAllocator, _process_hooks

from ..plugins.core_support import FakeAllocator, error_report, run_in_fork
from ..plugins.databases import ScratchDatabase
from ..plugins.hookless_fork_support import LIBC_FORK, settle_threads
from ..plugins.outage_support import STEADY_LEASE_SECONDS
from ..plugins.worker_support import allocator, read_slots

pytestmark = [
    pytest.mark.usefixtures("fresh_process_default"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks through glibc"),
]

#: Ticks this long keep the parent's window usable well past the fork, so a child that took IDs
#: from its copy of that window would repeat the parent's.
LONG_TICKS = Layout(tick_ms=100)
#: Children must start inside the parent's current tick: with 100 ms ticks, none of 4 did on a
#: machine at load average 17, with 1 s ticks none at load average 20 (beside a lease benchmark;
#: the test then cannot show the hazard, and says so). 4 s ticks, with sequence bits enough
#: that the parent never waits for the next tick.
LONG_TICKS_FOR_FORKS = Layout(tick_ms=4000, time_bits=34, sequence_bits=19)
CHILD_TIMEOUT_S = 120


def worker_ids_of(ids: Any, layout: Layout = snowflake_db.DEFAULT_LAYOUT) -> set[int]:
    return {layout.decode(i).worker_id for i in ids}


def _lease(generator: SnowflakeGenerator) -> TableLease:
    lease = generator.lease
    assert isinstance(lease, TableLease)
    return lease


def _window_live(generator: SnowflakeGenerator) -> bool:
    """Whether the generator's current window would still serve the hot path now."""
    start, end, _ = generator._window
    return bool(start <= generator._raw_clock() < end)


# -- the reset and the hot-path byte, without a database ------------------------------------------


def test_the_kernel_wipes_the_ready_byte_in_every_child_and_the_reset_sets_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(forks, "_resets", [*forks._resets, calls.append])
    assert forks.WIPED_ON_FORK, "MADV_WIPEONFORK is available on this Linux"
    assert forks.ready[0] == 1

    def hookless_child() -> dict[str, Any]:
        before = forks.ready[0]
        parents_before = list(calls)
        forks.reset_if_forked()
        forks.reset_if_forked()
        return {"before": before, "after": forks.ready[0], "calls": calls[len(parents_before) :]}

    def hooked_child() -> dict[str, Any]:
        forks.reset_if_forked()  # the hook already ran: nothing to do
        return {"ready": forks.ready[0], "calls": list(calls)}

    outcome = run_in_fork(hookless_child, fork=LIBC_FORK)["result"]
    assert outcome == {"before": 0, "after": 1, "calls": [os.getpid()]}
    outcome = run_in_fork(hooked_child)["result"]
    assert outcome == {"ready": 1, "calls": [os.getpid()]}
    assert calls == [] and forks.ready[0] == 1  # the parent is untouched


def test_threads_racing_into_a_hookless_child_reset_it_once_and_lease_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(forks, "_resets", [*forks._resets, calls.append])
    fake = FakeAllocator([11, 12, 13])
    generator = SnowflakeGenerator(allocator=fake)
    parent_ids = generator.next_ids(100)

    def child() -> dict[str, Any]:
        barrier = threading.Barrier(8)
        ids: list[list[int]] = [[] for _ in range(8)]

        def work(slot: int) -> None:
            barrier.wait(10)
            ids[slot].extend(generator.next_id() for _ in range(500))

        threads = [threading.Thread(target=work, args=(slot,)) for slot in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        return {
            "calls": len(calls),
            "leases": len(fake.leases),
            "inherited_abandoned": fake.leases[0].abandoned,
            "inherited_released": fake.leases[0].released,
            "ids": [i for chunk in ids for i in chunk],
        }

    outcome = run_in_fork(child, fork=LIBC_FORK)["result"]
    assert outcome["calls"] == 1
    assert outcome["leases"] == 2  # the parent's, then exactly one of its own
    assert outcome["inherited_abandoned"] is True and outcome["inherited_released"] is False
    child_ids = outcome["ids"]
    assert len(child_ids) == len(set(child_ids)) == 8 * 500
    assert worker_ids_of(child_ids) == {12}
    parent_ids += generator.next_ids(100)
    assert worker_ids_of(parent_ids) == {11}


def test_hookless_child_never_takes_ids_from_the_parents_window() -> None:
    """The clock does not move: the parent's window stays valid in the child, and the child's
    first ID must still come from a lease of its own in a later tick."""
    clock = FakeClock()
    fake = FakeAllocator([11, 12])
    generator = SnowflakeGenerator(allocator=fake, clock=clock, max_wait_ms=5000)
    parent_ids = generator.next_ids(10)

    def child() -> dict[str, Any]:
        live = _window_live(generator)
        # The library's first call repairs a hook-less child; no thread may start before it.
        forks.reset_if_forked()
        mover = threading.Timer(0.2, clock.advance, args=(1,))  # the next tick, a bit later
        mover.start()
        first = generator.next_id()
        mover.join()
        return {"live": live, "first": first}

    outcome = run_in_fork(child, fork=LIBC_FORK)["result"]
    assert outcome["live"] is True
    assert worker_ids_of([outcome["first"]]) == {12}
    parent_ids.append(generator.next_id())  # the parent goes on in the same window
    assert outcome["first"] not in parent_ids
    assert outcome["first"] >> 22 > parent_ids[-1] >> 22  # a later tick


def test_static_worker_id_in_a_hookless_child_is_refused_at_the_first_call() -> None:
    clock = FakeClock()
    generator = SnowflakeGenerator(5, clock=clock)
    generator.next_ids(10)

    def child() -> dict[str, Any]:
        live = _window_live(generator)  # same tick: the hot path would serve it
        reports = []
        for attempt in (generator.next_id, lambda: generator.next_ids(3)):
            try:
                attempt()
            except SnowflakeError as error:
                reports.append(error_report(error))
        return {"live": live, "reports": reports}

    outcome = run_in_fork(child, fork=LIBC_FORK)["result"]
    assert outcome["live"] is True
    assert [r["error"] for r in outcome["reports"]] == ["ForkedWorkerIdError"] * 2
    assert "static worker ID 5" in outcome["reports"][0]["message"]


def test_without_a_wiped_byte_the_fork_is_caught_by_process_id_at_the_next_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the kernel cannot wipe memory on fork (not Linux), the byte is plain memory and
    the process ID check in every slow path finds the fork from the child's next tick on."""
    monkeypatch.setattr(forks, "WIPED_ON_FORK", False)
    monkeypatch.setattr(forks, "ready", memoryview(bytearray(b"\x01")))
    clock = FakeClock()
    generator = SnowflakeGenerator(5, clock=clock)  # its hot path reads the plain byte
    generator.next_ids(10)

    def child() -> dict[str, Any]:
        clock.advance(1)
        try:
            generator.next_id()
        except SnowflakeError as error:
            return {**error_report(error), "ready": forks.ready[0]}
        return {"error": "none"}

    outcome = run_in_fork(child, fork=LIBC_FORK)["result"]
    assert outcome["error"] == "ForkedWorkerIdError", outcome
    assert outcome["ready"] == 1


def test_process_wide_static_worker_id_in_a_hookless_child_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snowflake_db.configure(worker_id=7, layout=LONG_TICKS)
    parent_id = snowflake_db.snowflake_default()

    def configured_child() -> str:
        try:
            snowflake_db.snowflake_default()
        except ForkedWorkerIdError as error:
            return str(error)
        return "no error"

    assert "static worker ID 7" in run_in_fork(configured_child, fork=LIBC_FORK)["result"]
    assert snowflake_db.snowflake_default() > parent_id

    # Never configured in the parent: the environment's worker ID is read first in the child.
    snowflake_db.reset()
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "9")
    outcome = run_in_fork(snowflake_db.snowflake_default, fork=LIBC_FORK)
    assert outcome.get("error") == "ForkedWorkerIdError", outcome
    assert "SNOWFLAKE_WORKER_ID=9" in outcome["message"]


# -- a table allocator across a hook-less fork ---------------------------------------------------


def _backend_of(dbapi_connection: Any) -> int | None:
    """The server's ID of this session, without a query: psycopg's backend pid, PyMySQL's
    thread ID (what MariaDB's CONNECTION_ID() returns); None for SQLite."""
    info = getattr(dbapi_connection, "info", None)
    if info is not None and hasattr(info, "backend_pid"):
        return int(info.backend_pid)
    thread_id = getattr(dbapi_connection, "thread_id", None)
    return int(thread_id()) if callable(thread_id) else None


def _record_statements(alloc: TableWorkerAllocator) -> list[tuple[int, int | None]]:
    """``(process ID, server session)`` of every statement the allocator's engine runs."""
    seen: list[tuple[int, int | None]] = []

    def before_cursor_execute(connection: Any, *args: Any) -> None:
        seen.append((os.getpid(), _backend_of(connection.connection.dbapi_connection)))

    event.listen(alloc._engine, "before_cursor_execute", before_cursor_execute)
    return seen


#: The steady lease, renewed every 2 s (the errors asserted below are zero: a 1.5 s lease
#: leaves a renewal 0.7 s, too little beside a second suite). The child runs two lease lengths.
RENEWING_LEASE_S = STEADY_LEASE_SECONDS
CHILD_RUN_S = 2 * RENEWING_LEASE_S


def test_hookless_child_leases_its_own_slot_on_its_own_connections_and_renews(
    any_db: ScratchDatabase,
) -> None:
    alloc = allocator(any_db, lease_seconds=RENEWING_LEASE_S)
    statements = _record_statements(alloc)
    generator = snowflake_db.configure(allocator=alloc)
    try:
        parent_ids = array("q", (snowflake_db.snowflake_default() for _ in range(2000)))
        parent_lease = _lease(generator)
        settle_threads(parent_lease)

        def child() -> dict[str, Any]:
            inherited = generator.lease
            # The run starts once the child holds its own lease: on a loaded machine its first
            # call (the lease's acquisition) took most of a run timed from the fork, and no
            # renewal fell due in what was left.
            ids = array("q", (snowflake_db.snowflake_default() for _ in range(200)))
            started = time.monotonic()
            errors: Counter[str] = Counter()
            while time.monotonic() - started < CHILD_RUN_S:
                try:
                    ids.extend(snowflake_db.snowflake_default() for _ in range(200))
                except SnowflakeError as error:
                    errors[type(error).__name__] += 1
                time.sleep(0.02)
            lease = _lease(generator)
            report = {
                "ids": ids.tolist(),
                "errors": dict(errors),
                "worker": generator.worker_id,
                "lease_is_mine": lease.pid == os.getpid(),
                "renewals": lease.renewals,
                "renewed_after_s": lease.renewed_at - started,
                "inherited_state": inherited.state if isinstance(inherited, TableLease) else None,
                "statements": [entry for entry in statements if entry[0] == os.getpid()],
            }
            _process_hooks._at_exit()  # what a clean exit runs: release this child's own slot only
            return report

        outcome = run_in_fork(child, fork=LIBC_FORK)
        assert "result" in outcome, outcome
        report = outcome["result"]
        parent_ids.extend(snowflake_db.snowflake_default() for _ in range(2000))
        rows = read_slots(any_db.url)
    finally:
        snowflake_db.reset()
        alloc.close()

    assert report["errors"] == {}, report["errors"]
    assert report["lease_is_mine"] is True and report["inherited_state"] == "abandoned"
    assert report["worker"] != parent_lease.worker_id
    # Renewed all along: several renewals (about 5 fall due), the last one past the first lease.
    assert report["renewals"] >= 3, report["renewals"]
    assert report["renewed_after_s"] > RENEWING_LEASE_S, report["renewed_after_s"]
    child_ids = report["ids"]
    assert worker_ids_of(child_ids) == {report["worker"]}
    assert not set(child_ids) & set(parent_ids)
    # The child's lease SQL ran on server sessions of its own, never on the parent's.
    child_sessions = {session for _, session in report["statements"]}
    parent_sessions = {session for pid, session in statements if pid == os.getpid()}
    assert report["statements"], "the child ran no lease statement at all"
    if any_db.backend != "sqlite":
        assert None not in child_sessions | parent_sessions
        assert not child_sessions & parent_sessions, (child_sessions, parent_sessions)
    assert rows[parent_lease.worker_id].lease_token == parent_lease.token  # never touched
    assert rows[report["worker"]].state == "free"  # released by the child's own exit hook


def _issue_in_hookless_child(out: Path, generator: SnowflakeGenerator, count: int) -> None:
    """The body of a hook-less child: issue right away, report, release, end with os._exit."""
    try:
        live = _window_live(generator)  # the parent's copied window, before the first call
        ids = array("q", (snowflake_db.snowflake_default() for _ in range(count)))
        report = {"live": live, "worker": generator.worker_id}
        _process_hooks._at_exit()
        out.with_suffix(".ids").write_bytes(ids.tobytes())
        out.with_suffix(".json").write_text(json.dumps(report))
    except BaseException:
        out.with_suffix(".json").write_text(json.dumps({"error": traceback.format_exc()}))


def _wait_bounded(pids: list[int], timeout_s: float) -> dict[int, int]:
    """Reap every child within ``timeout_s`` in all; SIGKILL the ones still running then."""
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert len(codes) == len(pids), f"{len(pids) - len(codes)} child(ren) hung"
    return codes


def test_parent_and_hookless_children_issuing_right_after_the_fork_never_collide(
    any_db: ScratchDatabase, tmp_path: Path
) -> None:
    children, per_child, parent_per_fork = 4, 3000, 1500
    alloc = allocator(any_db, lease_seconds=30)
    generator = snowflake_db.configure(allocator=alloc, layout=LONG_TICKS_FOR_FORKS)
    parent_ids = array("q")
    pids: list[int] = []
    try:
        parent_ids.append(snowflake_db.snowflake_default())
        settle_threads()
        for index in range(children):
            parent_ids.append(snowflake_db.snowflake_default())  # the window is open and live
            pid = LIBC_FORK()
            if pid == 0:  # pragma: no cover - the child never returns to pytest
                try:
                    _issue_in_hookless_child(tmp_path / f"child{index}", generator, per_child)
                finally:
                    os._exit(0)
            pids.append(pid)
            # Right away, from the same window the child copied.
            parent_ids.extend(snowflake_db.snowflake_default() for _ in range(parent_per_fork))
        codes = _wait_bounded(pids, CHILD_TIMEOUT_S)
        parent_worker = generator.worker_id
    finally:
        snowflake_db.reset()
        alloc.close()
    assert set(codes.values()) == {0}
    reports = [json.loads((tmp_path / f"child{i}.json").read_text()) for i in range(children)]
    errors = [report["error"] for report in reports if "error" in report]
    assert not errors, errors[0]
    # The hazard was real: children started while the parent's window was still usable.
    assert any(report["live"] for report in reports), reports
    everything = array("q", parent_ids)
    for index in range(children):
        everything.frombytes((tmp_path / f"child{index}.ids").read_bytes())
    assert len(everything) == 1 + children * (1 + parent_per_fork + per_child)
    assert len(set(everything)) == len(everything), "a hook-less child repeated IDs"
    workers = [report["worker"] for report in reports]
    assert len({*workers, parent_worker}) == children + 1


def _session_of(alloc: TableWorkerAllocator, backend: str) -> int:
    """The server session of the allocator's pooled connection (checked back in afterwards)."""
    query = "SELECT pg_backend_pid()" if backend == "postgresql" else "SELECT CONNECTION_ID()"
    with alloc._engine.connect() as connection:
        return int(connection.exec_driver_sql(query).scalar_one())


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_hookless_child_exit_hook_never_closes_the_parents_connections(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    """A child that never issued an ID and ends through the exit hook (``atexit``) must neither
    close the parent's pooled connection nor release the parent's lease."""
    database = database_factory(backend)
    alloc = allocator(database, lease_seconds=30)  # no renewal competes for the pooled connection
    generator = SnowflakeGenerator(allocator=alloc)
    try:
        generator.next_id()
        parent_lease = _lease(generator)
        parent_session = _session_of(alloc, backend)
        settle_threads()

        def child() -> float:
            started = time.monotonic()
            _process_hooks._at_exit()
            return time.monotonic() - started

        exit_seconds = run_in_fork(child, fork=LIBC_FORK)["result"]
        assert exit_seconds < 2.0  # no wait for the parent's heartbeat thread, absent here
        assert _session_of(alloc, backend) == parent_session  # same session, still open
        rows = read_slots(database.url)
        assert rows[parent_lease.worker_id].lease_token == parent_lease.token
        assert rows[parent_lease.worker_id].state == "live"
    finally:
        generator.close()
        alloc.close()


def test_stalled_clock_after_hookless_fork_is_reported_not_served_from_the_parent() -> None:
    """With no tick to move to, the child waits (bounded) and reports the stall: it never falls
    back to the parent's window."""
    clock = FakeClock()
    generator = SnowflakeGenerator(allocator=FakeAllocator([3, 4]), clock=clock, max_wait_ms=50)
    generator.next_ids(5)

    def child() -> dict[str, str]:
        try:
            generator.next_id()
        except ClockStalledError as error:
            return error_report(error)
        return {"error": "none"}

    assert run_in_fork(child, fork=LIBC_FORK)["result"]["error"] == "ClockStalledError"
