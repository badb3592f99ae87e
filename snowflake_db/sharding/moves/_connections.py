"""One way to open a psycopg session on a move's source or target, whatever the caller holds.

A move step takes a connection string, a SQLAlchemy ``Engine`` (psycopg driver) or an open
psycopg connection. Each step opens a session, runs in autocommit mode (its transactions are
explicit) and gives the connection back; descriptions never carry a password.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import InvalidArgumentTypeError, MissingExtraError, ShardMoveError

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
except ImportError as error:  # pragma: no cover - the postgres extra is missing
    raise MissingExtraError(__name__, package="psycopg", extra="postgres") from error

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    Endpoint = str | Engine | psycopg.Connection[Any]
else:
    Endpoint = object

#: Seconds the mover waits for a connection to a server that does not answer.
CONNECT_TIMEOUT_S = 10


def describe_conninfo(conninfo: str) -> str:
    """``host:port/dbname`` of a libpq connection string or URI: never its password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparsable connection string>"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or parts.get('user') or ''}"


class Connector:
    """Opens autocommit psycopg sessions on one server of a move (``role``: source or target)."""

    def __init__(self, endpoint: Endpoint, role: str) -> None:
        self.role = role
        self._conninfo: str | None = None
        self._engine: Any = None
        self._connection: psycopg.Connection[Any] | None = None
        self._held: psycopg.Connection[Any] | None = None
        if isinstance(endpoint, str):
            self._conninfo = endpoint
            self.description = describe_conninfo(endpoint)
        elif isinstance(endpoint, psycopg.Connection):
            self._connection = endpoint
            info = endpoint.info
            self.description = f"{info.host}:{info.port}/{info.dbname}"
        elif hasattr(endpoint, "raw_connection") and hasattr(endpoint, "url"):
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
    def session(self) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit session; a failure to connect is a :class:`ShardMoveError` naming
        the server (host, port, database: no password). Inside :meth:`held`, the held
        session (unless it broke: then a new one)."""
        held = self._held
        if held is not None and not (held.closed or held.broken):
            with self._named_if_lost(held):
                yield held
            return
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
            connection = psycopg.connect(self._conninfo, autocommit=True,
                                         connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as error:
            raise ShardMoveError(
                f"cannot connect to the {self.role} {self.description}: {_first_line(error)}"
            ) from error
        with connection, self._named_if_lost(connection):
            yield connection

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep one session open for every :meth:`session` inside this block: a step that
        polls (the drain) or a run of short steps (the cutover) then pays no connection set-up
        per call. Nested blocks share the outer one."""
        if self._held is not None:
            yield
            return
        opened = self.session()
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
                if error is None and not (connection.closed or connection.broken):
                    raise

    @contextmanager
    def _named_if_lost(self, connection: psycopg.Connection[Any]) -> Iterator[None]:
        """A server that went away during a step (restarted, unreachable) is named: psycopg's
        own message ("server closed the connection unexpectedly") says not which one."""
        try:
            yield
        except psycopg.OperationalError as error:
            if not (connection.broken or connection.closed):
                raise
            raise ShardMoveError(
                f"lost the connection to the {self.role} {self.description}: "
                f"{_first_line(error)}"
            ) from error

    def _engine_session(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            raw = self._engine.raw_connection()
        except Exception as error:  # sqlalchemy.exc.OperationalError wraps psycopg's
            raise ShardMoveError(
                f"cannot connect to the {self.role} {self.description}: {_first_line(error)}"
            ) from error
        connection: psycopg.Connection[Any] = raw.driver_connection
        try:
            connection.autocommit = True
            with self._named_if_lost(connection):
                yield connection
        except BaseException:
            if connection.closed or connection.broken:
                raw.invalidate()
            raise
        finally:
            if not (connection.closed or connection.broken):
                connection.autocommit = False  # the pool expects a transactional connection
            raw.close()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
