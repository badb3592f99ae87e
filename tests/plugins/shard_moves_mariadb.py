"""The MariaDB part of the shard-move tests (:mod:`tests.plugins.shard_moves` holds what every
backend shares): two throwaway servers, a database pair on them, a step driver, and what only
MariaDB has (capture triggers, changelog and progress tables; the copy held by a row lock).

``start_servers`` starts a source with a row-based binary log (as production sources run:
the triggers and the binlog checks are exercised with it) and a target without one
(``example_project.local_servers``, stopped by PID at the end); ``Pair`` is one database on each
with the same sharded tables, rows only on the source; ``run_steps`` drives a backend's steps
in order; ``KIND`` is this backend's :class:`tests.plugins.shard_moves.Kind`.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pymysql
from sqlalchemy.engine import make_url

from example_project import local_servers
from snowflake_db.sharding.moves import Leftovers, wait_until
from snowflake_db.sharding.moves._mariadb import FENCE_ERRNO, MariaDBMoveBackend

from .databases import drop_mariadb_database, unavailable
from .shard_moves import CONNECT_TIMEOUT_S, STEP_TIMEOUT_S, BasePair, MoveThread, Setup, server_pair

DDL = [
    """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL,
       status VARCHAR(40) NOT NULL DEFAULT 'new', total_cents BIGINT NOT NULL,
       created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), note TEXT,
       weight DOUBLE, label VARCHAR(20) CHARACTER SET latin1, blob_ VARBINARY(16)
       ) ENGINE=InnoDB""",
    """CREATE TABLE order_items (id BIGINT PRIMARY KEY, order_id BIGINT NOT NULL,
       sku VARCHAR(40) NOT NULL, qty INT NOT NULL, price DECIMAL(10, 2) NOT NULL,
       FOREIGN KEY (order_id) REFERENCES orders (id)) ENGINE=InnoDB""",
]
LOAD = [
    """INSERT INTO orders (id, customer_id, total_cents, created_at, note, weight, label, blob_)
       SELECT (seq << 4) | (seq % 16), seq % 97, seq * 7,
              TIMESTAMP'2026-01-01 00:00:00' - INTERVAL seq MINUTE, MD5(seq), seq / 3,
              CONCAT('é', seq), UNHEX(LPAD(HEX(seq), 8, '0'))
       FROM seq_1_to_3000""",
    """INSERT INTO order_items (id, order_id, sku, qty, price)
       SELECT ((seq + 100000) << 4) | (seq % 16), (seq << 4) | (seq % 16), CONCAT('sku', seq),
              seq % 5 + 1, seq / 7
       FROM seq_1_to_3000""",
]
#: What run_steps runs, in order (``stop_after`` takes one of them).
STEPS = ("check", "capture", "copy", "synced", "caught_up", "pre_verify", "fence", "drained",
         "verify", "cleanup")


class Server(local_servers.ThrowawayMariaDB):
    """A throwaway mariadbd; with ``binlog``, a row-based binary log in place of the
    ``--skip-log-bin`` local_servers starts it with."""

    def __init__(self, *, binlog: bool = False, **options: Any) -> None:
        self.binlog = binlog
        super().__init__(**options)

    def launch(self) -> None:
        if not self.binlog:
            super().launch()
            return
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                ["mariadbd", "--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.tmp}",
                 f"--port={self.port}", "--bind-address=127.0.0.1",
                 f"--socket={self.directory / 'mysqld.sock'}", "--log-bin=mariadb-bin",
                 "--binlog-format=ROW", "--server-id=1", "--innodb-buffer-pool-size=32M",
                 *self._user],
                stdout=log, stderr=subprocess.STDOUT, env=self._environment,
            )


@dataclass
class Servers:
    source: Server
    target: Server


@contextmanager
def start_servers() -> Iterator[Servers]:
    """A source (row-based binary log) and a target, from one install, started in parallel."""
    try:
        source = Server(binlog=True, name="mvsrc")
    except local_servers.ServerUnavailableError as error:
        unavailable(str(error))

    def start(source: Server, target: Server) -> None:
        source.launch()
        target.launch()
        source.wait_ready()
        target.wait_ready()

    with server_pair(source, lambda: Server(name="mvtgt", template=source.data), start
                     ) as (_, target):
        yield Servers(source, target)


_databases = itertools.count(1)


@dataclass
class Pair(BasePair):
    """One database on each server, with the same sharded tables; rows only on the source."""

    def url(self, which: str, user: str = "root", password: str = "") -> str:
        server = self.server(which)
        secret = f":{password}" if password else ""
        return f"mysql+pymysql://{user}{secret}@{server.host}:{server.port}/{self.db}"

    def connect(self, which: str, *, autocommit: bool = True) -> Any:
        server = self.server(which)
        return pymysql.connect(host=server.host, port=server.port, user="root",
                               database=self.db, autocommit=autocommit, charset="utf8mb4",
                               connect_timeout=10)

    def backend(self, *, shard: int = 5, move_id: int | None = None, **options: Any
                ) -> MariaDBMoveBackend:
        given: dict[str, Any] = {"source": self.url("source"), "target": self.url("target"),
                                 **self.move_options(shard, move_id, "maria_b")}
        given.update(options)
        return MariaDBMoveBackend(**given)

    def query(self, which: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        connection = self.connect(which)
        try:
            with connection.cursor() as cursor:
                cursor.execute(query, params)
                return list(cursor.fetchall())
        finally:
            connection.close()

    def execute(self, which: str, *statements: str) -> None:
        for statement in statements:
            self.query(which, statement)

    def move_objects(self, which: str) -> list[str]:
        """Every trigger and table of any move (``sfdb_*``) in this database on ``which``."""
        return sorted(
            [f"trigger {name}" for (name,) in self.query(
                which, "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS "
                       "WHERE TRIGGER_SCHEMA = %s AND TRIGGER_NAME LIKE 'sfdb%%'", (self.db,))]
            + [f"table {name}" for (name,) in self.query(
                which, "SELECT TABLE_NAME FROM information_schema.TABLES "
                       "WHERE TABLE_SCHEMA = %s AND TABLE_NAME LIKE 'sfdb%%'", (self.db,))])

    def assert_no_capture_left(self) -> None:
        """No capture trigger, changelog or progress table of any move on either side."""
        for which in ("source", "target"):
            left = [name for name in self.move_objects(which)
                    if not name.startswith(("trigger sfdb_fence_", "table sfdb_fence_"))]
            assert left == [], (which, left)

    def assert_nothing_left(self) -> None:
        assert self.move_objects("source") == [] and self.move_objects("target") == []


@contextmanager
def make_pair(servers: Servers, prefix: str = "mvdb") -> Iterator[Pair]:
    """A fresh database on each server, tables on both, rows on the source."""
    db = f"{prefix}{next(_databases)}"
    for server in (servers.source, servers.target):
        connection = server.connect()
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {db}")
                cursor.execute(f"USE {db}")
                for statement in DDL:
                    cursor.execute(statement)
        finally:
            connection.close()
    pair = Pair(servers, db)
    pair.execute("source", *LOAD)
    try:
        yield pair
    finally:
        for server in (servers.source, servers.target):
            with server.connect() as connection, connection.cursor() as cursor:
                drop_mariadb_database(cursor, db)


def is_fence_refusal(error: BaseException) -> bool:
    args = getattr(error, "args", ())
    return bool(args) and args[0] == FENCE_ERRNO and "SFM01 shard=" in str(args[1])


# -- steps -------------------------------------------------------------------------------------


def run_steps(backend: MariaDBMoveBackend, *, start_at: str = "check",
              stop_after: str | None = None, timeout_s: float = STEP_TIMEOUT_S,
              terminate_blockers: bool = False,
              on_step: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Run :data:`STEPS` in order (from ``start_at`` up to ``stop_after``) as a mover would:
    the copy and the catch-up are :meth:`advance` calls until the copy is done and the backlog
    small, the drain polls :meth:`drained`; each wait bounded by ``timeout_s``."""
    results: dict[str, Any] = {}
    position: list[str] = []

    def advance_until(done: Callable[[], bool], what: str) -> float:
        def step() -> bool:
            if done():
                return True
            backend.advance()
            return False
        return wait_until(step, timeout_s=timeout_s, what=what, poll_s=0.0)

    def fence() -> Any:
        fenced = backend.fence(terminate_blockers=terminate_blockers)
        position.append(fenced.position)
        return fenced

    actions: dict[str, Callable[[], Any]] = {
        "check": backend.check,
        "capture": backend.capture,
        "copy": backend.copy,
        "synced": lambda: advance_until(backend.copy_synced, "initial copy done"),
        "caught_up": lambda: advance_until(lambda: (backend.backlog() or 0) <= 20,
                                           "backlog of 20 rows"),
        "pre_verify": lambda: backend.verify_before_fence(timeout_s=timeout_s),
        "fence": fence,
        "drained": lambda: wait_until(lambda: backend.drained(position[0]),
                                      timeout_s=timeout_s, what="drained", poll_s=0.0),
        "verify": backend.verify,
        "cleanup": backend.cleanup,
    }
    with backend.held():
        for name in STEPS[STEPS.index(start_at):]:
            results[name] = actions[name]()
            if on_step is not None:
                on_step(name, results[name])
            if name == stop_after:
                break
    return results


# -- this backend's part of the shared tests ---------------------------------------------------

#: The fence's objects on the source: a trigger per kind of write on each of the two tables,
#: and the fence row's table.
FENCE_OBJECTS = 2 * 3 + 1


@dataclass
class RowLockHold:
    """A transaction on the target that holds a lock on the end of the empty ``orders`` table
    (a locking read of all of it): every insert into it waits, the copy's first one included,
    for up to ``innodb_lock_wait_timeout`` (50 s); the mover's checks read past it."""

    setup: Setup
    connection: Any

    def wait(self, moving: MoveThread) -> None:
        def held() -> bool:
            assert moving.error is None, (moving.error, moving.events)
            return copy_waiting(self.setup)
        wait_until(held, timeout_s=60, what="the copy's insert waiting on b", poll_s=0.2)

    def release(self) -> None:
        with suppress(pymysql.MySQLError):  # a killed target ended the session already
            self.connection.rollback()  # the copy goes on
        with suppress(pymysql.MySQLError):
            self.connection.close()

    def drop(self) -> None:
        """Nothing: the lock went with its transaction."""


def copy_waiting(setup: Setup) -> bool:
    """Whether an insert into ``b``'s orders waits for a lock (the held copy). Polled at
    0.2 s at most: InnoDB refreshes its transaction views only 0.1 s after the last read."""
    return bool(setup.pair.query(
        "target", "SELECT 1 FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' "
                  "AND trx_query LIKE '%%INSERT INTO%%orders%%'"))


class MariaDBKind:
    """MariaDB's part of :mod:`tests.plugins.shard_moves`."""

    name = "mariadb"
    fence_objects = FENCE_OBJECTS
    write_kinds = frozenset({"insert", "insert_ignore", "insert_ignore_dup", "upsert",
                             "replace", "update", "delete"})
    down_errors: tuple[type[BaseException], ...] = (pymysql.err.OperationalError,)

    def start_servers(self, *, both_logical: bool = True) -> Any:
        """The source with a row-based binary log, the target without (either way)."""
        return start_servers()

    def make_pair(self, servers: Servers, prefix: str) -> Any:
        return make_pair(servers, prefix=prefix)

    def open(self, url: str) -> Any:
        """An autocommit connection."""
        where = make_url(url)
        return pymysql.connect(host=where.host, port=where.port, user=where.username,
                               database=where.database, autocommit=True, charset="utf8mb4",
                               connect_timeout=CONNECT_TIMEOUT_S)

    def write(self, url: str, query: str, params: tuple[Any, ...]) -> int:
        """One autocommit statement on its own connection (:meth:`open`)."""
        connection = self.open(url)
        try:
            return self.run(connection, query, params)
        finally:
            connection.close()

    def run(self, connection: Any, query: str, params: tuple[Any, ...]) -> int:
        with connection.cursor() as cursor:
            return int(cursor.execute(query, params))

    def hold_copy(self, setup: Setup) -> RowLockHold:
        connection = setup.connect("b", autocommit=False)
        with connection.cursor() as cursor:
            assert cursor.execute("SELECT id FROM orders FOR UPDATE") == 0
        return RowLockHold(setup, connection)

    def bring_down(self, server: Server, how: str) -> None:
        """``stop``: a clean shutdown (SIGTERM); ``kill``: SIGKILL (crash recovery)."""
        assert server.process is not None
        if how == "kill":
            server.process.kill()
            server.process.wait(30)
            server.process = None
        else:
            assert how == "stop", how
            server.stop()

    def is_down(self, server: Server) -> bool:
        return server.process is None

    def run_steps(self, backend: MariaDBMoveBackend, *, stop_after: str | None = None
                  ) -> dict[str, Any]:
        return run_steps(backend, stop_after=stop_after)

    def assert_left_after(self, pair: Pair, left: Leftovers, step: str, move_id: int, *,
                          captured: bool, copying: bool, fenced: bool) -> None:
        """The changelog (and the fence's triggers and table, down) once captured, the
        copy's progress table once copying, the fence's row up once fenced."""
        assert (f"source:sfdb_changes_{move_id}" in left.verify_objects) == captured, step
        assert (f"target:sfdb_copy_{move_id}" in left.verify_objects) == copying, step
        assert len(left.fence_triggers) == (FENCE_OBJECTS if captured else 0), step
        fence_row = pair.query("source", f"SELECT fenced FROM sfdb_fence_{move_id}"
                               ) if captured else [(0,)]
        assert fence_row == [(int(fenced),)], step

    def assert_not_fenced(self, pair: Pair, backend: MariaDBMoveBackend) -> None:
        """The fence's row down, and no mark of a first pass in the changelog."""
        assert pair.query("source", f"SELECT fenced FROM sfdb_fence_{backend.move_id}"
                          ) == [(0,)]
        assert pair.query("source", f"SELECT COUNT(*) FROM sfdb_changes_{backend.move_id} "
                                    "WHERE seq = 1") == [(0,)]  # no mark

    def drop_database(self, server: Server, name: str) -> None:
        with suppress(pymysql.MySQLError), server.connect() as connection, \
                connection.cursor() as cursor:
            drop_mariadb_database(cursor, name)


KIND = MariaDBKind()
