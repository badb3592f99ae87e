"""CPython's own after-fork repair, run late in a child forked without Python's fork hooks.

A fork made from C (uWSGI without ``py-call-uwsgi-fork-hooks``) skips ``PyOS_AfterFork_Child``,
which re-creates the GIL and the interpreter's locks and runs the ``os.register_at_fork`` hooks.
The child then inherits the GIL's mutex and condition variables as the parent's other threads
left them: with a thread waiting for the GIL at the fork (a heartbeat, any busy thread), the
condition variable keeps a waiter that no longer exists, and the child's first release of the
GIL (any I/O, such as a database call) can block for ever in ``pthread_cond_signal``.

At the first call of this library in such a child, :func:`repair` runs that function itself, if
it is safe: CPython on Linux, exactly one OS thread in the process (the function forgets every
other thread), and the import lock not held. Everything it needs is resolved in the parent at
import, and the thread count is read through libc with the GIL held, because releasing the GIL
is what can hang. Where it cannot run, the library starts no thread in the child
(:func:`snowflake_db.forks.threads_allowed`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

_STATUS = b"/proc/self/status"
_THREADS = b"\nThreads:"


def _resolve() -> tuple[Callable[[], Any], Any] | None:
    """``PyOS_AfterFork_Child`` and libc, both called with the GIL held (``PyDLL``)."""
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.pythonapi  # dlopen(NULL): the interpreter and libc, GIL held in calls
        after_fork = libc.PyOS_AfterFork_Child
        after_fork.restype = None
        after_fork.argtypes = []
        buffer = ctypes.create_string_buffer(4096)
        libc.open.restype = libc.read.restype = libc.close.restype = ctypes.c_int
    except (ImportError, AttributeError, OSError):
        return None
    return after_fork, (libc, buffer)


_resolved = _resolve()


def _os_threads(libc: Any, buffer: Any) -> int | None:
    """The process's OS threads, from ``/proc/self/status``, without releasing the GIL."""
    fd = libc.open(_STATUS, os.O_RDONLY)
    if fd < 0:
        return None
    try:
        count = libc.read(fd, buffer, len(buffer) - 1)
    finally:
        libc.close(fd)
    if count <= 0:
        return None
    text = buffer.raw[:count]
    at = text.find(_THREADS)
    if at < 0:
        return None
    digits = text[at + len(_THREADS) :].split(b"\n", 1)[0].strip()
    return int(digits) if digits.isdigit() else None


def repair() -> bool:
    """Run CPython's after-fork repair (and with it every fork hook) now if that is safe;
    False when it cannot (then no hook ran)."""
    if _resolved is None:
        return False
    after_fork, (libc, buffer) = _resolved
    if _os_threads(libc, buffer) != 1:
        return False
    import _imp  # built in, already imported: no file is read

    if _imp.lock_held():
        return False
    after_fork()
    return True
