"""Real database fixtures: each test gets its own freshly created, uniquely named database.

Server URLs come from the environment (defaults match the local services):

* ``SNOWFLAKE_TEST_POSTGRES_URL`` (``postgresql+psycopg://postgres@127.0.0.1:5432/test``)
* ``SNOWFLAKE_TEST_MARIADB_URL`` (``mysql+pymysql://root@127.0.0.1:3306/test``)

A server that cannot be reached skips its tests with the reason, except under ``CI=true``,
where it fails them: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pymysql
import pytest
from sqlalchemy import MetaData, create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url

POSTGRES_URL_ENV = "SNOWFLAKE_TEST_POSTGRES_URL"
MARIADB_URL_ENV = "SNOWFLAKE_TEST_MARIADB_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test"

BACKENDS = ("postgresql", "mariadb", "sqlite")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def server_url(backend: str) -> URL:
    if backend == "postgresql":
        return make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    if backend == "mariadb":
        return make_url(os.environ.get(MARIADB_URL_ENV, DEFAULT_MARIADB_URL))
    raise ValueError(f"no server for backend {backend!r}")


def unavailable(reason: str, *, allow_module_level: bool = False) -> NoReturn:
    """Skip the test for a missing server, binary or dependency, saying why; under ``CI=true``
    fail it instead, so that CI never passes by skipping. The one place tests decide this."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing server or dependency is a failure)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def throwaway_server(backend: str) -> Any:
    """A throwaway ``postgresql`` or ``mariadb`` server of :mod:`example_project.local_servers`,
    not started (its ``close()`` stops and removes it), or :func:`unavailable` saying why."""
    from example_project import local_servers

    problem = (local_servers.postgres_unavailable() if backend == "postgresql"
               else local_servers.mariadb_unavailable())
    if problem:
        unavailable(problem)
    if backend == "postgresql":
        return local_servers.ThrowawayPostgres()
    return local_servers.ThrowawayMariaDB()


#: How long the once-per-process probe waits for a server to accept a connection. A server that
#: is not there refuses at once; one that is busy (the shared servers beside a second suite, a
#: lease benchmark and Django's own suite) took more than 3 s, and a 3 s probe then failed every
#: test of that backend in that process, and in the Django settings dropped its alias, so
#: pytest-xdist's workers collected different tests (make test beside the lease benchmark).
PROBE_CONNECT_SECONDS = 30

_reachable: dict[str, str | None] = {}


def _check_server(backend: str) -> None:
    """Connect once per session; remember the error so every test reports the same reason."""
    if backend not in _reachable:
        url = server_url(backend)
        connect_args = {"connect_timeout": PROBE_CONNECT_SECONDS}
        try:
            engine = create_engine(url, connect_args=connect_args)
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            engine.dispose()
            _reachable[backend] = None
        except Exception as error:
            _reachable[backend] = f"{type(error).__name__}: {error}".splitlines()[0]
    problem = _reachable[backend]
    if problem is not None:
        unavailable(
            f"{backend} server at {server_url(backend).render_as_string(hide_password=True)} "
            f"is not reachable ({problem}); set "
            f"{POSTGRES_URL_ENV if backend == 'postgresql' else MARIADB_URL_ENV}"
        )


@dataclass
class ScratchDatabase:
    backend: str
    url: URL
    name: str
    engines: list[Engine] = field(default_factory=list, repr=False)

    @property
    def url_string(self) -> str:
        return self.url.render_as_string(hide_password=False)

    def engine(
        self, *metadata: MetaData, sqlite_foreign_keys: bool = False, **connect_args: Any
    ) -> Engine:
        """An engine on this database with ``metadata``'s tables created. It is disposed when
        the database is dropped, so no test leaves connections open on a database being dropped.
        ``sqlite_foreign_keys``: SQLite enforces foreign keys only when each connection asks."""
        engine = create_engine(self.url, connect_args=connect_args)
        if sqlite_foreign_keys and self.backend == "sqlite":
            event.listen(engine, "connect", _sqlite_foreign_keys_on)
        self.engines.append(engine)
        for tables in metadata:
            tables.create_all(engine)
        return engine


def _sqlite_foreign_keys_on(dbapi_connection: Any, _record: object) -> None:
    dbapi_connection.execute("PRAGMA foreign_keys=ON")


def create_database(backend: str, tmp_dir: Path) -> ScratchDatabase:
    """Create a uniquely named empty database on ``backend`` and return its URL."""
    name = f"sfdb_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    if backend == "sqlite":
        path = tmp_dir / f"{name}.sqlite3"
        return ScratchDatabase(backend, make_url(f"sqlite:///{path}"), name)
    _check_server(backend)
    admin = create_engine(server_url(backend), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            if backend == "postgresql":
                connection.execute(text(f'CREATE DATABASE "{name}"'))
            else:
                connection.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    finally:
        admin.dispose()
    return ScratchDatabase(backend, server_url(backend).set(database=name), name)


def drop_database(database: ScratchDatabase) -> None:
    for engine in database.engines:
        engine.dispose()
    if database.backend == "sqlite":
        path = Path(database.url.database or "")
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    admin = create_engine(server_url(database.backend), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            if database.backend == "postgresql":
                connection.execute(text(f'DROP DATABASE IF EXISTS "{database.name}" WITH (FORCE)'))
            else:
                drop_mariadb_database(connection.connection.cursor(), database.name)
    finally:
        admin.dispose()


#: How long a MariaDB DROP DATABASE waits for another session's lock on one of its tables
#: before it fails (the server's own lock_wait_timeout is a day).
DROP_LOCK_WAIT_S = 60
#: ER_NO_SUCH_THREAD: KILL of a session that has ended.
_UNKNOWN_THREAD = 1094


def drop_mariadb_database(cursor: Any, name: str) -> None:
    """``DROP DATABASE`` on MariaDB as PostgreSQL's ``WITH (FORCE)`` does it: the sessions still
    using the database are killed first, since a transaction one of them left open (a failed
    test's connection, a child still running) holds a metadata lock the drop would wait a day
    for; a lock held from elsewhere fails the drop in :data:`DROP_LOCK_WAIT_S`, saying so.
    ``cursor``: a DB-API cursor on the server, in autocommit mode."""
    cursor.execute(f"SET SESSION lock_wait_timeout = {DROP_LOCK_WAIT_S}")
    cursor.execute("SELECT ID FROM information_schema.PROCESSLIST "
                   "WHERE DB = %s AND ID <> CONNECTION_ID()", (name,))
    for (session,) in cursor.fetchall():
        try:
            cursor.execute(f"KILL {int(session)}")
        except pymysql.MySQLError as error:  # it ended by itself meanwhile
            if error.args[0] != _UNKNOWN_THREAD:
                raise
    cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def database_factory(tmp_path: Path) -> Iterator[Callable[[str], ScratchDatabase]]:
    """Create any number of fresh databases in a test; all are dropped afterwards."""
    created: list[ScratchDatabase] = []

    def factory(backend: str) -> ScratchDatabase:
        database = create_database(backend, tmp_path)
        created.append(database)
        return database

    yield factory
    for database in reversed(created):
        drop_database(database)


@pytest.fixture
def postgres_db(database_factory: Callable[[str], ScratchDatabase]) -> ScratchDatabase:
    return database_factory("postgresql")


@pytest.fixture
def mariadb_db(database_factory: Callable[[str], ScratchDatabase]) -> ScratchDatabase:
    return database_factory("mariadb")


@pytest.fixture
def sqlite_db(database_factory: Callable[[str], ScratchDatabase]) -> ScratchDatabase:
    return database_factory("sqlite")


@pytest.fixture(params=BACKENDS)
def any_db(
    request: pytest.FixtureRequest, database_factory: Callable[[str], ScratchDatabase]
) -> ScratchDatabase:
    """A fresh database on each backend in turn: PostgreSQL, MariaDB and a SQLite file."""
    return database_factory(request.param)
