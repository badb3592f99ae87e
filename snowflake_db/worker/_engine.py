"""Engine set-up: the control database's URL, the private engine an allocator owns, the bound
on every statement, and the one bounded retry loop.

**The engine** is never the application's pool, never its transactions. Each allocator opens one
small private engine on the control database's URL (:func:`make_engine`), used by its heartbeat
thread and for acquiring and releasing, so a caller's transaction (or rollback) can never include
a lease statement and a busy application pool can never starve a renewal. It keeps one idle
connection (a prefork server with N workers holds N), checked with a pre-ping.
:class:`ControlDatabase` runs work on it and creates missing tables on demand: until the worker
tables are known to exist, a database error from the work triggers a check, so the inspection
stays off the common path.

**The URL** (:func:`to_url`, :func:`check_supported`) must name the control database fully;
``postgres://``, ``mysql://`` and ``mariadb://`` get the installed driver. This is the one URL
normaliser: the CLI and :func:`snowflake_db.sqlalchemy.engine_url` use it too.

**The retry loop** (:func:`retry`): lock conflicts the server broke, tables another process is
creating, a SQLite file another process is switching to WAL, a generated key that already exists:
each is retried a few times with a short pause; the last failure (or one that ``retryable``
refuses) propagates.

**Statement bounds.** How long one statement may wait for the control database, on each backend:

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

import importlib.util
import math
import random
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry

from ..errors import AllocatorUnavailableError, InvalidArgumentError, InvalidArgumentTypeError
from ..process import URL_FORMS
from . import _process_hooks
from ._store import WorkerStore

_T = TypeVar("_T")


# -- the retry loop --------------------------------------------------------------------------


#: Driver error codes of a transaction the server aborted to break a lock conflict: retry it.
#: MySQL/MariaDB 1213 deadlock; SQLSTATE 40001 serialization failure, 40P01 deadlock
#: (PostgreSQL). Never a lock wait timeout (1205): that is the allocator's bound on a database
#: that does not answer (the statement bounds), and retrying it would multiply the bound.
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


# -- statement bounds ------------------------------------------------------------------------

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


def bounded_connect_args(url: URL, seconds: float) -> dict[str, Any]:
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


# -- URLs and the engine ---------------------------------------------------------------------

#: backend -> (driver modules in order of preference as (module, SQLAlchemy driver), extra)
_DRIVERS = {
    "postgresql": ((("psycopg", "psycopg"), ("psycopg2", "psycopg2")), "postgres"),
    "mysql": ((("pymysql", "pymysql"), ("MySQLdb", "mysqldb")), "mysql"),
    "mariadb": ((("pymysql", "pymysql"), ("MySQLdb", "mysqldb")), "mysql"),
}
_BACKEND_ALIASES = {"postgres": "postgresql"}

#: ``application_name`` of the allocator's PostgreSQL connections (see pg_stat_activity).
APPLICATION_NAME = "snowflake_db worker leases"


def to_url(url_or_engine: str | URL | Engine) -> URL:
    """The URL of a string, URL or Engine (an Engine is used for its URL only); a string is
    parsed by :func:`parse_url`."""
    if isinstance(url_or_engine, Engine):
        return url_or_engine.url
    if isinstance(url_or_engine, URL):
        return url_or_engine
    if isinstance(url_or_engine, str):
        return parse_url(url_or_engine, origin=_WORKER_ORIGIN)
    raise InvalidArgumentTypeError(
        "TableWorkerAllocator needs a database URL (str or sqlalchemy URL) or an Engine, "
        f"got {type(url_or_engine).__name__}"
    )


#: How the allocator's messages name its URL (the CLI names the option or variable instead).
_WORKER_ORIGIN = "the worker database URL "


def normalise_url(text: str, *, origin: str = "") -> URL:
    """The one URL normaliser: ``text`` (a platform's ``DATABASE_URL`` or a SQLAlchemy URL)
    parsed, with the installed driver named (:func:`with_installed_driver`) and refused when
    it leaves the server or database to the driver's defaults (:func:`check_supported`).

    Every refusal is an :class:`~snowflake_db.errors.InvalidArgumentError` beginning with
    ``origin``, how the user gave the URL (``"--url "``, ``"SNOWFLAKE_WORKER_URL="``); the
    CLI and the allocator print the same words.
    """
    url = parse_url(text, origin=origin)
    check_supported(url, origin=origin, shown=safe_url_text(text))  # as the user wrote it
    return url


def parse_url(text: str, *, origin: str = "") -> URL:
    """``text`` as a URL with the installed driver named, or an error naming it (password
    hidden) after ``origin``."""
    try:
        url = make_url(text.strip())
    except Exception:
        shown = text if "@" not in text else safe_url_text(text)  # no password to hide
        raise InvalidArgumentError(
            f"{origin}{shown!r} is not a database URL; use {URL_FORMS}"
        ) from None
    return with_installed_driver(url, origin=origin)


def with_installed_driver(url: URL, *, origin: str = "") -> URL:
    """``postgres://``, ``mysql://``, ``mariadb://`` (a platform's ``DATABASE_URL``) with the
    installed driver named, or an error naming the URL and what to install or write instead."""
    backend, _, driver = url.drivername.partition("+")
    backend = _BACKEND_ALIASES.get(backend, backend)
    if backend == "sqlite":
        return url
    text = f"{origin}{safe_url_text(url)}"
    if backend not in _DRIVERS:
        raise InvalidArgumentError(f"{text}: unknown database {backend!r}; use {URL_FORMS}")
    candidates, extra = _DRIVERS[backend]
    if not driver:
        installed = [name for module, name in candidates if importlib.util.find_spec(module)]
        if not installed:
            raise InvalidArgumentError(
                f"{text}: no {backend} driver is installed; pip install 'snowflake-db[{extra}]'"
            )
        driver = installed[0]
    url = url.set(drivername=f"{backend}+{driver}")
    try:
        url.get_dialect()
    except Exception:  # SQLAlchemy raises its plugin loader's own errors
        raise InvalidArgumentError(
            f"{text}: SQLAlchemy knows no {backend} driver {driver!r}; leave it out "
            f"({backend}://USER@HOST/DB picks the installed one)"
        ) from None
    return url


def safe_url_text(url: str | URL) -> str:
    """The URL for messages, password hidden."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable URL>"


def check_supported(url: URL, *, origin: str = _WORKER_ORIGIN, shown: str | None = None) -> None:
    """Refuse a URL that does not say which database holds the worker tables.

    Without a host (or socket) and a database name, drivers fall back to their defaults
    (libpq's ``PGHOST``/``PGDATABASE`` or local socket, MySQL's localhost): processes configured
    alike could lease from different tables, and their IDs collide. SQLite must be a file: an
    in-memory database is private to one connection, so its leases protect nothing.
    ``shown`` is the URL as given (default: ``url``, password hidden).
    """
    missing = unnamed_part(url)
    if missing is None:
        return
    text = f"{origin}{shown if shown is not None else safe_url_text(url)}"
    if missing == "file":
        raise InvalidArgumentError(
            f"{text} names no SQLite file; use sqlite:///PATH (in-memory SQLite is private to "
            "one connection: leases there protect nothing)"
        )
    if missing == "host":
        raise InvalidArgumentError(
            f"{text} names no host or socket; write it out (e.g. "
            f"{url.get_backend_name()}://USER@127.0.0.1/DB, or ?host=/path/to/socket) rather "
            "than relying on the driver's defaults"
        )
    raise InvalidArgumentError(
        f"{text} names no database; add /DBNAME after the host rather than relying on the "
        "driver's defaults"
    )


def unnamed_part(url: URL) -> Literal["file", "host", "database"] | None:
    """What ``url`` leaves to the driver's defaults: no SQLite ``file`` (in-memory), no
    ``host`` (or socket), no ``database``; None when it names all."""
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        in_memory = (
            database in ("", ":memory:")
            or database.startswith("file::memory:")
            or _query_value(url, "mode") == "memory"
        )
        return "file" if in_memory else None
    if not (url.host or _query_value(url, "host") or _query_value(url, "unix_socket")):
        return "host"
    if not (url.database or _query_value(url, "dbname")):
        return "database"
    return None


def _query_value(url: URL, name: str) -> str:
    """A query parameter's (first) value, or ``""``; SQLAlchemy keeps repeats as a tuple."""
    value = url.query.get(name)
    if isinstance(value, tuple):
        value = value[0] if value else None
    return value or ""


def make_engine(
    url: URL,
    *,
    timeout_seconds: float,
    idle_transaction_seconds: float | None = None,
    engine_options: Mapping[str, Any] | None = None,
) -> Engine:
    """A small private engine with driver timeouts, pre-ping and SQLite locking set up.

    ``idle_transaction_seconds``: how long the server lets a session idle inside a transaction
    (see the statement bounds above). ``engine_options`` are extra :func:`sqlalchemy.create_engine`
    arguments; its ``connect_args`` are merged over the defaults here.
    """
    backend = url.get_backend_name()
    # Connects, lock waits and statements are bounded (above); the URL's own settings win.
    connect_args = bounded_connect_args(url, timeout_seconds)
    # Disconnects (a killed backend, a restarted server) are detected on checkout.
    # https://docs.sqlalchemy.org/en/20/core/pooling.html#disconnect-handling-pessimistic
    options: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 1, "max_overflow": 2}
    if backend == "postgresql":
        if "application_name" not in url.query and url.get_driver_name() in (
            "psycopg",
            "psycopg2",
        ):
            connect_args["application_name"] = APPLICATION_NAME
    elif backend in ("mysql", "mariadb"):
        # READ COMMITTED: InnoDB then takes no gap locks, which deadlock concurrent claims of
        # not-yet-existing slot rows under REPEATABLE READ. The claim's conditional UPDATE still
        # re-reads the latest committed row under its row lock.
        # https://mariadb.com/kb/en/innodb-lock-modes/ (gap locks)
        options["isolation_level"] = "READ COMMITTED"
    extra = dict(engine_options or {})
    connect_args.update(extra.pop("connect_args", {}) or {})
    options.update(extra)
    engine = create_engine(url, connect_args=connect_args, **options)
    bound_sessions(engine, timeout_seconds, idle_seconds=idle_transaction_seconds)
    if backend == "sqlite":
        _serialise_sqlite_writes(engine)
        _process_hooks.gate_engine(engine)  # a fork never copies SQLite mid-call
    return engine


def _serialise_sqlite_writes(engine: Engine) -> None:
    """Every transaction starts with ``BEGIN IMMEDIATE`` (the write lock up front), in WAL mode.

    A deferred transaction that reads and then writes can fail with SQLITE_BUSY without waiting
    when another connection writes first; taking the write lock at BEGIN makes concurrent claims
    simply queue behind the busy timeout. WAL lets readers (and an application's open read
    transaction) coexist with a writer. Recipe from
    https://docs.sqlalchemy.org/en/20/dialects/sqlite.html#serializable-isolation-savepoints-transactional-ddl
    and https://www.sqlite.org/lang_transaction.html
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            _enable_wal(cursor)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL once; concurrent first connections may find it locked.

    Changing the journal mode needs an exclusive lock and does not always wait on the busy
    timeout, so retry briefly; if it stays locked, another process is switching it anyway, and
    BEGIN IMMEDIATE with the busy timeout is correct in either journal mode.
    """
    import sqlite3  # only SQLite engines get here

    cursor.execute("PRAGMA journal_mode")
    if str(cursor.fetchone()[0]).lower() == "wal":
        return

    def switch() -> None:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.fetchall()

    def locked(error: Exception) -> bool:
        text = str(error)
        return isinstance(error, sqlite3.OperationalError) and ("locked" in text or "busy" in text)

    try:
        retry(switch, attempts=_WAL_ATTEMPTS, retryable=locked, pause=lambda n: 0.01 * n)
    except sqlite3.OperationalError as error:
        if not locked(error):
            raise


_WAL_ATTEMPTS = 20


# -- the control database --------------------------------------------------------------------


#: CREATE TABLE attempts when other processes race to create the tables.
_CREATE_ATTEMPTS = 5


class ControlDatabase:
    """An allocator's engine on the control database and its worker tables."""

    def __init__(
        self,
        url: URL,
        store: WorkerStore,
        *,
        create_tables: bool,
        timeout_seconds: float,
        idle_transaction_seconds: float | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.store = store
        self.create_tables_on_demand = create_tables
        try:
            self.engine = make_engine(
                url,
                timeout_seconds=timeout_seconds,
                idle_transaction_seconds=idle_transaction_seconds,
                engine_options=engine_options,
            )
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"the database driver for {safe_url_text(url)} is not installed "
                f"({error}); install it, e.g. pip install 'snowflake-db[postgres]' (psycopg) "
                "or 'snowflake-db[mysql]' (PyMySQL)",
                name=error.name,
            ) from error
        self._tables_ready = False

    def run(self, work: Callable[[Connection], _T], *, transaction: bool = False) -> _T:
        """Run ``work`` on one of the engine's connections (tables created on demand), inside
        one transaction with ``transaction``."""
        if transaction:
            work = partial(_in_transaction, work)
        with self.engine.connect() as connection:
            if self._tables_ready:
                return work(connection)
            try:
                result = work(connection)
            except DBAPIError as error:
                if error.connection_invalidated or is_timeout(error):
                    raise  # the database did not answer: no second wait for it
                if connection.in_transaction():
                    connection.rollback()
                with connection.begin():
                    missing = self.store.missing_tables(connection)
                if missing and not self.create_tables_on_demand:
                    raise AllocatorUnavailableError(
                        f"the worker tables {', '.join(missing)} do not exist in "
                        f"{safe_url_text(self.url)}: create them with a migration "
                        "(snowflake_db.alembic / the snowflake_db Django app) or pass "
                        "create_tables=True; a Django data migration that makes rows with "
                        "Snowflake keys must depend on ('snowflake_db', '0002_workerlayout') "
                        "so that they exist before it runs"
                    ) from None
                if missing:
                    self.create_tables(connection)
                # Once more, with the tables in place (perhaps just created by another
                # process, which is also why none may be missing now); a second failure is real.
                result = work(connection)
            self._tables_ready = True
            return result

    def create_tables(self, connection: Connection) -> None:
        """CREATE TABLE for missing tables, tolerating processes that race to do the same.

        A racing process may have created one table and not yet the other, so after a failure
        the check (``checkfirst``) and creation run again, a bounded number of times.
        """

        def attempt() -> None:
            try:
                with connection.begin():
                    self.store.create_tables(connection)
            except DBAPIError:
                with connection.begin():
                    if not self.store.missing_tables(connection):
                        return  # another process finished the job
                raise

        retry(
            attempt,
            attempts=_CREATE_ATTEMPTS,
            retryable=lambda error: isinstance(error, DBAPIError),
            pause=jitter(0.01, 0.05),
        )
        self._tables_ready = True


def _in_transaction(work: Callable[[Connection], _T], connection: Connection) -> _T:
    with connection.begin():
        return work(connection)
