"""Threads, forks and spawned processes: no ID is ever issued twice.

Forked children report back to the parent through a pipe or a queue, and every assertion runs in
the parent, so a failure in a child cannot go unnoticed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest

import snowflake_db
from snowflake_db import (
    DEFAULT_LAYOUT,
    ClockMovedBackwardsError,
    ClockStalledError,
    ForkedWorkerIdError,
    SnowflakeError,
    SnowflakeGenerator,
)
from snowflake_db.testing import DEFAULT_FAKE_START_MS, FakeClock
from tests.plugins.core_support import FakeAllocator, error_report, run_in_fork

pytestmark = pytest.mark.usefixtures("fresh_process_default")


def is_strictly_increasing(ids: list[int]) -> bool:
    """One caller's IDs must increase; across callers only uniqueness is promised."""
    return all(earlier < later for earlier, later in pairwise(ids))


def worker_ids_of(ids: list[int]) -> set[int]:
    """Worker IDs by bit arithmetic: decoding hundreds of thousands of IDs would be slow."""
    return {(i >> DEFAULT_LAYOUT.worker_shift) & DEFAULT_LAYOUT.max_worker_id for i in ids}


# -- threads -----------------------------------------------------------------------------------


def run_threads(count: int, work: Callable[[int], list[int]]) -> list[list[int]]:
    """Start ``count`` threads together on ``work(index)`` and return each thread's IDs."""
    barrier = threading.Barrier(count)
    results: list[list[int]] = [[] for _ in range(count)]
    failures: list[BaseException] = []

    def target(index: int) -> None:
        barrier.wait()
        try:
            results[index] = work(index)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    return results


@pytest.mark.slow
def test_sixteen_threads_share_one_generator() -> None:
    generator = SnowflakeGenerator(12)

    def work(_: int) -> list[int]:
        next_id = generator.next_id
        return [next_id() for _ in range(50_000)]

    per_thread = run_threads(16, work)
    assert all(is_strictly_increasing(ids) for ids in per_thread)
    every = [i for ids in per_thread for i in ids]
    assert len(every) == 800_000
    assert len(set(every)) == len(every), "duplicate IDs across threads"
    assert worker_ids_of(every) == {12}


def test_threads_mixing_next_id_and_next_ids() -> None:
    generator = SnowflakeGenerator(13)

    def work(index: int) -> list[int]:
        rng = random.Random(index)
        ids: list[int] = []
        while len(ids) < 40_000:
            if index % 2:
                ids.extend(generator.next_ids(rng.randint(1, 5000)))
            else:
                ids.extend(generator.next_id() for _ in range(rng.randint(1, 500)))
        return ids

    per_thread = run_threads(8, work)
    assert all(is_strictly_increasing(ids) for ids in per_thread)
    every = [i for ids in per_thread for i in ids]
    assert len(set(every)) == len(every), "duplicate IDs across threads"


def test_threads_while_the_clock_jumps_around() -> None:
    """Lock-free readers racing a clock that moves on, wobbles back and falls far behind."""
    clock = FakeClock(DEFAULT_FAKE_START_MS)
    generator = SnowflakeGenerator(14, clock=clock, rollback_tolerance_ms=10, max_wait_ms=20)
    stop = threading.Event()

    def drive_clock() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            step = rng.random()
            if step < 0.1:
                clock.advance(-rng.randint(1, 10))  # within tolerance
            elif step < 0.13:
                clock.advance(-3000)  # beyond tolerance, briefly
                time.sleep(0.001)
                clock.advance(3000)
            else:
                clock.advance(1)
            time.sleep(0.0002)

    driver = threading.Thread(target=drive_clock)
    driver.start()
    deadline = time.monotonic() + 1.5

    def work(_: int) -> list[int]:
        ids: list[int] = []
        while time.monotonic() < deadline and len(ids) < 100_000:
            with contextlib.suppress(ClockMovedBackwardsError, ClockStalledError):
                ids.append(generator.next_id())
        return ids

    try:
        per_thread = run_threads(4, work)
    finally:
        stop.set()
        driver.join()
    assert all(is_strictly_increasing(ids) for ids in per_thread)
    every = [i for ids in per_thread for i in ids]
    assert len(every) > 1000
    assert len(set(every)) == len(every), "duplicate IDs across threads"


# -- os.fork -----------------------------------------------------------------------------------


def test_forked_child_refuses_an_inherited_static_worker_id() -> None:
    generator = SnowflakeGenerator(5)
    parent_ids = generator.next_ids(1000)

    def child() -> list[dict[str, str]]:
        reports = []
        for attempt in (generator.next_id, lambda: generator.next_ids(3)):
            try:
                attempt()
            except SnowflakeError as error:
                reports.append(error_report(error))
        return reports

    reports = run_in_fork(child)["result"]
    assert [report["error"] for report in reports] == ["ForkedWorkerIdError"] * 2
    message = reports[0]["message"]
    assert "forked" in message and "static worker ID 5" in message
    assert "configure" in message and "TableWorkerAllocator" in message
    assert generator.next_id() > parent_ids[-1]  # the parent is unaffected


def test_forked_child_reconfigures_with_its_own_worker_id() -> None:
    snowflake_db.configure(worker_id=5)
    parent_ids = [snowflake_db.snowflake_default() for _ in range(1000)]

    def child() -> dict[str, Any]:
        try:
            snowflake_db.snowflake_default()
        except ForkedWorkerIdError as error:
            refused = error_report(error)
        else:
            refused = {"error": "none"}
        snowflake_db.configure(worker_id=6)
        ids = [snowflake_db.snowflake_default() for _ in range(20_000)]
        return {"refused": refused, "ids": ids}

    outcome = run_in_fork(child)["result"]
    parent_ids += [snowflake_db.snowflake_default() for _ in range(20_000)]
    assert outcome["refused"]["error"] == "ForkedWorkerIdError"
    child_ids = outcome["ids"]
    assert is_strictly_increasing(child_ids)
    assert worker_ids_of(child_ids) == {6}
    assert worker_ids_of(parent_ids) == {5}
    assert not set(child_ids) & set(parent_ids)


def test_forked_child_of_a_leased_generator_abandons_and_leases_anew() -> None:
    allocator = FakeAllocator([11, 12])
    generator = SnowflakeGenerator(allocator=allocator)
    parent_ids = generator.next_ids(2000)
    parent_lease = allocator.leases[0]

    def child() -> dict[str, Any]:
        ids = [generator.next_id() for _ in range(2000)]
        return {
            "ids": ids,
            "worker_id": generator.worker_id,
            "leases": len(allocator.leases),
            "inherited_abandoned": allocator.leases[0].abandoned,
            "inherited_released": allocator.leases[0].released,
        }

    outcome = run_in_fork(child)["result"]
    assert outcome["inherited_abandoned"] is True
    assert outcome["inherited_released"] is False  # never release the parent's slot
    assert outcome["leases"] == 2
    assert outcome["worker_id"] == 12
    assert worker_ids_of(outcome["ids"]) == {12}
    assert is_strictly_increasing(outcome["ids"])
    # In the parent nothing changed: same lease, same worker, still issuing.
    assert not parent_lease.abandoned and not parent_lease.released
    assert generator.lease is parent_lease
    parent_ids += generator.next_ids(2000)
    assert worker_ids_of(parent_ids) == {11}
    assert not set(parent_ids) & set(outcome["ids"])


def test_forked_child_closing_an_inherited_generator_never_releases_the_parent_lease() -> None:
    allocator = FakeAllocator([21, 22])
    generator = SnowflakeGenerator(allocator=allocator)
    generator.next_id()

    def child() -> dict[str, bool]:
        generator.close()
        lease = allocator.leases[0]
        return {"released": lease.released, "acquired_again": len(allocator.leases) > 1}

    outcome = run_in_fork(child)["result"]
    assert outcome == {"released": False, "acquired_again": False}
    assert generator.next_id() > 0


# -- multiprocessing ---------------------------------------------------------------------------


def _report_next_id(generator: SnowflakeGenerator, queue: Any) -> None:
    """Child of a "fork" Process: try the inherited generator and report what happened."""
    try:
        queue.put({"result": generator.next_id()})
    except BaseException as error:
        queue.put(error_report(error))


def _configure_pool_worker(counter: Any) -> None:
    """Pool initializer: each pool process takes a distinct worker ID, as the docs advise."""
    with counter.get_lock():
        counter.value += 1
        worker_id = 100 + counter.value
    snowflake_db.configure(worker_id=worker_id)


def _pool_task(count: int) -> list[int]:
    return [snowflake_db.snowflake_default() for _ in range(count)]


def _spawned_ids(worker_id: int | None, count: int, queue: Any) -> None:
    """Child of a "spawn" Process: static worker ID, or the environment when ``None``."""
    try:
        if worker_id is not None:
            snowflake_db.configure(worker_id=worker_id)
        queue.put({"result": [snowflake_db.snowflake_default() for _ in range(count)]})
    except BaseException as error:
        queue.put(error_report(error))


def test_multiprocessing_fork_child_refuses_an_inherited_static_worker_id() -> None:
    generator = SnowflakeGenerator(7)
    generator.next_ids(100)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_report_next_id, args=(generator, queue))
    process.start()
    report = queue.get(timeout=60)
    process.join(60)
    assert process.exitcode == 0
    assert report["error"] == "ForkedWorkerIdError", report
    assert "static worker ID 7" in report["message"]


def test_multiprocessing_fork_pool_with_distinct_worker_ids() -> None:
    snowflake_db.configure(worker_id=1)
    parent_ids = [snowflake_db.snowflake_default() for _ in range(1000)]
    context = multiprocessing.get_context("fork")
    counter = context.Value("i", 0)
    with context.Pool(2, initializer=_configure_pool_worker, initargs=(counter,)) as pool:
        batches = pool.map_async(_pool_task, [10_000] * 6).get(timeout=120)
    parent_ids += [snowflake_db.snowflake_default() for _ in range(1000)]
    child_ids = [i for batch in batches for i in batch]
    assert all(is_strictly_increasing(batch) for batch in batches)
    assert worker_ids_of(child_ids) <= {101, 102}
    every = parent_ids + child_ids
    assert len(set(every)) == len(every), "duplicate IDs across forked processes"


@pytest.mark.slow
def test_spawned_processes_with_distinct_worker_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned children configured with distinct worker IDs issue disjoint IDs; a child that
    would take the worker ID from the environment it inherited (shared by every sibling) is
    refused, as in a forked child."""
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "4")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [
        context.Process(target=_spawned_ids, args=(3, 30_000, queue)),
        context.Process(target=_spawned_ids, args=(5, 30_000, queue)),
        context.Process(target=_spawned_ids, args=(None, 10, queue)),
    ]
    for process in processes:
        process.start()
    reports = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    refused = [report for report in reports if "result" not in report]
    assert [report["error"] for report in refused] == ["ForkedWorkerIdError"], reports
    assert "SNOWFLAKE_WORKER_ID=4 was inherited from pid" in refused[0]["message"]
    batches = [report["result"] for report in reports if "result" in report]
    assert sorted(worker_ids_of(batch).pop() for batch in batches) == [3, 5]
    assert all(is_strictly_increasing(batch) for batch in batches)
    assert not set(batches[0]) & set(batches[1])
