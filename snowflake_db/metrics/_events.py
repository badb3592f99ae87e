"""The events of :mod:`snowflake_db.metrics` and the listeners told about each as it happens.

Kept apart from the counting (:mod:`._recorder`): listeners are the user's code, called
on the thread that saw the event, and one that raises must never reach the ID it was called for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["EVENTS", "Listener", "add_listener", "notify", "remove_listener"]

logger = logging.getLogger("snowflake_db.metrics")

#: Events reported to listeners, with the meaning of their value.
EVENTS = {
    "clock_wait": "seconds a call waited for the next tick (its sequences were used up)",
    "clock_rollback_tolerated": "ms the clock fell behind the last tick, within the tolerance",
    "clock_rollback_refused": "ms behind: a call raised ClockMovedBackwardsError",
    "lease_refused": "0: a call raised LeaseExpiredError or WorkerLeaseError (fenced)",
    "fence_ended": "seconds from the first refused call to the next ID issued",
    "lease_acquired": "seconds the acquisition took",
    "lease_acquisition_failed": "seconds the failed acquisition took",
    "lease_renewed": "seconds the renewal took",
    "lease_renewal_failed": "seconds the failed renewal took",
    "lease_lost": "0: a renewal found the slot taken or reaped",
}

#: ``listener(event, value)``: called on the thread that saw the event (a generator's slow path,
#: holding its lock, or the heartbeat thread). Keep it short and never issue IDs from it.
Listener = Callable[[str, float], None]

_listeners: tuple[Listener, ...] = ()
_listeners_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    """Call ``listener(event, value)`` for every event of :data:`EVENTS` from now on.

    A listener that raises is logged and skipped; it never affects the ID it was called for.
    """
    global _listeners  # noqa: PLW0603 - copy-on-write tuple: notifying reads it without a lock
    if not callable(listener):
        raise InvalidArgumentTypeError(f"listener must be callable, got {listener!r}")
    with _listeners_lock:
        if listener in _listeners:
            raise InvalidArgumentError(f"listener {listener!r} was already added")
        _listeners = (*_listeners, listener)


def remove_listener(listener: Listener) -> None:
    """Stop calling a listener given to :func:`add_listener`."""
    global _listeners  # noqa: PLW0603 - see add_listener
    with _listeners_lock:
        if listener not in _listeners:
            raise InvalidArgumentError(f"listener {listener!r} was not added")
        _listeners = tuple(known for known in _listeners if known != listener)


def notify(event: str, value: float) -> None:
    """Tell every listener; one that raises is logged and the others still hear it."""
    for listener in _listeners:
        try:
            listener(event, value)
        except Exception:
            logger.exception("snowflake_db: metrics listener %r failed on %s", listener, event)
