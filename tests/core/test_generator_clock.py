"""SnowflakeGenerator under clock faults, with an injected clock, and its lease (fencing) contract.

Every test asserts the one property that matters: IDs from one generator strictly increase and
never repeat, whatever the clock does, and a failed call changes nothing.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snowflake_db import (
    DEFAULT_EPOCH_MS,
    DEFAULT_LAYOUT,
    DEFAULT_ROLLBACK_TOLERANCE_MS,
    ClockError,
    ClockMovedBackwardsError,
    ClockStalledError,
    GeneratorClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Layout,
    LeaseExpiredError,
    MonotonicClock,
    SnowflakeGenerator,
    TimeExhaustedError,
    WorkerAllocator,
    WorkerLease,
    WorkerLeaseError,
    wall_clock,
)
from snowflake_db.testing import DEFAULT_FAKE_START_MS, FakeClock
from tests.plugins.core_support import (
    CountedClock,
    FakeAllocator,
    after_next_read,
    boundary_ints,
    layouts,
)
from tests.plugins.scheduler_delay import SchedulerDelay

T0 = DEFAULT_FAKE_START_MS
NOW_MS = time.time_ns() // 1_000_000
decode = DEFAULT_LAYOUT.decode


def assert_strictly_increasing(ids: list[int]) -> None:
    """Strictly increasing implies unique; report the first offending pair to ease debugging."""
    for index, (earlier, later) in enumerate(pairwise(ids)):
        assert earlier < later, f"ID #{index + 1} ({later}) is not above #{index} ({earlier})"


def later(delay_s: float, action: Callable[[], None]) -> threading.Timer:
    """Run ``action`` from another thread while the generator waits in this one."""
    timer = threading.Timer(delay_s, action)
    timer.start()
    return timer


class SteppingClock:
    """Unix ms that advance by 1 every ``reads_per_ms`` reads: time passes with use, so the
    generator's waits end without real sleeping. ``now_ms`` can be moved back by the test."""

    def __init__(self, start_ms: int, reads_per_ms: int) -> None:
        self.now_ms = start_ms
        self.reads_per_ms = reads_per_ms
        self._reads = 0

    def __call__(self) -> int:
        self._reads += 1
        if self._reads >= self.reads_per_ms:
            self._reads = 0
            self.now_ms += 1
        return self.now_ms


def exhaust_tick(generator: SnowflakeGenerator) -> list[int]:
    """Issue every ID of the current tick of a frozen clock (4096 with the default layout)."""
    ids = [generator.next_id() for _ in range(generator.layout.ids_per_tick)]
    assert decode(ids[0]).sequence == 0
    assert decode(ids[-1]).sequence == generator.layout.max_sequence
    return ids


# -- construction ------------------------------------------------------------------------------


def test_constructor_validates_its_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match=r"worker_id=1024.*1023"):
        SnowflakeGenerator(1024)
    with pytest.raises(InvalidArgumentError, match="-1"):
        SnowflakeGenerator(-1)
    with pytest.raises(InvalidArgumentTypeError):
        SnowflakeGenerator(True)
    with pytest.raises(InvalidArgumentTypeError):
        SnowflakeGenerator(1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        SnowflakeGenerator()
    with pytest.raises(InvalidArgumentTypeError, match="Layout"):
        SnowflakeGenerator(1, layout="41/10/12")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="clock"):
        SnowflakeGenerator(1, clock=T0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="rollback_tolerance_ms=-1"):
        SnowflakeGenerator(1, rollback_tolerance_ms=-1)
    with pytest.raises(InvalidArgumentError, match="max_wait_ms=-1"):
        SnowflakeGenerator(1, max_wait_ms=-1)
    narrow = Layout(time_bits=41, worker_bits=3, sequence_bits=12)
    with pytest.raises(InvalidArgumentError, match=r"worker_id=8.*7"):
        SnowflakeGenerator(8, layout=narrow)


def test_default_clock_follows_wall_time() -> None:
    generator = SnowflakeGenerator(3)
    before = time.time_ns() // 1_000_000
    ids = [generator.next_id() for _ in range(20_000)]
    after = time.time_ns() // 1_000_000
    assert_strictly_increasing(ids)
    first, last = decode(ids[0]), decode(ids[-1])
    assert before - 1000 <= first.timestamp_ms <= last.timestamp_ms <= after + 1000
    assert first.worker_id == last.worker_id == 3


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generator_on_any_layout(data: st.DataObject) -> None:
    """Each tick of a test-driven clock yields consecutive sequences of that tick, up to the
    layout's last tick, then TimeExhaustedError: never a wrapped or out-of-range ID."""
    layout = data.draw(layouts())
    worker_id = data.draw(boundary_ints(0, layout.max_worker_id))
    randomize = data.draw(st.booleans())
    latest_start = max(layout.epoch_ms, layout.max_timestamp_ms - 20 * layout.tick_ms)
    clock = FakeClock(data.draw(boundary_ints(layout.epoch_ms, latest_start)))
    generator = SnowflakeGenerator(
        worker_id, layout=layout, clock=clock, randomize_sequence_start=randomize
    )
    per_tick = max(1, min(200, layout.ids_per_tick // 2))
    issued: list[int] = []
    for _ in range(data.draw(st.integers(1, 8))):
        tick_start = layout.tick_start_ms(layout.tick_of(clock.now_ms))
        batch = (
            generator.next_ids(per_tick)
            if data.draw(st.booleans())
            else [generator.next_id() for _ in range(per_tick)]
        )
        decoded = [layout.decode(i) for i in batch]
        assert {d.timestamp_ms for d in decoded} == {tick_start}
        assert {(d.worker_id, d.shard) for d in decoded} == {(worker_id, 0)}
        first = decoded[0].sequence
        assert [d.sequence for d in decoded] == list(range(first, first + per_tick))
        assert randomize or first == 0
        issued += batch
        clock.advance(layout.tick_ms * data.draw(st.integers(1, 3)))
        if clock.now_ms > layout.max_timestamp_ms:
            with pytest.raises(TimeExhaustedError):
                generator.next_id()
            break
    assert_strictly_increasing(issued)
    assert all(0 <= i <= layout.max_id for i in issued)


@pytest.mark.parametrize("clock", [wall_clock, MonotonicClock()], ids=["wall", "monotonic"])
def test_library_clocks_can_be_injected(clock: Callable[[], int]) -> None:
    generator = SnowflakeGenerator(3, clock=clock)
    before = time.time_ns() // 1_000_000
    ids = generator.next_ids(10_000) + [generator.next_id() for _ in range(10_000)]
    after = time.time_ns() // 1_000_000
    assert_strictly_increasing(ids)
    assert before - 1000 <= decode(ids[0]).timestamp_ms <= decode(ids[-1]).timestamp_ms
    assert decode(ids[-1]).timestamp_ms <= after + 1000


def test_frozen_clock_counts_up_one_tick() -> None:
    generator = SnowflakeGenerator(42, clock=FakeClock(T0))
    ids = exhaust_tick(generator)
    assert_strictly_increasing(ids)
    assert [decode(i).sequence for i in ids] == list(range(4096))
    assert {decode(i).timestamp_ms for i in ids} == {T0}
    assert {decode(i).worker_id for i in ids} == {42}


# -- rollbacks ---------------------------------------------------------------------------------


def test_small_rollback_keeps_issuing_from_the_last_tick() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    before = [generator.next_id() for _ in range(10)]
    clock.advance(-1500)  # within the default 2000 ms tolerance
    during = [generator.next_id() for _ in range(100)]
    assert {decode(i).timestamp_ms for i in during} == {T0}
    assert decode(during[0]).sequence == 10
    clock.advance(1501)
    after = [generator.next_id() for _ in range(10)]
    assert decode(after[0]).timestamp_ms == T0 + 1
    assert_strictly_increasing(before + during + after)


def test_rollback_tolerance_boundary() -> None:
    assert DEFAULT_ROLLBACK_TOLERANCE_MS == 2000
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    ids = [generator.next_id()]
    clock.advance(-2000)
    ids.append(generator.next_id())  # exactly at the tolerance: still fine
    clock.advance(-1)
    with pytest.raises(ClockMovedBackwardsError) as caught:
        generator.next_id()
    assert caught.value.delta_ms == 2001
    assert caught.value.tolerance_ms == 2000
    assert "2001" in str(caught.value) and "2000" in str(caught.value)
    clock.advance(1)
    ids.append(generator.next_id())
    assert_strictly_increasing(ids)


def test_large_rollback_raises_and_leaves_the_generator_unchanged() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    issued = [generator.next_id() for _ in range(5)]
    clock.advance(-60_000)
    for _ in range(3):  # repeated failures change nothing either
        with pytest.raises(ClockMovedBackwardsError) as caught:
            generator.next_id()
        assert caught.value.delta_ms == 60_000
        with pytest.raises(ClockMovedBackwardsError):
            generator.next_ids(10)
    assert isinstance(caught.value, ClockError)
    clock.advance(60_000)
    resumed = generator.next_id()
    assert resumed > issued[-1]
    assert resumed not in issued
    assert decode(resumed).timestamp_ms == T0
    assert decode(resumed).sequence == 5  # the sequence went on; nothing was reset or skipped


def test_zero_tolerance_refuses_any_rollback() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, rollback_tolerance_ms=0)
    first = generator.next_id()
    clock.advance(-1)
    with pytest.raises(ClockMovedBackwardsError) as caught:
        generator.next_id()
    assert (caught.value.delta_ms, caught.value.tolerance_ms) == (1, 0)
    clock.advance(1)
    assert generator.next_id() > first


def test_rollback_beyond_tolerance_during_sequence_exhaustion() -> None:
    """The reset-before-throw bug class: a failed call must not make the tick reusable."""
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=20)
    issued = exhaust_tick(generator)
    clock.advance(-3000)
    with pytest.raises(ClockMovedBackwardsError) as caught:
        generator.next_id()
    assert caught.value.delta_ms == 3000
    clock.advance(3000)  # back on the exhausted tick, and frozen there
    with pytest.raises(ClockStalledError):
        generator.next_id()
    with pytest.raises(ClockStalledError):
        generator.next_ids(1)
    clock.advance(1)
    following = exhaust_tick(generator)
    assert not set(following) & set(issued)
    assert_strictly_increasing(issued + following)
    assert decode(following[0]).timestamp_ms == T0 + 1


def test_rollback_within_tolerance_then_stall_while_exhausted() -> None:
    """Pinned to the last tick by a small rollback, the tick runs out and the wait gives up:
    the tick must stay used up for every later call."""
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=20)
    issued = [generator.next_id() for _ in range(100)]
    clock.advance(-5)
    issued += [generator.next_id() for _ in range(3996)]  # the rest of tick T0
    assert decode(issued[-1]).sequence == 4095
    with pytest.raises(ClockStalledError):
        generator.next_id()
    clock.set(T0)
    with pytest.raises(ClockStalledError):
        generator.next_id()
    clock.set(T0 + 1)
    following = [generator.next_id() for _ in range(10)]
    assert_strictly_increasing(issued + following)
    assert decode(following[0]).sequence == 0


def test_clock_moves_back_further_while_waiting_for_the_next_tick(
    scheduler_delay: SchedulerDelay,
) -> None:
    clock = CountedClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=5000)
    issued = exhaust_tick(generator)
    clock.advance(-100)  # within tolerance: the generator waits for tick T0 + 1
    timer = after_next_read(clock, 0.05, lambda: clock.set(T0 - 5000))  # while it waits
    started = time.monotonic()
    with pytest.raises(ClockMovedBackwardsError) as caught:
        generator.next_id()
    timer.join()
    ended = time.monotonic()
    assert ended - started < scheduler_delay.widen(5, started, ended)
    assert caught.value.delta_ms == 5000
    assert "waiting" in str(caught.value)
    clock.set(T0)
    timer = later(0.05, lambda: clock.set(T0 + 1))
    following = generator.next_id()
    timer.join()
    assert following > issued[-1]
    assert (decode(following).timestamp_ms, decode(following).sequence) == (T0 + 1, 0)


def test_frozen_clock_with_exhausted_sequence_stalls_in_bounded_time(
    scheduler_delay: SchedulerDelay,
) -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=50)
    issued = exhaust_tick(generator)
    started = time.monotonic()
    with pytest.raises(ClockStalledError) as caught:
        generator.next_id()
    ended = time.monotonic()
    assert 0.04 <= ended - started < scheduler_delay.widen(5, started, ended)
    assert isinstance(caught.value, ClockError)
    assert str(T0 + 1) in str(caught.value)  # names the tick it waited for
    clock.advance(1)
    assert generator.next_id() > issued[-1]


def test_clock_advancing_during_the_wait_succeeds() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, max_wait_ms=5000)
    issued = exhaust_tick(generator)
    timer = later(0.03, lambda: clock.advance(1))
    following = generator.next_id()
    timer.join()
    assert following > issued[-1]
    assert (decode(following).timestamp_ms, decode(following).sequence) == (T0 + 1, 0)


def test_exhaustion_with_a_real_clock_waits_for_the_next_tick() -> None:
    generator = SnowflakeGenerator(1)
    ids = generator.next_ids(3 * 4096 + 5)
    assert_strictly_increasing(ids)
    ticks = Counter(decode(i).timestamp_ms for i in ids)
    assert len(ticks) >= 4
    assert max(ticks.values()) <= 4096


@pytest.mark.parametrize("amplitude_ms", [1, 3])
def test_jitter(amplitude_ms: int) -> None:
    """A clock that wobbles a few ms back and forth around real time (as after NTP slews)."""
    rng = random.Random(amplitude_ms)
    started = time.monotonic_ns()

    def jittery() -> int:
        elapsed_ms = (time.monotonic_ns() - started) // 1_000_000
        return T0 + elapsed_ms + rng.randint(-amplitude_ms, amplitude_ms)

    generator = SnowflakeGenerator(1, clock=jittery)
    ids = [generator.next_id() for _ in range(60_000)]
    ids += generator.next_ids(40_000)
    assert_strictly_increasing(ids)
    ticks = {i >> DEFAULT_LAYOUT.time_shift for i in ids}
    assert len(ticks) >= 100_000 // DEFAULT_LAYOUT.ids_per_tick


def test_forward_jump() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    before = [generator.next_id() for _ in range(3)]
    clock.advance(600_000)
    jumped = [generator.next_id() for _ in range(3)]
    assert decode(jumped[0]).timestamp_ms == T0 + 600_000
    assert decode(jumped[0]).sequence == 0
    clock.advance(-600_000)  # jumping back to where it was is a rollback of ten minutes
    with pytest.raises(ClockMovedBackwardsError) as caught:
        generator.next_id()
    assert caught.value.delta_ms == 600_000
    clock.advance(600_001)
    assert_strictly_increasing([*before, *jumped, generator.next_id()])


@pytest.mark.slow
def test_a_million_ids_with_random_rollbacks() -> None:
    tolerance = 20
    rng = random.Random(20261121)
    clock = SteppingClock(T0, 1000)
    generator = SnowflakeGenerator(
        7, clock=clock, rollback_tolerance_ms=tolerance, max_wait_ms=50
    )
    next_id = generator.next_id
    ids: list[int] = []
    outcomes: Counter[str] = Counter()
    while len(ids) < 1_000_000:
        clock.reads_per_ms = rng.choice([50, 500, 2000, 8000])
        fault = rng.random()
        back = 0
        if fault < 0.15:
            back = rng.randint(1, tolerance)
        elif fault < 0.25:
            back = rng.randint(tolerance + 1, 3000)
        elif fault < 0.30:
            clock.now_ms += rng.randint(1, 5000)
        clock.now_ms -= back
        try:
            if rng.random() < 0.1:
                ids.extend(generator.next_ids(rng.randint(1, 10_000)))
            else:
                for _ in range(rng.randint(1, 100) if back else rng.randint(1, 5000)):
                    ids.append(next_id())
            outcomes["ok"] += 1
        except ClockMovedBackwardsError as error:
            assert back > tolerance, f"raised on a rollback of {back} ms, within tolerance"
            assert error.tolerance_ms == tolerance
            assert tolerance < error.delta_ms <= back
            outcomes["moved back"] += 1
        except ClockStalledError:
            outcomes["stalled"] += 1
        clock.now_ms += back
    assert outcomes["moved back"] > 20, outcomes
    assert len(set(ids)) == len(ids), "duplicate IDs"
    assert_strictly_increasing(ids)
    assert all((i >> 12) & 1023 == 7 for i in ids)


# -- end of time, before the epoch, bad clocks -------------------------------------------------


def test_time_exhausted() -> None:
    layout = Layout(time_bits=10, worker_bits=10, sequence_bits=4, epoch_ms=NOW_MS - 10_000)
    assert layout.max_timestamp_ms < NOW_MS
    with pytest.raises(TimeExhaustedError) as caught:
        SnowflakeGenerator(1, layout=layout, clock=FakeClock(NOW_MS)).next_id()
    assert layout.exhausted_at.isoformat() in str(caught.value)

    clock = FakeClock(layout.max_timestamp_ms)
    generator = SnowflakeGenerator(1, layout=layout, clock=clock, max_wait_ms=10)
    last_tick = [generator.next_id() for _ in range(16)]
    assert_strictly_increasing(last_tick)
    assert all(0 < i <= layout.max_id for i in last_tick)
    assert layout.decode(last_tick[-1]).timestamp_ms == layout.max_timestamp_ms
    with pytest.raises(ClockStalledError):
        generator.next_id()
    clock.advance(1)
    for _ in range(3):
        with pytest.raises(TimeExhaustedError):
            generator.next_id()
        with pytest.raises(TimeExhaustedError):
            generator.next_ids(5)


def test_time_exhausted_mid_batch_returns_nothing_wrapped() -> None:
    layout = Layout(time_bits=10, worker_bits=10, sequence_bits=4, epoch_ms=NOW_MS - 10_000)
    clock = FakeClock(layout.max_timestamp_ms - 2, step_ms=1)
    generator = SnowflakeGenerator(1, layout=layout, clock=clock)
    seen: list[int] = []
    with pytest.raises(TimeExhaustedError):
        while True:
            seen.append(generator.next_id())
    assert seen, "the last ticks were still usable"
    assert_strictly_increasing(seen)
    assert all(0 <= i <= layout.max_id for i in seen)
    with pytest.raises(TimeExhaustedError):
        generator.next_ids(100)


def test_clock_before_the_epoch() -> None:
    generator = SnowflakeGenerator(1, clock=FakeClock(DEFAULT_EPOCH_MS - 1))
    with pytest.raises(ClockError) as caught:
        generator.next_id()
    assert not isinstance(caught.value, ClockMovedBackwardsError)
    assert "epoch" in str(caught.value)
    assert str(DEFAULT_EPOCH_MS) in str(caught.value)


@pytest.mark.parametrize(
    "reading", [float(T0), str(T0), None, True], ids=["float", "str", "None", "bool"]
)
def test_clock_must_return_integer_ms(reading: object) -> None:
    generator = SnowflakeGenerator(1, clock=lambda: reading)  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidArgumentTypeError) as caught:
        generator.next_id()
    assert type(reading).__name__ in str(caught.value)
    with pytest.raises(InvalidArgumentTypeError):
        generator.next_ids(3)


# -- randomised sequence start, batches, shards, close -----------------------------------------


def test_randomized_sequence_start() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, randomize_sequence_start=True, max_wait_ms=0)
    ids: list[int] = []
    firsts = []
    for _ in range(200):
        tick_ids = [generator.next_id() for _ in range(3)]
        firsts.append(decode(tick_ids[0]).sequence)
        ids += tick_ids
        clock.advance(1)
    assert len(set(firsts)) > 50, "the first sequence of a tick should vary"
    assert all(0 <= first < 2048 for first in firsts)  # room is left in every tick
    assert_strictly_increasing(ids)
    # Draining a randomly started tick still ends at the last sequence, then waits.
    drained = [generator.next_id()]
    while decode(drained[-1]).sequence < DEFAULT_LAYOUT.max_sequence:
        drained.append(generator.next_id())
    with pytest.raises(ClockStalledError):
        generator.next_id()
    assert_strictly_increasing(ids + drained)


def test_sequence_start_is_zero_by_default() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    for _ in range(20):
        assert decode(generator.next_id()).sequence == 0
        clock.advance(1)


def test_next_ids_spans_ticks() -> None:
    clock = FakeClock(T0, step_ms=1)  # every read moves one ms on
    generator = SnowflakeGenerator(1, clock=clock)
    ids = generator.next_ids(10_000)
    assert len(ids) == 10_000
    assert_strictly_increasing(ids)
    per_tick = Counter(decode(i).timestamp_ms for i in ids)
    assert len(per_tick) >= 3
    assert sum(per_tick.values()) == 10_000
    ids += [generator.next_id() for _ in range(10)]
    ids += generator.next_ids(5000)
    assert_strictly_increasing(ids)


def test_next_ids_edge_arguments() -> None:
    generator = SnowflakeGenerator(1, clock=FakeClock(T0))
    assert generator.next_ids(0) == []
    assert len(generator.next_ids(1)) == 1
    with pytest.raises(InvalidArgumentError, match="n=-1"):
        generator.next_ids(-1)
    for bad in (1.5, 2.0, True, "3", None):
        with pytest.raises(InvalidArgumentTypeError):
            generator.next_ids(bad)  # type: ignore[arg-type]
    assert decode(generator.next_id()).sequence == 1  # failed calls consumed nothing


def test_next_id_in_shard() -> None:
    layout = Layout(time_bits=38, worker_bits=10, sequence_bits=12, shard_bits=3)
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(9, layout=layout, clock=clock)
    shards = [5, 0, 7, 3, 3, 1]
    ids = [generator.next_id_in_shard(shard) for shard in shards]
    assert [i & 0b111 for i in ids] == shards
    assert [layout.decode(i).shard for i in ids] == shards
    assert [layout.decode(i).sequence for i in ids] == list(range(6))
    assert {layout.decode(i).worker_id for i in ids} == {9}
    ids.append(generator.next_id())
    assert layout.decode(ids[-1]).shard == 0
    assert_strictly_increasing(ids)
    for bad in (8, -1):
        with pytest.raises(InvalidArgumentError, match=rf"shard={bad}.*"):
            generator.next_id_in_shard(bad)
    for bad_type in (True, 2.0, "1"):
        with pytest.raises(InvalidArgumentTypeError):
            generator.next_id_in_shard(bad_type)  # type: ignore[arg-type]
    plain = SnowflakeGenerator(1, clock=clock)
    assert plain.next_id_in_shard(0) > 0
    with pytest.raises(InvalidArgumentError, match="maximum 0"):
        plain.next_id_in_shard(1)


def test_close() -> None:
    generator = SnowflakeGenerator(1, clock=FakeClock(T0))
    generator.next_id()
    generator.close()
    generator.close()  # idempotent
    with pytest.raises(GeneratorClosedError):
        generator.next_id()
    with pytest.raises(GeneratorClosedError):
        generator.next_ids(2)
    with SnowflakeGenerator(2, clock=FakeClock(T0)) as scoped:
        scoped.next_id()
    with pytest.raises(GeneratorClosedError):
        scoped.next_id()


# -- leases: the allocator contract, without a database -----------------------------------------


def test_fakes_satisfy_the_lease_protocols() -> None:
    allocator = FakeAllocator([1])
    assert isinstance(allocator, WorkerAllocator)
    assert isinstance(allocator.acquire(layout=DEFAULT_LAYOUT, clock=FakeClock()), WorkerLease)


def test_lease_is_acquired_on_first_use_or_ensure_worker() -> None:
    allocator = FakeAllocator([17, 18])
    generator = SnowflakeGenerator(allocator=allocator, clock=FakeClock(T0))
    assert generator.worker_id is None and generator.lease is None
    assert allocator.leases == []
    assert generator.ensure_worker() == 17
    assert generator.worker_id == 17
    assert generator.lease is allocator.leases[0]
    assert decode(generator.next_id()).worker_id == 17
    assert len(allocator.leases) == 1  # the lease is not re-acquired per ID


def test_the_lease_hears_of_each_tick_before_ids_are_issued_from_it() -> None:
    layout = Layout(time_bits=38, tick_ms=10)
    start = layout.tick_start_ms(layout.tick_of(T0))
    clock = FakeClock(start + 4)
    allocator = FakeAllocator([6])
    generator = SnowflakeGenerator(allocator=allocator, layout=layout, clock=clock)
    generator.ensure_worker()
    lease = allocator.leases[0]
    assert lease.issued_through_ms == [0]  # taken, nothing issued
    first = generator.next_ids(3)
    clock.set(start + 25)
    second = generator.next_id()
    # Each report covers its whole tick (release stores it as the mark) and came first.
    assert lease.issued_through_ms == [0, start + 9, start + 29]
    assert max(layout.decode(i).timestamp_ms for i in first) <= start + 9
    assert layout.decode(second).timestamp_ms <= start + 29


def test_a_tick_past_the_mark_is_refused_after_it_was_reported() -> None:
    clock = FakeClock(T0)
    allocator = FakeAllocator([5], high_water_ms=T0)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    generator.next_id()
    clock.set(T0 + 1)
    with pytest.raises(WorkerLeaseError):
        generator.next_id()
    # Reported before the check (a release racing it would cover it), never issued.
    assert allocator.leases[0].issued_through_ms[-1] == T0 + 1


def test_ids_only_above_the_floor() -> None:
    started = time.monotonic_ns()

    def clock() -> int:  # real time, shifted to T0: the generator has to wait for the floor
        return T0 + (time.monotonic_ns() - started) // 1_000_000

    allocator = FakeAllocator([4], floor_ms=T0 + 50)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    ids = generator.next_ids(5000)
    assert decode(ids[0]).timestamp_ms > T0 + 50
    assert decode(ids[0]).worker_id == 4
    assert_strictly_increasing(ids)


def test_floor_inside_a_tick_skips_that_whole_tick() -> None:
    layout = Layout(time_bits=38, tick_ms=10)
    start = layout.tick_start_ms(layout.tick_of(T0))
    clock = FakeClock(start, step_ms=1)
    allocator = FakeAllocator([4], floor_ms=start + 3)  # tick [start, start + 10) was used
    generator = SnowflakeGenerator(allocator=allocator, layout=layout, clock=clock)
    assert layout.decode(generator.next_id()).timestamp_ms == start + 10


def test_floor_far_ahead_of_the_clock_is_refused() -> None:
    clock = FakeClock(T0)
    allocator = FakeAllocator([4], floor_ms=T0 + 60_000)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    with pytest.raises(ClockMovedBackwardsError):
        generator.next_id()
    clock.set(T0 + 60_001)
    assert decode(generator.next_id()).timestamp_ms == T0 + 60_001


def test_no_id_past_the_high_water_mark() -> None:
    clock = FakeClock(T0)
    allocator = FakeAllocator([5], high_water_ms=T0 + 2)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    ids = []
    for _ in range(3):  # T0, T0 + 1, T0 + 2 are allowed
        ids.append(generator.next_id())
        clock.advance(1)
    with pytest.raises(WorkerLeaseError) as caught:
        generator.next_id()
    assert not isinstance(caught.value, LeaseExpiredError)
    assert str(T0 + 2) in str(caught.value)
    assert "fake lease of worker 5" in str(caught.value)
    with pytest.raises(WorkerLeaseError):
        generator.next_ids(10)
    allocator.leases[0].high_water_ms = T0 + 1000  # the heartbeat renewed the reservation
    ids.append(generator.next_id())
    assert_strictly_increasing(ids)
    assert decode(ids[-1]).timestamp_ms == T0 + 3
    assert all(decode(i).timestamp_ms <= T0 + 2 for i in ids[:-1])


def test_next_ids_stops_at_the_high_water_mark() -> None:
    clock = FakeClock(T0, step_ms=1)
    allocator = FakeAllocator([5], high_water_ms=T0 + 5)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    with pytest.raises(WorkerLeaseError):
        generator.next_ids(100_000)
    allocator.leases[0].high_water_ms = T0 + 100_000
    following = generator.next_ids(10)
    assert decode(following[0]).timestamp_ms > T0 + 5
    assert_strictly_increasing(following)


def test_expired_lease_fences_until_renewed() -> None:
    clock = FakeClock(T0)
    allocator = FakeAllocator([6])
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    issued = [generator.next_id()]
    lease = allocator.leases[0]
    lease.valid_until = time.monotonic() - 0.001  # the heartbeat missed its deadline
    clock.advance(1)
    for _ in range(2):
        with pytest.raises(LeaseExpiredError) as caught:
            generator.next_id()
        assert isinstance(caught.value, WorkerLeaseError)
        assert "fake lease of worker 6" in str(caught.value)
    with pytest.raises(LeaseExpiredError):
        generator.next_ids(3)
    lease.valid_until = time.monotonic() + 60  # renewed
    issued.append(generator.next_id())
    assert_strictly_increasing(issued)
    assert len(allocator.leases) == 1  # an expired lease is renewed, not replaced
    assert not lease.released


class _DeadlinePassesDuringRead(FakeClock):
    """A clock whose ``passing_read``-th reading lets the lease's local deadline pass while it
    is taken: a thread descheduled between the lease check and the clock reading."""

    def __init__(self, start_ms: int, allocator: FakeAllocator) -> None:
        super().__init__(start_ms)
        self.allocator = allocator
        self.reads = 0
        self.passing_read = -1

    def __call__(self) -> int:
        self.reads += 1
        if self.reads == self.passing_read:
            self.allocator.leases[0].valid_until = time.monotonic() - 0.001
        return super().__call__()


def test_a_deadline_that_passes_while_the_clock_is_read_opens_no_tick_after_it() -> None:
    """The deadline is checked again after the clock reading, so a thread that lost the CPU
    between the lease check and that reading never opens a tick begun after the deadline (the
    lease benchmark once counted 181 IDs past their process's own deadline, by its monotonic
    clock, at load 15; the database's lease still covered them, by its safety margin)."""
    allocator = FakeAllocator([6])
    clock = _DeadlinePassesDuringRead(T0, allocator)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    issued = [generator.next_id()]
    clock.advance(1)
    # The next call reads the clock on its lock-free path (the old tick's window: no), then
    # checks the lease under the lock and reads the clock again: the deadline passes there.
    clock.passing_read = clock.reads + 2
    with pytest.raises(LeaseExpiredError):
        generator.next_id()
    assert clock.reads >= clock.passing_read
    allocator.leases[0].valid_until = time.monotonic() + 60  # renewed
    issued.append(generator.next_id())
    assert_strictly_increasing(issued)
    assert decode(issued[-1]).timestamp_ms == T0 + 1


def test_lost_lease_is_replaced_and_ids_keep_increasing() -> None:
    clock = FakeClock(T0)
    allocator = FakeAllocator([900, 3])  # the new slot has a lower worker ID
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    issued = [generator.next_id() for _ in range(10)]
    allocator.leases[0].lost = True
    clock.advance(1)
    issued += [generator.next_id() for _ in range(10)]
    assert len(allocator.leases) == 2
    assert generator.worker_id == 3
    assert [decode(i).worker_id for i in issued] == [900] * 10 + [3] * 10
    assert_strictly_increasing(issued)
    assert not allocator.leases[0].released  # a lost slot is someone else's now


def test_lost_lease_within_the_same_tick_waits_for_the_next_tick() -> None:
    clock = FakeClock(T0)
    allocator = FakeAllocator([900, 3])
    generator = SnowflakeGenerator(allocator=allocator, clock=clock, max_wait_ms=5000)
    issued = exhaust_tick(generator)  # the slow path runs again only once the tick is used up
    allocator.leases[0].lost = True
    timer = later(0.03, lambda: clock.advance(1))
    issued.append(generator.next_id())
    timer.join()
    assert decode(issued[-1]).worker_id == 3
    assert_strictly_increasing(issued)


def test_lease_with_out_of_range_worker_id_is_refused() -> None:
    allocator = FakeAllocator([1024])
    generator = SnowflakeGenerator(allocator=allocator, clock=FakeClock(T0))
    with pytest.raises(InvalidArgumentError, match=r"1024.*1023"):
        generator.next_id()


def test_close_releases_the_lease() -> None:
    allocator = FakeAllocator([8])
    generator = SnowflakeGenerator(allocator=allocator, clock=FakeClock(T0))
    generator.next_id()
    generator.close()
    assert allocator.leases[0].released
    assert not allocator.leases[0].abandoned
    with pytest.raises(GeneratorClosedError):
        generator.next_id()
    assert len(allocator.leases) == 1


def test_allocator_argument_validation() -> None:
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        SnowflakeGenerator(1, allocator=FakeAllocator([1]))
    with pytest.raises(InvalidArgumentTypeError, match="acquire"):
        SnowflakeGenerator(allocator=object())  # type: ignore[arg-type]
