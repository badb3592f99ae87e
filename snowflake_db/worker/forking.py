"""Process hooks: fork hygiene and release at a clean exit, for every live allocator.

After ``os.fork()`` the child owns copies of the parent's pooled connections and leases. It must
not use either: the connections' sockets are shared with the parent, and the leases are the
parent's. The hook drops the pools without closing them (``Engine.dispose(close=False)``, see
https://docs.sqlalchemy.org/en/20/core/pooling.html#using-connection-pools-with-multiprocessing-or-os-fork)
and marks inherited leases abandoned; generators then lease a new worker ID lazily.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Protocol


class _ProcessAware(Protocol):
    def _after_fork_in_child(self, parent_pid: int) -> None: ...

    def _close_at_exit(self) -> None: ...


_allocators: weakref.WeakSet[_ProcessAware] = weakref.WeakSet()
_pid = os.getpid()


def track(allocator: _ProcessAware) -> None:
    """Give ``allocator`` the fork and exit hooks for as long as it lives."""
    _allocators.add(allocator)


def _after_fork_in_child() -> None:
    global _pid
    parent_pid, _pid = _pid, os.getpid()
    for allocator in list(_allocators):
        allocator._after_fork_in_child(parent_pid)


def _at_exit() -> None:
    for allocator in list(_allocators):
        allocator._close_at_exit()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
