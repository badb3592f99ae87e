"""snowflake_db.metrics without a database: each figure after a known sequence of events
(clock faults from an injected clock, fencing from a lease the test expires), exact ID counts
across threads and forks, listeners, and both exporters on a generator's figures."""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import threading
import time
from array import array

import pytest

import snowflake_db
from snowflake_db import (
    ClockMovedBackwardsError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Layout,
    LeaseExpiredError,
    MissingExtraError,
    SnowflakeError,
    SnowflakeGenerator,
    WorkerLeaseError,
    metrics,
)
from snowflake_db.metrics import FIGURES, MetricsSnapshot
from snowflake_db.testing import FakeClock, deterministic_ids
from tests.plugins.core_support import CountedClock, FakeAllocator, after_next_read, run_in_fork
from tests.plugins.scheduler_delay import SchedulerDelay

T0 = 1_704_067_200_000  # 2024-01-01
#: 4 IDs per tick: tests drain ticks quickly.
SMALL = Layout(sequence_bits=2)


def test_ids_issued_counts_next_id_next_ids_and_the_process_default() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, layout=SMALL, clock=clock)
    assert generator.metrics().ids_issued == 0
    for _ in range(3):
        generator.next_id()
    assert generator.metrics().ids_issued == 3  # read from the open window
    clock.advance(1)
    generator.next_id()  # a new window: the old one's 3 stay counted
    assert generator.metrics().ids_issued == 4
    clock.step_ms = 1  # next_ids spans ticks: every window it drew from counts
    assert len(generator.next_ids(10)) == 10
    assert generator.metrics().ids_issued == 14
    with deterministic_ids(worker_id=3):
        before = snowflake_db.get_generator().metrics().ids_issued
        for _ in range(5):
            snowflake_db.snowflake_default()
        assert snowflake_db.get_generator().metrics().ids_issued == before + 5


def test_ids_issued_is_exact_with_threads_on_the_lock_free_path() -> None:
    generator = SnowflakeGenerator(2)
    per_thread, threads = 50_000, 4
    seen = [array("q") for _ in range(threads)]

    def issue(into: array[int]) -> None:
        take = generator.next_id
        for _ in range(per_thread):
            into.append(take())

    workers = [threading.Thread(target=issue, args=(seen[i],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    generator.next_ids(1000)
    total = per_thread * threads + 1000
    assert len({i for ids in seen for i in ids}) == per_thread * threads
    assert generator.metrics().ids_issued == total
    # Once the replaced windows are folded in (after STRAGGLER_SECONDS), the count is the same.
    time.sleep(metrics.STRAGGLER_SECONDS + 0.1)
    generator.resume_after(generator.last_tick + 1)  # replaces the window: folds old ones
    assert generator.metrics().ids_issued == total


def test_the_process_keeps_the_counts_of_collected_generators() -> None:
    # In a forked child, which has only this thread: the figures are the whole process's, and
    # a thread another test left running here (it issued 3 IDs once, under load) must not count.
    def child() -> tuple[int, int, int]:
        before = metrics.snapshot().ids_issued
        generator = SnowflakeGenerator(4)
        generator.next_ids(100)
        generator.next_id()
        issued = metrics.snapshot().ids_issued
        del generator
        gc.collect()
        return before, issued, metrics.snapshot().ids_issued

    outcome = run_in_fork(child)
    assert "result" in outcome, outcome
    before, issued, after_collection = outcome["result"]
    assert issued == before + 101
    assert after_collection == before + 101  # counters never go down


def test_clock_waits_when_a_tick_is_used_up(scheduler_delay: SchedulerDelay) -> None:
    clock = CountedClock(T0)
    generator = SnowflakeGenerator(1, layout=SMALL, clock=clock)
    generator.next_ids(4)  # the whole tick
    started = time.monotonic()
    mover = after_next_read(clock, 0.2, lambda: clock.advance(1))
    generator.next_id()  # waits until the thread moves the clock
    mover.join()
    ended = time.monotonic()
    figures = generator.metrics()
    assert figures.clock_waits == 1
    assert 0.15 <= figures.clock_wait_seconds < scheduler_delay.widen(5, started, ended)
    assert figures.ids_issued == 5 and figures.clock_rollbacks_tolerated == 0


def test_rollbacks_tolerated_once_per_episode_and_refusals_per_call() -> None:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock, rollback_tolerance_ms=1000)
    generator.next_id()
    clock.advance(-500)
    generator.next_id()  # behind, within tolerance: issues from the last tick
    generator.next_id()
    figures = generator.metrics()
    assert (figures.clock_rollbacks_tolerated, figures.clock_rollback_max_ms) == (1, 500)
    clock.advance(-2500)  # 3000 ms behind
    for _ in range(2):
        with pytest.raises(ClockMovedBackwardsError):
            generator.next_id()
    figures = generator.metrics()
    assert figures.clock_rollback_refusals == 2 and figures.clock_rollback_max_ms == 3000
    assert figures.clock_rollbacks_tolerated == 1
    clock.set(T0 + 1)  # a new tick ends the episode
    generator.next_id()
    clock.advance(-300)
    generator.next_id()
    figures = generator.metrics()
    assert figures.clock_rollbacks_tolerated == 2 and figures.clock_rollback_max_ms == 3000
    assert figures.ids_issued == 5


def test_fencing_counts_refused_calls_and_the_time_until_the_next_id(
    scheduler_delay: SchedulerDelay,
) -> None:
    allocator = FakeAllocator([7])
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(allocator=allocator, clock=clock)
    generator.next_id()
    lease = allocator.leases[0]
    lease.valid_until = time.monotonic() - 1  # the heartbeat did not renew in time
    clock.advance(1)
    fenced_from = time.monotonic()
    for _ in range(3):
        with pytest.raises(LeaseExpiredError):
            generator.next_id()
    time.sleep(0.2)
    figures = generator.metrics()
    assert figures.lease_refusals == 3 and figures.fenced_generators == 1
    assert figures.fenced_seconds >= 0.2  # ongoing: counted up to now
    lease.valid_until = time.monotonic() + 60  # renewed
    generator.next_id()
    fenced = generator.metrics()
    allowed = scheduler_delay.widen(10, fenced_from, time.monotonic())
    assert fenced.fenced_generators == 0 and 0.2 <= fenced.fenced_seconds < allowed
    time.sleep(0.1)
    assert generator.metrics().fenced_seconds == fenced.fenced_seconds  # the fence ended
    # Past the reserved high-water mark: refused too (WorkerLeaseError).
    lease.high_water_ms = clock() + 5
    clock.advance(10)
    with pytest.raises(WorkerLeaseError):
        generator.next_id()
    assert generator.metrics().lease_refusals == 4
    generator.close()
    assert generator.metrics().fenced_generators == 0  # closing ends an ongoing fence


def test_time_left_days_is_the_layouts_and_the_process_reports_the_soonest() -> None:
    short = Layout(time_bits=36)  # 2**36 ms from 2020-01-01: ran out in 2022
    now_ms = time.time_ns() // 1_000_000
    generator = SnowflakeGenerator(1)
    expected = (generator.layout.max_timestamp_ms + 1 - now_ms) / 86_400_000
    assert generator.metrics().time_left_days == pytest.approx(expected, abs=0.01)
    later_epoch = Layout(time_bits=39, epoch_ms=now_ms - 1000)
    soonest = SnowflakeGenerator(2, layout=later_epoch)
    expected_soonest = (later_epoch.max_timestamp_ms + 1 - now_ms) / 86_400_000
    process_days = metrics.snapshot().time_left_days
    assert process_days is not None and process_days <= expected_soonest + 0.01
    assert metrics.days_left(short, now_ms) < 0  # a layout that already ran out
    assert soonest.metrics().time_left_days == pytest.approx(expected_soonest, abs=0.01)


def test_a_forked_child_starts_from_zero_and_the_parent_keeps_its_counts() -> None:
    generator = SnowflakeGenerator(allocator=FakeAllocator([1, 2]))
    generator.next_ids(1000)
    parent_before = metrics.snapshot()
    assert parent_before.ids_issued >= 1000

    def child() -> tuple[int, int, int, int]:
        inherited = metrics.snapshot().ids_issued, generator.metrics().ids_issued
        generator.next_ids(7)  # leases worker 2 from the copied fake allocator
        fresh = SnowflakeGenerator(3)
        fresh.next_ids(5)
        return (*inherited, generator.metrics().ids_issued, metrics.snapshot().ids_issued)

    assert run_in_fork(child) == {"result": (0, 0, 7, 12)}
    assert generator.metrics().ids_issued == 1000
    assert metrics.snapshot().ids_issued == parent_before.ids_issued


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks through glibc")
def test_a_child_forked_without_the_hooks_starts_from_zero_too() -> None:
    from tests.plugins.hookless_fork_support import LIBC_FORK, settle_threads

    generator = SnowflakeGenerator(allocator=FakeAllocator([1, 2]))
    generator.next_ids(1000)
    parent_before = metrics.snapshot().ids_issued

    def child() -> tuple[int, int, int]:
        # No hook ran: the snapshot itself runs the after-fork reset first.
        inherited = metrics.snapshot().ids_issued
        generator.next_ids(3)
        return inherited, generator.metrics().ids_issued, metrics.snapshot().ids_issued

    settle_threads()
    assert run_in_fork(child, fork=LIBC_FORK) == {"result": (0, 3, 3)}
    assert metrics.snapshot().ids_issued == parent_before


def test_listeners_hear_events_and_bad_listeners_are_refused() -> None:
    heard: list[tuple[str, float]] = []

    def listener(event: str, value: float) -> None:
        heard.append((event, value))

    def broken(event: str, value: float) -> None:
        raise RuntimeError("monitoring is down")

    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    generator.next_id()
    metrics.add_listener(listener)
    metrics.add_listener(broken)
    try:
        with pytest.raises(InvalidArgumentError, match="already added"):
            metrics.add_listener(listener)
        clock.advance(-100)
        generator.next_id()  # the broken listener is logged; the ID is still issued
        clock.advance(-5000)
        with pytest.raises(ClockMovedBackwardsError):
            generator.next_id()
    finally:
        metrics.remove_listener(listener)
        metrics.remove_listener(broken)
    # (Other tests' allocators may still renew leases in this process: keep the clock events.)
    clock_events = [(event, value) for event, value in heard if event.startswith("clock_")]
    assert clock_events == [("clock_rollback_tolerated", 100), ("clock_rollback_refused", 5100)]
    with pytest.raises(InvalidArgumentError, match="was not added"):
        metrics.remove_listener(listener)
    with pytest.raises(InvalidArgumentTypeError, match="callable"):
        metrics.add_listener("print")  # type: ignore[arg-type]
    assert set(metrics.EVENTS) >= {event for event, _ in heard}


def test_a_failing_listener_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: str, value: float) -> None:
        raise RuntimeError("monitoring is down")

    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    generator.next_id()
    metrics.add_listener(broken)
    try:
        clock.advance(-10)
        with caplog.at_level(logging.ERROR, logger="snowflake_db.metrics"):
            assert generator.next_id() > 0
    finally:
        metrics.remove_listener(broken)
    assert "monitoring is down" in caplog.text


def test_snapshot_as_dict_and_slots_without_a_table_allocator() -> None:
    generator = SnowflakeGenerator(1)
    generator.next_id()
    figures = generator.metrics(with_slots=True)
    assert figures.slots is None and "no allocator that counts slots" in (figures.slots_error or "")
    values = figures.as_dict()
    assert values["ids_issued"] == 1 and values["slots"] is None
    assert {figure.field for figure in FIGURES} <= set(values)
    snowflake_db.reset()
    assert "no process-wide generator" in (metrics.snapshot(with_slots=True).slots_error or "")


# -- exporters -----------------------------------------------------------------------------------


def _known_generator() -> SnowflakeGenerator:
    clock = FakeClock(T0)
    generator = SnowflakeGenerator(1, clock=clock)
    generator.next_ids(42)
    clock.advance(-250)
    generator.next_id()
    return generator


def test_prometheus_exposition_of_a_generator() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from snowflake_db.exporters.prometheus import SnowflakeCollector

    generator = _known_generator()
    registry = CollectorRegistry()
    registry.register(SnowflakeCollector(snapshot=generator.metrics))
    text = generate_latest(registry).decode()
    assert "# TYPE snowflake_db_ids_issued_total counter" in text
    assert "snowflake_db_ids_issued_total 43.0" in text
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples["snowflake_db_clock_rollbacks_tolerated_total"] == 1
    assert samples["snowflake_db_clock_rollback_max_ms"] == 250
    assert samples["snowflake_db_lease_acquisitions_total"] == 0
    assert samples["snowflake_db_time_left_days"] > 20_000
    assert "snowflake_db_worker_slots" not in text  # with_slots is off
    # The default registry's auto-describe uses describe(): no snapshot at registration.
    assert next(family.name for family in SnowflakeCollector().describe()) == (
        "snowflake_db_ids_issued"
    )


def _otel_values(reader: object) -> dict[str, list[tuple[dict[str, object], float]]]:
    data = reader.get_metrics_data()  # type: ignore[attr-defined]
    return {
        metric.name: [(dict(point.attributes), point.value) for point in metric.data.data_points]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def test_opentelemetry_instruments_of_a_generator() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from snowflake_db.exporters.opentelemetry import create_instruments

    generator = _known_generator()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        instruments = create_instruments(provider.get_meter("test"), snapshot=generator.metrics)
        assert len(instruments) == len(FIGURES)
        values = _otel_values(reader)
        assert values["snowflake_db.ids_issued"] == [({}, 43)]
        assert values["snowflake_db.clock_rollback_max_ms"] == [({}, 250)]
        generator.next_ids(7)
        assert _otel_values(reader)["snowflake_db.ids_issued"] == [({}, 50)]
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("module", "package", "extra"),
    [
        ("snowflake_db.exporters.prometheus", "prometheus_client", "prometheus"),
        ("snowflake_db.exporters.prometheus_multiprocess", "prometheus_client", "prometheus"),
        ("snowflake_db.exporters.opentelemetry", "opentelemetry", "opentelemetry"),
    ],
)
def test_an_exporter_without_its_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, package: str, extra: str
) -> None:
    for name in list(sys.modules):
        if name in (package, module) or name.startswith(f"{package}."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # makes "import package" fail
    with pytest.raises(MissingExtraError) as caught:
        importlib.import_module(module)
    message = str(caught.value)
    assert f"pip install 'snowflake-db[{extra}]'" in message and module in message
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, SnowflakeError)
    assert caught.value.extra == extra


def test_metrics_snapshot_is_frozen() -> None:
    figures = MetricsSnapshot(pid=1)
    with pytest.raises(AttributeError):
        figures.ids_issued = 5  # type: ignore[misc]


def test_a_generator_collected_while_its_thread_holds_the_registry_lock_does_not_hang() -> None:
    """The collector runs finalizers in whatever thread allocates, also inside snapshot()'s
    locked section: retiring a collected generator must not wait for that lock (a make test
    hung there for good, in snapshot -> finalize -> retire)."""
    before = metrics.snapshot().ids_issued

    def collect_while_locked() -> None:
        generator = SnowflakeGenerator(1)
        generator.next_ids(5)
        cycle: list[object] = [generator]
        cycle.append(cycle)  # only the collector frees it
        del generator, cycle
        with metrics._registry.lock:
            gc.collect()

    worker = threading.Thread(target=collect_while_locked, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "retiring the recorder waited on a lock its own thread held"
    assert metrics.snapshot().ids_issued == before + 5  # its IDs stay counted
