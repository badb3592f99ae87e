"""One bounded retry loop for the worker package's races with other processes.

Lock conflicts the server broke, tables another process is creating, a SQLite file another
process is switching to WAL, a generated key that already exists: each is retried a few times
with a short pause; the last failure (or one that ``retryable`` refuses) propagates.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

_T = TypeVar("_T")

#: Driver error codes of a transaction the server aborted to break a lock conflict: retry it.
#: MySQL/MariaDB 1213 deadlock; SQLSTATE 40001 serialization failure, 40P01 deadlock
#: (PostgreSQL). Never a lock wait timeout (1205): that is the allocator's bound on a database
#: that does not answer (timeouts.py), and retrying it would multiply the bound.
_CONFLICT_CODES = {1213}
_CONFLICT_SQLSTATES = {"40001", "40P01"}
#: Whole-transaction attempts when the server keeps aborting it over lock conflicts.
CONFLICT_ATTEMPTS = 5


def retry(
    attempt: Callable[[], _T],
    *,
    attempts: int,
    retryable: Callable[[Exception], bool],
    pause: Callable[[int], float],
) -> _T:
    """Call ``attempt`` until it returns, at most ``attempts`` times.

    After failure number ``n`` that ``retryable`` accepts, sleep ``pause(n)`` seconds and try
    again; any other failure, or the last one, propagates unchanged.
    """
    for number in range(1, attempts + 1):
        try:
            return attempt()
        except Exception as error:
            if number == attempts or not retryable(error):
                raise
            seconds = pause(number)
            if seconds > 0:
                time.sleep(seconds)
    raise AssertionError("unreachable")  # pragma: no cover


def jitter(low: float, high: float) -> Callable[[int], float]:
    """A pause growing with the attempt number, randomised so racing processes spread out."""
    return lambda number: random.uniform(low, high) * number


def is_conflict(error: Exception) -> bool:
    """Did the server abort the transaction to break a deadlock or a lock wait?"""
    if not isinstance(error, DBAPIError):
        return False
    original = error.orig
    if getattr(original, "sqlstate", None) in _CONFLICT_SQLSTATES:
        return True
    args: tuple[object, ...] = getattr(original, "args", ())
    return bool(args) and args[0] in _CONFLICT_CODES


def retry_conflicts(attempt: Callable[[], _T]) -> _T:
    """Run a whole transaction again (bounded) if the server aborted it over a lock conflict."""
    return retry(
        attempt, attempts=CONFLICT_ATTEMPTS, retryable=is_conflict, pause=jitter(0.005, 0.05)
    )
