"""The lease benchmark's judge: every ID against the leases that covered it, two ways.

*By the database*: a trigger logs each lease row as the database writes it, in microseconds
(floored, as an ID's stamp is the floor of its tick). An ID stamped ``stamp`` (ms) was issued
somewhere in its tick ``[stamp, stamp + tick_ms)``, so it is covered when a lease row of its
own process for its worker ID was written before the tick ended (``written_at < stamp +
tick_ms``) and expires after the tick began (``stamp < expires_at``). That compares the
process's clock with the database's: an ID that is covered only once the clocks may differ by
the offset measured for its process is reported apart (``within offset``), not as outside.

*By the process alone*: each process records, on its own monotonic clock, when every lease and
renewal was applied (before the generator could see it) and the local deadline it set. The
default clock is that monotonic clock plus a fixed offset, so each ID's tick maps back to
monotonic time exactly: no clock is compared with another. An ID is covered when its tick
began before a deadline and ended after the renewal that set it was applied.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from snowflake_db import DEFAULT_LAYOUT
from snowflake_db.metrics import MetricsRecorder
from snowflake_db.worker import TableLease
from snowflake_db.worker import _clock_skew as clock_skew
from snowflake_db.worker._renewer import LeaseRenewer
from snowflake_db.worker._store import WorkerStore

LEASE_LOG = """
CREATE TABLE lease_log (
    worker_id integer, lease_token varchar(32), pid integer, written_at_us bigint,
    expires_at_ms bigint
);
CREATE FUNCTION log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO lease_log VALUES (
        NEW.worker_id, NEW.lease_token, NEW.pid,
        CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000) AS BIGINT),
        NEW.expires_at_ms);
    RETURN NULL;
END $$;
CREATE TRIGGER log_lease AFTER INSERT OR UPDATE ON snowflake_worker_slots
    FOR EACH ROW EXECUTE FUNCTION log_lease();
CREATE TABLE commit_log (worker_id integer, pid integer, committing_at_us bigint);
CREATE FUNCTION log_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO commit_log VALUES (
        NEW.worker_id, NEW.pid,
        CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000) AS BIGINT));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER log_commit AFTER INSERT OR UPDATE ON snowflake_worker_slots
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION log_commit();
"""
"""The lease rows as written (``lease_log``) and the moment each of their transactions began
to commit (``commit_log``: a deferred trigger runs at COMMIT, before the WAL is flushed)."""

_DB_NOW_US = text("SELECT CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000) AS BIGINT)")


def merge_intervals(intervals: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    merged: list[tuple[Any, Any]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def touches(intervals: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether ``[start, end)`` overlaps one of the merged, sorted ``intervals``."""
    index = bisect.bisect_left(intervals, (end, -math.inf)) - 1  # last one starting before end
    return index >= 0 and intervals[index][1] > start


# -- measured in each load process ---------------------------------------------------------------


def measure_offset_us(connection: Any, clock_offset_ns: int, samples: int = 50) -> tuple[int, int]:
    """(process clock minus database clock, uncertainty), µs, from the tightest of ``samples``
    readings of ``clock_timestamp()`` between two readings of the process's clock."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = time.monotonic_ns()
        database_us = connection.execute(_DB_NOW_US).scalar_one()
        after = time.monotonic_ns()
        local_us = ((before + after) // 2 + clock_offset_ns) // 1000
        uncertainty = (after - before) // 2000 + 2  # + both clocks' 1 µs resolution
        if best is None or uncertainty < best[1]:
            best = (local_us - database_us, uncertainty)
    assert best is not None
    return best


@dataclass
class RenewalTrace:
    """What one process's lease keeping did, on its monotonic clock (seconds)."""

    #: (worker ID, applied at, local deadline set): before the generator could see it.
    applied: list[tuple[int, float, float]] = field(default_factory=list)
    #: Every renewal attempt: its thread, the lease's deadline before it, and when it was
    #: ``called``, its UPDATE began and ended (``update``, ``updated``), its clock reading
    #: (``skew``, ``skewed``), the commit returned (``answered``) and it was ``applied``.
    renewals: list[dict[str, Any]] = field(default_factory=list)
    #: (start, end) of every caller's wait in ``renew_if_due`` (the generator is held).
    waits: list[tuple[float, float]] = field(default_factory=list)

    def install(self) -> None:
        """Record from now on (in this process only: call it in the forked load process)."""
        trace = self
        original_init, original_renewed = TableLease.__init__, TableLease.renewed
        original_renew, original_update = LeaseRenewer.renew, WorkerStore.renew
        original_measure, original_answered = clock_skew.measure, MetricsRecorder.renewal_answered
        local = threading.local()

        def moment(name: str) -> None:
            current = getattr(local, "current", None)
            if current is not None:
                current[name] = time.monotonic()
                current[f"{name}:cpu"], current[f"{name}:queued"] = _thread_times()

        def init(lease: TableLease, **kwargs: Any) -> None:
            applied = time.monotonic()
            original_init(lease, **kwargs)
            trace.applied.append((lease.worker_id, applied, lease.valid_until))

        def renewed(lease: TableLease, **kwargs: Any) -> None:
            moment("applied")
            applied = time.monotonic()
            original_renewed(lease, **kwargs)
            trace.applied.append((lease.worker_id, applied, lease.valid_until))

        def update(store: WorkerStore, connection: Any, **kwargs: Any) -> bool:
            moment("update")
            try:
                return bool(original_update(store, connection, **kwargs))
            finally:
                moment("updated")

        def measure(*args: Any, **kwargs: Any) -> clock_skew.ClockSkew:
            moment("skew")
            try:
                return original_measure(*args, **kwargs)
            finally:
                moment("skewed")

        def answered(recorder: MetricsRecorder, *args: Any, **kwargs: Any) -> None:
            moment("answered")
            original_answered(recorder, *args, **kwargs)

        def renew(renewer: LeaseRenewer, lease: TableLease) -> None:
            local.current = current = {
                "thread": threading.current_thread().name,
                "deadline": lease.valid_until,
                "called": time.monotonic(),
            }
            current["called:cpu"], current["called:queued"] = _thread_times()
            try:
                original_renew(renewer, lease)
            finally:
                local.current = None
                trace.renewals.append(current)

        original_wait = LeaseRenewer.renew_for_caller

        def wait(renewer: LeaseRenewer, lease: TableLease) -> None:
            start = time.monotonic()
            try:
                original_wait(renewer, lease)
            finally:
                trace.waits.append((start, time.monotonic()))

        LeaseRenewer.renew_for_caller = wait  # type: ignore[method-assign,assignment]
        TableLease.__init__ = init  # type: ignore[method-assign,assignment]
        TableLease.renewed = renewed  # type: ignore[method-assign,assignment]
        LeaseRenewer.renew = renew  # type: ignore[method-assign,assignment]
        WorkerStore.renew = update  # type: ignore[method-assign,assignment]
        clock_skew.measure = measure
        MetricsRecorder.renewal_answered = answered  # type: ignore[method-assign,assignment]


def _thread_times() -> tuple[float, float]:
    """This thread's CPU time and its time waiting for a CPU on a run queue (s, Linux)."""
    try:
        with open("/proc/thread-self/schedstat") as file:
            on_cpu, queued, _ = file.read().split()
        return int(on_cpu) / 1e9, int(queued) / 1e9
    except OSError:
        return math.nan, math.nan


# -- judging -------------------------------------------------------------------------------------


def server_moments(connection: Any) -> dict[int, list[tuple[int, str]]]:
    """Per process ID, (database µs, ``"written"`` or ``"committing"``) of each lease write."""
    rows = connection.execute(
        text(
            "SELECT pid, written_at_us, 'written' FROM lease_log UNION ALL "
            "SELECT pid, committing_at_us, 'committing' FROM commit_log"
        )
    ).all()
    moments: dict[int, list[tuple[int, str]]] = {}
    for pid, at_us, kind in rows:
        moments.setdefault(pid, []).append((at_us, kind))
    return {pid: sorted(found) for pid, found in moments.items()}


@dataclass
class LeaseRecord:
    """Every lease row the database wrote for one process: per worker ID, the merged intervals
    [written, expires) (database clock, µs) in which it held that ID."""

    held: dict[int, list[tuple[int, int]]]
    deadlines: dict[int, int]  # per worker ID, its latest expiry (ms) written before the outage


NO_LEASES = LeaseRecord(held={}, deadlines={})


def lease_records(connection: Any, stopped_us: int) -> dict[int, LeaseRecord]:
    """Per process ID, the intervals its leases covered and its deadlines at ``stopped_us``.

    A lease row covers the IDs stamped from the moment it was written (the process cannot know
    of it earlier) until its expiry; rows written in a transaction that did not commit are not
    in the log either. Released rows (no token or no expiry) cover nothing."""
    rows = connection.execute(
        text(
            "SELECT pid, worker_id, written_at_us, expires_at_ms FROM lease_log "
            "WHERE lease_token IS NOT NULL AND expires_at_ms IS NOT NULL"
        )
    ).all()
    spans: dict[int, dict[int, list[tuple[int, int]]]] = {}
    deadlines: dict[int, dict[int, int]] = {}
    for pid, worker_id, written_us, expires_ms in rows:
        spans.setdefault(pid, {}).setdefault(worker_id, []).append((written_us, expires_ms * 1000))
        if written_us < stopped_us:
            per_worker = deadlines.setdefault(pid, {})
            per_worker[worker_id] = max(expires_ms, per_worker.get(worker_id, expires_ms))
    return {
        pid: LeaseRecord(
            held={w: merge_intervals(spans_of_w) for w, spans_of_w in per_pid.items()},
            deadlines=deadlines.get(pid, {}),
        )
        for pid, per_pid in spans.items()
    }


@dataclass
class LeaseCheck:
    """A process's IDs judged both ways; per worker ID the latest stamp before its deadline."""

    outside: int = 0  # uncovered by the database's rows even allowing for the clock offset
    within_offset: int = 0  # uncovered as stamped, covered within the measured clock offset
    outside_locally: int = 0  # uncovered by the process's own applied leases (no clock compared)
    first_outside: tuple[int, int] | None = None  # (worker ID, stamp ms)
    first_outside_locally: tuple[int, int] | None = None
    #: where that first one's tick lay between the leases the process had applied
    first_outside_locally_gap: str = ""
    last_before_deadline: dict[int, int] = field(default_factory=dict)

    def describe(self, index: int) -> list[str]:
        """The misses of process ``index`` (nothing when every ID was covered)."""
        notes = []
        if self.outside:
            worker, stamp = self.first_outside or (-1, 0)
            notes.append(
                f"process {index}: {self.outside} IDs stamped outside its leases by the "
                f"database's log, beyond the clock offset (first: worker {worker} at {stamp} ms)"
            )
        if self.outside_locally:
            worker, stamp = self.first_outside_locally or (-1, 0)
            notes.append(
                f"process {index}: {self.outside_locally} IDs stamped outside the leases it had "
                f"applied, by its own monotonic clock (first: worker {worker} at {stamp} ms; "
                f"{self.first_outside_locally_gap})"
            )
        return notes


def ids_of(arrays: Iterable[Iterable[int]]) -> Iterator[tuple[int, int]]:
    """(worker ID, stamp ms) of every ID."""
    layout = DEFAULT_LAYOUT
    time_shift, worker_shift = layout.time_shift, layout.worker_shift
    worker_mask, epoch_ms, tick_ms = layout.max_worker_id, layout.epoch_ms, layout.tick_ms
    for ids in arrays:
        for value in ids:
            yield (value >> worker_shift) & worker_mask, epoch_ms + (value >> time_shift) * tick_ms


def check_ids(
    arrays: Iterable[Iterable[int]],
    record: LeaseRecord,
    *,
    offset_us: tuple[int, int],
    clock_offset_ns: int,
    applied: list[tuple[int, float, float]],
) -> LeaseCheck:
    """Judge every ID of one process (see the module's docstring)."""
    slack_us = abs(offset_us[0]) + offset_us[1]
    local: dict[int, list[tuple[int, int]]] = {}
    for worker_id, applied_at, valid_until in applied:
        if valid_until > applied_at:
            span = (round(applied_at * 1e9), round(valid_until * 1e9))
            local.setdefault(worker_id, []).append(span)
    local = {worker: merge_intervals(spans) for worker, spans in local.items()}
    check = LeaseCheck()
    last = check.last_before_deadline
    previous, verdict = (-1, -1), (False, False, False)
    for worker_id, stamp in ids_of(arrays):
        if (worker_id, stamp) != previous:  # IDs of one tick share a verdict
            previous = (worker_id, stamp)
            verdict = _judge(
                worker_id,
                stamp,
                record=record,
                local=local,
                slack_us=slack_us,
                clock_offset_ns=clock_offset_ns,
            )
            deadline = record.deadlines.get(worker_id)
            if deadline is not None and last.get(worker_id, -1) < stamp < deadline:
                last[worker_id] = stamp
        outside, within_offset, outside_locally = verdict
        if outside:
            check.outside += 1
            check.first_outside = check.first_outside or (worker_id, stamp)
        check.within_offset += within_offset
        if outside_locally:
            check.outside_locally += 1
            if check.first_outside_locally is None:
                check.first_outside_locally = (worker_id, stamp)
                start_ns = stamp * 1_000_000 - clock_offset_ns
                check.first_outside_locally_gap = describe_gap(
                    local.get(worker_id, []), start_ns,
                    start_ns + DEFAULT_LAYOUT.tick_ms * 1_000_000)
    return check


def describe_gap(intervals: list[tuple[int, int]], start: int, end: int) -> str:
    """Where ``[start, end)`` (ns) lies between the merged, sorted ``intervals``: how long after
    the end of the one before it began, how long before the next one it ended."""
    index = bisect.bisect_left(intervals, (end, -math.inf)) - 1
    parts = []
    if index >= 0:
        parts.append(f"its tick began {(start - intervals[index][1]) / 1e6:.3f} ms after the "
                     "deadline of the lease applied before it")
    else:
        parts.append("no lease was applied before its tick")
    if index + 1 < len(intervals):
        parts.append(f"ended {(intervals[index + 1][0] - end) / 1e6:.3f} ms before the next "
                     "was applied")
    return ", ".join(parts)


def _judge(
    worker_id: int,
    stamp: int,
    *,
    record: LeaseRecord,
    local: dict[int, list[tuple[int, int]]],
    slack_us: int,
    clock_offset_ns: int,
) -> tuple[bool, bool, bool]:
    """(outside beyond the offset, outside within it, outside the locally applied leases)."""
    tick_us = DEFAULT_LAYOUT.tick_ms * 1000
    held = record.held.get(worker_id, [])
    start_us = stamp * 1000
    outside = within_offset = False
    if not touches(held, start_us, start_us + tick_us):
        within_offset = touches(held, start_us - slack_us, start_us + tick_us + slack_us)
        outside = not within_offset
    start_ns = stamp * 1_000_000 - clock_offset_ns  # the tick's start, monotonic
    outside_locally = not touches(local.get(worker_id, []), start_ns, start_ns + tick_us * 1000)
    return outside, within_offset, outside_locally
