"""Spike for issue 31: measure the pieces of an online shard move on PostgreSQL 15.

Not product code and not part of ``make test``: it backs ``docs/design/shard-moves.md`` with
numbers. Run ``.venv/bin/python benchmarks/spike_shard_moves.py [--rows 1600000]``; it starts two
throwaway clusters (``example_project.local_servers``, ``wal_level=logical`` appended to their own
``postgresql.conf``), never touches the shared server, prints one JSON report and stops them.

Experiments (section numbers follow the design doc):

1. ``replica_identity``: does a row filter ``(id & 15) = k`` need ``id`` in the replica identity,
   and when does PostgreSQL say so (CREATE PUBLICATION or the first UPDATE)?
2. ``fence_lock_modes``: which fence DDL waits for a plain reader (CHECK ... NOT VALID vs
   CREATE TRIGGER), and does a CHECK fence stop a DELETE?
3. ``quiet_copy``: a subscription's initial copy of one shard vs ``psql COPY TO STDOUT | psql COPY
   FROM STDIN`` of the same rows between the same clusters.
4. ``move``: the whole move of shard ``k`` with 4 writer threads (insert/update/delete on every
   shard) plus one straggler transaction that writes shard ``k`` before the fence and commits
   after it: copy, catch-up, fence (trigger under ``lock_timeout``, retried), drain to the fence
   LSN, verification (count + checksums), acknowledged-order check, pauses of other shards.
5. ``checksum_cost``: seconds per million rows of the verification query.
6. ``cleanup``: DROP SUBSCRIPTION with the source reachable and unreachable; the mover
   SIGKILLed after each step, then a name-based cleanup; nothing may remain.
7. ``map_schema``: the control tables of the design doc, created and one flip run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from example_project.local_servers import ThrowawayPostgres, free_port
from snowflake_db import Layout, SnowflakeGenerator

SHARD_BITS = 4
MASK = (1 << SHARD_BITS) - 1
LAYOUT = Layout(sequence_bits=8, shard_bits=SHARD_BITS)
FENCE_SQLSTATE = "SFM01"
LOGICAL_CONF = """
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_logical_replication_workers = 8
max_sync_workers_per_subscription = 2
"""

ORDERS_DDL = """
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    status text NOT NULL DEFAULT 'new',
    total_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    note text
)
"""


# -- clusters --------------------------------------------------------------------------------


def start_clusters(extra_conf: str = "") -> tuple[ThrowawayPostgres, ThrowawayPostgres]:
    """Two clusters from one initdb, each with wal_level=logical in its own postgresql.conf."""
    source = ThrowawayPostgres(name="movesrc")
    target = ThrowawayPostgres(template=source.data, name="movetgt")
    for cluster in (source, target):
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(LOGICAL_CONF + extra_conf)
        cluster.start()
    return source, target


def connect(cluster: ThrowawayPostgres, db: str, **kw: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(host=cluster.host, port=cluster.port, user="postgres", dbname=db,
                           autocommit=kw.pop("autocommit", True), **kw)


def conninfo(cluster: ThrowawayPostgres, db: str) -> str:
    return f"host={cluster.host} port={cluster.port} user=postgres dbname={db}"


def one(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql.encode() if not params else sql, params or None).fetchone()
    return None if row is None else (row[0] if len(row) == 1 else row)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` (20 ms) until true; return the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what} not reached in {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def load_orders(conn: psycopg.Connection[Any], rows: int) -> None:
    """``rows`` orders with real keys of LAYOUT (worker 1..3, sequence, shard = row % 16)."""
    t0 = int(time.time() * 1000) - 86_400_000 - LAYOUT.epoch_ms
    shift_time = LAYOUT.worker_bits + LAYOUT.sequence_bits + SHARD_BITS
    shift_worker = LAYOUT.sequence_bits + SHARD_BITS
    conn.execute(
        f"""INSERT INTO orders (id, customer_id, status, total_cents, created_at, note)
        SELECT ((({t0} + n / 4096) << {shift_time}) | ((1 + n % 3) << {shift_worker})
                | (((n / 16) % 256) << {SHARD_BITS}) | (n % 16)),
               n % 100000, 'new', n % 50000, now() - (n || ' ms')::interval,
               repeat(md5(n::text), 2)
        FROM generate_series(0, {rows - 1}) AS n""".encode()
    )
    conn.execute(b"VACUUM ANALYZE orders")


# -- 1. replica identity ----------------------------------------------------------------------


def replica_identity(source: ThrowawayPostgres) -> dict[str, Any]:
    source.create_database("richeck")
    out: dict[str, Any] = {}
    with connect(source, "richeck") as c:
        c.execute(b"CREATE TABLE with_pk (id bigint PRIMARY KEY, customer_id bigint)")
        c.execute(b"CREATE TABLE no_pk (id bigint, customer_id bigint)")
        c.execute(b"INSERT INTO with_pk VALUES (5, 1), (6, 2); INSERT INTO no_pk VALUES (5, 1)")
        cases = {
            "pk_filter_on_id": "CREATE PUBLICATION p1 FOR TABLE with_pk WHERE ((id & 15) = 5)",
            "pk_filter_on_other_column":
                "CREATE PUBLICATION p2 FOR TABLE with_pk WHERE ((customer_id & 15) = 1)",
            "no_pk_filter_on_id": "CREATE PUBLICATION p3 FOR TABLE no_pk WHERE ((id & 15) = 5)",
        }
        for name, ddl in cases.items():
            table = "no_pk" if "no_pk" in name else "with_pk"
            try:
                c.execute(ddl.encode())
                created = "ok"
            except psycopg.Error as e:
                created = f"{e.sqlstate}: {e}"
            try:
                c.execute(f"UPDATE {table} SET customer_id = customer_id WHERE id = 5".encode())
                update = "ok"
            except psycopg.Error as e:
                update = f"{e.sqlstate}: {e.diag.message_primary} / {e.diag.message_detail}"
            out[name] = {"create_publication": created, "update_on_source": update}
            with suppress(psycopg.Error):
                c.execute(f"DROP PUBLICATION IF EXISTS p{list(cases).index(name) + 1}".encode())
        # Does the filter also refuse user-defined (non-builtin) functions?
        c.execute(b"CREATE FUNCTION my_shard(bigint) RETURNS bigint IMMUTABLE LANGUAGE sql"
                  b" AS 'SELECT $1 & 15'")
        try:
            c.execute(b"CREATE PUBLICATION p4 FOR TABLE with_pk WHERE (my_shard(id) = 5)")
            out["user_function_in_filter"] = "ok"
        except psycopg.Error as e:
            out["user_function_in_filter"] = f"{e.sqlstate}: {e.diag.message_primary}"
    return out


# -- 2. fence lock modes ------------------------------------------------------------------------

FENCE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION sfdb_fence_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = '{FENCE_SQLSTATE}',
        MESSAGE = format('shard %s of %s moved to %s', TG_ARGV[0], TG_TABLE_NAME, TG_ARGV[1]),
        DETAIL = format('shard=%s target=%s move=%s', TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]),
        HINT = 'reload the shard map and retry the transaction';
END $$
"""


def fence_sql(table: str, shard: int, target: str, move_id: int) -> list[str]:
    args = f"'{shard}', '{target}', '{move_id}'"
    name = f"sfdb_fence_{move_id}"
    return [
        f"CREATE TRIGGER {name}_w BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW "
        f"WHEN ((NEW.id & {MASK}) = {shard}) EXECUTE FUNCTION sfdb_fence_refuse({args})",
        f"CREATE TRIGGER {name}_d BEFORE DELETE ON {table} FOR EACH ROW "
        f"WHEN ((OLD.id & {MASK}) = {shard}) EXECUTE FUNCTION sfdb_fence_refuse({args})",
        f"CREATE TRIGGER {name}_t BEFORE TRUNCATE ON {table} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION sfdb_fence_refuse({args})",
    ]


def fence_lock_modes(source: ThrowawayPostgres) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with connect(source, "richeck") as c, connect(source, "richeck", autocommit=False) as reader:
        c.execute(FENCE_FUNCTION.encode())
        c.execute(b"CREATE TABLE fenced (id bigint PRIMARY KEY)")
        c.execute(b"INSERT INTO fenced VALUES (5), (21), (6)")
        reader.execute(b"SELECT count(*) FROM fenced")  # holds ACCESS SHARE until rollback
        c.execute(b"SET lock_timeout = '200ms'")
        for name, ddl in {
            "check_not_valid": "ALTER TABLE fenced ADD CONSTRAINT fence5 "
                               "CHECK ((id & 15) <> 5) NOT VALID",
            "trigger": ";".join(fence_sql("fenced", 5, "tgt", 0)),
        }.items():
            t = time.monotonic()
            try:
                c.execute(ddl.encode())
                out[f"{name}_beside_open_reader"] = f"created in {time.monotonic() - t:.3f}s"
            except psycopg.Error as e:
                waited = time.monotonic() - t
                out[f"{name}_beside_open_reader"] = f"{e.sqlstate} after {waited:.3f}s"
        reader.rollback()
        c.execute(b"DROP TRIGGER IF EXISTS sfdb_fence_0_w ON fenced;"
                  b"DROP TRIGGER IF EXISTS sfdb_fence_0_d ON fenced;"
                  b"DROP TRIGGER IF EXISTS sfdb_fence_0_t ON fenced")
        c.execute(b"ALTER TABLE fenced ADD CONSTRAINT fence5 CHECK ((id & 15) <> 5) NOT VALID")
        for stmt in ("INSERT INTO fenced VALUES (37)", "UPDATE fenced SET id = id WHERE id = 5",
                     "DELETE FROM fenced WHERE id = 21"):
            try:
                c.execute(stmt.encode())
                out[f"check_fence: {stmt}"] = "ALLOWED"
            except psycopg.Error as e:
                out[f"check_fence: {stmt}"] = f"refused {e.sqlstate}"
        c.execute(b"ALTER TABLE fenced DROP CONSTRAINT fence5")
        c.execute(";".join(fence_sql("fenced", 5, "tgt", 0)).encode())
        for stmt in ("INSERT INTO fenced VALUES (37)", "UPDATE fenced SET id = id WHERE id = 5",
                     "DELETE FROM fenced WHERE id = 5", "TRUNCATE fenced",
                     "UPDATE fenced SET id = id WHERE id = 6"):
            try:
                c.execute(stmt.encode())
                out[f"trigger_fence: {stmt}"] = "ALLOWED"
            except psycopg.Error as e:
                out[f"trigger_fence: {stmt}"] = (
                    f"refused {e.sqlstate}: {e.diag.message_primary} | {e.diag.message_detail}")
    return out


# -- 3. copy speed ------------------------------------------------------------------------------


def create_subscription_objects(source: ThrowawayPostgres, target: ThrowawayPostgres, *,
                                src_db: str, tgt_db: str, shard: int, move_id: int) -> None:
    """The mover's steps: publication, slot (named, so a resume finds it), subscription."""
    name = f"sfdb_move_{move_id}"
    with connect(source, src_db) as s:
        # Publication first: pgoutput reads the publication through the slot's historic
        # catalog snapshot, so a slot made before it fails with "publication does not exist".
        s.execute(f"CREATE PUBLICATION {name} FOR TABLE orders WHERE ((id & {MASK}) = {shard})"
                  .encode())
        s.execute(f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')".encode())
    with connect(target, tgt_db) as t:
        t.execute(f"CREATE SUBSCRIPTION {name} CONNECTION '{conninfo(source, src_db)}' "
                  f"PUBLICATION {name} WITH (create_slot = false, slot_name = '{name}', "
                  f"copy_data = true)".encode())


def wait_synced(target: ThrowawayPostgres, db: str, move_id: int, timeout: float = 600) -> float:
    with connect(target, db) as t:
        return wait_for(lambda: one(t, f"""SELECT bool_and(srsubstate IN ('r', 's'))
            FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
            WHERE s.subname = 'sfdb_move_{move_id}'""") is True, timeout, "initial copy")


def drop_move(source: ThrowawayPostgres, target: ThrowawayPostgres, *, src_db: str,
              tgt_db: str, move_id: int) -> None:
    name = f"sfdb_move_{move_id}"
    with connect(target, tgt_db) as t:
        t.execute(f"DROP SUBSCRIPTION IF EXISTS {name}".encode())
    with connect(source, src_db) as s:
        s.execute(f"DROP PUBLICATION IF EXISTS {name}".encode())


def pipe_copy(source: ThrowawayPostgres, target: ThrowawayPostgres, *, src_db: str,
              tgt_db: str, shard: int) -> float:
    out_cmd = (f"psql -qX -h {source.host} -p {source.port} -U postgres -d {src_db} -c "
               f"\"COPY (SELECT * FROM orders WHERE (id & {MASK}) = {shard}) TO STDOUT\"")
    in_cmd = (f"psql -qX -v ON_ERROR_STOP=1 -h {target.host} -p {target.port} -U postgres "
              f"-d {tgt_db} -c \"COPY orders FROM STDIN\"")
    t = time.monotonic()
    subprocess.run(f"set -o pipefail; {out_cmd} | {in_cmd}", shell=True, check=True,
                   executable="/bin/bash", timeout=600)
    return time.monotonic() - t


def quiet_copy(source: ThrowawayPostgres, target: ThrowawayPostgres, rows: int) -> dict[str, Any]:
    shard = 3
    for db in ("quiet", "pipe"):
        target.create_database(db)
        with connect(target, db) as t:
            t.execute(ORDERS_DDL.encode())
    with connect(source, "shop") as s:
        shard_rows = one(s, f"SELECT count(*) FROM orders WHERE (id & {MASK}) = {shard}")
    pipes, subs = [], []
    for round_ in range(2):  # alternate, so background load hits both
        with connect(target, "pipe") as t:
            t.execute(b"TRUNCATE orders")
        pipes.append(pipe_copy(source, target, src_db="shop", tgt_db="pipe", shard=shard))
        with connect(target, "quiet") as t:
            t.execute(b"TRUNCATE orders")
        t0 = time.monotonic()
        create_subscription_objects(source, target, src_db="shop", tgt_db="quiet", shard=shard,
                                    move_id=900 + round_)
        wait_synced(target, "quiet", 900 + round_)
        subs.append(time.monotonic() - t0)
        with connect(target, "quiet") as t:
            copied = one(t, "SELECT count(*) FROM orders")
        drop_move(source, target, src_db="shop", tgt_db="quiet", move_id=900 + round_)
        assert copied == shard_rows, (copied, shard_rows)
    best_pipe, best_sub = min(pipes), min(subs)
    return {"shard_rows": shard_rows, "table_rows": rows, "pipe_s": pipes,
            "subscription_s": subs, "pipe_rows_per_s": round(shard_rows / best_pipe),
            "subscription_rows_per_s": round(shard_rows / best_sub),
            "ratio_best": round(best_pipe / best_sub, 2)}


# -- 4. the move under load --------------------------------------------------------------------


@dataclass
class Op:
    start: float
    latency: float
    shard: int
    kind: str
    ok: bool


@dataclass
class Writer:
    worker_id: int
    cluster: ThrowawayPostgres
    stop: threading.Event
    ops: list[Op] = field(default_factory=list)
    alive: dict[int, str] = field(default_factory=dict)  # acked present rows -> status
    deleted: set[int] = field(default_factory=set)
    refused: int = 0

    def run(self) -> None:
        gen = SnowflakeGenerator(self.worker_id, layout=LAYOUT)
        rng = random.Random(self.worker_id)
        with connect(self.cluster, "shop") as conn:
            while not self.stop.is_set():
                roll = rng.random()
                mine = list(self.alive) if roll < 0.3 and self.alive else None
                params: tuple[Any, ...]
                if mine and roll < 0.2:
                    oid, kind = rng.choice(mine), "update"
                    status = f"paid{rng.randrange(1000)}"
                    sql, params = "UPDATE orders SET status = %s WHERE id = %s", (status, oid)
                elif mine:
                    oid, kind, status = rng.choice(mine), "delete", ""
                    sql, params = "DELETE FROM orders WHERE id = %s", (oid,)
                else:
                    oid = gen.next_id_in_shard(rng.randrange(MASK + 1))
                    kind, status = "insert", "new"
                    sql = ("INSERT INTO orders (id, customer_id, total_cents, note) "
                           "VALUES (%s, %s, %s, 'live')")
                    params = (oid, rng.randrange(100000), rng.randrange(50000))
                t = time.monotonic()
                try:
                    conn.execute(sql, params)  # autocommit: acknowledged when it returns
                    ok = True
                except psycopg.Error as e:
                    if e.sqlstate != FENCE_SQLSTATE:
                        raise
                    ok, self.refused = False, self.refused + 1
                self.ops.append(Op(t, time.monotonic() - t, oid & MASK, kind, ok))
                if ok and kind == "delete":
                    self.alive.pop(oid)
                    self.deleted.add(oid)
                elif ok:
                    self.alive[oid] = status


CHECKSUM_SQL = """SELECT count(*), coalesce(sum(h::numeric), 0), coalesce(bit_xor(h), 0)
FROM (SELECT hashtextextended(o::text, 0) AS h FROM orders o {where}) x"""


def checksum(conn: psycopg.Connection[Any], shard: int | None) -> tuple[int, int, int]:
    conn.execute(b"SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET extra_float_digits = 3")
    where = "" if shard is None else f"WHERE (id & {MASK}) = {shard}"
    return tuple(one(conn, CHECKSUM_SQL.format(where=where)))


def fence(source: ThrowawayPostgres, *, shard: int, move_id: int, lock_timeout_ms: int,
          attempts: int = 50) -> dict[str, Any]:
    """Create the fence triggers under a bounded lock wait; retry; return attempts and LSN."""
    failures: list[float] = []
    with connect(source, "shop") as s:
        s.execute(FENCE_FUNCTION.encode())
        for attempt in range(1, attempts + 1):
            t = time.monotonic()
            try:
                with s.transaction():
                    s.execute(f"SET LOCAL lock_timeout = '{lock_timeout_ms}ms'".encode())
                    blockers = one(s, """SELECT coalesce(array_agg(DISTINCT l.pid), '{}')
                        FROM pg_locks l WHERE l.relation = 'orders'::regclass
                        AND l.mode = 'RowExclusiveLock' AND l.granted""")
                    for ddl in fence_sql("orders", shard, "target", move_id):
                        s.execute(ddl.encode())
                fence_lsn = one(s, "SELECT pg_current_wal_lsn()::text")
                return {"attempts": attempt, "failed_attempt_s": failures,
                        "locked_and_created_s": round(time.monotonic() - t, 4),
                        "writers_holding_row_locks_at_last_attempt": len(blockers),
                        "fence_lsn": fence_lsn, "fenced_at": t}
            except psycopg.errors.LockNotAvailable:
                failures.append(round(time.monotonic() - t, 4))
    raise RuntimeError(f"fence not taken in {attempts} attempts")


def straggler(cluster: ThrowawayPostgres, started: threading.Event, hold_s: float,
              result: dict[str, Any]) -> None:
    """A transaction that writes shard 5 before the fence and commits after it."""
    gen = SnowflakeGenerator(900, layout=LAYOUT)
    oid = gen.next_id_in_shard(5)
    with connect(cluster, "shop", autocommit=False) as c:
        c.execute("INSERT INTO orders (id, customer_id, total_cents, note) "
                  "VALUES (%s, 1, 1, 'straggler')", (oid,))
        started.set()
        time.sleep(hold_s)  # a slow request: the point of the experiment
        c.commit()
        result["committed_at"] = time.monotonic()
        result["id"] = oid


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def move_under_load(source: ThrowawayPostgres, target: ThrowawayPostgres, *, shard: int,
                    lock_timeout_ms: int, straggler_s: float) -> dict[str, Any]:
    move_id = 1
    target.create_database("moved")
    with connect(target, "moved") as t:
        t.execute(ORDERS_DDL.encode())
    stop = threading.Event()
    writers = [Writer(w, source, stop) for w in range(1, 5)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    for thread in threads:
        thread.start()
    try:
        return _move(source, target, shard=shard, lock_timeout_ms=lock_timeout_ms,
                     straggler_s=straggler_s, writers=writers, threads=threads, stop=stop,
                     move_id=move_id)
    finally:
        stop.set()


def _move(source: ThrowawayPostgres, target: ThrowawayPostgres, *, shard: int,
          lock_timeout_ms: int, straggler_s: float, writers: list[Writer],
          threads: list[threading.Thread], stop: threading.Event, move_id: int
          ) -> dict[str, Any]:
    time.sleep(2.0)  # baseline window of the writers' latency
    t_copy = time.monotonic()
    create_subscription_objects(source, target, src_db="shop", tgt_db="moved", shard=shard,
                                move_id=move_id)
    copy_s = wait_synced(target, "moved", move_id)
    t_synced = time.monotonic()
    # caught up: the slot's confirmed position close to the current WAL
    with connect(source, "shop") as s:
        lag = one(s, f"""SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)
                   FROM pg_replication_slots WHERE slot_name = 'sfdb_move_{move_id}'""")
    time.sleep(1.0)  # writers keep streaming to the target
    started, straggled = threading.Event(), dict[str, Any]()
    st = threading.Thread(target=straggler, args=(source, started, straggler_s, straggled))
    st.start()
    started.wait(10)
    fenced = fence(source, shard=shard, move_id=move_id, lock_timeout_ms=lock_timeout_ms)
    t_fenced = time.monotonic()
    with connect(source, "shop") as s:
        drain_s = wait_for(lambda: one(s, f"""SELECT confirmed_flush_lsn >= '{fenced["fence_lsn"]}'
            FROM pg_replication_slots WHERE slot_name = 'sfdb_move_{move_id}'""") is True,
            60, "drain to the fence")
    with connect(target, "moved") as t:
        sub_stat = one(t, f"""SELECT received_lsn::text, latest_end_lsn::text
            FROM pg_stat_subscription WHERE subname = 'sfdb_move_{move_id}'""")
    t_drained = time.monotonic()
    with connect(source, "shop") as s, connect(target, "moved") as t:
        v0 = time.monotonic()
        src_sum, tgt_sum = checksum(s, shard), checksum(t, shard)
        verify_s = time.monotonic() - v0
    time.sleep(1.0)  # writers keep going after the flip: refused on shard k, others proceed
    stop.set()
    for thread in threads:
        thread.join(30)
    st.join(30)
    # acknowledged-order check on the target
    with connect(target, "moved") as t:
        on_target = dict(t.execute(b"SELECT id, status FROM orders").fetchall())
    expected = {oid: st_ for w in writers for oid, st_ in w.alive.items() if oid & MASK == shard}
    if "id" in straggled:
        expected[straggled["id"]] = "new"
    gone = {oid for w in writers for oid in w.deleted if oid & MASK == shard}
    lost = [oid for oid in expected if oid not in on_target]
    wrong = [oid for oid, s_ in expected.items() if oid in on_target and on_target[oid] != s_]
    resurrected = [oid for oid in gone if oid in on_target]
    ops = [op for w in writers for op in w.ops]
    other = [op for op in ops if op.shard != shard and op.ok]
    base = [op.latency for op in other if op.start < t_copy]
    during_copy = [op for op in other if t_copy <= op.start < t_synced]
    window_start = fenced["fenced_at"] - sum(fenced["failed_attempt_s"]) - 0.05
    at_fence = [op.latency for op in other if window_start <= op.start < t_fenced]
    copy_window = t_synced - t_copy
    before = [op for op in other if op.start < t_copy]
    rate_before = len(before) / (t_copy - min(op.start for op in ops))
    rate_copy = len(during_copy) / copy_window
    moving = [op.latency for op in ops if op.shard == shard and op.ok]
    c0 = time.monotonic()
    cleaned = cleanup_by_name(source, target, src_db="shop", tgt_db="moved", move_id=move_id)
    cleanup_s = time.monotonic() - c0
    return {
        "cleanup": cleaned, "cleanup_s": round(cleanup_s, 3),
        "left_after_cleanup": leftovers(source, target, "shop", "moved"),
        "shard": shard, "initial_copy_s": round(copy_s, 2),
        "lag_bytes_after_sync": int(lag),
        "fence": {k: v for k, v in fenced.items() if k != "fenced_at"},
        "straggler_hold_s": straggler_s,
        "straggler_committed_before_fence_created": straggled.get("committed_at", 1e18)
        <= t_fenced,
        "drain_to_fence_s": round(drain_s, 3),
        "pg_stat_subscription_received_latest_end": sub_stat,
        "verify_s": round(verify_s, 3), "source_checksum": [str(x) for x in src_sum],
        "target_checksum": [str(x) for x in tgt_sum], "checksums_equal": src_sum == tgt_sum,
        "acked_rows_of_shard": len(expected), "lost": len(lost), "wrong_status": len(wrong),
        "resurrected_deletes": len(resurrected), "rows_on_target": len(on_target),
        "writes_refused_by_fence": sum(w.refused for w in writers),
        "other_shards": {
            "ops": len(other), "p99_baseline_ms": round(pct(base, 0.99) * 1000, 1),
            "max_baseline_ms": round(max(base) * 1000, 1),
            "max_at_fence_ms": round(max(at_fence, default=0) * 1000, 1),
            "ops_at_fence": len(at_fence),
            "rate_before_per_s": round(rate_before), "rate_during_copy_per_s": round(rate_copy),
            "rate_ratio_during_copy": round(rate_copy / rate_before, 2)},
        "moving_shard_p99_ms": round(pct(moving, 0.99) * 1000, 1),
        "fence_to_verified_s": round(t_drained - t_fenced + verify_s, 3),
    }


# -- 5. checksum cost --------------------------------------------------------------------------


def checksum_cost(source: ThrowawayPostgres) -> dict[str, Any]:
    with connect(source, "shop") as s:
        rows = one(s, "SELECT count(*) FROM orders")
        timings = {}
        for name, shard in (("whole_table", None), ("one_shard_filter", 7)):
            t = time.monotonic()
            checksum(s, shard)
            timings[name] = time.monotonic() - t
        t = time.monotonic()
        one(s, "SELECT count(*), sum(('x' || substr(md5(o::text), 1, 16))::bit(64)::bigint"
               "::numeric) FROM orders o")
        timings["md5_whole_table"] = time.monotonic() - t
        t = time.monotonic()
        one(s, "SELECT count(*) FROM orders o")
        timings["count_only_whole_table"] = time.monotonic() - t
    per_m = {k: round(v / (rows / 1e6), 3) for k, v in timings.items()}
    return {"rows": rows, "seconds": {k: round(v, 3) for k, v in timings.items()},
            "seconds_per_million_rows_scanned": per_m}


# -- 6. cleanup ---------------------------------------------------------------------------------


def leftovers(source: ThrowawayPostgres, target: ThrowawayPostgres, src_db: str,
              tgt_db: str) -> dict[str, Any]:
    with connect(source, src_db) as s, connect(target, tgt_db) as t:
        return {
            "slots": [r[0] for r in s.execute(b"SELECT slot_name FROM pg_replication_slots")],
            "publications": [r[0] for r in s.execute(b"SELECT pubname FROM pg_publication")],
            "fence_triggers": [r[0] for r in s.execute(
                b"SELECT tgname FROM pg_trigger WHERE tgname LIKE 'sfdb_fence_%'")],
            "subscriptions": [r[0] for r in t.execute(b"SELECT subname FROM pg_subscription")],
        }


def cleanup_by_name(source: ThrowawayPostgres, target: ThrowawayPostgres, *, src_db: str,
                    tgt_db: str, move_id: int) -> list[str]:
    """What a resume/abort does: find every object by its deterministic name, drop it."""
    name, done = f"sfdb_move_{move_id}", []
    with connect(target, tgt_db) as t:
        sub = one(t, f"SELECT oid FROM pg_subscription WHERE subname = '{name}'")
        if sub is not None:
            try:
                t.execute(f"DROP SUBSCRIPTION {name}".encode())
                done.append("drop subscription (dropped its slot)")
            except psycopg.Error:  # source unreachable: detach the slot, drop it there later
                t.execute(f"ALTER SUBSCRIPTION {name} DISABLE".encode())
                t.execute(f"ALTER SUBSCRIPTION {name} SET (slot_name = NONE)".encode())
                t.execute(f"DROP SUBSCRIPTION {name}".encode())
                done.append("drop subscription detached from slot")
    with connect(source, src_db) as s:
        for (slot, active_pid) in s.execute(
                f"""SELECT slot_name, active_pid FROM pg_replication_slots
                WHERE slot_name = '{name}'
                OR slot_name LIKE 'pg\\_{sub or 0}\\_sync\\_%'""".encode()).fetchall():
            if active_pid is not None:
                s.execute(f"SELECT pg_terminate_backend({active_pid})".encode())
                wait_for(lambda slot=slot: one(s, f"SELECT active_pid IS NULL FROM "
                         f"pg_replication_slots WHERE slot_name = '{slot}'") in (True, None),
                         10, "walsender gone")
            s.execute(f"SELECT pg_drop_replication_slot('{slot}')".encode())
            done.append(f"drop slot {slot}")
        if one(s, f"SELECT 1 FROM pg_publication WHERE pubname = '{name}'"):
            s.execute(f"DROP PUBLICATION {name}".encode())
            done.append("drop publication")
        for suffix in ("w", "d", "t"):
            if one(s, f"SELECT 1 FROM pg_trigger WHERE tgname = 'sfdb_fence_{move_id}_{suffix}'"):
                s.execute(f"DROP TRIGGER sfdb_fence_{move_id}_{suffix} ON orders".encode())
                done.append(f"drop trigger _{suffix}")
    return done


STEPS = ["publication", "slot", "subscription", "synced", "fence"]


def mover_child(src_port: int, tgt_port: int, upto: int, move_id: int) -> None:
    """Run the mover's steps 1..upto, say so, then wait to be SIGKILLed."""
    source, target = ThrowawayPostgres.__new__(ThrowawayPostgres), ThrowawayPostgres.__new__(
        ThrowawayPostgres)
    source.port, target.port = src_port, tgt_port
    name = f"sfdb_move_{move_id}"
    with connect(source, "shop") as s, connect(target, "kill") as t:
        for step in STEPS[:upto]:
            if step == "slot":
                s.execute(f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')"
                          .encode())
            elif step == "publication":
                s.execute(f"CREATE PUBLICATION {name} FOR TABLE orders WHERE ((id & {MASK}) = 9)"
                          .encode())
            elif step == "subscription":
                t.execute(f"CREATE SUBSCRIPTION {name} CONNECTION '{conninfo(source, 'shop')}' "
                          f"PUBLICATION {name} WITH (create_slot = false, slot_name = '{name}')"
                          .encode())
            elif step == "synced":
                wait_synced(target, "kill", move_id)
            elif step == "fence":
                s.execute(FENCE_FUNCTION.encode())
                for ddl in fence_sql("orders", 9, "target", move_id):
                    s.execute(ddl.encode())
    print("ready", flush=True)
    time.sleep(3600)


def cleanup(source: ThrowawayPostgres, target: ThrowawayPostgres) -> dict[str, Any]:
    out: dict[str, Any] = {}
    target.create_database("kill")
    # (a) the source unreachable at DROP SUBSCRIPTION
    with connect(target, "kill") as t:
        t.execute(ORDERS_DDL.encode())
    create_subscription_objects(source, target, src_db="shop", tgt_db="kill", shard=9,
                                move_id=50)
    wait_synced(target, "kill", 50)
    with connect(target, "kill") as t:
        t.execute(f"ALTER SUBSCRIPTION sfdb_move_50 CONNECTION 'host=127.0.0.1 port={free_port()}"
                  " user=postgres dbname=shop connect_timeout=2'".encode())
        try:
            t.execute(b"DROP SUBSCRIPTION sfdb_move_50")
            out["drop_with_source_unreachable"] = "dropped"
        except psycopg.Error as e:
            out["drop_with_source_unreachable"] = f"{e.sqlstate}: {e.diag.message_primary}"
    out["after_failed_drop"] = leftovers(source, target, "shop", "kill")
    out["cleanup_steps"] = cleanup_by_name(source, target, src_db="shop", tgt_db="kill",
                                           move_id=50)
    out["after_cleanup"] = leftovers(source, target, "shop", "kill")
    # (b) SIGKILL after each step, then the name-based cleanup
    kills = {}
    for upto in range(1, len(STEPS) + 1):
        with connect(target, "kill") as t:
            t.execute(b"TRUNCATE orders")
        move_id = 60 + upto
        child = subprocess.Popen([sys.executable, __file__, "--child", str(source.port),
                                  str(target.port), str(upto), str(move_id)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        line = child.stdout.readline()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        left = leftovers(source, target, "shop", "kill")
        steps = cleanup_by_name(source, target, src_db="shop", tgt_db="kill", move_id=move_id)
        after = leftovers(source, target, "shop", "kill")
        kills[STEPS[upto - 1]] = {"child": line.strip(), "left": left, "cleanup": steps,
                                  "clean": not any(after.values())}
    out["sigkill_after_step"] = kills
    return out


# -- 7. control schema --------------------------------------------------------------------------

MAP_SCHEMA = Path(__file__).with_name("spike_shard_map.sql")


def map_schema(target: ThrowawayPostgres) -> dict[str, Any]:
    target.create_database("control")
    with connect(target, "control") as c:
        c.execute(MAP_SCHEMA.read_text().encode())
        c.execute(b"""INSERT INTO snowflake_shard_targets (name, backend) VALUES
            ('pg_a', 'postgresql'), ('pg_b', 'postgresql');
            INSERT INTO snowflake_shard_map (logical_shard, target, state, since_version)
            SELECT s, 'pg_a', 'serving', 1
            FROM generate_series(0, 15) s""")
        insert = (b"""INSERT INTO snowflake_shard_moves (logical_shard, active_shard, source,
            target, backend, created_at_ms, updated_at_ms)
            VALUES (5, 5, 'pg_a', 'pg_b', 'postgresql', 0, 0)""")
        c.execute(insert)
        try:
            c.execute(insert)
            second = "accepted (BUG)"
        except psycopg.errors.UniqueViolation:
            second = "refused by UNIQUE (active_shard)"
        with c.transaction():  # the flip: one transaction
            c.execute(b"UPDATE snowflake_shard_map_version SET version = version + 1, "
                      b"changed_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            c.execute(b"""UPDATE snowflake_shard_map SET target = 'pg_b', state = 'serving',
                since_version = (SELECT version FROM snowflake_shard_map_version)
                WHERE logical_shard = 5""")
            c.execute(b"""UPDATE snowflake_shard_moves SET state = 'flipped', flipped_version =
                (SELECT version FROM snowflake_shard_map_version) WHERE active_shard = 5""")
        version = one(c, "SELECT version FROM snowflake_shard_map_version")
    return {"second_mover_on_same_shard": second, "version_after_flip": version}


# -- main ---------------------------------------------------------------------------------------


@contextmanager
def clusters(extra_conf: str) -> Iterator[tuple[ThrowawayPostgres, ThrowawayPostgres]]:
    source, target = start_clusters(extra_conf)
    try:
        yield source, target
    finally:
        keep = Path(os.environ.get("SPIKE_LOG_DIR", "/tmp/spike_shard_moves_logs"))
        keep.mkdir(exist_ok=True)
        for cluster in (source, target):
            with suppress(OSError):
                (keep / cluster.directory.name).write_text(cluster.log.read_text())
        source.close()
        target.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mover_child(*map(int, sys.argv[2:6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_600_000, help="orders on the source")
    parser.add_argument("--lock-timeout-ms", type=int, default=100)
    parser.add_argument("--straggler-s", type=float, default=0.35)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--wal-retrieve-retry-interval", default=None,
                        help="e.g. 200ms: how soon the launcher starts the next apply worker")
    args = parser.parse_args()
    report: dict[str, Any] = {"rows": args.rows, "load_average": os.getloadavg()}
    wanted = set(args.only or ["replica_identity", "fence_lock_modes", "quiet_copy", "move",
                               "checksum_cost", "cleanup", "map_schema"])
    extra = ("" if args.wal_retrieve_retry_interval is None
             else f"wal_retrieve_retry_interval = '{args.wal_retrieve_retry_interval}'\n")
    report["extra_conf"] = extra
    with clusters(extra) as (source, target):
        report["server_version"] = one(connect(source, "postgres"), "SHOW server_version")
        source.create_database("shop")
        with connect(source, "shop") as s:
            s.execute(ORDERS_DDL.encode())
            t = time.monotonic()
            load_orders(s, args.rows)
            report["load_s"] = round(time.monotonic() - t, 1)
        for name, run in (
            ("replica_identity", lambda: replica_identity(source)),
            ("fence_lock_modes", lambda: fence_lock_modes(source)),
            ("quiet_copy", lambda: quiet_copy(source, target, args.rows)),
            ("move", lambda: move_under_load(source, target, shard=5,
                                             lock_timeout_ms=args.lock_timeout_ms,
                                             straggler_s=args.straggler_s)),
            ("checksum_cost", lambda: checksum_cost(source)),
            ("cleanup", lambda: cleanup(source, target)),
            ("map_schema", lambda: map_schema(target)),
        ):
            if name in wanted:
                t = time.monotonic()
                report[name] = run()
                print(f"# {name} done in {time.monotonic() - t:.1f}s", file=sys.stderr)
        report["left_at_end"] = leftovers(source, target, "shop", "postgres")
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
