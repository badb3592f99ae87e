"""Process hooks: fork hygiene and release at a clean exit, for every live allocator.

After ``os.fork()`` the child owns copies of the parent's pooled connections and leases. It must
not use either: the connections' sockets are shared with the parent, and the leases are the
parent's. Each allocator's part of the child's reset drops the pools without closing them
(``Engine.dispose(close=False)``, see
https://docs.sqlalchemy.org/en/20/core/pooling.html#using-connection-pools-with-multiprocessing-or-os-fork),
marks inherited leases abandoned and starts a new heartbeat; generators then lease a new worker
ID lazily. It runs as part of :mod:`snowflake_db.forks`' one reset per process: from Python's
fork hook, or from the first allocator or generator call in a child forked without the hooks.

Pool children (``multiprocessing`` fork and forkserver, billiard: Celery's prefork pool) end
with ``os._exit``, which skips ``atexit``; a child that takes a lease runs the exit hooks from
its pool's own exit path instead (:func:`release_at_child_exit`, :mod:`.child_exit`), and on
SIGTERM, with which ``Pool.terminate()`` ends them (:mod:`snowflake_db.shutdown`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

from .. import forks
from ..shutdown import add_release_hook, release_on_sigterm_in_pool_child, signals_deferred
from . import child_exit

#: Per live allocator, weak references to its two hooks (it registers its own methods, so this
#: module calls nothing private and keeps no allocator alive).
_hooks: list[tuple[weakref.WeakMethod[Any], weakref.WeakMethod[Any]]] = []
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
    """In a pool child that will end with ``os._exit``, run the exit hooks from its pool's own
    exit path: multiprocessing's finalizers, or a billiard pool worker's ``on_exit``.

    Called whenever a lease is taken, so a recycled pool worker (``maxtasksperchild``, Celery's
    ``--max-tasks-per-child``) frees its slot as it ends rather than parking it for the lease
    length, and so does one that ``Pool.terminate()`` ends with SIGTERM (while SIGTERM has its
    default action). Once per process; a no-op outside such children.
    """
    global _finalizer_pid  # noqa: PLW0603
    pid = os.getpid()
    if _finalizer_pid == pid:
        return
    if child_exit.via_billiard(_at_exit) or child_exit.via_multiprocessing(_at_exit):
        _finalizer_pid = pid
        release_on_sigterm_in_pool_child()


def _after_fork_in_child(parent_pid: int) -> None:
    for after_fork, _ in _live():
        after_fork(parent_pid)


def _at_exit() -> None:
    forks.reset_if_forked()  # a child forked without the hooks must not close the parent's pools
    with signals_deferred():  # Pool.terminate()'s SIGTERM must not cut a release short
        for _, at_exit in _live():
            at_exit()


forks.on_fork(_after_fork_in_child)
atexit.register(_at_exit)
add_release_hook(_at_exit)  # snowflake_db.install_signal_handlers(): SIGTERM releases too
