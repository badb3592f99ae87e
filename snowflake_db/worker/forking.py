"""Process hooks: fork hygiene and release at a clean exit, for every live allocator.

After ``os.fork()`` the child owns copies of the parent's pooled connections and leases. It must
not use either: the connections' sockets are shared with the parent, and the leases are the
parent's. The hook drops the pools without closing them (``Engine.dispose(close=False)``, see
https://docs.sqlalchemy.org/en/20/core/pooling.html#using-connection-pools-with-multiprocessing-or-os-fork)
and marks inherited leases abandoned; generators then lease a new worker ID lazily.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

#: Per live allocator, weak references to its two hooks (it registers its own methods, so this
#: module calls nothing private and keeps no allocator alive).
_hooks: list[tuple[weakref.WeakMethod[Any], weakref.WeakMethod[Any]]] = []
_pid = os.getpid()


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
