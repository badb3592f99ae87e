"""A clean release stores the high-water mark the holder really reached, whatever its clock, so
short-lived processes (cron jobs, CLI runs) do not park slots. PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import subprocess
import sys
import time

from snowflake_db import (
    Layout,
    MonotonicClock,
    SnowflakeGenerator,
    WorkerIdExhaustedError,
    wall_clock,
)
from snowflake_db.worker import TableLease

from ..plugins.databases import ScratchDatabase
from ..plugins.scheduler_delay import SchedulerDelay
from ..plugins.worker_support import allocator, read_slots, wait_for

SINGLE_SLOT = Layout(worker_bits=0)
#: Long enough that a mark kept at the whole reserve would refuse the next holder
#: (it is far more than the default 1 s floor wait).
LEASE_SECONDS = 10.0


class SkewedClock:
    """A custom clock (not the built-in monotonic one): wall time plus a fixed offset."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms

    def __call__(self) -> int:
        return wall_clock() + self.offset_ms


def _lease(gen: SnowflakeGenerator) -> TableLease:
    lease = gen.lease
    assert isinstance(lease, TableLease)
    return lease


def test_release_with_a_custom_clock_frees_the_slot_at_once(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    with allocator(any_db, lease_seconds=LEASE_SECONDS) as alloc:
        first = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT, clock=SkewedClock(-300))
        old_ids = first.next_ids(20_000)
        reserved = _lease(first).high_water_ms
        first.close()
        last_issued_ms = max(SINGLE_SLOT.decode(i).timestamp_ms for i in old_ids)
        stored = read_slots(any_db.url)[0]
        assert stored.state == "free"
        assert stored.high_water_ms == last_issued_ms < reserved - 5000

        # A later holder on a correct clock takes the slot at once and issues above the mark.
        second = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT)
        started = time.monotonic()
        assert second.ensure_worker() == 0
        assert _lease(second).floor_ms == last_issued_ms
        assert last_issued_ms < second.clock()  # nothing to wait for
        new_ids = second.next_ids(20_000)
        ended = time.monotonic()
        assert ended - started < scheduler_delay.widen(LEASE_SECONDS / 2, started, ended)
        assert min(new_ids) > max(old_ids)
        second.close()


def test_release_before_any_id_keeps_only_the_previous_mark(any_db: ScratchDatabase) -> None:
    with allocator(any_db, lease_seconds=LEASE_SECONDS) as alloc:
        first = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT, clock=wall_clock)
        ids = first.next_ids(1000)
        first.close()
        mark = read_slots(any_db.url)[0].high_water_ms
        assert mark == max(SINGLE_SLOT.decode(i).timestamp_ms for i in ids)
        idle = SnowflakeGenerator(allocator=alloc, layout=SINGLE_SLOT, clock=SkewedClock(-200))
        idle.ensure_worker()  # leased, nothing issued: the previous holder's mark stays
        idle.close()
        assert read_slots(any_db.url)[0].high_water_ms == mark


_SEQUENTIAL_PROCESS = """
import sys
import snowflake_db
from snowflake_db.worker import TableWorkerAllocator
gen = snowflake_db.configure(
    allocator=TableWorkerAllocator(sys.argv[1], lease_seconds=float(sys.argv[2])),
    layout=snowflake_db.Layout(worker_bits=1),
    clock=snowflake_db.wall_clock,
)
ids = [snowflake_db.snowflake_default() for _ in range(1000)]
print(gen.worker_id, max(ids))
"""


def test_sequential_processes_with_the_wall_clock_reuse_two_slots(
    any_db: ScratchDatabase,
) -> None:
    """worker_bits=1: each process exits cleanly (atexit release); none may find both parked."""
    results: list[tuple[int, int]] = []
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, "-c", _SEQUENTIAL_PROCESS, any_db.url_string, str(LEASE_SECONDS)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        worker, last_id = map(int, done.stdout.split())
        results.append((worker, last_id))
    assert all(0 <= worker <= 1 for worker, _ in results)
    rows = read_slots(any_db.url)
    assert all(row.state == "free" for row in rows.values())


def test_an_unreleased_slot_is_parked_for_the_longer_of_lease_and_reserve(
    any_db: ScratchDatabase,
) -> None:
    """The README's arithmetic: a holder that ends without releasing parks its slot for
    max(lease_seconds, reserve_ahead_ms/1000 - max_floor_wait_ms/1000) after its last renewal:
    the lease and the reserve run side by side."""
    clock = MonotonicClock()
    # lease 1 s, reserve 8 s, the next holder waits up to 0.5 s: parked ~7.5 s, not 1 s or 8 s.
    # Every step is timed off the mark the database holds, never off this test's own pace:
    # a claim that committed late on a loaded machine moves the mark, not the test's verdict.
    with allocator(any_db, lease_seconds=1.0, reserve_ahead_ms=8000) as crashed:
        crashed.acquire(layout=SINGLE_SLOT, clock=clock).abandon()  # a SIGKILLed holder
    mark = read_slots(any_db.url)[0].high_water_ms
    with allocator(any_db, lease_seconds=1.0, max_floor_wait_ms=500) as next_holder:
        # Real time is the subject (the README's parking arithmetic against the clock), so the
        # lease and the mark are waited out, not set in the table.
        time.sleep(max(0.0, (mark - 6400 - clock()) / 1000))  # 1.6 s after the last renewal
        assert wait_for(lambda: read_slots(any_db.url)[0].state == "expired", 5)
        try:  # the lease alone is over...
            next_holder.acquire(layout=SINGLE_SLOT, clock=clock)
        except WorkerIdExhaustedError as error:  # ...but the mark still parks the slot
            assert "high-water mark more than 500 ms ahead" in str(error)
        else:
            ahead = mark - clock()
            assert ahead <= 500, f"the slot was handed out while its mark was {ahead} ms ahead"
            raise AssertionError(f"the acquisition took so long that the mark was {ahead} ms ahead")
        time.sleep(max(0.0, (mark - 300 - clock()) / 1000))
        taken = next_holder.acquire(layout=SINGLE_SLOT, clock=clock)
        assert taken.worker_id == 0 and taken.floor_ms is not None
