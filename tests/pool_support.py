"""Task functions for multiprocessing pools in tests: a small module (only snowflake_db
imports), so forkserver and spawn children import little before their first task."""

from __future__ import annotations

import snowflake_db
from snowflake_db import Layout, SnowflakeError
from snowflake_db.worker import TableWorkerAllocator

#: Eight worker slots: recycled children that parked theirs would exhaust it within one pool run.
POOL_LAYOUT = Layout(worker_bits=3)

TaskResult = tuple[int, int | None, list[int], str | None]


def configure_child(url: str, lease_seconds: float) -> None:
    """Pool initializer: lease from ``url`` (for start methods that inherit nothing)."""
    allocator = TableWorkerAllocator(url, lease_seconds=lease_seconds)
    snowflake_db.configure(allocator=allocator, layout=POOL_LAYOUT)


def issue_ids(task: int) -> TaskResult:
    """Issue a few IDs from the process-wide generator: ``(task, worker, ids, error)``."""
    try:
        ids = [snowflake_db.snowflake_default() for _ in range(100)]
        return task, snowflake_db.get_generator().worker_id, ids, None
    except SnowflakeError as error:
        return task, None, [], f"{type(error).__name__}: {error}"
