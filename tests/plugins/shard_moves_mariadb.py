"""Two throwaway MariaDB servers, a database pair on them, writer threads and a step driver:
what the MariaDB shard-move tests share (tests/sharding/test_shard_moves_mariadb.py).

``start_servers`` starts a source with a row-based binary log (as production sources run:
the triggers and the binlog checks are exercised with it) and a target without one
(``example_project.local_servers``, stopped by PID at the end); ``Pair`` is one database on each
with the same sharded tables, rows only on the source; ``Writer`` writes (insert, INSERT IGNORE,
ON DUPLICATE KEY UPDATE, REPLACE, update, delete) its own rows on every shard so that what each
acknowledged write left is known exactly; ``run_steps`` drives a backend's steps in order.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pymysql

from example_project import local_servers
from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.sharding.moves import MovedTable, wait_until
from snowflake_db.sharding.moves._mariadb import FENCE_ERRNO, MariaDBMoveBackend

from .databases import unavailable

LAYOUT = Layout(sequence_bits=8, shard_bits=4)
MASK = LAYOUT.max_shard
TABLES = [MovedTable("orders"), MovedTable("order_items")]
STEP_TIMEOUT_S = 60.0
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
    target: Server | None = None
    try:
        target = Server(name="mvtgt", template=source.data)
        source.launch()
        target.launch()
        source.wait_ready()
        target.wait_ready()
        assert not {source.port, target.port} & {5432, 3306}  # never the shared servers
        yield Servers(source, target)
    finally:
        source.close()
        if target is not None:
            target.close()


_databases = itertools.count(1)


@dataclass
class Pair:
    """One database on each server, with the same sharded tables; rows only on the source."""

    servers: Servers
    db: str
    move_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def server(self, which: str) -> Server:
        return self.servers.source if which == "source" else self.servers.target

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
        given: dict[str, Any] = {
            "source": self.url("source"), "target": self.url("target"), "layout": LAYOUT,
            "shard": shard, "move_id": next(self.move_ids) if move_id is None else move_id,
            "target_name": "maria_b", "tables": TABLES,
        }
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

    def rows(self, which: str, table: str, shard: int) -> dict[int, tuple[Any, ...]]:
        return {row[0]: row for row in self.query(
            which, f"SELECT * FROM {table} WHERE (id & {MASK}) = %s", (shard,))}

    def count(self, which: str, query: str) -> int:
        return int(self.query(which, query)[0][0])

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
                cursor.execute(f"DROP DATABASE IF EXISTS {db}")


def is_fence_refusal(error: BaseException) -> bool:
    args = getattr(error, "args", ())
    return bool(args) and args[0] == FENCE_ERRNO and "SFM01 shard=" in str(args[1])


# -- writers -----------------------------------------------------------------------------------


@dataclass
class Op:
    start: float
    end: float
    shard: int
    kind: str
    ok: bool


@dataclass
class Writer:
    """Autocommit writes on every shard, own rows only, so that what each acknowledged write
    left behind is known exactly: plain INSERT, INSERT IGNORE (a new row, or a duplicate that
    changes nothing), INSERT ... ON DUPLICATE KEY UPDATE, REPLACE, UPDATE and DELETE."""

    worker_id: int
    pair: Pair
    stop: threading.Event
    ops: list[Op] = field(default_factory=list)
    alive: dict[int, str] = field(default_factory=dict)  # acknowledged rows -> status
    deleted: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        generator = SnowflakeGenerator(self.worker_id, layout=LAYOUT)
        rng = random.Random(self.worker_id)
        try:
            connection = self.pair.connect("source")
            try:
                while not self.stop.is_set() and len(self.ops) < 50_000:
                    self._one(connection, generator, rng)
                    time.sleep(0.001)
            finally:
                connection.close()
        except Exception as error:  # reported by the test, never swallowed
            self.errors.append(repr(error))

    def _one(self, connection: Any, generator: SnowflakeGenerator, rng: random.Random) -> None:
        roll = rng.random()
        status = f"s{rng.randrange(10_000)}"
        new_id = generator.next_id_in_shard(rng.randrange(MASK + 1))
        existing = rng.choice(list(self.alive)) if self.alive else None
        insert = "INTO orders (id, customer_id, total_cents, status) VALUES (%s, 7, 70, %s)"
        after: str | None  # the row's status once acknowledged (None: deleted)
        if existing is not None and roll < 0.15:
            oid, kind, after = existing, "update", status
            query, params = "UPDATE orders SET status = %s WHERE id = %s", (status, oid)
        elif existing is not None and roll < 0.25:
            oid, kind, after = existing, "delete", None
            query, params = "DELETE FROM orders WHERE id = %s", (oid,)
        elif existing is not None and roll < 0.32:  # a duplicate: ignored, nothing changes
            oid, kind, after = existing, "insert_ignore_dup", self.alive[existing]
            query, params = f"INSERT IGNORE {insert}", (oid, status)
        elif roll < 0.4:
            oid, kind, after = new_id, "insert_ignore", status
            query, params = f"INSERT IGNORE {insert}", (oid, status)
        elif existing is not None and roll < 0.5:
            oid, kind, after = existing, "upsert", status
            query = f"INSERT {insert} ON DUPLICATE KEY UPDATE status = VALUES(status)"
            params = (oid, status)
        elif existing is not None and roll < 0.58:
            oid, kind, after = existing, "replace", status
            query, params = f"REPLACE {insert}", (oid, status)
        else:
            oid, kind, after = new_id, "insert", status
            query, params = f"INSERT {insert}", (oid, status)
        start = time.monotonic()
        try:
            with connection.cursor() as cursor:
                cursor.execute(query, params)  # autocommit: acknowledged when it returns
            ok = True
        except pymysql.MySQLError as error:
            if not is_fence_refusal(error):
                raise
            ok = False
        self.ops.append(Op(start, time.monotonic(), oid & MASK, kind, ok))
        if not ok:
            return
        if after is None:
            del self.alive[oid]
            self.deleted.add(oid)
        else:
            self.alive[oid] = after


def start_writers(pair: Pair, count: int = 3) -> tuple[list[Writer], Callable[[], None]]:
    """``count`` writer threads on the source; returns them and a stop (joins, bounded)."""
    stop = threading.Event()
    writers = [Writer(worker, pair, stop) for worker in range(1, count + 1)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    for thread in threads:
        thread.start()

    def stopped() -> None:
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
    return writers, stopped


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
