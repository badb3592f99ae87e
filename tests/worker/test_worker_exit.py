"""Every way a process ends releases its slot: pool children, which end with ``os._exit`` (no
``atexit``), release from their pool's own exit path. Real pools with recycled workers
(``maxtasksperchild=1``) over 8 slots: multiprocessing (fork and forkserver) and billiard,
Celery's prefork pool, whose workers end from ``Worker._do_exit``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import billiard
import billiard.pool
import pytest

import snowflake_db
from snowflake_db.worker import TableWorkerAllocator

from ..plugins.databases import ScratchDatabase
from ..plugins.scheduler_delay import wait_patiently
from ..plugins.worker_support import read_slots
from .pool_support import (
    POOL_LAYOUT,
    TaskResult,
    configure_child,
    configured_parent,
    issue_ids,
    pool_context,
)

TASKS = 100
#: billiard's workers pause 1 s before they exit (Worker._do_exit): 32 one-task workers (4 times
#: the 8 slots) prove the release as 100 would, in a third of the time.
BILLIARD_TASKS = 32
#: Long enough that any slot parked for it would exhaust the 8 slots within the run.
LEASE_SECONDS = 30.0


def _run_pool(method: str, url: str) -> list[TaskResult]:
    """100 one-task children, at most 2 at a time; bounded in time, joined before returning."""
    # forkserver: SQLAlchemy and the driver imported once in the server rather than in each of
    # the 100 children (the test holds either way).
    context = pool_context(method)
    initializer: Callable[..., None] | None = None
    initargs: tuple[Any, ...] = ()
    if method != "fork":
        initializer, initargs = configure_child, (url, LEASE_SECONDS)
    pool = context.Pool(2, initializer=initializer, initargs=initargs, maxtasksperchild=1)
    try:
        mapped = pool.map_async(issue_ids, range(TASKS), chunksize=1)
        assert wait_patiently(lambda timeout: _ready(mapped, timeout), 300), "tasks unfinished"
        pool.close()
        _join_bounded(pool, 60)
        return mapped.get(0)
    finally:
        pool.terminate()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_recycled_pool_workers_release_their_slots(
    backend: str, method: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    database = database_factory(backend)
    url = database.url_string
    parent_allocator = None
    if method == "fork":  # children inherit the configured process-wide generator
        parent_allocator = TableWorkerAllocator(url, lease_seconds=LEASE_SECONDS)
        snowflake_db.configure(allocator=parent_allocator, layout=POOL_LAYOUT)
    try:
        results = _run_pool(method, url)
    finally:
        snowflake_db.reset()
        if parent_allocator is not None:
            parent_allocator.close()
    errors = [error for _, _, _, error in results if error is not None]
    assert not errors, f"{len(errors)} of {TASKS} tasks failed; first: {errors[0]}"
    assert sorted(task for task, _, _, _ in results) == list(range(TASKS))
    workers = {worker for _, worker, _, _ in results}
    assert workers <= set(range(POOL_LAYOUT.max_worker_id + 1))
    ids = [i for _, _, batch, _ in results for i in batch]
    assert len(ids) == len(set(ids)) == TASKS * 100
    # Every child released its slot as it ended (none waits for its lease to expire).
    rows = read_slots(url)
    assert rows and all(row.state == "free" for row in rows.values()), rows


# -- billiard (Celery's prefork pool) ------------------------------------------------------------


def _ready(result: Any, timeout: float) -> bool:
    result.wait(timeout)
    return bool(result.ready())


def _joined(thread: threading.Thread, timeout: float) -> bool:
    thread.join(timeout)
    return not thread.is_alive()


def _join_bounded(pool: Any, seconds: float) -> None:
    """``pool.join()``, which has no timeout, from a helper thread: bounded, patiently."""
    joiner = threading.Thread(target=pool.join, daemon=True)
    joiner.start()
    assert wait_patiently(lambda timeout: _joined(joiner, timeout), seconds), (
        "the pool's last children did not exit"
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_recycled_billiard_pool_workers_release_their_slots(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    """Each worker runs one task and ends through ``Worker._do_exit`` (``os._exit``, after a
    one-second pause billiard makes there): 32 tasks would need 32 slots if none released."""
    url = database_factory(backend).url_string
    parent_allocator = configured_parent(url, LEASE_SECONDS)
    parent_worker = snowflake_db.get_generator().worker_id
    pool = billiard.Pool(2, maxtasksperchild=1)
    try:
        # One job per task, as Celery sends them. A map is one job for all its tasks: billiard
        # fails it with WorkerLostError once 10 s pass after a recycled worker's exit without
        # the whole map done, which a slow fork under load made happen once.
        jobs = [pool.apply_async(issue_ids, (task,)) for task in range(BILLIARD_TASKS)]
        results = [job.get(timeout=600) for job in jobs]
        pool.close()
        _join_bounded(pool, 60)
    finally:
        pool.terminate()
        snowflake_db.reset()
        parent_allocator.close()
    errors = [error for _, _, _, error in results if error is not None]
    assert not errors, f"{len(errors)} of {BILLIARD_TASKS} tasks failed; first: {errors[0]}"
    assert sorted(task for task, _, _, _ in results) == list(range(BILLIARD_TASKS))
    assert parent_worker not in {worker for _, worker, _, _ in results}
    ids = [i for _, _, batch, _ in results for i in batch]
    assert len(ids) == len(set(ids)) == BILLIARD_TASKS * 100
    rows = read_slots(url)
    assert rows and all(row.state == "free" for row in rows.values()), rows


def _record_exit(pid: int, exitcode: int) -> None:
    """A pool's own ``on_process_exit``: still called, before the release, with IDs usable."""
    out = os.environ["SNOWFLAKE_TEST_EXIT_LOG"]
    worker = snowflake_db.get_generator().worker_id
    with open(out, "a") as log:
        log.write(f"{pid} {exitcode} {worker} {snowflake_db.snowflake_default()}\n")


def test_billiard_pool_keeps_its_own_exit_callback_and_then_releases(
    sqlite_db: ScratchDatabase, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "exits.log"
    monkeypatch.setenv("SNOWFLAKE_TEST_EXIT_LOG", str(log))
    parent_allocator = configured_parent(sqlite_db.url_string, LEASE_SECONDS)
    # The Pool class itself: the context's Pool() does not pass on_process_exit on.
    pool = billiard.pool.Pool(1, maxtasksperchild=1, on_process_exit=_record_exit)
    try:
        results = pool.map_async(issue_ids, range(3), chunksize=1).get(timeout=120)
        pool.close()
        _join_bounded(pool, 60)
    finally:
        pool.terminate()
        snowflake_db.reset()
        parent_allocator.close()
    assert [error for *_, error in results] == [None] * 3
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 3  # the pool's callback ran in each worker, IDs still issued there
    assert {int(worker) for _, _, worker, _ in lines} == {worker for _, worker, _, _ in results}
    rows = read_slots(sqlite_db.url)
    assert all(row.state == "free" for row in rows.values()), rows


def _lease_and_return() -> None:
    snowflake_db.snowflake_default()  # the inherited generator leases this child's own slot


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_billiard_process_child_releases_its_slot_as_it_ends(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    url = database_factory(backend).url_string
    parent_allocator = configured_parent(url, LEASE_SECONDS)
    parent_worker = snowflake_db.get_generator().worker_id
    try:
        child = billiard.Process(target=_lease_and_return)
        child.start()
        child.join(60)
        assert child.exitcode == 0
        rows = read_slots(url)
    finally:
        snowflake_db.reset()
        parent_allocator.close()
    children = [row for worker, row in rows.items() if worker != parent_worker]
    assert len(children) == 1 and children[0].state == "free", rows
    assert rows[parent_worker].state == "live"


def test_billiard_is_never_imported_by_the_library() -> None:
    code = (
        "import sys, snowflake_db, snowflake_db.worker, snowflake_db.worker._process_hooks; "
        "print('billiard' in sys.modules)"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert output.strip() == "False"
