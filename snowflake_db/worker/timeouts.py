"""How long one statement of the allocator may wait for the control database, on each backend.

A database that does not answer must cost an :class:`~snowflake_db.AllocatorUnavailableError`
within seconds, as a database that is down does, never a caller blocked for as long as someone
holds a lock on the slots table. Every connection of an allocator's engine gets the same bound
``seconds`` (:func:`statement_seconds`):

* PostgreSQL: ``statement_timeout`` and ``lock_timeout`` for the session, ``connect_timeout``
  (at least :data:`MIN_CONNECT_SECONDS`, see below), ``tcp_user_timeout`` (a host that
  vanished with a request unanswered) and ``idle_in_transaction_session_timeout`` (see below).
  https://www.postgresql.org/docs/current/runtime-config-client.html
* MariaDB / MySQL: ``lock_wait_timeout`` (table locks) and ``innodb_lock_wait_timeout`` (row
  locks), ``max_statement_time`` (MariaDB) or ``max_execution_time`` (MySQL); PyMySQL's
  ``connect_timeout`` (the TCP connect, at least :data:`MIN_CONNECT_SECONDS`), and
  ``read_timeout`` / ``write_timeout`` one second longer than the bound, for a server that stops
  answering at all (the handshake is a read: it gets the read timeout); on MariaDB also
  ``idle_transaction_timeout``.
  https://mariadb.com/kb/en/server-system-variables/
* SQLite: the busy timeout (how long a statement waits for another connection's lock), at
  least :data:`SQLITE_MIN_BUSY_SECONDS`: SQLite's lock waits are not fair (a waiting writer
  polls, and a busier one can take the lock between its polls), so a shorter wait could fail a
  healthy holder's renewal beside a process that retries in a loop.

The other way round, a holder frozen inside one of its transactions (SIGSTOP, a paused VM)
keeps the slot row it renews locked, and the next process whose claim lands on that slot would
wait out its bound and fail. So the server ends an allocator session that stays idle inside a
transaction for a whole lease (:func:`idle_transaction_seconds`, at least
:data:`MIN_IDLE_TRANSACTION_SECONDS`): by then the frozen holder's lease has passed its local
deadline, so ending its transaction takes nothing it could still use (when it runs again its
renewal fails and it fences, as after any failed renewal). SQLite has no such limit:
a frozen holder keeps the file locked until it runs again.

A slow database that answers within the bound works as before. A new connection may take
longer than one statement: a server under load starts a session in seconds (PostgreSQL forks a
backend and, on a database new to it, builds its catalog caches), so libpq's connect waits at
least :data:`MIN_CONNECT_SECONDS`; a server that is down refuses at once whatever the limit. A
timed-out statement is never retried by the allocator (:func:`is_timeout`): one bound, not a
multiple of it.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry

#: Bounds on the per-statement limit, whatever the lease length.
MIN_STATEMENT_SECONDS = 1.0
MAX_STATEMENT_SECONDS = 10.0
#: Shortest connect timeout: with a 6 s lease's 2 s, four processes starting beside a second
#: test suite once waited longer than that for PostgreSQL to start their sessions.
MIN_CONNECT_SECONDS = 5
#: Shortest idle time inside a transaction before the server ends the session: a process on a
#: loaded machine can stall for seconds between two statements (a renewal once took 2.8 s
#: beside a second test suite), and a short lease must not cost it its acquisition.
MIN_IDLE_TRANSACTION_SECONDS = 5.0
#: Shortest SQLite busy timeout (see above).
SQLITE_MIN_BUSY_SECONDS = 5.0
#: SQLSTATEs of a statement PostgreSQL cancelled at its statement or lock timeout.
_PG_TIMEOUTS = {"57014", "55P03"}
#: MariaDB/MySQL: lock wait timeout, max_statement_time, max_execution_time, lost connection
#: (the read timeout), server gone.
_MYSQL_TIMEOUTS = {1205, 1969, 3024, 2013, 2006}


def statement_seconds(lease_seconds: float) -> float:
    """The bound for ``lease_seconds``: a third of the lease, within 1 to 10 seconds."""
    return min(MAX_STATEMENT_SECONDS, max(MIN_STATEMENT_SECONDS, lease_seconds / 3))


def bound_seconds(backend: str, lease_seconds: float) -> float:
    """How long one statement may wait on ``backend`` (``postgresql``, ``mariadb``, ``mysql``,
    ``sqlite``) for an allocator with this lease length."""
    seconds = statement_seconds(lease_seconds)
    return max(seconds, SQLITE_MIN_BUSY_SECONDS) if backend == "sqlite" else seconds


def idle_transaction_seconds(lease_seconds: float) -> float:
    """How long an allocator's session may stay idle inside a transaction: a whole lease."""
    return max(MIN_IDLE_TRANSACTION_SECONDS, lease_seconds)


def connect_args(url: URL, seconds: float) -> dict[str, Any]:
    """Driver arguments bounding connects and (client side) reads; the URL's own win."""
    backend, driver, query = url.get_backend_name(), url.get_driver_name(), url.query
    whole = max(1, math.ceil(seconds))
    connecting = max(whole, MIN_CONNECT_SECONDS)
    args: dict[str, Any] = {}
    if backend == "postgresql":
        args["connect_timeout"] = connecting
        if _libpq_version(driver) >= 120000:  # libpq 12 added tcp_user_timeout
            args["tcp_user_timeout"] = round(seconds * 1000)
    elif backend in ("mysql", "mariadb") and driver == "pymysql":
        args["connect_timeout"] = connecting
        args["read_timeout"] = args["write_timeout"] = whole + 1
    elif backend == "sqlite":
        args["timeout"] = max(seconds, SQLITE_MIN_BUSY_SECONDS)
    return {name: value for name, value in args.items() if name not in query}


def _libpq_version(driver: str) -> int:
    """The libpq the PostgreSQL driver runs on (e.g. 160004), or 0 when unknown."""
    try:
        if driver == "psycopg":
            import psycopg

            return int(psycopg.pq.version())
        if driver == "psycopg2":
            import psycopg2.extensions  # type: ignore[import-untyped]

            return int(psycopg2.extensions.libpq_version())
    except (ImportError, AttributeError):
        pass
    return 0


def bound_sessions(engine: Engine, seconds: float, *, idle_seconds: float | None = None) -> None:
    """Set the server-side statement and lock limits on every new connection of ``engine``,
    and (``idle_seconds``) how long a session may stay idle inside a transaction."""
    backend = engine.url.get_backend_name()
    if backend not in ("postgresql", "mysql", "mariadb"):
        return
    whole = max(1, math.ceil(seconds))

    @event.listens_for(engine, "connect")
    def _limit(dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        try:
            limits = _session_limits(backend, dbapi_connection, seconds, whole, idle_seconds)
            for statement in limits:
                cursor.execute(statement)
        finally:
            cursor.close()
        dbapi_connection.commit()  # PostgreSQL's SET is transactional


def _session_limits(
    backend: str, dbapi_connection: Any, seconds: float, whole: int, idle_seconds: float | None
) -> list[str]:
    if backend == "postgresql":
        ms = round(seconds * 1000)
        limits = [f"SET statement_timeout = {ms}", f"SET lock_timeout = {ms}"]
        if idle_seconds is not None:
            limits.append(f"SET idle_in_transaction_session_timeout = {round(idle_seconds * 1000)}")
        return limits
    limits = [f"SET SESSION lock_wait_timeout = {whole}"]
    limits.append(f"SET SESSION innodb_lock_wait_timeout = {whole}")
    info = getattr(dbapi_connection, "get_server_info", None)
    version = str(info()) if callable(info) else ""
    if "mariadb" in version.lower():
        limits.append(f"SET SESSION max_statement_time = {seconds:.3f}")
        if idle_seconds is not None:  # MariaDB 10.3+; MySQL has no such limit
            limits.append(f"SET SESSION idle_transaction_timeout = {math.ceil(idle_seconds)}")
    else:
        limits.append(f"SET SESSION max_execution_time = {round(seconds * 1000)}")
    return limits


def is_timeout(error: BaseException) -> bool:
    """Did a statement fail because the database did not answer within the bound?"""
    if not isinstance(error, DBAPIError):
        return False
    original = error.orig
    if getattr(original, "sqlstate", None) in _PG_TIMEOUTS:
        return True
    args: tuple[object, ...] = getattr(original, "args", ())
    if args and args[0] in _MYSQL_TIMEOUTS:
        return True
    text = str(original).lower()
    return "database is locked" in text or "timeout expired" in text
