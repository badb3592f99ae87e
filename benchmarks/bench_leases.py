"""Leases under CPU overload: no fencing while the database answers, and fencing when it does not.

Run ``.venv/bin/python benchmarks/bench_leases.py`` (a few minutes; ``--quick`` for a short
smoke run). It starts ``--processes`` processes (default 8), each with ``--threads`` threads
(default 4) calling ``next_id()`` as fast as they can (``--work`` idle loop rounds after each
ID, default 50: about a microsecond) on a generator leased from a ``TableWorkerAllocator`` with
``--lease-seconds`` (default 3 s) leases: on a 2-core machine the heartbeat threads compete with
32 busy threads for the CPU and their processes' GILs. Each table row says how often a caller
renewed a lease itself (``by caller``) or waited for a running renewal (``waits``).

Phase 1, *healthy*: a scratch database on the shared PostgreSQL server (created and dropped,
``SNOWFLAKE_TEST_POSTGRES_URL``), ``--seconds`` (default 60 s). Target: zero
``LeaseExpiredError`` (zero errors of any kind) and zero duplicates.

Phase 2, *outage*: a throwaway PostgreSQL cluster the benchmark creates itself (``initdb`` and
``pg_ctl`` from ``--pg-bin``, as the ``postgres`` user when run as root, on a free port in a
temporary directory; never the shared server) is stopped for ``--outage-seconds`` (default 10 s)
while the processes issue, then started again. A trigger logs every lease row the database
writes, so each lease's real deadline (``expires_at_ms``, database clock) is known afterwards.
Targets: every process fences before its lease's deadline (the margin is printed); every
process issues again within 2 s of the database's return; zero duplicates.

In both phases every ID is judged two ways (:mod:`lease_judge`): against the lease rows the
database logged (trigger ``log_lease``, microseconds), its tick must overlap a lease of its own
process for its worker ID, IDs that need the measured clock offset reported apart; and against
the leases its process had applied, on that process's own monotonic clock. When a process fences
in the healthy phase, the renewal that came too late is printed step by step.

Every ID is kept (``array('q')`` per thread, written to a temporary file) and checked at the
end: each thread's IDs strictly increase, and a merge of all threads' sorted IDs finds no value
twice. Exits non-zero when a target is missed.
"""

from __future__ import annotations

import argparse
import heapq
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise, repeat
from pathlib import Path
from typing import Any, TypeVar

from bench_worker import scratch_database  # the shared server's scratch database, dropped after
from lease_judge import (
    LEASE_LOG,
    NO_LEASES,
    LeaseCheck,
    LeaseRecord,
    RenewalTrace,
    check_ids,
    lease_records,
    measure_offset_us,
    merge_intervals,
    server_moments,
)
from sqlalchemy import Connection, create_engine
from sqlalchemy.exc import OperationalError

import snowflake_db

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from example_project.local_servers import DEFAULT_PG_BIN, ThrowawayPostgres
from snowflake_db import SnowflakeError, SnowflakeGenerator
from snowflake_db.clock import MonotonicClock
from snowflake_db.worker import TableLease, TableWorkerAllocator

FORK = multiprocessing.get_context("fork")
T = TypeVar("T")
RESUME_TARGET_S = 2.0


# -- one process of the load ---------------------------------------------------------------------


@dataclass
class ThreadLog:
    """What one issuing thread saw: its IDs (in a file), errors, and fenced intervals."""

    path: str
    errors: Counter[str] = field(default_factory=Counter)
    fenced: list[tuple[float, float]] = field(default_factory=list)  # wall-clock (start, end)
    #: At each fence's first error: (monotonic now, local deadline, renewal in flight).
    fences: list[tuple[float, float, bool]] = field(default_factory=list)
    count: int = 0


def _issue(gen: SnowflakeGenerator, stop_at: float, work: int, log: ThreadLog) -> None:
    """Call ``next_id()`` until ``stop_at``, with ``work`` idle loop rounds (a request's CPU)
    after each ID; after an error, sleep 1 ms and note when the thread was fenced."""
    ids = array("q")
    append, next_id, now = ids.append, gen.next_id, time.time
    fenced_since: float | None = None
    while True:
        for _ in range(256):  # read the wall clock once per 256 calls on the hot path
            try:
                append(next_id())
                for _ in repeat(None, work):
                    pass
            except SnowflakeError as error:
                log.errors[type(error).__name__] += 1
                if fenced_since is None:
                    fenced_since = now()
                    lease = gen.lease
                    if isinstance(lease, TableLease):
                        running = lease.renewal_in_flight() is not None
                        log.fences.append((time.monotonic(), lease.valid_until, running))
                time.sleep(0.001)
                break
            if fenced_since is not None:
                log.fenced.append((fenced_since, now()))
                fenced_since = None
        if now() >= stop_at:
            break
    if fenced_since is not None:
        log.fenced.append((fenced_since, now()))
    log.count = len(ids)
    with open(log.path, "wb") as file:
        ids.tofile(file)


def _process(index: int, url: str, args: dict[str, Any], queues: tuple[Any, Any, Any]) -> None:
    """One process: lease a worker ID, then issue from ``threads`` threads until the end time."""
    ready, start, results = queues
    trace = RenewalTrace()
    trace.install()
    try:
        alloc = TableWorkerAllocator(url, lease_seconds=args["lease_seconds"])
        gen = SnowflakeGenerator(allocator=alloc)
        assert isinstance(gen.clock, MonotonicClock)  # the judge maps stamps back to monotonic
        offset_ns = gen.clock.offset_ns
        offsets = [_offset(url, offset_ns)]
        gen.ensure_worker()
        first_lease = gen.lease
        if args["stop_heartbeat"]:  # diagnostics: callers alone keep the lease
            alloc._heartbeat.stop()
        ready.put(index)
        stop_at = start.get()
        logs = [
            ThreadLog(path=os.path.join(args["out"], f"p{index}-t{t}.q"))
            for t in range(args["threads"])
        ]
        threads = [
            threading.Thread(target=_issue, args=(gen, stop_at, args["work"], log)) for log in logs
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        offsets.append(_offset(url, offset_ns))
        leases = [lease for lease in (first_lease, gen.lease) if isinstance(lease, TableLease)]
        report = {
            "index": index,
            "pid": os.getpid(),
            "worker_ids": sorted({lease.worker_id for lease in leases}),
            "renewals": sum(lease.renewals for lease in set(leases)),
            "caller_renewals": sum(getattr(lease, "caller_renewals", 0) for lease in set(leases)),
            "caller_waits": sum(getattr(lease, "caller_waits", 0) for lease in set(leases)),
            "threads": [(log.path, log.count, dict(log.errors), log.fenced) for log in logs],
            "fences": sorted(fence for log in logs for fence in log.fences),
            "clock_offset_ns": offset_ns,
            "offset_us": max(offsets, key=lambda offset: abs(offset[0]) + offset[1]),
            "applied": trace.applied,
            "trace": trace.renewals,
            "waits": trace.waits,
            "error": None,
        }
        gen.close()
        alloc.close()
    except BaseException as error:  # report, never hang the parent
        ready.put(index)
        report = {"index": index, "error": f"{type(error).__name__}: {error}"}
    results.put(report)


def _on_connection(url: str, work: Callable[[Connection], T]) -> T:
    """``work`` on a connection of a short-lived engine."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return work(connection)
    finally:
        engine.dispose()


def _offset(url: str, clock_offset_ns: int, *, wait_seconds: float = 60.0) -> tuple[int, int]:
    """This process's clock minus the database's, and the uncertainty, in µs. Connection
    failures are retried for ``wait_seconds``: after the outage phase a loaded machine can take
    longer than the phase's tail to bring the throwaway server back ("the database system is
    starting up" failed a whole run once)."""
    give_up = time.monotonic() + wait_seconds
    while True:
        try:
            return _on_connection(url, partial(measure_offset_us, clock_offset_ns=clock_offset_ns))
        except OperationalError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.5)


#: The fields of a :class:`ProcessResult` taken from a process's report as they are.
_REPORTED = (
    "index",
    "pid",
    "worker_ids",
    "renewals",
    "caller_renewals",
    "caller_waits",
    "fences",
    "clock_offset_ns",
    "offset_us",
    "applied",
    "trace",
    "waits",
)


@dataclass
class ProcessResult:
    index: int
    pid: int
    worker_ids: list[int]
    renewals: int
    caller_renewals: int
    caller_waits: int
    ids: int
    errors: Counter[str]
    fenced: list[tuple[float, float]]  # merged over the process's threads
    files: list[str]
    fences: list[tuple[float, float, bool]]
    clock_offset_ns: int
    offset_us: tuple[int, int]  # its clock minus the database's (the larger of two), uncertainty
    applied: list[tuple[int, float, float]]
    trace: list[dict[str, Any]]
    waits: list[tuple[float, float]]

    @property
    def fenced_seconds(self) -> float:
        return sum(end - start for start, end in self.fenced)


def run_load(
    url: str, *, seconds: float, processes: int, threads: int, lease_seconds: float, work: int,
    out: str, during: Any = None, stop_heartbeat: bool = False,
) -> tuple[list[ProcessResult], float]:
    """Run the load for ``seconds``; ``during(started_at)`` runs in this process meanwhile.
    Returns the per-process results and the wall-clock start."""
    ready, start, results = FORK.Queue(), FORK.Queue(), FORK.Queue()
    options = {
        "lease_seconds": lease_seconds,
        "threads": threads,
        "out": out,
        "work": work,
        "stop_heartbeat": stop_heartbeat,
    }
    children = [
        FORK.Process(target=_process, args=(i, url, options, (ready, start, results)))
        for i in range(processes)
    ]
    for child in children:
        child.start()
    for _ in children:
        ready.get(timeout=120)
    started_at = time.time()
    for _ in children:
        start.put(started_at + seconds)
    if during is not None:
        during(started_at)
    reports = [results.get(timeout=seconds + 300) for _ in children]
    for child in children:
        child.join(60)
    failed = [report["error"] for report in reports if report["error"]]
    if failed:
        raise RuntimeError(f"a load process failed: {failed[0]}")
    out_results = []
    for report in sorted(reports, key=lambda r: r["index"]):
        errors: Counter[str] = Counter()
        fenced: list[tuple[float, float]] = []
        for _, _, thread_errors, thread_fenced in report["threads"]:
            errors.update(thread_errors)
            fenced.extend(thread_fenced)
        out_results.append(
            ProcessResult(
                **{name: report[name] for name in _REPORTED},
                ids=sum(count for _, count, _, _ in report["threads"]),
                errors=errors,
                fenced=merge_intervals(fenced),
                files=[path for path, *_ in report["threads"]],
            )
        )
    return out_results, started_at


# -- checking the IDs ----------------------------------------------------------------------------


def _load(path: str) -> array[int]:
    ids = array("q")
    with open(path, "rb") as file:
        ids.frombytes(file.read())
    return ids


def _increasing(ids: array[int]) -> bool:
    return all(a < b for a, b in pairwise(ids))


def count_duplicates(results: list[ProcessResult]) -> tuple[int, int, int]:
    """(IDs, duplicates, threads whose IDs did not strictly increase), reading every file."""
    arrays = [_load(path) for result in results for path in result.files]
    ordered = [_increasing(ids) for ids in arrays]
    total = sum(len(ids) for ids in arrays)
    duplicates = 0
    previous = None
    streams = [ids if fine else sorted(ids) for ids, fine in zip(arrays, ordered, strict=True)]
    for value in heapq.merge(*streams):
        if value == previous:
            duplicates += 1
        previous = value
    unordered = ordered.count(False)
    return total, duplicates, unordered


def check_against_leases(result: ProcessResult, record: LeaseRecord) -> LeaseCheck:
    """Judge every ID of the process against its lease rows and its own applied leases."""
    return check_ids(
        (_load(path) for path in result.files),
        record,
        offset_us=result.offset_us,
        clock_offset_ns=result.clock_offset_ns,
        applied=result.applied,
    )


# -- databases -----------------------------------------------------------------------------------


def install_lease_log(url: str) -> None:
    """Create the worker tables, then log every lease row written (with the database time)."""
    alloc = TableWorkerAllocator(url)
    try:
        alloc.create_tables()
    finally:
        alloc.close()
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(LEASE_LOG)
    finally:
        engine.dispose()


def read_lease_records(url: str, stopped_us: int) -> dict[int, LeaseRecord]:
    return _on_connection(url, partial(lease_records, stopped_us=stopped_us))


# -- reporting -----------------------------------------------------------------------------------


def print_table(results: list[ProcessResult], extra: dict[int, str] | None = None) -> None:
    extra = extra or {}
    header = (
        f"{'proc':>4} {'worker':>6} {'IDs':>12} {'renewals':>8} {'by caller':>9} {'waits':>5} "
        f"{'fenced s':>8}  errors"
    )
    if extra:
        header += " | outage"
    print(header)
    print("-" * (len(header) + 30))
    for result in results:
        errors = ", ".join(f"{name} {count:,}" for name, count in sorted(result.errors.items()))
        line = (
            f"{result.index:>4} {','.join(map(str, result.worker_ids)):>6} {result.ids:>12,} "
            f"{result.renewals:>8} {result.caller_renewals:>9} {result.caller_waits:>5} "
            f"{result.fenced_seconds:>8.2f}  "
            f"{errors or '-'}"
        )
        if result.index in extra:
            line += f" | {extra[result.index]}"
        print(line)


def print_totals(
    results: list[ProcessResult], *, with_fenced: bool
) -> tuple[int, int, Counter[str]]:
    """Print the run's IDs, duplicates, threads out of order and errors by type (and the
    seconds fenced); return the duplicates, the unordered threads and the errors."""
    total, duplicates, unordered = count_duplicates(results)
    errors: Counter[str] = Counter()
    for result in results:
        errors.update(result.errors)
    fenced = ""
    if with_fenced:
        fenced = f"; fenced {sum(result.fenced_seconds for result in results):.2f} s in all"
    print(
        f"total: {total:,} IDs, {duplicates} duplicates, {unordered} threads out of order; "
        f"errors: {dict(errors) or 'none'}{fenced}"
    )
    return duplicates, unordered, errors


def judge(
    results: list[ProcessResult], records: dict[int, LeaseRecord]
) -> tuple[list[LeaseCheck], list[str]]:
    """Judge every process's IDs both ways, print the verdicts; return them and the misses."""
    checks = [check_against_leases(r, records.get(r.pid, NO_LEASES)) for r in results]
    offsets = [result.offset_us for result in results]
    print(
        "judge: clocks minus the database's "
        + ", ".join(f"{offset:+d} ± {uncertainty} µs" for offset, uncertainty in offsets)
        + f"; IDs outside their process's lease rows (database clock): "
        f"{sum(check.outside for check in checks)} beyond the clock offset, "
        f"{sum(check.within_offset for check in checks)} within it; outside the leases each "
        f"process had applied (its own monotonic clock): "
        f"{sum(check.outside_locally for check in checks)}"
    )
    missed = [note for r, c in zip(results, checks, strict=True) for note in c.describe(r.index)]
    return checks, missed


def print_fences(
    results: list[ProcessResult],
    lease_seconds: float,
    moments: dict[int, list[tuple[int, str]]],
    shown: int = 6,
) -> None:
    """Diagnostics for the fences of the healthy phase: the renewal that came too late, and
    where its time went (ms between the moments the trace recorded; ``written`` and
    ``committing`` are the database's, mapped to the process's clock by the measured offset)."""
    fences: list[tuple[tuple[float, float, bool], ProcessResult]] = []
    for result in results:
        for fence in result.fences:  # each thread records the same fence: keep the first
            if not any(r is result and abs(f[0] - fence[0]) < 0.5 for f, r in fences):
                fences.append((fence, result))
    if not fences:
        return
    running = sum(1 for (_, _, in_flight), _ in fences if in_flight)
    print(f"fences: {len(fences)}, {running} with a renewal in flight at the first error")
    renew_every = lease_seconds / 3
    valid_for = lease_seconds - lease_seconds / 5
    steps = ("called", "update", "updated", "skew", "skewed", "answered", "applied")
    for (at, deadline, _), result in fences[:shown]:
        due = deadline - valid_for + renew_every
        print(
            f"  process {result.index}: first error {1000 * (at - deadline):+.0f} ms from the "
            f"deadline, {at - due:.2f} s after the renewal was due; renewals since:"
        )
        for renewal in result.trace:
            if renewal["deadline"] < deadline - 0.01 or renewal["called"] > at + 1.0:
                continue  # an earlier period's renewal, or a later one
            times = [(step, renewal[step]) for step in steps if step in renewal]
            offset_s = (result.offset_us[0] * 1000 - result.clock_offset_ns) / 1e9
            start, end = times[0][1], times[-1][1]
            for at_us, kind in moments.get(result.pid, []):
                moment = at_us / 1e6 + offset_s  # database time on this process's clock
                if start <= moment <= end + 0.01:
                    times.append((kind, moment))
            times.sort(key=lambda step_moment: step_moment[1])
            gaps = ", ".join(
                f"{step} +{1000 * (moment - previous):.0f}"
                for (_, previous), (step, moment) in pairwise(times)
            )
            last = [step for step in steps if step in renewal][-1]
            cpu = renewal[f"{last}:cpu"] - renewal["called:cpu"]
            queued = renewal[f"{last}:queued"] - renewal["called:queued"]
            held = sum(
                max(0.0, min(end, times[-1][1]) - max(begin, start))
                for begin, end in result.waits
            )
            print(
                f"    {renewal['thread']}: called {renewal['called'] - due:+.3f} s after due; "
                f"{gaps}; ends {1000 * (times[-1][1] - at):+.0f} ms from the first error; "
                f"callers held {1000 * held:.0f} ms of it; the renewing thread ran "
                f"{1000 * cpu:.0f} ms and waited {1000 * queued:.0f} ms for a CPU (the rest: "
                "for the GIL, a lock or the database)"
            )


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


# -- the two phases ------------------------------------------------------------------------------


def healthy_phase(args: argparse.Namespace, out: str) -> list[str]:
    print(
        f"\n== phase 1: healthy database (shared PostgreSQL), {args.processes} processes x "
        f"{args.threads} threads, {args.lease_seconds:g} s leases, {args.seconds:g} s; "
        f"load average before: {load_average()}"
    )
    with scratch_database("postgresql") as url:
        install_lease_log(url)
        results, _ = run_load(
            url,
            seconds=args.seconds,
            processes=args.processes,
            threads=args.threads,
            lease_seconds=args.lease_seconds,
            work=args.work,
            stop_heartbeat=args.stop_heartbeat,
            out=out,
        )
        records = read_lease_records(url, stopped_us=0)
        moments = _on_connection(url, server_moments)
    print(f"load average after: {load_average()}")
    print_table(results)
    duplicates, unordered, errors = print_totals(results, with_fenced=True)
    missed = [f"healthy: {miss}" for miss in judge(results, records)[1]]
    print_fences(results, args.lease_seconds, moments)
    if errors.get("LeaseExpiredError", 0):
        missed.append(f"healthy: {errors['LeaseExpiredError']} LeaseExpiredError (target 0)")
    other = sum(count for name, count in errors.items() if name != "LeaseExpiredError")
    if other:
        missed.append(f"healthy: {other} other errors (target 0)")
    if duplicates or unordered:
        missed.append(f"healthy: {duplicates} duplicates, {unordered} unordered threads")
    for path in (path for result in results for path in result.files):
        os.unlink(path)
    return missed


def outage_phase(args: argparse.Namespace, out: str) -> list[str]:
    before, outage, after = args.outage_before, args.outage_seconds, args.outage_after
    seconds = before + outage + after
    print(
        f"\n== phase 2: throwaway PostgreSQL stopped for {outage:g} s (after {before:g} s; "
        f"{after:g} s more), {args.processes} processes x {args.threads} threads, "
        f"{args.lease_seconds:g} s leases; load average before: {load_average()}"
    )
    server = ThrowawayPostgres(args.pg_bin, name="bench-pg")
    url = server.url("bench")
    times: dict[str, float] = {}

    def cut(started_at: float) -> None:
        time.sleep(max(0.0, started_at + before - time.time()))
        times["stop_requested"] = time.time()
        server.stop()
        times["stopped"] = time.time()
        time.sleep(max(0.0, times["stop_requested"] + outage - time.time()))
        server.start()
        times["back"] = time.time()

    try:
        server.start()
        server.create_database("bench")
        install_lease_log(url)
        results, _ = run_load(
            url,
            seconds=seconds,
            processes=args.processes,
            threads=args.threads,
            lease_seconds=args.lease_seconds,
            work=args.work,
            stop_heartbeat=args.stop_heartbeat,
            out=out,
            during=cut,
        )
        # Every lease row each process had written; the deadlines are those of the leases held
        # when the database went away (a renewal written once it was back, which can be just
        # before pg_ctl returns, starts a new interval instead of moving the old deadline).
        records = read_lease_records(url, round(times["stopped"] * 1_000_000))
    finally:
        server.close()
    print(
        f"load average after: {load_average()}; database stopped "
        f"{times['stopped'] - times['stop_requested']:.2f} s after the request, back "
        f"{times['back'] - times['stop_requested']:.2f} s after it"
    )
    checks, missed = judge(results, records)
    extra: dict[int, str] = {}
    for result, check in zip(results, checks, strict=True):
        notes = []
        record = records.get(result.pid, NO_LEASES)
        for worker_id, deadline in sorted(record.deadlines.items()):
            last = check.last_before_deadline.get(worker_id)
            margin = "n/a" if last is None else f"{deadline - last} ms"
            notes.append(f"w{worker_id}: last ID {margin} before the deadline")
        fences = [
            (start, end)
            for start, end in result.fenced
            if start < times["back"] and end > times["stop_requested"]
        ]
        if not fences:
            missed.append(f"process {result.index} never fenced during the outage")
            notes.append("never fenced")
        else:
            fenced_at = min(s for s, _ in fences)
            resumed = max(e for _, e in fences) - times["back"]
            first_deadline = min(record.deadlines.values(), default=None)
            if first_deadline is not None:
                notes.append(f"fenced {first_deadline / 1000 - fenced_at:.2f} s before it")
                if fenced_at * 1000 >= first_deadline:
                    missed.append(f"process {result.index} fenced after its deadline")
            # "back" is stamped when pg_ctl start returns, which polls for readiness: a process
            # can reconnect a little before that, and then resumed is negative.
            notes.append(
                f"resumed {resumed:.2f} s after the return" if resumed >= 0
                else f"resumed {-resumed:.2f} s before pg_ctl reported the server ready"
            )
            if resumed > RESUME_TARGET_S:
                missed.append(
                    f"process {result.index} resumed {resumed:.2f} s after the database's return"
                )
        extra[result.index] = "; ".join(notes)
    print_table(results, extra)
    duplicates, unordered, _ = print_totals(results, with_fenced=False)
    if duplicates or unordered:
        missed.append(f"outage: {duplicates} duplicates, {unordered} unordered threads")
    for path in (path for result in results for path in result.files):
        os.unlink(path)
    return [f"outage: {item}" if not item.startswith("outage") else item for item in missed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--lease-seconds", type=float, default=3.0)
    parser.add_argument(
        "--work", type=int, default=50, help="idle loop rounds after each ID (a request's CPU)"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="healthy phase length")
    parser.add_argument("--outage-before", type=float, default=10.0)
    parser.add_argument("--outage-seconds", type=float, default=10.0)
    parser.add_argument("--outage-after", type=float, default=10.0)
    parser.add_argument("--pg-bin", default=str(DEFAULT_PG_BIN), help="initdb and pg_ctl are here")
    parser.add_argument(
        "--stop-heartbeat",
        action="store_true",
        help="diagnostics: stop each allocator's heartbeat thread, so only callers renew",
    )
    parser.add_argument("--skip-healthy", action="store_true")
    parser.add_argument("--skip-outage", action="store_true")
    parser.add_argument("--quick", action="store_true", help="15 s healthy, 5+10+5 s outage")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if args.quick:
        args.seconds, args.outage_before, args.outage_after = 15.0, 5.0, 5.0
    print(
        f"snowflake_db {snowflake_db.__version__}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs"
    )
    missed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sfdb-bench-leases-") as out:
        if not args.skip_healthy:
            missed += healthy_phase(args, out)
        if not args.skip_outage:
            missed += outage_phase(args, out)
    print(
        "\ntargets: healthy: zero LeaseExpiredError, zero duplicates; outage: every process "
        f"fences before its lease's deadline (database clock), resumes within "
        f"{RESUME_TARGET_S:g} s of the database's return, zero duplicates"
    )
    if missed:
        print("MISSED: " + "; ".join(missed))
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
