"""Exit paths of pool children that end with ``os._exit``, where ``atexit`` never runs.

``multiprocessing`` (fork and forkserver): ``Process._bootstrap`` runs the finalizers registered
in the child (``multiprocessing.util._exit_function``) before ``os._exit``.

billiard (Celery's prefork pool): its ``Process._bootstrap`` runs the same function
(``billiard.util`` re-exports multiprocessing's ``Finalize`` and ``_exit_function``), but a pool
worker never gets there: ``billiard.pool.Worker._do_exit`` calls ``os._exit`` itself, straight
after the worker's ``on_exit(pid, exitcode)`` callback (the pool's ``on_process_exit``; Celery's
``process_destructor``, which sends ``worker_process_shutdown``). So a pool worker releases from
that callback, after the one it had. Neither library is imported here: only one already loaded
can have started this process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def via_billiard(release: Callable[[], None]) -> bool:
    """In a billiard child, arrange for ``release`` to run as it ends; False elsewhere."""
    process = sys.modules.get("billiard.process")
    if process is None:
        return False
    current = process.current_process()
    if getattr(current, "_parent_pid", None) is None:
        return False  # billiard's main process (a Celery worker's parent), not a child
    pool = sys.modules.get("billiard.pool")
    worker = getattr(current, "_target", None)  # a pool process runs a Worker as its target
    if pool is not None and isinstance(worker, pool.Worker):
        worker.on_exit = _ReleaseAfter(worker.on_exit, release)
        return True
    _finalize(release)  # a plain billiard.Process: its _bootstrap runs the finalizers
    return True


def via_multiprocessing(release: Callable[[], None]) -> bool:
    """In a ``multiprocessing`` child, arrange for ``release`` to run as it ends; False
    elsewhere (the finalizers inherited from the parent are cleared when a child starts)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return False
    _finalize(release)
    return True


def _finalize(release: Callable[[], None]) -> None:
    from multiprocessing import util

    util.Finalize(None, release, exitpriority=0)


class _ReleaseAfter:
    """A billiard pool worker's ``on_exit``: the callback it had first (its receivers, such as
    Celery's ``worker_process_shutdown``, may still issue IDs), then the release."""

    def __init__(self, previous: Any, release: Callable[[], None]) -> None:
        self.previous = previous
        self.release = release

    def __call__(self, pid: int, exitcode: int) -> None:
        try:
            if self.previous is not None:
                self.previous(pid, exitcode)
        finally:
            self.release()
