"""The PostgreSQL part of the shard-move tests (:mod:`tests.plugins.shard_moves` holds what
every backend shares): two throwaway clusters, a database pair on them, and what only
PostgreSQL has (publications, replication slots, subscriptions; the copy held by an advisory
lock).

``start_clusters`` starts a source and a target (``example_project.local_servers``, stopped by
PID at the end) with the given lines appended to their ``postgresql.conf``; ``Pair`` is one
database on each with the same sharded tables, rows only on the source; ``KIND`` is this
backend's :class:`tests.plugins.shard_moves.Kind`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from example_project import local_servers
from snowflake_db.sharding.moves import Leftovers, PostgresMoveBackend, run_move_steps, wait_until

from .databases import unavailable
from .shard_moves import (
    CONNECT_TIMEOUT_S,
    MASK,
    SHARD,
    STEP_TIMEOUT_S,
    BasePair,
    MoveThread,
    Setup,
    server_pair,
)

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
#: Both clusters of the mover's tests: a shard moves from ``a`` to ``b`` and back.
BOTH_CONF = SOURCE_CONF + "max_logical_replication_workers = 6\n"
#: The fence's objects on the source: a trigger per kind of write on each of the two tables.
FENCE_OBJECTS = 6


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

    def start(source: local_servers.ThrowawayPostgres,
              target: local_servers.ThrowawayPostgres) -> None:
        for cluster, conf in ((source, source_conf), (target, target_conf)):
            with (cluster.data / "postgresql.conf").open("a") as handle:
                handle.write(conf)
            cluster.start()

    source = local_servers.ThrowawayPostgres(name="movesrc")
    with server_pair(source, lambda: local_servers.ThrowawayPostgres(
            template=source.data, name="movetgt"), start) as (_, target):
        yield Clusters(source, target)


_databases = itertools.count(1)


@dataclass
class Pair(BasePair):
    """One database on each cluster, with the same sharded tables; rows only on the source."""

    @property
    def clusters(self) -> Clusters:
        return self.servers  # type: ignore[no-any-return]

    def url(self, which: str) -> str:
        return str(self.server(which).url(self.db))

    def conninfo(self, which: str) -> str:
        cluster = getattr(self.clusters, which)
        return f"host={cluster.host} port={cluster.port} user=postgres dbname={self.db}"

    def connect(self, which: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo(which), autocommit=autocommit, connect_timeout=10)

    def backend(self, *, shard: int = 5, move_id: int | None = None, **kw: Any
                ) -> PostgresMoveBackend:
        options: dict[str, Any] = {
            "source": self.conninfo("source"), "target": self.conninfo("target"),
            "source_conninfo_for_target": self.conninfo("source"),
            **self.move_options(shard, move_id, "pg_b")}
        options.update(kw)
        return PostgresMoveBackend(**options)

    def query(self, which: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connect(which) as conn:
            cursor = conn.execute(query.encode(), params)
            return list(cursor) if cursor.description is not None else []

    def assert_nothing_left(self) -> None:
        """No publication, slot or subscription at all, whatever its name."""
        assert self.count("source", "SELECT count(*) FROM pg_publication") == 0
        assert self.count("source", "SELECT count(*) FROM pg_replication_slots") == 0
        assert self.count("target", "SELECT count(*) FROM pg_subscription") == 0

    def assert_no_capture_left(self) -> None:
        """No replication object of any move (a fence is a trigger: it may stay)."""
        self.assert_nothing_left()


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




# -- this backend's part of the shared tests ---------------------------------------------------


HOLD_LOCK = 4242


@dataclass
class AdvisoryHold:
    """A session on the target holding advisory lock :data:`HOLD_LOCK`, which an ``ALWAYS``
    trigger on orders waits for before each row: the table copy (which runs as a replica,
    where only ``ALWAYS`` triggers fire) waits at its first row. A table lock would hold up
    the apply worker too (it locks a table before skipping the changes of one not yet copied).
    """

    setup: Setup
    conn: psycopg.Connection[Any]

    def wait(self, moving: MoveThread) -> None:
        """Until the orders table's copy is under way: state 'd' on the target, its
        table-copy slot on the source."""
        pair = self.setup.pair

        def started() -> bool:
            assert moving.error is None, (moving.error, moving.events)
            with pair.connect("target") as t:
                state = t.execute("SELECT srsubstate::text FROM pg_subscription_rel "
                                  "WHERE srrelid = 'orders'::regclass").fetchone()
            if state != ("d",):
                return False
            with pair.connect("source") as s:
                row = s.execute("SELECT count(*) FROM pg_replication_slots "
                                "WHERE slot_name LIKE 'pg\\_%\\_sync\\_%'").fetchone()
                return bool(row and row[0])
        wait_until(started, timeout_s=60, what="the orders table's copy under way")

    def release(self) -> None:
        self.conn.close()  # ends the lock: the copy goes on

    def drop(self) -> None:
        with self.setup.pair.connect("target") as t:
            t.execute("DROP TRIGGER IF EXISTS hold_copy ON orders")


#: Advisory locks the order_items copy waits for: during its copy, and after it (its catch-up).
COPYING_LOCK, CAUGHT_UP_LOCK = 4343, 4344


class StrandedCopy:
    """The order_items copy left as a crash of the source can leave it: its state ``f``
    (copied) on the target and its table-sync slot gone from the source, which PostgreSQL
    cannot recover from (the worker asks for the slot for ever).

    Made deterministically: an ``ALWAYS`` trigger on the target's order_items waits for
    :data:`COPYING_LOCK` while the table copies and for :data:`CAUGHT_UP_LOCK` once copied.
    With the copy held, a row of the shard copied by it is updated on the source and the
    subscription's main worker receives the update; released, the copy ends (``f``) and its
    catch-up must apply that update, where it waits. Its slot is then dropped on the source
    (its walsender ended first), and the catch-up released: its next read finds the
    connection gone, and every restart the slot missing."""

    def __init__(self, setup: Setup, move_id: int = 1) -> None:
        self.setup = setup
        self.name = f"sfdb_move_{move_id}"
        with setup.pair.connect("target") as t:
            t.execute(f"""CREATE FUNCTION hold_items() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  CASE (SELECT srsubstate FROM pg_subscription_rel WHERE srrelid = TG_RELID
                        LIMIT 1)
                    WHEN 'd' THEN PERFORM pg_advisory_xact_lock_shared({COPYING_LOCK});
                    WHEN 'f' THEN PERFORM pg_advisory_xact_lock_shared({CAUGHT_UP_LOCK});
                    ELSE NULL;
                  END CASE;
                  RETURN NEW;
                END $$""".encode())
            t.execute(b"CREATE TRIGGER hold_items BEFORE INSERT OR UPDATE ON order_items "
                      b"FOR EACH ROW EXECUTE FUNCTION hold_items()")
            t.execute(b"ALTER TABLE order_items ENABLE ALWAYS TRIGGER hold_items")
        self._locks: dict[int, psycopg.Connection[Any]] = {}
        for lock in (COPYING_LOCK, CAUGHT_UP_LOCK):
            self._locks[lock] = setup.pair.connect("target")
            self._locks[lock].execute("SELECT pg_advisory_lock(%s)", (lock,))

    def _waiting_on(self, lock: int) -> bool:
        return bool(self.setup.pair.query(
            "target", "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                      "AND NOT granted", (lock,)))

    def _release(self, lock: int) -> None:
        self._locks.pop(lock).close()

    def make(self, moving: MoveThread | None = None) -> str:
        """Strand the copy (the move's subscription made); the dropped slot's name."""
        pair = self.setup.pair

        def waiting(lock: int) -> Callable[[], bool]:
            def check() -> bool:
                assert moving is None or moving.error is None, moving.error
                return self._waiting_on(lock)
            return check

        wait_until(waiting(COPYING_LOCK), timeout_s=60, what="the order_items copy held")
        relid = pair.query("target", "SELECT 'order_items'::regclass::oid")[0][0]
        [slot] = [name for (name,) in pair.query(
            "source", "SELECT slot_name::text FROM pg_replication_slots")
            if re.fullmatch(rf"pg_\d+_sync_{relid}_\d+", name)]
        with pair.connect("source") as s:
            s.execute("SET synchronous_commit = on")
            s.execute("UPDATE order_items SET qty = qty WHERE id = (SELECT min(id) FROM "
                      "order_items WHERE id & %s = %s)", (MASK, SHARD))
            [(updated,)] = s.execute("SELECT pg_current_wal_lsn()::text").fetchall()
        wait_until(lambda: bool(pair.query(
            "target", "SELECT 1 FROM pg_stat_subscription WHERE subname = %s AND "
                      "relid IS NULL AND received_lsn >= %s::pg_lsn", (self.name, updated))),
            timeout_s=60, what="the update received by the subscription's main worker")
        self._release(COPYING_LOCK)
        wait_until(waiting(CAUGHT_UP_LOCK), timeout_s=60,
                   what="the order_items catch-up held at the update")

        def dropped() -> bool:
            with pair.connect("source") as s:
                s.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                          "WHERE slot_name = %s AND active_pid IS NOT NULL", (slot,))
                try:
                    s.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                except psycopg.errors.ObjectInUse:  # its walsender not gone yet
                    return False
            return True

        wait_until(dropped, timeout_s=30, what=f"slot {slot} dropped")
        self._release(CAUGHT_UP_LOCK)
        return slot

    def close(self) -> None:
        for lock in list(self._locks):
            self._release(lock)


class PostgresKind:
    """PostgreSQL's part of :mod:`tests.plugins.shard_moves`."""

    name = "postgresql"
    fence_objects = FENCE_OBJECTS
    write_kinds = frozenset({"insert", "update", "delete"})
    down_errors: tuple[type[BaseException], ...] = (psycopg.OperationalError,)

    @contextmanager
    def start_servers(self, *, both_logical: bool = True) -> Iterator[Clusters]:
        """Both clusters with ``wal_level = logical`` (a shard moves from ``a`` to ``b`` and
        back), or only the source (the target with the default ``replica``)."""
        confs = (BOTH_CONF, BOTH_CONF) if both_logical else (SOURCE_CONF, TARGET_CONF)
        with start_clusters(*confs) as started:
            yield started

    def make_pair(self, servers: Clusters, prefix: str) -> Any:
        return make_pair(servers, prefix=prefix)

    def open(self, url: str) -> psycopg.Connection[Any]:
        """An autocommit connection whose commits are durable (the clusters run with
        ``synchronous_commit = off``, and a crashed server would lose commits acknowledged a
        moment before: the server's setting, not the move's doing)."""
        libpq = url.replace("+psycopg", "") + "?options=-c%20synchronous_commit%3Don"
        return psycopg.connect(libpq, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)

    def write(self, url: str, query: str, params: tuple[Any, ...]) -> int:
        """One autocommit statement on its own connection (:meth:`open`)."""
        with self.open(url) as conn:
            return self.run(conn, query, params)

    def run(self, connection: psycopg.Connection[Any], query: str, params: tuple[Any, ...]
            ) -> int:
        return int(connection.execute(query.encode(), params).rowcount)

    def hold_copy(self, setup: Setup) -> AdvisoryHold:
        with setup.pair.connect("target") as t:
            t.execute(f"""CREATE FUNCTION hold_copy() RETURNS trigger LANGUAGE plpgsql AS $$
                          BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD_LOCK}); RETURN NEW;
                          END $$""".encode())
            t.execute("CREATE TRIGGER hold_copy BEFORE INSERT ON orders FOR EACH ROW "
                      "EXECUTE FUNCTION hold_copy()")
            t.execute("ALTER TABLE orders ENABLE ALWAYS TRIGGER hold_copy")
        conn = setup.pair.connect("target")
        conn.execute("SELECT pg_advisory_lock(%s)", (HOLD_LOCK,))
        return AdvisoryHold(setup, conn)

    def bring_down(self, server: local_servers.ThrowawayPostgres, how: str) -> None:
        """``immediate``: a crash (SIGQUIT; a fast shutdown would wait for the walsender of a
        held copy)."""
        assert how == "immediate", how
        server.stop(immediate=True)

    def is_down(self, server: local_servers.ThrowawayPostgres) -> bool:
        return server.pid is None

    def drop_database(self, server: local_servers.ThrowawayPostgres, name: str) -> None:
        """Nothing: the clusters go at the end, and a control database holds no slot."""

    def run_steps(self, backend: PostgresMoveBackend, *, stop_after: str | None = None
                  ) -> dict[str, Any]:
        """The library's own driver, each wait bounded by :data:`STEP_TIMEOUT_S`."""
        return run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after=stop_after)

    def assert_left_after(self, pair: Pair, left: Leftovers, step: str, move_id: int, *,
                          captured: bool, copying: bool, fenced: bool) -> None:
        """A publication and its slot once captured, the subscription once copying, the
        fence's triggers once fenced."""
        name = f"sfdb_move_{move_id}"
        assert left.publications == ((name,) if captured else ()), step
        assert (name in left.slots) == captured, step
        assert left.subscriptions == ((name,) if copying else ()), step
        assert len(left.fence_triggers) == (FENCE_OBJECTS if fenced else 0), step

    def assert_not_fenced(self, pair: Pair, backend: PostgresMoveBackend) -> None:
        """No fence trigger yet."""
        assert len(backend.leftovers().fence_triggers) == 0


KIND = PostgresKind()
