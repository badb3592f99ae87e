"""Task functions for multiprocessing pools in tests: a small module (only snowflake_db
imports), so forkserver and spawn children import little before their first task."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import time
from typing import Any

import snowflake_db
from snowflake_db import Layout, SnowflakeError
from snowflake_db.worker import TableWorkerAllocator

#: Eight worker slots: recycled children that parked theirs would exhaust it within one pool run.
POOL_LAYOUT = Layout(worker_bits=3)

TaskResult = tuple[int, int | None, list[int], str | None]

#: What the forkserver imports once instead of each child (SQLAlchemy and psycopg cost about
#: 0.8 s of CPU a child; a pool of 100 recycled children spent 30 s importing them).
FORKSERVER_PRELOAD = [
    "tests.worker.pool_support", "sqlalchemy.dialects.postgresql.psycopg", "psycopg"]


def pool_context(method: str) -> Any:
    """``multiprocessing.get_context(method)``; for ``forkserver`` with :data:`FORKSERVER_PRELOAD`
    (which takes effect only if this starts the server: every pool test here asks for it)."""
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context


def configure_child(url: str, lease_seconds: float) -> None:
    """Pool initializer: lease from ``url`` (for start methods that inherit nothing)."""
    allocator = TableWorkerAllocator(url, lease_seconds=lease_seconds)
    snowflake_db.configure(allocator=allocator, layout=POOL_LAYOUT)


def configured_parent(url: str, lease_seconds: float) -> TableWorkerAllocator:
    """Configure and use the process-wide generator in the parent: forked children inherit it."""
    allocator = TableWorkerAllocator(url, lease_seconds=lease_seconds)
    snowflake_db.configure(allocator=allocator, layout=POOL_LAYOUT)
    snowflake_db.snowflake_default()
    return allocator


def issue_ids(task: int) -> TaskResult:
    """Issue a few IDs from the process-wide generator: ``(task, worker, ids, error)``."""
    try:
        ids = [snowflake_db.snowflake_default() for _ in range(100)]
        return task, snowflake_db.get_generator().worker_id, ids, None
    except SnowflakeError as error:
        return task, None, [], f"{type(error).__name__}: {error}"


def lease_then_wait(marker_dir: str) -> None:
    """Lease, say so with a file named after this process, then sleep until the pool ends this
    child (a busy worker when terminated)."""
    snowflake_db.snowflake_default()
    with open(os.path.join(marker_dir, str(os.getpid())), "w"):
        pass
    time.sleep(120)


def lease_then_stick_in_c(marker_dir: str) -> None:
    """Lease, say so with a file named after this process, then wait in C code that no signal
    interrupts (a mutex locked twice: a child that inherited a locked mutex waits so): the
    main thread never runs Python code again, so no Python-level signal handler runs."""
    snowflake_db.snowflake_default()
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # pthread_mutex_t is 40 bytes on x86-64 Linux
    libc.pthread_mutex_init(mutex, None)
    libc.pthread_mutex_lock(mutex)
    with open(os.path.join(marker_dir, str(os.getpid())), "w"):
        pass
    libc.pthread_mutex_lock(mutex)


def lease_then_install_handlers(task: int) -> int | None:
    """Lease, then opt in to install_signal_handlers() on top of the pool child's own SIGTERM
    handling (``snowflake_db.install_signal_handlers`` in a task, as some apps do)."""
    snowflake_db.snowflake_default()
    with contextlib.suppress(snowflake_db.SignalHandlersError):  # a second task in this child
        snowflake_db.install_signal_handlers()
    return snowflake_db.get_generator().worker_id


def own_sigterm_handler(marker_dir: str) -> None:
    """Pool initializer: the application's own SIGTERM handler, which must stay in charge."""

    def handler(signum: int, frame: object) -> None:
        with open(os.path.join(marker_dir, f"{os.getpid()}.term"), "w"):
            pass
        os._exit(5)

    signal.signal(signal.SIGTERM, handler)
