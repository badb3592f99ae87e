"""After a fork, one reset per process: by Python's fork hook, or by the first call that notices
a new process ID when the fork skipped the hooks.

A forked child must not use what it copied from its parent: locks another thread may have held
at the fork, ID windows the parent keeps issuing from, leases and pooled connections. Modules
register their part of the reset (:func:`on_fork`); it runs once per process, either from
``os.register_at_fork`` or, after a fork made from C without Python's hooks (uWSGI without
``py-call-uwsgi-fork-hooks``, see https://github.com/unbit/uwsgi/pull/2388), from
:func:`reset_if_forked`, which every slow path calls before it takes a lock.

The lock-free ``next_id`` cannot ask the kernel for the process ID per ID (a system call, some
200 ns, would halve its speed). It reads :data:`ready` instead: one byte in a page marked
``MADV_WIPEONFORK`` (Linux 4.14+, see madvise(2)), which the kernel zeroes in every child,
hooks or not, and the reset sets again. Where that is not available the byte is plain memory:
a fork without the hooks is then noticed at the child's next tick.

A child forked without the hooks also inherits the interpreter's GIL in whatever state the
parent's other threads left it: a thread that was waiting for it at the fork leaves a waiter
that will never wake, and the first thread the child starts can deadlock with the main one on
that condition variable, or the child's first I/O can block for ever. So the first call in
such a child runs CPython's own after-fork repair when it is safe (:func:`repair`: one OS
thread), which runs the fork hooks too; where it is not, the process never starts a thread of
ours (:func:`threads_allowed`) and its leases are renewed by their callers instead.

**The repair.** A fork made from C skips ``PyOS_AfterFork_Child``, which re-creates the GIL and
the interpreter's locks and runs the ``os.register_at_fork`` hooks. The child then inherits the
GIL's mutex and condition variables as the parent's other threads left them: with a thread
waiting for the GIL at the fork (a heartbeat, any busy thread), the condition variable keeps a
waiter that no longer exists, and the child's first release of the GIL (any I/O, such as a
database call) can block for ever in ``pthread_cond_signal``. :func:`repair` runs that function
itself, if it is safe: CPython on Linux, exactly one OS thread in the process (the function
forgets every other thread), and the import lock not held. Everything it needs is resolved in
the parent at import, and the thread count is read through libc with the GIL held, because
releasing the GIL is what can hang. Where it cannot run, the library starts no thread in the
child (:func:`threads_allowed`).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .errors import SnowflakeError

#: madvise(2) advice number on Linux, for Pythons whose ``mmap`` module lacks the name.
_LINUX_MADV_WIPEONFORK = 18
#: How long a thread waits for another thread of the same child to finish the reset.
_WAIT_FOR_RESET_S = 30.0


def _byte_wiped_on_fork() -> tuple[memoryview, bool]:
    """A byte set to 1 that the kernel zeroes in forked children, if it can; else plain."""
    advice = getattr(
        mmap, "MADV_WIPEONFORK", _LINUX_MADV_WIPEONFORK if sys.platform == "linux" else None
    )
    if advice is not None:
        try:
            # Only private anonymous memory can be wiped on fork.
            page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            page.madvise(advice)
        except (AttributeError, OSError, ValueError):
            pass
        else:
            view = memoryview(page)  # keeps the page mapped for the life of the process
            view[0] = 1
            return view, True
    return memoryview(bytearray(b"\x01")), False


#: ``ready[0]`` is 1 once this process may use its state (always in the first process); 0 in a
#: forked child until its reset has run, when :data:`WIPED_ON_FORK`.
ready, WIPED_ON_FORK = _byte_wiped_on_fork()

_pid = os.getpid()
#: Whether this process's after-fork reset ran from a first call rather than from the fork hook.
_forked_without_hooks = False
_resets: list[Callable[[int], None]] = []
#: The reset under way in this process, for threads of a hook-less child that arrive meanwhile.
_running: dict[int, threading.Event] = {}


def on_fork(reset: Callable[[int], None]) -> None:
    """Run ``reset(parent_pid)`` once in every forked child, before it uses anything copied.

    Resets run in registration order, from the fork hook (one thread, no lock held) or from the
    first call that notices the fork: they must only replace state, never wait for a lock.
    """
    if reset not in _resets:
        _resets.append(reset)


def threads_allowed() -> bool:
    """Whether this process may start threads: False in a child forked without Python's fork
    hooks (its GIL may be inherited mid-handoff; see the module docstring)."""
    reset_if_forked()
    return not _forked_without_hooks


def reset_if_forked() -> None:
    """Run this process's after-fork reset now if a fork skipped Python's hooks; call it before
    taking any lock copied from the parent. Cheap: one byte read where the kernel wipes it,
    else one system call."""
    if WIPED_ON_FORK and ready[0]:
        return  # the kernel clears the byte in every child: this process's reset has run
    if os.getpid() != _pid and not repair():  # repaired: the hook has just run
        _reset(hooks=False)


def _reset(*, hooks: bool = True) -> None:
    """Run every registered reset once in this process (the fork hook, or the first thread of a
    hook-less child to get here; the others wait for it), then mark the process ready."""
    global _pid, _forked_without_hooks  # noqa: PLW0603
    pid = os.getpid()
    if pid == _pid:
        return
    mine = threading.Event()
    running = _running.setdefault(pid, mine)  # atomic: one thread of this child wins
    if running is not mine:
        if not running.wait(_WAIT_FOR_RESET_S):
            raise SnowflakeError(
                f"pid {pid}: the after-fork reset started by another thread did not finish "
                f"within {_WAIT_FOR_RESET_S:g} s; no ID is issued from state copied from pid {_pid}"
            )
        return
    _forked_without_hooks = not hooks  # before the resets: they may start no thread
    errors: list[Exception] = []
    try:
        for reset in list(_resets):
            try:
                reset(_pid)
            except Exception as error:  # the other parts must still run
                errors.append(error)
    finally:
        for other in [key for key in _running if key != pid]:
            del _running[other]
        _pid = pid  # from here on this process is no longer "forked"
        ready[0] = 1
        mine.set()
    if errors:
        raise errors[0]


os.register_at_fork(after_in_child=_reset)


# -- CPython's own after-fork repair ---------------------------------------------------------

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
