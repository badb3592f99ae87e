"""Cutting the allocator off from its control database and restoring it (PostgreSQL, MariaDB,
SQLite), and recording the IDs and errors of a generator meanwhile: shared by the outage, renewal
and lease-metrics tests.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import create_engine, text

from snowflake_db import SnowflakeError, SnowflakeGenerator
from snowflake_db.worker._engine import APPLICATION_NAME

from .databases import ScratchDatabase, server_url

#: The outage tests' lease: short, so a cut database fences within seconds.
LEASE_SECONDS = 1.5
#: For the tests that claim callers never fence while the database answers: the heartbeat's
#: renewal may take 2.8 s before the deadline passes, a caller's 2.1 s. A machine loaded by
#: two test runs at once, both in their timing stage, needed more than the 1.9 s and 1.4 s of
#: a 4 s lease (2026-11-26: callers fenced for 0.3 s with the heartbeat starved on PostgreSQL,
#: and a heartbeat-less MariaDB process fenced, while quick commits went on); with 1.5 s
#: leases it was 0.7 s.
STEADY_LEASE_SECONDS = 6.0


@dataclass
class Recorder:
    """Issues IDs in a thread, recording each ID and error with its monotonic time."""

    gen: SnowflakeGenerator
    ids: list[tuple[int, float]] = field(default_factory=list)
    errors: list[tuple[type[BaseException], float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.ids.append((self.gen.next_id(), time.monotonic()))
            except SnowflakeError as error:
                self.errors.append((type(error), time.monotonic()))
                time.sleep(0.01)
            time.sleep(0.0005)

    def issued_between(self, start: float, end: float) -> list[int]:
        return [i for i, at in self.ids if start <= at <= end]


class Outage:
    """Backend-specific ways to cut the allocator off from its database and restore it."""

    def __init__(self, database: ScratchDatabase) -> None:
        self.database = database
        self.url = database.url_string
        self._sqlite: sqlite3.Connection | None = None
        self._user = f"sfdb_{uuid.uuid4().hex[:8]}"
        if database.backend == "mariadb":
            self._admin(
                f"CREATE USER '{self._user}'@'%' IDENTIFIED BY 'pw'",
                f"GRANT ALL ON `{database.name}`.* TO '{self._user}'@'%'",
            )
            self.url = database.url.set(username=self._user, password="pw").render_as_string(
                hide_password=False
            )

    def _admin(self, *statements: str, fetch: str | None = None) -> list[int]:
        engine = create_engine(server_url(self.database.backend), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                ids = [int(row[0]) for row in connection.execute(text(fetch))] if fetch else []
                for statement in statements:
                    connection.execute(text(statement))
                return ids
        finally:
            engine.dispose()

    def kill_allocator_connections(self) -> int:
        if self.database.backend == "postgresql":
            return len(
                self._admin(
                    fetch="SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{self.database.name}' "
                    f"AND application_name = '{APPLICATION_NAME}'"
                )
            )
        return self._kill_mariadb()

    def _kill_mariadb(self) -> int:
        ids = self._admin(
            fetch=f"SELECT id FROM information_schema.processlist WHERE user = '{self._user}'"
        )
        for connection_id in ids:
            with contextlib.suppress(Exception):  # it may have gone by itself
                self._admin(f"KILL CONNECTION {connection_id}")
        return len(ids)

    def cut(self) -> None:
        backend = self.database.backend
        if backend == "postgresql":
            # New connections refused first, then every session ended, until none is left:
            # ended first, the heartbeat reconnected before the refusal and kept renewing (a
            # fence awaited 20 s in vain, beside a second suite); a session starting as the
            # refusal commits may show up a moment later.
            name = self.database.name
            self._admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            deadline = time.monotonic() + 10
            while self._admin(fetch="SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"):
                assert time.monotonic() < deadline, f"sessions on {name} outlived 10 s"
                time.sleep(0.05)
        elif backend == "mariadb":
            self._admin(f"ALTER USER '{self._user}'@'%' ACCOUNT LOCK")
            self._kill_mariadb()
        else:
            self._sqlite = sqlite3.connect(self.database.url.database or "", timeout=30)
            self._sqlite.isolation_level = None
            self._sqlite.execute("BEGIN EXCLUSIVE")

    def restore(self) -> None:
        backend = self.database.backend
        if backend == "postgresql":
            self._admin(f'ALTER DATABASE "{self.database.name}" ALLOW_CONNECTIONS true')
        elif backend == "mariadb":
            self._admin(f"ALTER USER '{self._user}'@'%' ACCOUNT UNLOCK")
        elif self._sqlite is not None:
            self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
            self._sqlite = None

    def close(self) -> None:
        self.restore()
        if self.database.backend == "mariadb":
            self._admin(f"DROP USER IF EXISTS '{self._user}'@'%'")


@contextlib.contextmanager
def recording(gen: SnowflakeGenerator) -> Iterator[Recorder]:
    recorder = Recorder(gen)
    thread = threading.Thread(target=recorder.run, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.stop.set()
        thread.join(30)
