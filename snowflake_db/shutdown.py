"""Release worker leases when the process is told to stop (SIGTERM, SIGINT): opt in.

Containers and service managers (Kubernetes, ``docker stop``, systemd) stop a process with
SIGTERM, whose default action ends it without running ``atexit``: its worker slot would stay
parked for the lease length, on every rolling deploy. :func:`install_signal_handlers` releases
first, then does what the signal did before (the default action ends the process with the usual
signal status; a Python handler is called). The core knows no database: allocators register what
to run here (:func:`add_release_hook`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

from .errors import SignalHandlersError

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

_release_hooks: list[Callable[[], None]] = []
_previous: dict[int, _Handler] = {}


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
    if _previous:
        raise SignalHandlersError(
            "snowflake_db.install_signal_handlers() was already called in this process (for "
            f"{', '.join(signal.Signals(s).name for s in _previous)}); call it once"
        )
    if threading.current_thread() is not threading.main_thread():
        raise SignalHandlersError(
            "snowflake_db.install_signal_handlers() must be called from the main thread "
            f"(Python runs signal handlers there), not from {threading.current_thread().name!r}"
        )
    chosen = [signal.Signals(s) for s in signals]
    for signum in chosen:
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:
            continue
        _previous[signum] = previous
        signal.signal(signum, _release_then_chain)


def _release_then_chain(signum: int, frame: FrameType | None) -> None:
    for hook in list(_release_hooks):
        hook()  # the hooks log their own failures; the signal must go on regardless
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    # SIG_DFL (or a handler not set from Python): let the default action happen.
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
