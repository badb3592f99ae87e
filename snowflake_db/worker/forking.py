"""Process hooks: fork hygiene and release at a clean exit, for every live allocator.

After ``os.fork()`` the child owns copies of the parent's pooled connections and leases. It must
not use either: the connections' sockets are shared with the parent, and the leases are the
parent's. The hook drops the pools without closing them (``Engine.dispose(close=False)``, see
https://docs.sqlalchemy.org/en/20/core/pooling.html#using-connection-pools-with-multiprocessing-or-os-fork)
and marks inherited leases abandoned; generators then lease a new worker ID lazily.

``multiprocessing`` children (fork and forkserver) end with ``os._exit``, which skips ``atexit``;
they run ``multiprocessing.util`` finalizers instead, so a child that takes a lease registers
the exit hooks there too (:func:`release_at_child_exit`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from ..shutdown import add_release_hook

#: Per live allocator, weak references to its two hooks (it registers its own methods, so this
#: module calls nothing private and keeps no allocator alive).
_hooks: list[tuple[weakref.WeakMethod[Any], weakref.WeakMethod[Any]]] = []
_pid = os.getpid()
#: The process whose multiprocessing exit path already runs the exit hooks.
_finalizer_pid: int | None = None


def track(after_fork_in_child: Callable[[int], None], at_exit: Callable[[], None]) -> None:
    """Call these bound methods after a fork (in the child, with the parent's PID) and at a
    clean exit, for as long as their object lives."""
    _live()  # drop the entries of objects gone since
    _hooks.append((weakref.WeakMethod(after_fork_in_child), weakref.WeakMethod(at_exit)))


def _live() -> list[tuple[Callable[..., None], Callable[..., None]]]:
    """The hooks of objects still alive; dead entries are dropped."""
    live = []
    for after_fork, at_exit in list(_hooks):
        fork_hook, exit_hook = after_fork(), at_exit()
        if fork_hook is None or exit_hook is None:
            # No lock (a fork hook must never wait on one): another thread may remove it first.
            with contextlib.suppress(ValueError):
                _hooks.remove((after_fork, at_exit))
            continue
        live.append((fork_hook, exit_hook))
    return live


def release_at_child_exit() -> None:
    """In a ``multiprocessing`` child, run the exit hooks from multiprocessing's own exit path.

    Its ``Process._bootstrap`` ends the child with ``os._exit`` after running the finalizers
    registered in the child (``multiprocessing.util._exit_function``; the ones inherited are
    cleared when the child starts). Called whenever a lease is taken, so a recycled pool worker
    (``maxtasksperchild``, Celery's ``--max-tasks-per-child``) frees its slot as it ends rather
    than parking it for the lease length. Once per process; a no-op outside such children.
    """
    global _finalizer_pid  # noqa: PLW0603
    pid = os.getpid()
    if _finalizer_pid == pid:
        return
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return
    from multiprocessing import util

    util.Finalize(None, _at_exit, exitpriority=0)
    _finalizer_pid = pid


def _after_fork_in_child() -> None:
    global _pid
    parent_pid, _pid = _pid, os.getpid()
    for after_fork, _ in _live():
        after_fork(parent_pid)


def _at_exit() -> None:
    for _, at_exit in _live():
        at_exit()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
add_release_hook(_at_exit)  # snowflake_db.install_signal_handlers(): SIGTERM releases too
