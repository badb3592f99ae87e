"""Lease and slot figures of snowflake_db.metrics on real control databases (PostgreSQL,
MariaDB, a SQLite file): acquisitions, renewals and their latency, exhaustion, a lost lease,
fencing through a database outage, slot counts, and both exporters with slots."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine, text

from snowflake_db import (
    Layout,
    MonotonicClock,
    SnowflakeGenerator,
    WorkerIdExhaustedError,
    WorkerLeaseError,
    metrics,
)
from snowflake_db.metrics import MetricsSnapshot, SlotCounts
from snowflake_db.process import overridden
from snowflake_db.worker import TableLease, TableWorkerAllocator

from ..plugins.databases import ScratchDatabase
from ..plugins.outage_support import LEASE_SECONDS as OUTAGE_LEASE_SECONDS
from ..plugins.outage_support import STEADY_LEASE_SECONDS, Outage, Recorder, recording
from ..plugins.scheduler_delay import SchedulerDelay, lapse_excuse
from ..plugins.worker_support import LEASE_SECONDS, allocator, expire_lease, wait_for

#: 16 worker slots: small enough to read every count.
LAYOUT = Layout(worker_bits=4)
#: Long enough that no renewal on a busy server comes near the deadline.
EXPORTER_LEASE_SECONDS = 6.0


def _populate(
    database: ScratchDatabase, lease_seconds: float = LEASE_SECONDS
) -> tuple[SnowflakeGenerator, Callable[[], None]]:
    """One live lease (a generator's), one expired (a crashed holder's), one reservation."""
    alloc = allocator(database, lease_seconds=lease_seconds)
    generator = SnowflakeGenerator(allocator=alloc, layout=LAYOUT)
    generator.ensure_worker()
    crashed = allocator(database)
    lost = crashed.acquire(layout=LAYOUT, clock=MonotonicClock())
    lost.abandon()
    crashed.close()
    alloc.reserve_worker_id("orders id function", layout=LAYOUT)
    expire_lease(database.url, lost.worker_id)  # the crashed holder's lease is over

    def close() -> None:
        generator.close()
        alloc.close()

    return generator, close


def test_acquisitions_renewals_and_slot_counts(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    started = time.monotonic()
    generator, close = _populate(any_db)
    try:
        assert wait_for(lambda: generator.metrics().lease_renewals >= 2, 15)
        figures = generator.metrics(with_slots=True)
        delay = scheduler_delay.during(started, time.monotonic())  # renewals are on time
        assert figures.lease_acquisitions == 1 and figures.lease_acquisition_failures == 0
        assert figures.lease_renewal_failures == 0 and figures.leases_lost == 0
        assert 0 < figures.lease_renewal_max_seconds <= figures.lease_renewal_seconds
        assert figures.lease_renewal_seconds < figures.lease_renewals * LEASE_SECONDS + delay
        assert figures.slots_error is None
        slots = figures.slots
        assert slots is not None
        assert slots.available == 14 and slots.parked == 0
        assert (slots.size, slots.live, slots.expired, slots.reserved, slots.free) == (
            16, 1, 1, 1, 0
        )
        assert slots.never_used == 13
        # The live lease renewed within its period (a third of the lease), by the db clock.
        assert slots.stalest_renewal_seconds is not None
        assert 0 <= slots.stalest_renewal_seconds < LEASE_SECONDS + delay
        lease = generator.lease
        assert isinstance(lease, TableLease)
        assert figures.lease_renewals <= lease.renewals + 1  # the heartbeat may be mid-renewal
        # A layout with fewer worker IDs counts only its own slots.
        smaller = lease_allocator_counts(generator, Layout(worker_bits=1))
        assert smaller.size == 2 and smaller.reserved == 0
    finally:
        close()


def lease_allocator_counts(generator: SnowflakeGenerator, layout: Layout) -> SlotCounts:
    counts = generator._allocator.slot_counts(layout)  # type: ignore[union-attr]
    assert isinstance(counts, SlotCounts)
    return counts


def test_exhaustion_counts_a_failed_acquisition(any_db: ScratchDatabase) -> None:
    two_slots = Layout(worker_bits=1)
    allocators = [allocator(any_db) for _ in range(3)]
    generators = [SnowflakeGenerator(allocator=a, layout=two_slots) for a in allocators]
    try:
        generators[0].ensure_worker()
        generators[1].ensure_worker()
        with pytest.raises(WorkerIdExhaustedError):
            generators[2].ensure_worker()
        figures = generators[2].metrics(with_slots=True)
        assert (figures.lease_acquisitions, figures.lease_acquisition_failures) == (0, 1)
        slots = figures.slots
        assert slots is not None
        assert (slots.size, slots.live, slots.expired, slots.available) == (2, 2, 0, 0)
        assert generators[0].metrics().lease_acquisitions == 1
    finally:
        for generator in generators:
            generator.close()
        for alloc in allocators:
            alloc.close()


def test_a_lost_lease_is_counted_and_a_new_one_acquired(any_db: ScratchDatabase) -> None:
    alloc = allocator(any_db)
    generator = SnowflakeGenerator(allocator=alloc, layout=LAYOUT)
    try:
        worker_id = generator.ensure_worker()
        engine = create_engine(any_db.url)
        try:
            with engine.begin() as connection:  # another holder took the slot
                connection.execute(
                    text("UPDATE snowflake_worker_slots SET lease_token = :t WHERE worker_id = :w"),
                    {"t": "x" * 32, "w": worker_id},
                )
        finally:
            engine.dispose()
        assert wait_for(lambda: generator.metrics().leases_lost == 1, 15)
        generator.next_id()  # leases again
        figures = generator.metrics()
        assert figures.lease_acquisitions == 2 and figures.ids_issued == 1
        assert generator.worker_id != worker_id
    finally:
        generator.close()
        alloc.close()


@pytest.mark.timing(seconds=8)  # see tests/conftest.py
@pytest.mark.slow
def test_an_outage_counts_renewal_failures_refusals_and_time_fenced(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    # Beside a second suite a MariaDB renewal took 0.87 s, and with a 1.5 s lease a caller was
    # fenced before the cut (safe, but then the figures below describe the wrong moment): the
    # servers keep the steady lease. SQLite's cut is a lock its renewal waits behind for the
    # busy timeout (5 s), so its outage must stay shorter: the short lease there.
    lease_seconds = OUTAGE_LEASE_SECONDS if any_db.backend == "sqlite" else STEADY_LEASE_SECONDS
    outage = Outage(any_db)
    alloc = TableWorkerAllocator(outage.url, lease_seconds=lease_seconds)
    generator = SnowflakeGenerator(allocator=alloc)
    try:
        generator.ensure_worker()
        with recording(generator) as recorder:
            assert wait_for(lambda: generator.metrics().lease_renewals >= 1, 10)
            before = _unfenced_before_the_cut(generator, recorder, scheduler_delay,
                                              lease_seconds)
            outage.cut()
            cut_at = time.monotonic()
            assert wait_for(
                lambda: generator.metrics().lease_refusals > before.lease_refusals, 15)
            time.sleep(0.5)
            if any_db.backend != "sqlite":  # refused connections fail renewals at once
                assert wait_for(lambda: generator.metrics().lease_renewal_failures
                                > before.lease_renewal_failures, 15)
            during = generator.metrics()
            assert during.fenced_generators == 1
            assert during.fenced_seconds - before.fenced_seconds >= 0.4
            restored_at = time.monotonic()
            outage.restore()
            assert wait_for(lambda: bool(recorder.issued_between(restored_at, 1e12)), 20)
            time.sleep(0.2)
        after = generator.metrics()
        assert after.fenced_generators == 0
        # Fenced from the first refusal (after the cut) until IDs flowed again.
        assert during.fenced_seconds < after.fenced_seconds
        assert after.fenced_seconds - before.fenced_seconds < time.monotonic() - cut_at
        refusals = [e for e, _ in recorder.errors if issubclass(e, WorkerLeaseError)]
        assert after.lease_refusals == len(refusals) > before.lease_refusals
        assert after.ids_issued == len(recorder.ids)  # exactly the IDs the thread received
        assert after.lease_renewals > during.lease_renewals  # renewed after the outage
        if any_db.backend == "sqlite":
            # SQLite's renewal waited for the file lock (busy timeout) and then went through:
            # its latency shows the outage.
            assert after.lease_renewal_max_seconds >= restored_at - cut_at - 0.5
    finally:
        generator.close()
        alloc.close()
        outage.close()


def _unfenced_before_the_cut(
    generator: SnowflakeGenerator, recorder: Recorder, scheduler_delay: SchedulerDelay,
    lease_seconds: float,
) -> MetricsSnapshot:
    """The figures just before the cut, with IDs flowing. A refusal before it (the database
    answered) is allowed only where this process was kept from running for half the lease's
    slack in the lease before it: a loaded scheduler (load 12-18 on 2 cores) let SQLite's
    1.5 s lease lapse, while a product that fences on a healthy database fails here on an
    idle machine. The outage's figures are then judged from this baseline."""
    excuse = lapse_excuse(lease_seconds)
    for error, at in list(recorder.errors):
        if issubclass(error, WorkerLeaseError):
            delayed = scheduler_delay.during(at - lease_seconds, at)
            assert delayed >= excuse, (
                f"{error.__name__} before the cut, on a healthy database (kept from running "
                f"{delayed:.2f} s of the lease)")
    assert wait_for(lambda: generator.metrics().fenced_generators == 0, 10)
    return generator.metrics()


# -- exporters with the control database's slots --------------------------------------------------


def test_prometheus_and_opentelemetry_with_slots(
    any_db: ScratchDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    # The lease's length is not the subject: a 2 s lease lapsed once on an overloaded shared
    # MariaDB between the claim and the first ID.
    generator, close = _populate(any_db, lease_seconds=EXPORTER_LEASE_SECONDS)
    try:
        with overridden(generator):  # the process-wide generator, as configure() makes it
            _check_exporters_with_slots(generator, caplog)
    finally:
        close()


def _check_exporters_with_slots(
    generator: SnowflakeGenerator, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from snowflake_db.exporters.opentelemetry import create_instruments
    from snowflake_db.exporters.prometheus import SnowflakeCollector

    generator.next_ids(10)
    registry = CollectorRegistry()
    registry.register(SnowflakeCollector(with_slots=True))
    exposition = generate_latest(registry).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    assert samples[("snowflake_db_worker_slots", (("state", "live"),))] == 1
    assert samples[("snowflake_db_worker_slots", (("state", "expired"),))] == 1
    assert samples[("snowflake_db_worker_slots", (("state", "reserved"),))] == 1
    assert samples[("snowflake_db_worker_slots", (("state", "free"),))] == 0
    assert samples[("snowflake_db_worker_slots", (("state", "never_used"),))] == 13
    assert samples[("snowflake_db_worker_slots_available", ())] == 14
    assert samples[("snowflake_db_worker_slots_parked", ())] == 0
    assert samples[("snowflake_db_worker_slot_capacity", ())] == 16
    assert samples[("snowflake_db_control_database_up", ())] == 1
    assert samples[("snowflake_db_ids_issued_total", ())] >= 10  # the whole process
    assert samples[("snowflake_db_lease_acquisitions_total", ())] >= 1

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        create_instruments(provider.get_meter("test"), with_slots=True)
        data = reader.get_metrics_data()
        points = {
            metric.name: {
                tuple(sorted(point.attributes.items())): point.value
                for point in metric.data.data_points
            }
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
    finally:
        provider.shutdown()
    assert points["snowflake_db.worker_slots"] == {
        (("state", "live"),): 1,
        (("state", "expired"),): 1,
        (("state", "reserved"),): 1,
        (("state", "free"),): 0,
        (("state", "never_used"),): 13,
    }
    assert points["snowflake_db.ids_issued"][()] >= 10

    # The control database gone (here: the allocator closed): the scrape still answers.
    generator._allocator.close()  # type: ignore[union-attr]
    with caplog.at_level(logging.WARNING, logger="snowflake_db.exporters"):
        text_after = generate_latest(registry).decode()
    assert "snowflake_db_control_database_up 0.0" in text_after
    assert "the worker slots were not counted" in caplog.text and "was closed" in caplog.text
    assert 'snowflake_db_worker_slots{state="live"}' not in text_after
    assert "was closed" in (metrics.snapshot(with_slots=True).slots_error or "")
