"""``next_ids(n)`` fills the ticks its generator left unused instead of waiting for future ones:
never at or below its last tick, never at or below a lease's floor, never before the generator
has a tick of its own, at most ``MAX_BACKFILL_MS`` back. IDs stay unique and strictly increasing,
with real threads mixing ``next_id`` and ``next_ids``."""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Sequence
from itertools import pairwise

import pytest

from snowflake_db import DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, ClockStalledError, SnowflakeGenerator
from snowflake_db.generator import MAX_BACKFILL_MS

from ..plugins.core_support import FakeAllocator

T0 = DEFAULT_EPOCH_MS + 10**9
PER_TICK = 4096  # the default layout: 12 sequence bits, 1 ms ticks
decode = DEFAULT_LAYOUT.decode


class FrozenClock:
    """Unix ms that move only when the test says: a batch that needs a future tick stalls."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def _times(ids: list[int]) -> list[int]:
    return [decode(snowflake_id).timestamp_ms for snowflake_id in ids]


def _strictly_increasing(ids: Sequence[int]) -> bool:
    return all(a < b for a, b in pairwise(ids))


def test_a_batch_fills_the_ticks_since_the_last_id_without_waiting() -> None:
    clock = FrozenClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=0)
    first = generator.next_id()
    clock.now_ms = T0 + 10
    ids = generator.next_ids(3 * PER_TICK)  # a frozen clock: only past ticks can serve it
    times = _times(ids)
    assert times[0] == T0 + 8 and times[-1] == T0 + 10
    assert ids[0] > first and _strictly_increasing(ids)
    with pytest.raises(ClockStalledError):
        generator.next_id()  # the current tick is used up, and no tick is ever used twice
    clock.now_ms += 1
    assert generator.next_id() > ids[-1]


def test_never_at_or_below_the_last_tick() -> None:
    clock = FrozenClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=0)
    last = generator.next_ids(PER_TICK)[-1]  # tick T0 used up
    clock.now_ms = T0 + 1
    with pytest.raises(ClockStalledError):
        generator.next_ids(3 * PER_TICK)  # only T0 + 1 is free: the rest would be future ticks
    # The failed call returned nothing; the tick it opened is spent, never reused.
    clock.now_ms = T0 + 4
    ids = generator.next_ids(3 * PER_TICK)
    assert _times(ids)[0] == T0 + 2 and ids[0] > last and _strictly_increasing(ids)


def test_a_new_static_generator_starts_at_the_current_tick() -> None:
    """Another process may have used the same static worker ID until just before this one."""
    clock = FrozenClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=0)
    assert set(_times(generator.next_ids(PER_TICK))) == {T0}
    with pytest.raises(ClockStalledError):
        SnowflakeGenerator(2, clock=clock, max_wait_ms=0).next_ids(PER_TICK + 1)


def test_reaches_at_most_max_backfill_ms_back() -> None:
    clock = FrozenClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=0)
    generator.next_id()
    clock.now_ms = T0 + 60_000
    ticks = MAX_BACKFILL_MS + 1  # the current tick and MAX_BACKFILL_MS before it
    ids = generator.next_ids(ticks * PER_TICK)
    assert _times(ids)[0] == T0 + 60_000 - MAX_BACKFILL_MS
    assert _times(ids)[-1] == T0 + 60_000 and _strictly_increasing(ids)
    clock.now_ms = T0 + 120_000
    with pytest.raises(ClockStalledError):
        generator.next_ids((ticks + 1) * PER_TICK)  # one tick more would be in the future


def test_stays_above_the_previous_holders_high_water_mark() -> None:
    clock = FrozenClock(T0 + 10)
    allocator = FakeAllocator(worker_ids=[3], floor_ms=T0 + 5)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock, max_wait_ms=0)
    ids = generator.next_ids(5 * PER_TICK)  # ticks T0+6 .. T0+10, all above the floor
    assert _times(ids)[0] == T0 + 6 and _times(ids)[-1] == T0 + 10
    assert {decode(snowflake_id).worker_id for snowflake_id in ids} == {3}
    with pytest.raises(ClockStalledError):
        SnowflakeGenerator(
            allocator=FakeAllocator(worker_ids=[4], floor_ms=T0 + 5), clock=clock, max_wait_ms=0
        ).next_ids(5 * PER_TICK + 1)
    assert max(allocator.leases[0].issued_through_ms) == T0 + 10  # what release may keep


def test_threads_mixing_next_id_and_next_ids_never_repeat_an_id() -> None:
    generator = SnowflakeGenerator(7)
    results: list[array[int]] = []
    errors: list[BaseException] = []
    deadline = time.monotonic() + 5

    def issue(batch: int) -> None:
        ids: array[int] = array("q")
        try:
            for _ in range(40):
                if time.monotonic() > deadline:
                    break
                ids.extend(generator.next_ids(batch))
                ids.extend(generator.next_id() for _ in range(500))
                time.sleep(0.002)  # leave ticks unused for the next batch to fill
        except BaseException as error:  # reported below, with the thread's IDs
            errors.append(error)
        results.append(ids)

    threads = [threading.Thread(target=issue, args=(batch,)) for batch in (3, 5000, 9000, 20000)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and len(results) == len(threads)
    assert all(_strictly_increasing(ids) for ids in results)  # each thread's IDs in order
    every_id = array("q")
    for ids in results:
        every_id.extend(ids)
    assert len(every_id) > 100_000
    assert len(set(every_id)) == len(every_id)
