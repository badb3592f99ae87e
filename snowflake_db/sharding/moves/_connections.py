"""One way to open a session on a move's source or target, whatever the caller holds.

A move step takes, on PostgreSQL (psycopg 3, the ``postgres`` extra), a libpq connection
string or URI, a SQLAlchemy ``Engine`` (psycopg driver) or an open psycopg connection
(:class:`Connector`); on MariaDB (PyMySQL, the ``mysql`` extra) a SQLAlchemy URL (string or
``URL``), an ``Engine`` (pymysql driver) or an open PyMySQL connection
(:class:`MariaDBConnector`). Each step opens a session, runs in autocommit mode (its
transactions are explicit) and gives the connection back; a connect waits at most
:data:`CONNECT_TIMEOUT_S`; descriptions never carry a password. Each driver is imported when a
connector of its backend is made, so a move needs only its own backend's extra.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ...errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MissingExtraError,
    ShardMoveError,
)

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import URL, Engine

    #: What a move step connects with (see the module's docstring).
    Endpoint = str | URL | Engine | psycopg.Connection[Any]
else:
    Endpoint = object

#: Seconds the mover waits for a connection to a server that does not answer.
CONNECT_TIMEOUT_S = 10

_C = TypeVar("_C")


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as error:  # pragma: no cover - the postgres extra is missing
        raise MissingExtraError(__name__, package="psycopg", extra="postgres") from error
    return psycopg


def _pymysql() -> Any:
    try:
        import pymysql  # type: ignore[import-untyped]
    except ImportError as error:  # pragma: no cover - the mysql extra is missing
        raise MissingExtraError(__name__, package="PyMySQL", extra="mysql") from error
    return pymysql


def describe_conninfo(conninfo: str) -> str:
    """``host:port/dbname`` of a libpq connection string or URI: never its password."""
    psycopg = _psycopg()
    try:
        parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparsable connection string>"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or parts.get('user') or ''}"


class _Sessions(Generic[_C]):
    """What both backends' connectors share: the held session of :meth:`held`, reused by
    every :meth:`session` inside it unless it broke."""

    role: str
    description: str

    def __init__(self) -> None:
        self._held: _C | None = None

    def session(self) -> AbstractContextManager[_C]:
        """An autocommit session; a failure to connect is a :class:`ShardMoveError` naming
        the server (host, port, database: no password). Inside :meth:`held`, the held
        session (unless it broke: then a new one)."""
        return self._session()

    @contextmanager
    def _session(self) -> Iterator[_C]:
        held = self._held
        if held is not None and self._alive(held):
            with self._named_if_lost(held):
                yield held
            return
        with self._open() as connection:
            yield connection

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep one session open for every :meth:`session` inside this block: a step that
        polls (the drain) or a run of short steps (the cutover) then pays no connection set-up
        per call. Nested blocks share the outer one."""
        if self._held is not None:
            yield
            return
        opened = self._session()
        connection = opened.__enter__()
        self._held = connection
        error: BaseException | None = None
        try:
            yield
        except BaseException as raised:
            error = raised
            raise
        finally:
            self._held = None
            try:
                if error is None:
                    opened.__exit__(None, None, None)
                else:
                    opened.__exit__(type(error), error, error.__traceback__)
            except Exception:
                # Ending a session that broke meanwhile (a restarted server: the steps used a
                # new one since) or while an error propagates must not replace the outcome.
                if error is None and self._alive(connection):
                    raise

    def _cannot_connect(self, error: BaseException) -> ShardMoveError:
        return ShardMoveError(
            f"cannot connect to the {self.role} {self.description}: {_first_line(error)}")

    def _lost(self, error: BaseException) -> ShardMoveError:
        return ShardMoveError(
            f"lost the connection to the {self.role} {self.description}: {_first_line(error)}")

    # -- each driver's ---------------------------------------------------------------------

    def _open(self) -> AbstractContextManager[_C]:
        """A new session (or the caller's connection), named if lost."""
        raise NotImplementedError

    def _alive(self, connection: _C) -> bool:
        raise NotImplementedError

    def _named_if_lost(self, connection: _C) -> AbstractContextManager[None]:
        """A server that went away during a step (restarted, unreachable) is named: the
        driver's own message says not which one."""
        raise NotImplementedError


class Connector(_Sessions["psycopg.Connection[Any]"]):
    """Opens autocommit psycopg sessions on one PostgreSQL server of a move (``role``:
    source or target)."""

    def __init__(self, endpoint: Endpoint, role: str) -> None:
        super().__init__()
        from sqlalchemy.engine import Engine

        pg = _psycopg()
        self.role = role
        self._conninfo: str | None = None
        self._engine: Any = None
        self._connection: psycopg.Connection[Any] | None = None
        if isinstance(endpoint, str):
            self._conninfo = endpoint
            self.description = describe_conninfo(endpoint)
        elif isinstance(endpoint, pg.Connection):
            self._connection = endpoint
            info = endpoint.info
            self.description = f"{info.host}:{info.port}/{info.dbname}"
        elif isinstance(endpoint, Engine):
            driver = endpoint.url.get_driver_name()
            if driver != "psycopg":
                raise InvalidArgumentTypeError(
                    f"the {role} engine uses the {driver!r} driver; a move needs psycopg 3 "
                    "(a postgresql+psycopg:// URL)"
                )
            self._engine = endpoint
            url = endpoint.url
            self.description = f"{url.host}:{url.port or 5432}/{url.database}"
        else:
            raise InvalidArgumentTypeError(
                f"the {role} must be a connection string, a SQLAlchemy Engine or a psycopg "
                f"connection, not {type(endpoint).__name__}"
            )

    @contextmanager
    def _open(self) -> Iterator[psycopg.Connection[Any]]:
        pg = _psycopg()
        if self._connection is not None:
            if not self._connection.autocommit:
                self._connection.autocommit = True
            yield self._connection
            return
        if self._engine is not None:
            yield from self._engine_session()
            return
        assert self._conninfo is not None
        try:
            connection = pg.connect(self._conninfo, autocommit=True,
                                    connect_timeout=CONNECT_TIMEOUT_S)
        except pg.OperationalError as error:
            raise self._cannot_connect(error) from error
        with connection, self._named_if_lost(connection):
            yield connection

    def _alive(self, connection: psycopg.Connection[Any]) -> bool:
        return not (connection.closed or connection.broken)

    @contextmanager
    def _named_if_lost(self, connection: psycopg.Connection[Any]) -> Iterator[None]:
        try:
            yield
        except _psycopg().OperationalError as error:
            if self._alive(connection):
                raise
            raise self._lost(error) from error

    def _engine_session(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            raw = self._engine.raw_connection()
        except Exception as error:  # sqlalchemy.exc.OperationalError wraps psycopg's
            raise self._cannot_connect(error) from error
        connection: psycopg.Connection[Any] = raw.driver_connection
        try:
            connection.autocommit = True
            with self._named_if_lost(connection):
                yield connection
        except BaseException:
            if not self._alive(connection):
                raw.invalidate()
            raise
        finally:
            if self._alive(connection):
                connection.autocommit = False  # the pool expects a transactional connection
            raw.close()


#: MySQL client errors of a connection that went away (server gone, lost during a query,
#: a packet out of order after a restart).
_MYSQL_LOST = frozenset({2006, 2013, 2055})


class MariaDBConnector(_Sessions[Any]):
    """Opens autocommit PyMySQL sessions on one MariaDB server of a move (``role``: source or
    target). ``endpoint`` is a SQLAlchemy URL (``mysql+pymysql://`` or ``mariadb://``; its
    query may add PyMySQL's connect arguments, such as ``unix_socket`` or ``charset``), an
    ``Engine`` of the pymysql driver or a PyMySQL connection."""

    def __init__(self, endpoint: Endpoint, role: str) -> None:
        super().__init__()
        pymysql = _pymysql()
        from sqlalchemy.engine import URL, Engine, make_url

        self.role = role
        self._arguments: dict[str, Any] | None = None
        self._engine: Any = None
        self._connection: Any = None
        if isinstance(endpoint, pymysql.connections.Connection):
            self._connection = endpoint
            self.description = f"{endpoint.host}:{endpoint.port}/{_text(endpoint.db)}"
        elif isinstance(endpoint, Engine):
            driver = endpoint.url.get_driver_name()
            if driver != "pymysql":
                raise InvalidArgumentTypeError(
                    f"the {role} engine uses the {driver!r} driver; a MariaDB move needs "
                    "PyMySQL (a mysql+pymysql:// URL)")
            self._engine = endpoint
            self.description = _describe_url(endpoint.url)
        elif isinstance(endpoint, URL) or (isinstance(endpoint, str) and "://" in endpoint):
            url = make_url(endpoint)
            self._arguments = _pymysql_arguments(url, role)
            self.description = _describe_url(url)
        else:
            raise InvalidArgumentTypeError(
                f"the {role} must be a mysql+pymysql:// URL, a SQLAlchemy Engine or a PyMySQL "
                f"connection, not {type(endpoint).__name__}")

    @contextmanager
    def _open(self) -> Iterator[Any]:
        pymysql = _pymysql()
        if self._connection is not None:
            if not self._connection.get_autocommit():
                self._connection.autocommit(True)
            yield self._connection
            return
        if self._engine is not None:
            yield from self._engine_session()
            return
        assert self._arguments is not None
        try:
            connection = pymysql.connect(**self._arguments)
        except pymysql.err.OperationalError as error:
            raise self._cannot_connect(error) from error
        try:
            with self._named_if_lost(connection):
                yield connection
        finally:
            if connection.open:
                connection.close()

    def _alive(self, connection: Any) -> bool:
        return bool(connection.open)

    @contextmanager
    def _named_if_lost(self, connection: Any) -> Iterator[None]:
        try:
            yield
        except _pymysql().err.OperationalError as error:
            if self._alive(connection) and error.args[:1] and error.args[0] not in _MYSQL_LOST:
                raise
            raise self._lost(error) from error

    def _engine_session(self) -> Iterator[Any]:
        try:
            raw = self._engine.raw_connection()
        except Exception as error:  # sqlalchemy.exc.OperationalError wraps PyMySQL's
            raise self._cannot_connect(error) from error
        connection = raw.driver_connection
        try:
            connection.autocommit(True)
            with self._named_if_lost(connection):
                yield connection
        except BaseException:
            if not self._alive(connection):
                raw.invalidate()
            raise
        finally:
            if self._alive(connection):
                connection.autocommit(False)  # the pool expects a transactional connection
            raw.close()


def _pymysql_arguments(url: URL, role: str) -> dict[str, Any]:
    """``pymysql.connect`` keywords for a SQLAlchemy URL, in autocommit mode with the connect
    timeout; an unknown query key is refused by name."""
    backend = url.get_backend_name()
    if backend not in ("mysql", "mariadb"):
        raise InvalidArgumentError(
            f"the {role} URL {_describe_url(url)} is a {backend} URL, not MariaDB's")
    accepted = set(inspect.signature(_pymysql().connections.Connection.__init__).parameters)
    arguments: dict[str, Any] = {"charset": "utf8mb4", "connect_timeout": CONNECT_TIMEOUT_S}
    for key, value in url.query.items():
        if key not in accepted or key in ("self", "autocommit", "passwd", "db"):
            raise InvalidArgumentError(
                f"the {role} URL's query has {key!r}, which is no PyMySQL connect argument")
        text = value if isinstance(value, str) else value[-1]
        arguments[key] = int(text) if key in ("port", "connect_timeout") else text
    arguments.update(url.translate_connect_args(username="user", database="database"))
    arguments["autocommit"] = True
    return arguments


def _describe_url(url: URL) -> str:
    """``host:port/database`` (or ``socket/database``) of a MariaDB URL: never its password."""
    socket = url.query.get("unix_socket")
    where = socket if isinstance(socket, str) else f"{url.host or 'localhost'}:{url.port or 3306}"
    return f"{where}/{url.database or ''}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
