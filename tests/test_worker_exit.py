"""Every way a process ends releases its slot: multiprocessing children, which end with
``os._exit`` (no ``atexit``), release from multiprocessing's own exit path. Real pools with
recycled workers (``maxtasksperchild=1``) over 8 slots, fork and forkserver."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest

import snowflake_db
from snowflake_db.worker import TableWorkerAllocator

from .plugins.databases import ScratchDatabase
from .pool_support import POOL_LAYOUT, TaskResult, configure_child, issue_ids
from .worker_support import read_slots

TASKS = 100
#: Long enough that any slot parked for it would exhaust the 8 slots within the run.
LEASE_SECONDS = 30.0


def _run_pool(method: str, url: str) -> list[TaskResult]:
    """100 one-task children, at most 2 at a time; bounded in time, joined before returning."""
    context = multiprocessing.get_context(method)
    initializer: Callable[..., None] | None = None
    initargs: tuple[Any, ...] = ()
    if method != "fork":
        initializer, initargs = configure_child, (url, LEASE_SECONDS)
    if method == "forkserver":
        # Import SQLAlchemy once in the server rather than in each of the 100 children (takes
        # effect only if this starts the server; the test holds either way).
        context.set_forkserver_preload(["tests.pool_support"])
    pool = context.Pool(2, initializer=initializer, initargs=initargs, maxtasksperchild=1)
    try:
        results = pool.map_async(issue_ids, range(TASKS), chunksize=1).get(timeout=300)
        pool.close()
        # join() has no timeout: bound it from a helper thread.
        joiner = threading.Thread(target=pool.join, daemon=True)
        joiner.start()
        joiner.join(60)
        assert not joiner.is_alive(), "the pool's last children did not exit"
        return results
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
