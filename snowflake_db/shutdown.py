"""Release worker leases when the process is told to stop (SIGTERM, SIGINT): opt in.

Containers and service managers (Kubernetes, ``docker stop``, systemd) stop a process with
SIGTERM, whose default action ends it without running ``atexit``: its worker slot would stay
parked for the lease length, on every rolling deploy. :func:`install_signal_handlers` releases
first, then does what the signal did before (the default action ends the process with the usual
signal status; a Python handler is called). The core knows no database: allocators register what
to run here (:func:`add_release_hook`).

Pool children (``multiprocessing``, billiard) get the same for SIGTERM without opting in
(:func:`release_on_sigterm_in_pool_child`): ``Pool.terminate()``, which ``with Pool() as pool``
calls on leaving the block, ends them with it.

The release runs in a helper thread, waited for at most :data:`RELEASE_WAIT_SECONDS`: the
signal may have interrupted the main thread inside a lock the release needs, and the process
must end regardless. While the main thread runs the exit hooks itself (:func:`signals_deferred`)
a handled signal waits for them instead of cutting their release short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType

from . import forks
from .errors import SignalHandlersError

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

#: Longest wait for the release before the signal goes on: a connect and one statement, each
#: bounded by the allocator (snowflake_db.worker._engine: at most 10 s).
RELEASE_WAIT_SECONDS = 15.0

_release_hooks: list[Callable[[], None]] = []
_previous: dict[int, _Handler] = {}
#: Signals handled without install_signal_handlers() (pool children's SIGTERM).
_automatic: set[int] = set()
#: How long a pool child's SIGTERM may wait for its main thread to start the handler before
#: the watchdog ends the process (the main thread runs it within milliseconds unless it is stuck
#: in C code that no signal interrupts).
STUCK_HANDLER_GRACE_SECONDS = 5.0
#: Whether a handled signal's handler has started in this process (the watchdog's question).
_handler_started = False
#: The SIGTERM watchdog's pipe in this process, ``(read_fd, write_fd)``: the wakeup fd.
_watchdog_pipe: tuple[int, int] | None = None
#: While above 0 the main thread is running the exit hooks; signals that arrive meanwhile.
_exiting_depth = 0
_deferred: list[int] = []


def add_release_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` (release every lease this process holds) when a handled signal arrives."""
    if hook not in _release_hooks:
        _release_hooks.append(hook)


def install_signal_handlers(
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """Release this process's worker leases on these signals, then chain to the previous handler.

    Call once, from the main thread, after your server has installed its own handlers (they are
    chained to, so their behaviour is kept). A signal that is ignored (``SIG_IGN``) stays ignored.
    After a handled signal the table allocators are closed: a process that survives it (its own
    handler returned) cannot lease again.
    """
    installed = [signum for signum in _previous if signum not in _automatic]
    if installed:
        raise SignalHandlersError(
            "snowflake_db.install_signal_handlers() was already called in this process (for "
            f"{', '.join(signal.Signals(s).name for s in installed)}); call it once"
        )
    if threading.current_thread() is not threading.main_thread():
        raise SignalHandlersError(
            "snowflake_db.install_signal_handlers() must be called from the main thread "
            f"(Python runs signal handlers there), not from {threading.current_thread().name!r}"
        )
    chosen = [signal.Signals(s) for s in signals]
    for signum in chosen:
        previous = signal.getsignal(signum)
        if signum in _automatic:  # already ours (a pool child's SIGTERM): keep what it chains to
            _automatic.discard(signum)
            continue
        if previous is signal.SIG_IGN:
            continue
        _previous[signum] = previous
        signal.signal(signum, _release_then_chain)


def release_on_sigterm_in_pool_child() -> None:
    """In a pool child, release before SIGTERM's default action ends the process.

    Only from the main thread (where Python runs handlers), and only while SIGTERM has its
    default action: a handler set by the application or its server stays as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.SIGTERM in _previous or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    _previous[signal.SIGTERM] = signal.SIG_DFL
    _automatic.add(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _release_then_chain)
    _watch_for_a_stuck_main_thread()


def _watch_for_a_stuck_main_thread() -> None:
    """Keep SIGTERM's default promise in a pool child: the process ends.

    Python runs the handler that replaced the default action in the main thread, when that
    thread next runs Python code. One stuck in C code that no signal interrupts (a mutex
    inherited locked across the fork, a C library's call that retries on ``EINTR``) never does,
    and ``Pool.terminate()`` then waits for the child for ever, where the default action would
    have ended it at once. The signal's C-level handler writes its number to the wakeup fd at
    once, whatever the main thread does; a watchdog thread reading it gives the handler
    :data:`STUCK_HANDLER_GRACE_SECONDS` to start, then releases (bounded, as the handler
    would) and ends the process with SIGKILL. Not armed where a wakeup fd is set already (an
    asyncio loop's) or no thread may start."""
    global _watchdog_pipe  # noqa: PLW0603
    if _watchdog_pipe is not None or not forks.threads_allowed():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:  # someone else's: theirs to keep
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    _watchdog_pipe = (read_fd, write_fd)
    threading.Thread(target=_watchdog, args=(read_fd,), name="snowflake_db-sigterm-watchdog",
                     daemon=True).start()


def _watchdog(read_fd: int) -> None:
    keep_signals_off_this_thread()
    while True:
        try:
            arrived = os.read(read_fd, 64)
        except OSError:  # closed by a fork's reset
            return
        if not arrived:
            return
        if signal.SIGTERM not in arrived:
            continue
        deadline = time.monotonic() + STUCK_HANDLER_GRACE_SECONDS
        while time.monotonic() < deadline:
            if _handler_started:  # it ends the process (its chain is SIGTERM's default)
                return
            time.sleep(0.02)
        _run_release_hooks(RELEASE_WAIT_SECONDS)  # what the handler could not start
        os.kill(os.getpid(), signal.SIGKILL)


def _forget_the_watchdog(_parent_pid: int) -> None:
    """A forked child has no watchdog thread: its signals must not fill the parent's pipe (the
    wakeup fd is inherited). From the main thread (the fork hook's) the fd is unset and the
    pipe closed; elsewhere the pipe stays open, so that the fd never names another file."""
    global _watchdog_pipe, _handler_started  # noqa: PLW0603
    _handler_started = False
    if _watchdog_pipe is None or threading.current_thread() is not threading.main_thread():
        return
    current = signal.set_wakeup_fd(-1)
    if current != _watchdog_pipe[1]:
        signal.set_wakeup_fd(current)  # not ours any more: put it back
    for fd in _watchdog_pipe:
        os.close(fd)
    _watchdog_pipe = None


forks.on_fork(_forget_the_watchdog)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Run the exit hooks from the main thread: a handled signal that arrives meanwhile goes
    on after them, so it does not end the process halfway through a release."""
    global _exiting_depth  # noqa: PLW0603
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _exiting_depth += 1
    try:
        yield
    finally:
        _exiting_depth -= 1
        if _exiting_depth == 0 and _deferred:
            signum = _deferred[0]
            _deferred.clear()
            _chain(signum, None)


def _release_then_chain(signum: int, frame: FrameType | None) -> None:
    global _handler_started  # noqa: PLW0603
    _handler_started = True
    if _exiting_depth:
        _deferred.append(signum)
        return
    _run_release_hooks(RELEASE_WAIT_SECONDS)
    _chain(signum, frame)


#: Signals a thread raises by its own fault (and the two no process can catch): never blocked.
_THREAD_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGKILL",
                 "SIGSTOP")
    if hasattr(signal, name)
)


def keep_signals_off_this_thread() -> None:
    """Block the signals sent to the whole process in the calling (background) thread.

    The kernel hands a process-directed signal to any thread that does not block it. Python
    runs its handler in the main thread only, when that thread next runs Python code: a
    SIGTERM that lands on a library thread while the main thread waits in C without a timeout
    (a pool child idle in its task queue's lock) is never handled, and ``Pool.terminate()``
    waits for that child for ever (seen once: a pool child with a lease, SIGTERM caught on its
    heartbeat thread). Blocked here, such signals go to the main thread, whose wait they end.
    """
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _THREAD_SIGNALS)


def _run_release_hooks(wait_seconds: float) -> None:
    """Run the hooks, waiting for them at most ``wait_seconds`` (see :func:`run_bounded`)."""
    run_bounded(_run_hooks, wait_seconds)


def run_bounded(work: Callable[[], None], wait_seconds: float) -> bool:
    """Run ``work`` (a release) in a helper thread and wait for it at most ``wait_seconds``;
    inline in a process that may start no thread (forked without Python's hooks and not
    repaired). Whether it finished within the wait."""
    if not forks.threads_allowed():
        work()
        return True
    done = threading.Event()

    def release() -> None:
        keep_signals_off_this_thread()
        try:
            work()
        finally:
            done.set()

    threading.Thread(target=release, name="snowflake_db-release", daemon=True).start()
    return done.wait(wait_seconds)


@contextlib.contextmanager
def signals_held(signums: Iterable[int]) -> Iterator[None]:
    """Hold these signals off the main thread for the block, whoever handles them, then let
    the first that arrived go on (its handler runs, or its default action happens).

    For a billiard pool process's release as it ends: billiard's own handler of its terminate
    signal raises ``SystemExit`` wherever the main thread is, which would cut the release short
    (:mod:`snowflake_db.worker._parent_death`). The block must be bounded (:func:`run_bounded`):
    the process cannot be ended by these signals meanwhile. Ignored signals stay ignored; a
    no-op outside the main thread, where handlers cannot be changed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    saved: dict[int, _Handler] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        arrived.append(signum)

    try:
        for signum in signums:
            handler = signal.getsignal(signum)
            if handler is signal.SIG_IGN or handler is None:  # None: set from C, left alone
                continue
            saved[signum] = handler
            signal.signal(signum, hold)
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        if arrived:
            signal.raise_signal(arrived[0])


def _run_hooks() -> None:
    for hook in list(_release_hooks):
        hook()  # the hooks log their own failures; the signal must go on regardless


def _chain(signum: int, frame: FrameType | None) -> None:
    """Do what ``signum`` did before this module handled it."""
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    # SIG_DFL (or a handler not set from Python): let the default action happen.
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
