"""A Celery pool process's parent-death signal: the process releases its slot before it ends.

Celery sets the parent-death signal of each prefork pool process to SIGKILL
(``prctl(PR_SET_PDEATHSIG)``, in ``celery.concurrency.prefork.process_initializer``), so that its
pool processes end with the worker. Linux sends that signal when the *thread* that forked the
process ends, not only when the parent process does (prctl(2): "the 'parent' in this case is
considered to be the thread that created this process"). billiard's threaded pool, which Celery
runs with brokers that have no event loop support (all but RabbitMQ, Redis and SQS), forks the
replacement of each recycled process (``--max-tasks-per-child``) from its supervisor thread,
and a warm shutdown (``Pool.close()``) ends that thread: each process it forked is killed then,
and one that was releasing its worker slot as it ended leaves the slot parked until its lease
expires. A worker that dies (SIGKILL, the OOM killer) ends all its pool processes the same way.

So a pool process that takes a lease changes its death signal from SIGKILL to
:data:`DEATH_SIGNAL` (:func:`take_over`), a real-time signal whose handler raises
``SystemExit`` at its first arrival, as billiard's terminate handler does: the process ends
through its exit path, which releases the slot with the signal held off (:class:`ExitRelease`,
:func:`snowflake_db.shutdown.signals_held`). The process ends when Celery's SIGKILL would have
ended it (a task it was running is interrupted, as before), but releases first.

Not billiard's terminate signal (SIGTERM): Linux sends the death signal again each time the
thread the process counts as its parent ends, and a killed worker's threads end one after
another, so it can arrive two or three times (measured: 1, 2 or 3 times from a parent with 9
threads). billiard's handler puts SIGTERM back to its default action at the first, and the
second then killed the process before its release began (a slot left live). The library's
handler ignores every arrival after the first.

A signal can be ignored or never handled (a task that swallows ``SystemExit``, or is inside C
code that does not return to Python), and a pool process must not outlive a dead worker. A
thread of the process watches the parent process (a pidfd, which becomes readable when the
whole process has ended, whatever its threads did before): once the parent has ended, the
process gets :data:`ORPHAN_EXIT_SECONDS` to end by itself, then the watch releases (if the exit
path has not) and sends it SIGKILL, as Celery intended.

Linux only (nowhere else has a parent-death signal); a no-op elsewhere and for a death signal
other than SIGKILL (the application chose it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from .. import forks
from ..shutdown import RELEASE_WAIT_SECONDS, keep_signals_off_this_thread, run_bounded

logger = logging.getLogger("snowflake_db.worker")

#: prctl(2) options (linux/prctl.h).
_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2

#: The death signal of a pool process the library took over: real-time (queued, never merged),
#: far from the few that glibc and common servers use, and handled by :func:`_parent_died`.
DEATH_SIGNAL = int(getattr(signal, "SIGRTMIN", 34)) + 6
#: How long a pool process whose parent process has ended gets to end by its death signal (its
#: exit path releases) before the watch releases its slot and kills it.
ORPHAN_EXIT_SECONDS = 10.0
#: Where a pidfd cannot be had (Linux before 5.3, a seccomp filter): how often the watch reads
#: the parent's process ID instead.
PARENT_POLL_SECONDS = 1.0


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` on Linux; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return function


def death_signal() -> int | None:
    """The calling thread's parent-death signal (0: none); None where it cannot be read."""
    prctl = _prctl()
    if prctl is None:
        return None
    value = ctypes.c_int(0)
    if prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) != 0:
        return None
    return value.value


class ExitRelease:
    """A pool process's release as it ends: run once, by whichever of its exit path and the
    parent watch comes first (the other waits for it), each wait at most
    :data:`~snowflake_db.shutdown.RELEASE_WAIT_SECONDS`."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._lock = threading.Lock()
        self._started = False
        self.done = threading.Event()

    def __call__(self) -> None:
        with self._lock:
            first, self._started = not self._started, True
        if not first:
            self.done.wait(RELEASE_WAIT_SECONDS)
            return

        def release() -> None:
            try:
                self._release()
            finally:
                self.done.set()

        run_bounded(release, RELEASE_WAIT_SECONDS)


#: Whether this process's death signal has arrived (its handler acts once).
_dying = False


def _parent_died(signum: int, frame: FrameType | None) -> None:
    """:data:`DEATH_SIGNAL`'s handler: the first arrival ends the process through its exit
    path, as billiard's terminate handler would; the ones after it change nothing."""
    global _dying  # noqa: PLW0603 - once per process
    if _dying:
        return
    _dying = True
    sys.exit(128 + signum)


def take_over(parent_pid: int, release: ExitRelease) -> bool:
    """In a pool process whose death signal is SIGKILL, make it :data:`DEATH_SIGNAL` and
    watch the parent process; whether it did. From the main thread only: the death signal is
    a property of the thread that sets it, and the kernel reads the main thread's."""
    if threading.current_thread() is not threading.main_thread():
        return False
    prctl = _prctl()
    if prctl is None or death_signal() != signal.SIGKILL:
        return False
    if not forks.threads_allowed():
        return False  # no watch possible: an orphan could outlive its parent; keep SIGKILL
    previous = signal.signal(DEATH_SIGNAL, _parent_died)
    if prctl(_PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0) != 0:
        signal.signal(DEATH_SIGNAL, previous)
        logger.debug("snowflake_db: prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    threading.Thread(
        target=_watch, args=(parent_pid, release), name="snowflake_db-parent-watch", daemon=True
    ).start()
    return True


def _watch(parent_pid: int, release: ExitRelease) -> None:
    keep_signals_off_this_thread()  # the death signal must reach the main thread
    try:
        _wait_for_exit(parent_pid)
        # The death signal is ending this process through its exit path, which releases.
        if not release.done.wait(ORPHAN_EXIT_SECONDS):
            logger.warning(
                "snowflake_db: pool process %d outlived its parent %d by %.0f s: releasing its "
                "worker slot and killing it",
                os.getpid(),
                parent_pid,
                ORPHAN_EXIT_SECONDS,
            )
            release()
    except Exception:  # a thread of ours must not die with a traceback on stderr
        logger.exception("snowflake_db: watching the parent process %d failed", parent_pid)
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_exit(parent_pid: int) -> None:
    """Return once the process ``parent_pid``, this process's parent, has ended."""
    pidfd: Any = getattr(os, "pidfd_open", None)
    fd = None
    if pidfd is not None:
        try:
            fd = pidfd(parent_pid)
        except OSError:  # gone already, or pidfds unavailable (ENOSYS, a seccomp EPERM)
            fd = None
    try:
        # Checked after the open: while it is our parent, the fd cannot be a reused PID's.
        if os.getppid() != parent_pid:
            return
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
            return
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_SECONDS)
    finally:
        if fd is not None:
            os.close(fd)
