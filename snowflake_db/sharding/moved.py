"""A write refused by a moving shard's fence: recognise it, reload the map, run the work again.

A shard move's fence (docs/design/shard-moves.md) refuses every write of the moving shard on its
source with SQLSTATE ``SFM01`` and ``DETAIL: shard=<k> target=<T> move=<m>`` (PostgreSQL), or
on MariaDB with a ``SIGNAL SQLSTATE 'SFM01'`` whose message carries ``SFM01 shard=<k>
target=<T> move=<m>`` (error 1644; PyMySQL 1.2 also reports the SQLSTATE, mysqlclient and
older PyMySQL only the number and the message). Nothing of the refused write committed, so
the work can run again once the router routes the shard to its new target.
:func:`shard_moved_error` finds that error however a driver or framework wrapped it
(psycopg's ``sqlstate``, psycopg2's ``pgcode``, the MySQL drivers' ``args``, SQLAlchemy's
``DBAPIError.orig``, Django's ``__cause__``) and returns it as
:class:`~snowflake_db.errors.ShardMovedError`; :func:`retry_shard_moved` runs a transaction
function until it passes the fence, refreshing the router between attempts, within a bounded
number of attempts and a bounded time.

Standard library only: the SQLAlchemy and Django helpers (``run_transaction`` in
:mod:`snowflake_db.sqlalchemy.sharding`, ``atomic_with_retry`` in
:mod:`snowflake_db.django.sharding`) wrap :func:`retry_shard_moved`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

from .._validate import require_int, require_seconds
from ..clock import monotonic
from ..errors import ShardMovedError

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_TIMEOUT_SECONDS",
    "SQLSTATE",
    "retry_shard_moved",
    "shard_moved_error",
]

logger = logging.getLogger("snowflake_db.sharding")

#: The SQLSTATE of the fence's error.
SQLSTATE = "SFM01"
#: The error number of a MariaDB fence's ``SIGNAL`` (``ER_SIGNAL_EXCEPTION``), as every MySQL
#: driver reports it: ``args == (1644, "... (SFM01 shard=<k> target=<T> move=<m>) ...")``.
MARIADB_ERRNO = 1644
#: How many times :func:`retry_shard_moved` runs the work at most, by default.
DEFAULT_ATTEMPTS = 8
#: How long :func:`retry_shard_moved` keeps trying at most, by default (seconds): longer than a
#: move's measured fence-to-flip pause (about 2 s) plus a router's refresh period.
DEFAULT_TIMEOUT_SECONDS = 15.0
#: The first pause between attempts; it doubles up to :data:`MAX_PAUSE_SECONDS`.
FIRST_PAUSE_SECONDS = 0.05
MAX_PAUSE_SECONDS = 2.0
#: How often ``refresh`` is called during a pause to see whether the map changed (seconds):
#: the attempt after the flip starts this long after it at most, not a whole pause.
POLL_SECONDS = 0.02

_DETAIL = re.compile(r"shard=(?P<shard>\d+) target=(?P<target>\S+) move=(?P<move>\d+)")
_MARIADB = re.compile(f"{SQLSTATE} " + _DETAIL.pattern)
T = TypeVar("T")


def shard_moved_error(error: BaseException) -> ShardMovedError | None:
    """The :class:`ShardMovedError` behind ``error`` (a fence's ``SFM01``, however wrapped), or
    ``None`` for any other error."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ShardMovedError):
            return current
        args: tuple[object, ...] = getattr(current, "args", ())
        if len(args) >= 2 and args[0] == MARIADB_ERRNO and isinstance(args[1], str):
            match = _MARIADB.search(args[1])
            if match is not None:
                return _from_mariadb(args[1], match)
        state = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if state == SQLSTATE:
            return _from_database(current)
        for name in ("orig", "__cause__", "__context__"):
            inner = getattr(current, name, None)
            if isinstance(inner, BaseException):
                pending.append(inner)
    return None


def _from_database(error: BaseException) -> ShardMovedError:
    diag = getattr(error, "diag", None)
    detail = getattr(diag, "message_detail", None) or str(error)
    match = _DETAIL.search(detail)
    if match is None:
        return ShardMovedError(
            f"a shard's fence refused the write (SQLSTATE {SQLSTATE}) without the expected "
            f"DETAIL 'shard=<k> target=<T> move=<m>': {error}",
            shard=-1,
            target="",
        )
    primary = getattr(diag, "message_primary", None) or str(error).splitlines()[0]
    return _moved(primary, match)


def _from_mariadb(message: str, match: re.Match[str]) -> ShardMovedError:
    return _moved(message.partition(f" ({SQLSTATE} ")[0], match)


def _moved(primary: str, match: re.Match[str]) -> ShardMovedError:
    """The error for a fence's refusal whose ``shard=.. target=.. move=..`` is ``match``."""
    shard, target, move = int(match["shard"]), match["target"], int(match["move"])
    return ShardMovedError(
        f"{primary} (shard {shard} moved to {target!r} by move {move}): reload the shard map "
        "and run the transaction again",
        shard=shard,
        target=target,
        move_id=move,
    )


def retry_shard_moved(
    work: Callable[[], T],
    *,
    refresh: Callable[[], object] | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    timeout_s: float = DEFAULT_TIMEOUT_SECONDS,
) -> T:
    """Run ``work`` (one whole transaction) until no fence refuses it, and return its result.

    After a refused attempt it calls ``refresh`` (a control-backed router's ``refresh``: one
    read of the map's version, the shard's new target is routed to from then on) and runs
    ``work`` again: at once after the first refusal (the map may have flipped since the attempt
    routed), then after a pause (50 ms, doubling up to 2 s) during which ``refresh`` is called
    every 20 ms and the pause ends as soon as it returns another value than before (the map
    changed: the flip is out), so the attempt after a flip lands within about 20 ms of it.
    Without ``refresh``, or when it returns ``None``, the pause is slept whole. Any other error
    is raised at once. After ``attempts`` runs, or when the next pause would end past
    ``timeout_s`` from the start, it raises :class:`ShardMovedError` saying how many attempts
    over how long, chained to the last refusal.
    """
    attempts = require_int("attempts", attempts, minimum=1)
    timeout_s = require_seconds("timeout_s", timeout_s, positive=True)
    started = monotonic()
    pause = FIRST_PAUSE_SECONDS
    attempt = 0
    seen: object = None  # what ``refresh`` returned before the last attempt
    while True:
        attempt += 1
        try:
            return work()
        except Exception as error:
            moved = shard_moved_error(error)
            if moved is None:
                raise
            last = moved
            cause: BaseException = error
        elapsed = monotonic() - started
        if attempt >= attempts or elapsed + pause > timeout_s:
            raise ShardMovedError(
                f"gave up after {attempt} attempt(s) in {elapsed:.2f} s (limits: {attempts} "
                f"attempts, {timeout_s:g} s): {last}",
                shard=last.shard,
                target=last.target,
                move_id=last.move_id,
            ) from cause
        if attempt == 1 and refresh is not None:
            # The attempt may have routed just before the flip: refresh and try again now.
            logger.info("snowflake_db: shard %d is fenced (move %s); attempt 2 after a map "
                        "refresh", last.shard, last.move_id)
            seen = _refreshed(refresh)
            continue
        logger.info(
            "snowflake_db: shard %d is fenced (move %s); attempt %d again within %.2f s (as "
            "soon as the map changes)", last.shard, last.move_id, attempt + 1, pause,
        )
        seen = _pause_until_changed(refresh, seen, pause)
        pause = min(pause * 2, MAX_PAUSE_SECONDS)


def _refreshed(refresh: Callable[[], object]) -> object:
    """``refresh()``'s value, or ``None`` when it failed (logged: the next attempt tells
    whether the old map still works)."""
    try:
        return refresh()
    except Exception as error:
        logger.warning("snowflake_db: refreshing the shard map failed: %s", error)
        return None


def _pause_until_changed(refresh: Callable[[], object] | None, seen: object,
                         pause: float) -> object:
    """Wait ``pause`` seconds, polling ``refresh`` every :data:`POLL_SECONDS` and returning
    early when its value differs from ``seen`` (a value both times: ``None`` tells nothing).
    Returns the last value ``refresh`` gave (``refresh`` runs once at least)."""
    if refresh is None:
        time.sleep(pause)
        return None
    if seen is None:
        time.sleep(pause)
        return _refreshed(refresh)
    deadline = monotonic() + pause
    value: object = None
    for _ in range(int(pause / POLL_SECONDS) + 2):  # bounded in count as well as in time
        time.sleep(max(0.0, min(POLL_SECONDS, deadline - monotonic())))
        value = _refreshed(refresh)
        if (value is not None and value != seen) or monotonic() >= deadline:
            break
    return value
