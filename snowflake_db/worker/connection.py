"""The engine an allocator owns: never the application's pool, never its transactions.

Each allocator opens one small private engine on the control database's URL, used by its
heartbeat thread and for acquiring and releasing, so a caller's transaction (or rollback) can
never include a lease statement and a busy application pool can never starve a renewal. It keeps
one idle connection (a prefork server with N workers holds N), checked with a pre-ping. Driver
and server-side timeouts bound every statement (:mod:`.timeouts`): a hung database or a held
lock costs an error within seconds, never a caller or a renewal blocked indefinitely.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from . import sqlite_fork_gate, timeouts
from .retry import retry

#: The URL forms accepted, for messages.
URL_FORMS = (
    "postgresql://USER@HOST/DB (or postgres://), mysql:// or mariadb://USER@HOST/DB, "
    "or sqlite:///PATH"
)
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
    """The URL of a string, URL or Engine (an Engine is used for its URL only)."""
    if isinstance(url_or_engine, Engine):
        return url_or_engine.url
    if isinstance(url_or_engine, URL):
        return url_or_engine
    if isinstance(url_or_engine, str):
        if not url_or_engine.strip():
            raise InvalidArgumentError("the worker database URL is empty")
        try:
            url = make_url(url_or_engine.strip())
        except Exception as error:
            raise InvalidArgumentError(
                f"cannot parse the worker database URL {safe_url_text(url_or_engine)!r}: {error}"
            ) from None
        return with_installed_driver(url)
    raise InvalidArgumentTypeError(
        "TableWorkerAllocator needs a database URL (str or sqlalchemy URL) or an Engine, "
        f"got {type(url_or_engine).__name__}"
    )


def with_installed_driver(url: URL) -> URL:
    """``postgres://``, ``mysql://``, ``mariadb://`` (a platform's ``DATABASE_URL``) with the
    installed driver named, or an error naming the URL and what to install or write instead."""
    backend, _, driver = url.drivername.partition("+")
    backend = _BACKEND_ALIASES.get(backend, backend)
    if backend == "sqlite":
        return url
    text = safe_url_text(url)
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


def check_supported(url: URL) -> None:
    """Refuse a URL that does not say which database holds the worker tables.

    Without a host (or socket) and a database name, drivers fall back to their defaults
    (libpq's ``PGHOST``/``PGDATABASE`` or local socket, MySQL's localhost): processes configured
    alike could lease from different tables, and their IDs collide. SQLite must be a file: an
    in-memory database is private to one connection, so its leases protect nothing.
    """
    missing = unnamed_part(url)
    if missing is None:
        return
    text = safe_url_text(url)
    if missing == "file":
        raise InvalidArgumentError(
            f"{text} is an in-memory SQLite database, private to one connection: leases "
            "there protect nothing. Use a file (sqlite:///path/workers.db)"
        )
    if missing == "host":
        raise InvalidArgumentError(
            f"the worker database URL {text!r} names no host or socket, so the driver would "
            "pick one from its defaults (environment, local socket); name it, e.g. "
            "postgresql+psycopg://user@db.example.com/app or ...?host=/var/run/postgresql"
        )
    raise InvalidArgumentError(
        f"the worker database URL {text!r} names no database, so the driver would pick "
        "one from its defaults (or none); add it, e.g. postgresql+psycopg://user@host/app"
    )


def unnamed_part(url: URL) -> Literal["file", "host", "database"] | None:
    """What ``url`` leaves to the driver's defaults: no SQLite ``file`` (in-memory), no
    ``host`` (or socket), no ``database``; None when it names all. The one rule that
    :func:`check_supported` and the CLI's URL check (with their own wording) apply."""
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
    (:mod:`.timeouts`). ``engine_options`` are extra :func:`sqlalchemy.create_engine`
    arguments; its ``connect_args`` are merged over the defaults here.
    """
    backend = url.get_backend_name()
    # Connects, lock waits and statements are bounded (timeouts.py); the URL's own settings win.
    connect_args = timeouts.connect_args(url, timeout_seconds)
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
    timeouts.bound_sessions(engine, timeout_seconds, idle_seconds=idle_transaction_seconds)
    if backend == "sqlite":
        _serialise_sqlite_writes(engine)
        sqlite_fork_gate.gate_engine(engine)  # a fork never copies SQLite mid-call
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
