"""Two throwaway PostgreSQL clusters, a database pair on them and writer threads: what the
shard-move tests share (tests/sharding/test_shard_moves_postgres.py, test_shard_mover.py).

``start_clusters`` starts a source and a target (``example_project.local_servers``, stopped by
PID at the end) with the given lines appended to their ``postgresql.conf``; ``Pair`` is one
database on each with the same sharded tables, rows only on the source; ``Writer`` writes
(insert, update, delete) its own rows on every shard so that what each acknowledged write left
is known exactly.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Engine, MetaData, create_engine, select

from example_project import local_servers
from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.sharding.moves import (
    FENCE_SQLSTATE,
    MovedTable,
    PostgresMoveBackend,
    ShardMover,
    wait_until,
)
from snowflake_db.sharding.shard_map import (
    add_target,
    create_shard_map_tables,
    init_shard_map,
    read_shard_map,
    shard_map_tables,
)
from snowflake_db.worker import worker_tables

from .databases import unavailable

LAYOUT = Layout(sequence_bits=8, shard_bits=4)
MASK = LAYOUT.max_shard
TABLES = [MovedTable("orders"), MovedTable("order_items")]
SOURCE_CONF = """
wal_level = logical
max_replication_slots = 6
max_wal_senders = 6
wal_retrieve_retry_interval = '200ms'
track_commit_timestamp = on
"""
TARGET_CONF = """
max_logical_replication_workers = 6
wal_retrieve_retry_interval = '200ms'
"""
DDL = [
    """CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL,
       status text NOT NULL DEFAULT 'new', total_cents bigint NOT NULL,
       created_at timestamptz NOT NULL DEFAULT now(), note text)""",
    """CREATE TABLE order_items (id bigint PRIMARY KEY, order_id bigint NOT NULL,
       sku text NOT NULL, qty integer NOT NULL, price numeric(10, 2) NOT NULL,
       weight double precision)""",
    # Items live on their order's shard (same low bits); deletes go children first.
    "ALTER TABLE order_items ADD FOREIGN KEY (order_id) REFERENCES orders (id)",
]
LOAD = [
    """INSERT INTO orders (id, customer_id, total_cents, created_at, note)
       SELECT (n << 4) | (n % 16), n % 97, n * 7, now() - n * interval '1 minute', md5(n::text)
       FROM generate_series(1, 3000) AS n""",
    """INSERT INTO order_items (id, order_id, sku, qty, price, weight)
       SELECT ((n + 100000) << 4) | (n % 16), (n << 4) | (n % 16), 'sku' || n, n % 5 + 1,
              n / 7.0, n / 3.0
       FROM generate_series(1, 3000) AS n""",
]
STEP_TIMEOUT_S = 60.0
#: Both clusters of the mover's tests: a shard moves from ``a`` to ``b`` and back.
BOTH_CONF = SOURCE_CONF + "max_logical_replication_workers = 6\n"


@dataclass
class Clusters:
    source: local_servers.ThrowawayPostgres
    target: local_servers.ThrowawayPostgres


@contextmanager
def start_clusters(source_conf: str = SOURCE_CONF, target_conf: str = TARGET_CONF
                   ) -> Iterator[Clusters]:
    """A source and a target cluster with these lines in their postgresql.conf."""
    problem = local_servers.postgres_unavailable()
    if problem:
        unavailable(problem)
    source = local_servers.ThrowawayPostgres(name="movesrc")
    target: local_servers.ThrowawayPostgres | None = None
    try:
        target = local_servers.ThrowawayPostgres(template=source.data, name="movetgt")
        for cluster, conf in ((source, source_conf), (target, target_conf)):
            with (cluster.data / "postgresql.conf").open("a") as handle:
                handle.write(conf)
            cluster.start()
        assert not {source.port, target.port} & {5432, 3306}  # never the shared servers
        yield Clusters(source, target)
    finally:
        source.close()
        if target is not None:
            target.close()


_databases = itertools.count(1)


@dataclass
class Pair:
    """One database on each cluster, with the same sharded tables; rows only on the source."""

    clusters: Clusters
    db: str
    move_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def conninfo(self, which: str) -> str:
        cluster = getattr(self.clusters, which)
        return f"host={cluster.host} port={cluster.port} user=postgres dbname={self.db}"

    def connect(self, which: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo(which), autocommit=autocommit, connect_timeout=10)

    def backend(self, *, shard: int = 5, move_id: int | None = None, **kw: Any
                ) -> PostgresMoveBackend:
        options: dict[str, Any] = {
            "source": self.conninfo("source"), "target": self.conninfo("target"),
            "source_conninfo_for_target": self.conninfo("source"), "layout": LAYOUT,
            "shard": shard, "move_id": next(self.move_ids) if move_id is None else move_id,
            "target_name": "pg_b", "tables": TABLES,
        }
        options.update(kw)
        return PostgresMoveBackend(**options)

    def rows(self, which: str, table: str, shard: int) -> dict[int, tuple[Any, ...]]:
        with self.connect(which) as conn:
            return {row[0]: row for row in conn.execute(
                f"SELECT * FROM {table} WHERE (id & {MASK}) = %s", (shard,))}

    def count(self, which: str, query: str) -> int:
        with self.connect(which) as conn:
            row = conn.execute(query).fetchone()
            assert row is not None
            return int(row[0])

    def assert_nothing_left(self) -> None:
        """No publication, slot or subscription at all, whatever its name."""
        assert self.count("source", "SELECT count(*) FROM pg_publication") == 0
        assert self.count("source", "SELECT count(*) FROM pg_replication_slots") == 0
        assert self.count("target", "SELECT count(*) FROM pg_subscription") == 0


@contextmanager
def make_pair(clusters: Clusters, prefix: str = "moves") -> Iterator[Pair]:
    """A fresh database on each cluster, tables on both, rows on the source."""
    db = f"{prefix}{next(_databases)}"
    for cluster in (clusters.source, clusters.target):
        cluster.create_database(db)
        cluster.execute(*DDL, database=db)
    clusters.source.execute(*LOAD, database=db)
    try:
        yield Pair(clusters, db)
    finally:  # a failed test's slot (slot names repeat per control database) must not fail the next
        drop_replication_objects(clusters, db)


def drop_replication_objects(clusters: Clusters, db: str) -> None:
    """After each test, whatever it left (a failed test must not fail the next ones):
    subscriptions of ``db`` on the target, slots of ``db`` on the source."""
    pair = Pair(clusters, db)
    with pair.connect("target") as conn:
        for (name,) in conn.execute("SELECT subname::text FROM pg_subscription s JOIN "
                                    "pg_database d ON d.oid = s.subdbid WHERE d.datname = %s",
                                    (db,)).fetchall():
            for statement in ("ALTER SUBSCRIPTION {} DISABLE",
                              "ALTER SUBSCRIPTION {} SET (slot_name = NONE)",
                              "DROP SUBSCRIPTION {}"):
                conn.execute(statement.format(f'"{name}"').encode())
    with pair.connect("source") as conn:
        for slot, pid in conn.execute("SELECT slot_name::text, active_pid FROM "
                                      "pg_replication_slots WHERE database = %s",
                                      (db,)).fetchall():
            if pid is not None:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_until(lambda slot=slot: conn.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,)).fetchone() in (None, (None,)), timeout_s=10, what="slot released")
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


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
    """Autocommit writes (insert, update, delete) on every shard, own rows only, so that what
    each acknowledged write left behind is known exactly."""

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
            with self.pair.connect("source") as conn:
                while not self.stop.is_set() and len(self.ops) < 50_000:
                    self._one(conn, generator, rng)
                    time.sleep(0.001)
        except Exception as error:  # reported by the test, never swallowed
            self.errors.append(repr(error))

    def _one(self, conn: psycopg.Connection[Any], generator: SnowflakeGenerator,
             rng: random.Random) -> None:
        roll = rng.random()
        params: tuple[Any, ...]
        if self.alive and roll < 0.2:
            oid, kind, status = rng.choice(list(self.alive)), "update", f"paid{rng.randrange(999)}"
            query, params = "UPDATE orders SET status = %s WHERE id = %s", (status, oid)
        elif self.alive and roll < 0.3:
            oid, kind, status = rng.choice(list(self.alive)), "delete", ""
            query, params = "DELETE FROM orders WHERE id = %s", (oid,)
        else:
            oid, kind, status = generator.next_id_in_shard(rng.randrange(MASK + 1)), "insert", "new"
            query = "INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, %s, %s)"
            params = (oid, rng.randrange(1000), rng.randrange(50_000))
        start = time.monotonic()
        try:
            conn.execute(query, params)  # autocommit: acknowledged when it returns
            ok = True
        except psycopg.Error as error:
            if error.sqlstate != FENCE_SQLSTATE:
                raise
            ok = False
        self.ops.append(Op(start, time.monotonic(), oid & MASK, kind, ok))
        if ok and kind == "delete":
            del self.alive[oid]
            self.deleted.add(oid)
        elif ok:
            self.alive[oid] = status


# -- a control database and the map (ShardMover's tests) -----------------------------------------

_controls = itertools.count(1)


@dataclass
class Setup:
    """A database pair (``a`` = first cluster, ``b`` = second), the control database and the
    map: every shard on ``a``, ``b`` registered."""

    pair: Pair
    control_url: str
    control: Engine
    movers: list[ShardMover] = field(default_factory=list)

    def url(self, name: str) -> str:
        cluster = self.pair.clusters.source if name == "a" else self.pair.clusters.target
        return cluster.url(self.pair.db)

    @property
    def targets(self) -> dict[str, str]:
        return {"a": self.url("a"), "b": self.url("b")}

    def mover(self, **options: Any) -> ShardMover:
        options.setdefault("lease_s", 5.0)
        options.setdefault("barrier_timeout_s", 30.0)
        options.setdefault("copy_timeout_s", 60.0)
        options.setdefault("catch_up_timeout_s", 60.0)
        # The tests' writers hold leases or are stopped before the cleanup.
        options.setdefault("assume_no_static_workers", True)
        mover = ShardMover(self.control, self.targets, layout=LAYOUT, tables=TABLES, **options)
        self.movers.append(mover)
        return mover

    def map_of(self, shard: int) -> tuple[str, str]:
        row = read_shard_map(self.control).rows[shard]
        return row.target, row.state

    def cli(self, *args: str, only: tuple[str, ...] = ("a", "b")) -> list[str]:
        return ["shards", *args, "--control", self.control_url,
                *(a for name, url in self.targets.items() if name in only
                  for a in ("--target", f"{name}={url}"))]

    def cli_move(self, *args: str, only: tuple[str, ...] = ("a", "b"),
                 tables: tuple[str, ...] = ("orders", "order_items")) -> list[str]:
        return [*self.cli("move", *args, only=only),
                *(a for table in tables for a in ("--table", table)), "--lease-seconds", "5",
                "--assume-no-static-workers"]

    def rows(self, name: str, shard: int) -> dict[str, dict[int, tuple[Any, ...]]]:
        which = "source" if name == "a" else "target"
        return {table: self.pair.rows(which, table, shard) for table in ("orders", "order_items")}

    def control_counts(self) -> tuple[int, int]:
        tables = shard_map_tables(MetaData())
        with self.control.connect() as connection:
            return (len(connection.execute(select(tables.moves.c.id)).all()),
                    read_shard_map(connection).version)


@contextmanager
def make_setup(clusters: Clusters, prefix: str = "mover", control_on: str = "source"
               ) -> Iterator[Setup]:
    """A database pair, a control database on the ``control_on`` cluster (``source`` = ``a``,
    ``target`` = ``b``) with the worker and map tables, and the map: every shard on ``a``,
    ``b`` registered."""
    with make_pair(clusters, prefix=prefix) as pair:
        name = f"{pair.db}_ctl{next(_controls)}"
        home = getattr(clusters, control_on)
        home.create_database(name)
        url = home.url(name)
        control = create_engine(url)
        create_shard_map_tables(control)
        worker_tables(MetaData()).slots.metadata.create_all(control)
        init_shard_map(control, layout=LAYOUT, assignment=["a"])
        add_target(control, "b")
        made = Setup(pair, url, control)
        try:
            yield made
        finally:
            for mover in made.movers:
                mover.close()
            control.dispose()


def assert_moved(setup: Setup, shard: int, before: dict[str, dict[int, tuple[Any, ...]]],
                 move_id: int, to: str = "b") -> None:
    """The shard's rows are on ``to`` exactly as they were, gone from the other side; the map
    serves it from ``to``; nothing of the move's replication is left."""
    other = "a" if to == "b" else "b"
    assert setup.rows(to, shard) == before
    assert setup.rows(other, shard) == {"orders": {}, "order_items": {}}
    assert setup.map_of(shard) == (to, "serving")
    mover = setup.mover()
    status = mover.status(move_id)
    assert status.move.state == "done" and status.move.mover_token is None
    left = mover.leftovers(move_id)
    assert left.replication_empty and len(left.fence_triggers) == 6
    setup.pair.assert_nothing_left()
