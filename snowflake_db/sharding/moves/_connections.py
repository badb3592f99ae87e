"""One way to open a session on a move's source or target, whatever the caller holds.

A move step takes, on PostgreSQL (psycopg 3, the ``postgres`` extra), a libpq connection
string or URI, a SQLAlchemy ``Engine`` (psycopg driver) or an open psycopg connection
(:class:`Connector`); on MariaDB (PyMySQL, the ``mysql`` extra) a SQLAlchemy URL (string or
``URL``), an ``Engine`` (pymysql driver) or an open PyMySQL connection
(:class:`MariaDBConnector`, the one MariaDB connector: both the MariaDB backend and the mover
use it). Each step opens a session, runs in autocommit mode (its transactions are explicit)
and gives the connection back; a connect waits at most :data:`CONNECT_TIMEOUT_S`; a server
that does not answer is a :class:`~snowflake_db.errors.MoveServerUnreachableError` naming it
(a connect that timed out is made again first, :data:`CONNECT_ATTEMPTS` in all);
descriptions never carry a password. Each driver is imported when a connector of its backend
is made, so a move needs only its own backend's extra.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ...errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MissingExtraError,
    MoveServerUnreachableError,
)

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import URL, Engine

    #: What a move step connects with (see the module's docstring).
    Endpoint = str | URL | Engine | psycopg.Connection[Any]
    #: The same on MariaDB (a PyMySQL connection: PyMySQL is untyped).
    MariaDBEndpoint = str | URL | Engine | Any
else:
    Endpoint = MariaDBEndpoint = object

#: Seconds the mover waits for a connection to a server that does not answer.
CONNECT_TIMEOUT_S = 10
#: Connects made in all when each times out (a server that refuses stops the step at once): a
#: server on a saturated host may take longer than one timeout to start a session (seen
#: beside two test suites on two cores), and connecting again has no side effect.
CONNECT_ATTEMPTS = 3

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
        """An autocommit session; a failure to connect, or a connection lost inside the block,
        is a :class:`~snowflake_db.errors.MoveServerUnreachableError` naming the server (host,
        port, database: no password). Inside :meth:`held`, the held session (unless it broke:
        then a new one)."""
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

    def _connect(self, connect: Callable[[], _C], failed: type[BaseException]) -> _C:
        """``connect()``, made again after one that timed out (:data:`CONNECT_ATTEMPTS` in
        all); any other failure, or the last timeout, is :meth:`_cannot_connect`."""
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                return connect()
            except failed as error:
                if attempt == CONNECT_ATTEMPTS or not _timed_out(error):
                    raise self._cannot_connect(error) from error
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _cannot_connect(self, error: BaseException) -> MoveServerUnreachableError:
        return MoveServerUnreachableError(
            f"cannot connect to the {self.role} {self.description}: {_first_line(error)}")

    def _lost(self, error: BaseException) -> MoveServerUnreachableError:
        return MoveServerUnreachableError(
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
        conninfo = self._conninfo
        connection = self._connect(
            lambda: pg.connect(conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S),
            pg.OperationalError)
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


#: Server errors that end the session they arrive on (shutdown in progress, connection killed):
#: PyMySQL still holds the socket, the session is gone.
_MYSQL_SESSION_ENDED = frozenset({1053, 1927})
#: The character set of every session of a MariaDB move: rows travel as the server's utf8mb4
#: literals, and the checksums hash them so.
MARIADB_CHARSET = "utf8mb4"


class MariaDBConnector(_Sessions[Any]):
    """Opens autocommit PyMySQL sessions (utf8mb4) on one MariaDB server of a move (``role``:
    source or target). ``endpoint`` is a SQLAlchemy URL (``mysql+pymysql://`` or
    ``mariadb://``; its query may add PyMySQL's connect arguments, such as ``unix_socket``), an
    ``Engine`` of the pymysql driver or a PyMySQL connection the caller keeps.

    A session taken from an engine's pool is closed after use, never given back: a move's
    session holds the move's lock on the target and its session variables, which the next
    user of a pooled connection must not inherit.
    """

    def __init__(self, endpoint: MariaDBEndpoint, role: str) -> None:
        super().__init__()
        pymysql = _pymysql()
        from sqlalchemy.engine import URL, Engine, make_url

        self.role = role
        self._arguments: dict[str, Any] | None = None
        self._engine: Any = None
        self._connection: Any = None
        if isinstance(endpoint, pymysql.connections.Connection):
            if endpoint.charset != MARIADB_CHARSET:
                raise InvalidArgumentError(
                    f"the {role} connection uses charset {endpoint.charset!r}; a move reads and "
                    f"writes rows as {MARIADB_CHARSET}: connect with charset={MARIADB_CHARSET!r}")
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

    def extra(self) -> Any:
        """One more session of the same account, apart from :meth:`session` and
        :meth:`held` (a watcher thread's); the caller closes it."""
        pymysql = _pymysql()
        if self._engine is not None:
            raw = self._engine_connection()
            connection = raw.driver_connection
            connection.autocommit(True)
            raw.detach()  # closed by the caller, never given back to the pool
            return connection
        arguments = self._arguments
        if arguments is None:
            c = self._connection
            arguments = {"host": c.host, "port": c.port, "user": _text(c.user),
                         "password": c.password, "database": _text(c.db) or None,
                         "unix_socket": c.unix_socket, "charset": MARIADB_CHARSET,
                         "connect_timeout": CONNECT_TIMEOUT_S, "autocommit": True}
        return self._connect(lambda: _pymysql_connect(arguments), pymysql.MySQLError)

    @contextmanager
    def _open(self) -> Iterator[Any]:
        pymysql = _pymysql()
        if self._connection is not None:
            with self._named_if_lost(self._connection):
                if not self._connection.get_autocommit():
                    self._connection.autocommit(True)
                yield self._connection
            return
        if self._engine is not None:
            yield from self._engine_session()
            return
        arguments = self._arguments
        assert arguments is not None
        connection = self._connect(lambda: _pymysql_connect(arguments), pymysql.MySQLError)
        try:
            with self._named_if_lost(connection):
                yield connection
        finally:
            if connection.open:
                with suppress(Exception):
                    connection.close()

    def _alive(self, connection: Any) -> bool:
        return bool(connection.open)

    @contextmanager
    def _named_if_lost(self, connection: Any) -> Iterator[None]:
        """Only this session's loss is named: PyMySQL closes a connection whose server went
        away (2006, 2013, ...), so an error of another session used inside the block (a step
        holds one on each server) passes unchanged to that session's own handler."""
        pymysql = _pymysql()
        try:
            yield
        except pymysql.MySQLError as error:
            number = error.args[0] if error.args and isinstance(error.args[0], int) else None
            if self._alive(connection) and not (
                number in _MYSQL_SESSION_ENDED and not _answers(connection, pymysql)
            ):
                raise
            raise self._lost(error) from error

    def _engine_connection(self) -> Any:
        try:
            return self._engine.raw_connection()
        except Exception as error:  # sqlalchemy.exc.OperationalError wraps PyMySQL's
            raise self._cannot_connect(error) from error

    def _engine_session(self) -> Iterator[Any]:
        raw = self._engine_connection()
        connection = raw.driver_connection
        try:
            with self._named_if_lost(connection):
                connection.autocommit(True)
                yield connection
        finally:
            raw.invalidate()  # never back to the pool with the move's lock or variables


def _answers(connection: Any, pymysql: Any) -> bool:
    """Whether a PyMySQL session still answers (a ping, no reconnect)."""
    try:
        connection.ping(reconnect=False)
    except pymysql.MySQLError:
        return False
    return True


def _pymysql_connect(arguments: dict[str, Any]) -> Any:
    """``pymysql.connect(**arguments)`` with the server's greeting bounded too: PyMySQL reads it
    under the read timeout, none unless given, so a server that accepts the connection and
    never answers held the mover for ever. The greeting gets :data:`CONNECT_TIMEOUT_S`; the
    session's own reads keep the given read timeout (none: a verification may run long)."""
    given = arguments.get("read_timeout")
    connection = _pymysql().connect(
        **{**arguments, "read_timeout": given if given is not None else CONNECT_TIMEOUT_S})
    if given is None:
        connection._read_timeout = None  # PyMySQL applies it at the next read
    return connection


def _timed_out(error: BaseException) -> bool:
    """Whether a connect failed by its timeout (psycopg's ``ConnectionTimeout``, PyMySQL's
    "timed out"), not by a refusal or a login error."""
    return type(error).__name__ == "ConnectionTimeout" or "timed out" in str(error)


def _pymysql_arguments(url: URL, role: str) -> dict[str, Any]:
    """``pymysql.connect`` keywords for a SQLAlchemy URL, in autocommit mode with the connect
    timeout; an unknown query key is refused by name."""
    backend = url.get_backend_name()
    if backend not in ("mysql", "mariadb"):
        raise InvalidArgumentError(
            f"the {role} URL {_describe_url(url)} is a {backend} URL, not MariaDB's")
    accepted = set(inspect.signature(_pymysql().connections.Connection.__init__).parameters)
    arguments: dict[str, Any] = {"charset": MARIADB_CHARSET,
                                 "connect_timeout": CONNECT_TIMEOUT_S}
    for key, value in url.query.items():
        if key not in accepted or key in ("self", "autocommit", "passwd", "db"):
            raise InvalidArgumentError(
                f"the {role} URL's query has {key!r}, which is no PyMySQL connect argument")
        text = value if isinstance(value, str) else value[-1]
        if key == "charset" and text != MARIADB_CHARSET:
            raise InvalidArgumentError(
                f"the {role} URL asks for charset {text!r}; a move reads and writes rows as "
                f"{MARIADB_CHARSET}: drop charset from the URL")
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
