"""The PostgreSQL steps of an online shard move, on two throwaway clusters (the steps every backend
shares are in test_shard_move_steps.py).

One pair of clusters for the pytest process (``tests.plugins.shard_moves``: the fixtures
``servers`` and ``pair``; ``example_project.local_servers``, stopped by PID at the end): the
source with ``wal_level = logical``, the target with the default ``replica`` (a subscriber needs
no logical WAL, and a move in the other direction shows the wal_level check). Both run
``wal_retrieve_retry_interval = 200ms``, as the mover recommends, so subscriptions start at
once. Each test makes its own database on each cluster with two sharded tables of a few thousand
rows (4 shard bits: shard = id & 15). Without the PostgreSQL binaries the tests skip with the
reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine

from example_project import local_servers
from snowflake_db import Layout
from snowflake_db.errors import InvalidArgumentError, InvalidArgumentTypeError, ShardMoveError
from snowflake_db.sharding.moves import (
    FENCE_SQLSTATE,
    FenceBlockedError,
    Leftovers,
    MovedTable,
    PostgresMoveBackend,
    VerificationMismatchError,
    run_move_steps,
    wait_until,
)

from ..plugins.shard_moves import (
    LAYOUT,
    MASK,
    STEP_TIMEOUT_S,
    TABLES,
    InThread,
    StepClock,
    assert_aborted_after_the_fence,
    assert_undone,
    refused_check,
    start_source_writers,
    wait_refused_and_passing,
)
from ..plugins.shard_moves_postgres import FENCE_OBJECTS, KIND, Pair

# The clusters of this process, in one xdist process: the target with wal_level = replica.
pytestmark = pytest.mark.xdist_group("shard_moves_postgresql")
BACKEND = "postgresql"
BOTH_LOGICAL = False


# -- the whole path ----------------------------------------------------------------------------


def test_full_move_carries_every_acknowledged_write_exactly_once(pair: Pair) -> None:
    shard = 5
    backend = pair.backend(shard=shard)
    record = StepClock()
    steps = record.steps
    writers, stop = start_source_writers(KIND, pair)
    try:
        wait_until(lambda: all(len(w.ops) >= 20 for w in writers), timeout_s=30,
                   what="writers running")
        record.start()
        results = run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, on_step=record)
        # Writers go on after the cleanup: shard 5 is refused, the others pass.
        wait_refused_and_passing(writers, shard, since=steps["fence"][1])
    finally:
        stop()  # joined, none left alive
    assert [w.errors for w in writers] == [[], [], []]

    ops = [op for w in writers for op in w.ops]
    refused = [op for op in ops if not op.ok]
    assert {op.shard for op in refused} == {shard}
    fence_started = steps["fence"][0]
    assert all(op.end > fence_started for op in refused)  # nothing refused before the fence
    assert any(op.ok and op.shard == shard and op.start > steps["copy"][1] for op in ops)

    # Every acknowledged write of shard 5 is on the target exactly once, as acknowledged.
    on_target = pair.rows("target", "orders", shard)
    on_source = pair.rows("source", "orders", shard)
    assert on_target == on_source
    expected = {oid: status for w in writers for oid, status in w.alive.items()
                if oid & MASK == shard}
    assert expected and {oid: on_target[oid][2] for oid in expected if oid in on_target} == (
        expected)
    assert not {oid for w in writers for oid in w.deleted if oid & MASK == shard} & set(on_target)
    assert pair.count("target", f"SELECT count(*) FROM orders WHERE (id & {MASK}) <> {shard}") == 0
    assert pair.rows("target", "order_items", shard) == pair.rows("source", "order_items", shard)
    verification = results["verify"]
    assert verification.source == verification.target
    # Two passes: before the fence every row but the written ones, after the drain only those.
    first = results["pre_verify"]
    assert first.scope == "before_fence" and first.source == first.target
    assert verification.scope == "changed"
    assert 0 < verification.source["orders"].rows <= verification.changed["orders"]
    assert (first.source["orders"].rows + verification.source["orders"].rows
            >= len(on_source))
    items = len(pair.rows("source", "order_items", shard))

    # Cleaned: only the fence stays; then the source's copy of the shard goes.
    assert results["cleanup"].source_pending is False
    left = backend.leftovers()
    assert left.replication_empty and len(left.fence_triggers) == 6
    pair.assert_nothing_left()
    others_before = pair.count("source", f"SELECT count(*) FROM orders WHERE (id & {MASK}) <> 5")
    deleted = backend.delete_source_rows(batch_size=100)
    assert deleted == len(on_source) + items
    assert pair.rows("source", "orders", shard) == {}
    assert pair.rows("source", "order_items", shard) == {}
    assert pair.count("source", f"SELECT count(*) FROM orders WHERE (id & {MASK}) <> 5") == (
        others_before)
    assert backend.unfence() and backend.leftovers() == Leftovers()


# -- pre-checks --------------------------------------------------------------------------------


def _fill_slots(pair: Pair) -> Callable[[], None]:
    with pair.connect("source") as conn:
        for i in range(5):  # of 6
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (f"filler_{i}",))

    def undo() -> None:
        with pair.connect("source") as conn:
            for i in range(5):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (f"filler_{i}",))
    return undo


def _fill_senders(pair: Pair) -> Callable[[], None]:
    held = [psycopg.connect(pair.conninfo("source"), replication="database", autocommit=True)
            for _ in range(5)]  # idle WAL senders, 5 of 6

    def undo() -> None:
        for conn in held:
            conn.close()
    return undo


def _run_on(which: str, *statements: str) -> Callable[[Pair], Callable[[], None]]:
    def setup(pair: Pair) -> Callable[[], None]:
        with pair.connect(which) as conn:
            for statement in statements:
                conn.execute(statement.encode())
        return lambda: None
    return setup


PRECHECKS: dict[str, tuple[Callable[[Pair], Callable[[], None]], dict[str, Any], list[str]]] = {
    "wal_level": (_run_on("source"), {"reverse": True},
                  ["check 'wal_level'", "'replica'", "wal_level = logical", "restart"]),
    "replication slots": (_fill_slots, {},
                          ["check 'replication slots'", "1 free", "max_replication_slots"]),
    "wal senders": (_fill_senders, {}, ["check 'wal senders'", "1 free", "max_wal_senders"]),
    "layout": (_run_on("source"), {"layout": Layout(sequence_bits=8)},
               ["check 'layout'", "shard_bits"]),
    "shard": (_run_on("source"), {"shard": 16}, ["check 'shard'", "0..15"]),
    "missing table": (_run_on("target", "DROP TABLE order_items"), {},
                      ["check 'tables'", "order_items does not exist on the target",
                       "migrations"]),
    "columns": (_run_on("target", "ALTER TABLE orders ALTER COLUMN note TYPE varchar(40)"), {},
                ["check 'columns'", "('note', 'text')", "('note', 'character varying(40)')"]),
    "column order": (_run_on("target", "ALTER TABLE orders DROP COLUMN note",
                             "ALTER TABLE orders ADD COLUMN note text",
                             "ALTER TABLE orders DROP COLUMN created_at",
                             "ALTER TABLE orders ADD COLUMN created_at timestamptz"), {},
                     ["check 'columns'", "order"]),
    "target rows": (_run_on("target", "INSERT INTO orders (id, customer_id, total_cents) "
                                      "VALUES (37, 1, 1)"), {},
                    ["check 'target rows'", "shard 5", "delete them"]),
    "replica identity": (_run_on("source", "ALTER TABLE order_items REPLICA IDENTITY NOTHING"),
                         {}, ["check 'replica identity'", "order_items", "42P10",
                              "REPLICA IDENTITY"]),
    "id column": (_run_on("source"), {"tables": [MovedTable("orders", "status")]},
                  ["check 'id column'", "orders.status", "text"]),
}


@pytest.mark.parametrize("case", list(PRECHECKS))
def test_precheck_refuses_with_its_message_and_creates_nothing(pair: Pair, case: str) -> None:
    setup, options, fragments = PRECHECKS[case]
    if options.pop("reverse", False):  # the target (wal_level = replica) as the source
        options = {"source": pair.conninfo("target"), "target": pair.conninfo("source"),
                   "source_conninfo_for_target": pair.conninfo("target")}
    backend, message = refused_check(pair, setup, options)
    for fragment in fragments:
        assert fragment in message
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()
    assert pair.count("source", "SELECT count(*) FROM pg_proc WHERE proname LIKE 'sfdb%'") == 0


def test_endpoint_of_another_kind_is_refused() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="not int"):
        PostgresMoveBackend(source=5, target="dbname=x",  # type: ignore[arg-type]
                            source_conninfo_for_target="dbname=x", layout=LAYOUT, shard=1,
                            move_id=1, target_name="b", tables=TABLES)


# -- the fence ---------------------------------------------------------------------------------


def test_fence_waits_out_an_open_transaction_then_refuses_every_write_of_the_shard(
    pair: Pair,
) -> None:
    """Through SQLAlchemy engines: the fence's lock waits for a transaction that wrote shard
    5 before it; that row reaches the target; later INSERT, UPDATE, DELETE, COPY and
    TRUNCATE of shard 5 fail with SFM01, other shards' writes pass."""
    shard = 5
    engines = [create_engine(f"postgresql+psycopg://postgres@{c.host}:{c.port}/{pair.db}")
               for c in (pair.clusters.source, pair.clusters.target)]
    backend = pair.backend(shard=shard, source=engines[0], target=engines[1])
    run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after="caught_up")
    straggler_id = (7777 << 4) | shard
    with pair.connect("source", autocommit=False) as straggler, pair.connect("source") as watch:
        straggler.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                          (straggler_id,))
        straggler_xid = straggler.execute("SELECT txid_current()").fetchone()
        fencing = InThread(backend.fence)
        wait_until(lambda: watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'CREATE OR REPLACE TRIGGER%'").fetchone() == (1,),
            timeout_s=30, what="the fence waiting for the straggler's lock")
        straggler.commit()
        fencing.join(STEP_TIMEOUT_S)
        # The database's own record of the order: the fence committed after the straggler
        # (track_commit_timestamp; the fence's transaction is its triggers' xmin).
        assert watch.execute(
            """SELECT pg_xact_commit_timestamp(t.xmin) > pg_xact_commit_timestamp(%s::xid)
               FROM pg_trigger t WHERE t.tgname = %s""",
            (str(straggler_xid[0] if straggler_xid else 0), f"sfdb_fence_{backend.move_id}_w"),
        ).fetchall() == [(True,), (True,)]
    assert fencing.error is None, fencing.error
    fenced = fencing.result
    wait_until(lambda: backend.drained(fenced.position), timeout_s=STEP_TIMEOUT_S, what="drained")
    assert straggler_id in pair.rows("target", "orders", shard)

    detail = f"shard={shard} target=pg_b move={backend.move_id}"
    refused_statements = [
        "INSERT INTO orders (id, customer_id, total_cents) VALUES (85, 1, 1)",
        f"UPDATE orders SET status = 'x' WHERE id = {straggler_id}",
        f"DELETE FROM orders WHERE id = {straggler_id}",
        "INSERT INTO order_items (id, order_id, sku, qty, price) VALUES (85, 1, 'a', 1, 1)",
        "TRUNCATE orders, order_items",
        "TRUNCATE order_items",
    ]
    with pair.connect("source") as conn:
        for statement in refused_statements:
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(statement.encode())
            assert refused.value.sqlstate == FENCE_SQLSTATE, statement
            assert refused.value.diag.message_detail == detail
            assert "reload the shard map" in (refused.value.diag.message_hint or "")
        copy = "COPY orders (id, customer_id, total_cents) FROM STDIN"
        with pytest.raises(psycopg.Error) as refused_copy, conn.cursor().copy(copy) as rows:
            rows.write_row((101, 1, 1))
        assert refused_copy.value.sqlstate == FENCE_SQLSTATE
        other = (7777 << 4) | 6
        conn.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                     (other,))
        conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (other,))
        conn.execute("DELETE FROM orders WHERE id = %s", (other,))
        conn.execute("DELETE FROM order_items WHERE order_id = 102")  # loaded, shard 6
        conn.execute("DELETE FROM orders WHERE id = 102")
    assert fenced.position  # journaled by the orchestration
    assert straggler_id in pair.rows("source", "orders", shard)

    # The source's rows stay while the publication streams; then the abort leaves nothing.
    assert_aborted_after_the_fence(pair, backend, shard, FENCE_OBJECTS)
    for engine in engines:
        engine.dispose()


def test_the_drain_point_lies_past_every_commit_before_the_fence(pair: Pair) -> None:
    """A write of the shard commits asynchronously (the clusters' ``synchronous_commit =
    off``) just before the fence, while the source's WAL writer is held (SIGSTOP): the
    fence's drain point still lies past that commit, and a drain to it (polled as the mover
    does, flushing the WAL) finds the row on the target. With ``pg_current_wal_lsn()`` (where
    WAL was written to) the drain point lay before the commit, the drain ended at once and the
    row was not on the target: seen under load at 15, where the WAL writer was slow to write
    the pages the fence had filled; certain here."""
    shard = 5
    backend = pair.backend(shard=shard)
    run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after="caught_up")
    row_id = (7778 << 4) | shard
    with pair.connect("source") as admin:
        walwriter = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").fetchone()
        assert walwriter is not None
        os.kill(walwriter[0], signal.SIGSTOP)
        try:
            with pair.connect("source") as writer:
                writer.execute("SET synchronous_commit = off")
                writer.execute(
                    "INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                    (row_id,))
                committed = writer.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            assert committed is not None
            fenced = backend.fence()
            assert admin.execute("SELECT %s::pg_lsn >= %s::pg_lsn",
                                 (fenced.position, str(committed[0]))).fetchone() == (True,)

            def drained() -> bool:
                if backend.drained(fenced.position):
                    return True
                backend.flush()
                return False

            wait_until(drained, timeout_s=STEP_TIMEOUT_S, what="drained")
            assert row_id in pair.rows("target", "orders", shard)
        finally:
            os.kill(walwriter[0], signal.SIGCONT)
    assert len(backend.unfence()) == 6
    assert backend.cleanup().source_pending is False
    backend.delete_target_rows()
    assert backend.leftovers() == Leftovers()


def test_fence_reports_blockers_then_terminates_them(pair: Pair) -> None:
    backend = pair.backend(fence_attempts=3)
    with pair.connect("source", autocommit=False) as idle:
        idle.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                     ((8888 << 4) | 1,))  # another shard's write blocks the fence's lock too
        idle_pid = idle.info.backend_pid
        with pytest.raises(FenceBlockedError) as blocked:
            backend.fence()
        assert [b.pid for b in blocked.value.blockers] == [idle_pid]
        assert blocked.value.blockers[0].state == "idle in transaction"
        assert f"pid {idle_pid} (idle in transaction" in str(blocked.value)
        assert backend.leftovers() == Leftovers()  # nothing half-created

        fenced = backend.fence(terminate_blockers=True)
        assert fenced.terminated == (idle_pid,) and fenced.attempts > 3
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
    assert (8888 << 4) | 1 not in pair.rows("source", "orders", 1)  # rolled back, never acked
    assert len(backend.leftovers().fence_triggers) == 6
    assert backend.fence().attempts == 0  # already up: rerun is a no-op
    backend.unfence()
    assert backend.leftovers() == Leftovers()


# -- crash and cleanup -------------------------------------------------------------------------

def test_cleanup_drops_the_publication_only_with_the_moving_tables_locked(pair: Pair) -> None:
    """PostgreSQL fails a write that reads a table's publications while one is dropped
    ('cache lookup failed for publication', XX000, which no retry helper expects): cleanup
    drops the move's publication holding the moving tables in SHARE mode, so a transaction
    writing there (any shard) holds the drop back, bounded, naming it; then it goes through."""
    backend = pair.backend(shard=9, fence_attempts=3)
    run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after="synced")
    publications = f"SELECT count(*) FROM pg_publication WHERE pubname = '{backend.name}'"
    with pair.connect("source", autocommit=False) as writing:
        writing.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                        ((7777 << 4) | 1,))
        with pytest.raises(FenceBlockedError) as blocked:
            backend.cleanup()
        assert [b.pid for b in blocked.value.blockers] == [writing.info.backend_pid]
        assert f"drop publication {backend.name}" in str(blocked.value)
        assert pair.count("source", publications) == 1
    report = backend.cleanup()
    assert report.source_pending is False
    assert f"dropped publication {backend.name} on the source" in report.done
    assert pair.count("source", publications) == 0
    backend.delete_target_rows()
    assert backend.leftovers() == Leftovers()


def test_cleanup_with_the_source_unreachable_then_back(pair: Pair) -> None:
    source = pair.clusters.source
    backend = pair.backend(shard=9)
    run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after="synced")
    source.stop()
    try:
        report = backend.cleanup()
        assert report.source_pending and "cannot connect to the source" in (
            report.source_error or "")
        assert any("detached from its slot" in step for step in report.done)
        assert pair.count("target", "SELECT count(*) FROM pg_subscription") == 0
        with pytest.raises(ShardMoveError, match="cannot connect to the source"):
            backend.leftovers()
    finally:
        source.start()
    with pair.connect("source") as conn:
        assert conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall() == [
            (backend.name,)]
    # A table copy running when the source went down leaves pg_<suboid>_sync_<relid>_<sysid>
    # (dropped subscription, one of the move's tables on the target): the move's to drop. One
    # for a table that is not the move's stays.
    with pair.connect("target") as conn:
        row = conn.execute("SELECT (SELECT system_identifier FROM pg_control_system()), "
                           "'orders'::regclass::oid::bigint").fetchone()
        assert row is not None
        sysid, relid = row
    orphan, foreign = f"pg_999999_sync_{relid}_{sysid}", f"pg_999999_sync_1_{sysid}"
    with pair.connect("source") as conn:
        for slot in (orphan, foreign):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    fresh = pair.backend(shard=9, move_id=backend.move_id)
    assert sorted(fresh.leftovers().slots) == sorted([backend.name, orphan])
    report = fresh.cleanup()
    assert report.source_pending is False
    assert f"dropped slot {backend.name} on the source" in report.done
    assert f"dropped slot {orphan} on the source" in report.done
    with pair.connect("source") as conn:
        assert conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall() == [
            (foreign,)]
        conn.execute("SELECT pg_drop_replication_slot(%s)", (foreign,))
    fresh.delete_target_rows()
    assert fresh.leftovers() == Leftovers()
    pair.assert_nothing_left()


# -- verification ------------------------------------------------------------------------------


def test_verify_detects_a_tampered_row_on_the_target(pair: Pair) -> None:
    """Through psycopg connections the caller holds."""
    shard = 3
    with pair.connect("source") as source, pair.connect("target") as target:
        backend = pair.backend(shard=shard, source=source, target=target)
        results = run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after="verify")
        first, clean = results["pre_verify"], results["verify"]
        assert first.source == first.target and first.source["orders"].rows == 188
        # Nothing written since the first pass: the second compares no row at all.
        assert clean.scope == "changed" and clean.changed == {"orders": 0, "order_items": 0}
        assert clean.source == clean.target and clean.source["orders"].rows == 0
        victim = min(pair.rows("target", "orders", shard))
        target.execute("UPDATE orders SET status = 'tampered' WHERE id = %s", (victim,))
        with pytest.raises(VerificationMismatchError) as mismatch:
            backend.verify()
        found = mismatch.value.verification
        assert found.scope == "changed" and found.changed["orders"] == 1
        assert found.source["orders"].rows == found.target["orders"].rows == 1
        assert found.source["orders"] != found.target["orders"]
        assert found.source["order_items"] == found.target["order_items"]
        message = str(mismatch.value)
        assert "(changed rows)" in message
        assert "orders: source (1, " in message and "order_items" not in message
        target.execute("UPDATE orders SET status = 'new' WHERE id = %s", (victim,))
        backend.verify()  # repaired
        target.execute(f"DELETE FROM order_items WHERE id = (SELECT min(id) FROM order_items "
                       f"WHERE (id & {MASK}) = {shard})")
        with pytest.raises(VerificationMismatchError, match="order_items: source"):
            backend.verify()
        assert_undone(backend)
    pair.assert_nothing_left()


def test_errors_name_the_server_but_never_the_password(pair: Pair) -> None:
    secret = "hunter2-s3cret"
    port = local_servers.free_port()
    nowhere = f"host=127.0.0.1 port={port} user=postgres password={secret} dbname=shop"
    with pytest.raises(ShardMoveError) as unreachable:
        pair.backend(source=nowhere).check()
    assert f"cannot connect to the source 127.0.0.1:{port}/shop" in str(unreachable.value)
    assert secret not in str(unreachable.value)

    # The subscription's connection string reaches the target only inside CREATE SUBSCRIPTION.
    backend = pair.backend(shard=2, source_conninfo_for_target=nowhere)
    backend.capture()
    with pytest.raises(ShardMoveError) as refused:
        backend.copy()
    assert "CREATE SUBSCRIPTION" in str(refused.value) and secret not in str(refused.value)
    assert str(port) in str(refused.value)  # the target's own words: where it could not connect
    backend.cleanup()
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_second_pass_compares_every_row_once_the_tracking_is_broken(pair: Pair) -> None:
    """A tracking trigger dropped (or disabled) between the passes: the changed rows are no
    longer known, so the second pass falls back to comparing every row of the shard."""
    shard = 7
    backend = pair.backend(shard=shard)
    run_move_steps(backend, timeout_s=STEP_TIMEOUT_S, stop_after="drained")
    assert backend.verify().scope == "changed"
    with pair.connect("target") as conn:
        conn.execute(f"ALTER TABLE orders DISABLE TRIGGER sfdb_track_{backend.move_id}_u")
        conn.execute(f"UPDATE orders SET note = 'untracked' WHERE id = (SELECT min(id) FROM "
                     f"orders WHERE (id & {MASK}) = {shard})")
    with pytest.raises(VerificationMismatchError) as mismatch:
        backend.verify()
    assert mismatch.value.verification.scope == "full"
    assert len(backend.leftovers().verify_objects) == 2 * (2 * 4 + 1)
    assert_undone(backend)


def test_delete_rows_scans_each_table_once_not_once_per_batch(pair: Pair) -> None:
    """Many batches (10 rows each), yet each table is scanned twice in all: the cursor that
    reads the shard's IDs and the confirming scan; other shards' rows stay."""
    shard = 8
    backend = pair.backend(shard=shard)
    run_move_steps(backend, timeout_s=STEP_TIMEOUT_S)
    rows = {t: len(pair.rows("source", t, shard)) for t in ("orders", "order_items")}
    others = pair.count("source", f"SELECT count(*) FROM orders WHERE (id & {MASK}) <> {shard}")
    assert min(rows.values()) > 100  # at least 11 batches per table

    def seq_scans() -> dict[str, int]:
        with pair.connect("source") as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            return {r[0]: r[1] for r in conn.execute(
                "SELECT relname::text, seq_scan FROM pg_stat_user_tables "
                "WHERE relname IN ('orders', 'order_items')")}

    with pair.connect("source") as conn:  # else each deleted order scans its items (the FK)
        conn.execute("CREATE INDEX ON order_items (order_id)")

    def others_gone() -> bool:
        # A session's scans reach the statistics when it ends (before it leaves
        # pg_stat_activity), and the ones above end after their client has gone: counted
        # after `before`, one of them made order_items 3 beside a second suite.
        with pair.connect("source") as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone() == (0,)

    wait_until(others_gone, timeout_s=30, what="the sessions that scanned the tables ended")
    before = seq_scans()
    deleted = backend.delete_source_rows(batch_size=10, pause_ratio=0.0)
    assert deleted == sum(rows.values())
    after: dict[str, int] = {}

    def flushed() -> bool:
        after.update(seq_scans())
        return all(after[t] - before[t] >= 2 for t in before)

    wait_until(flushed, timeout_s=10, what="the deleting session's statistics")
    assert {t: after[t] - before[t] for t in before} == {"orders": 2, "order_items": 2}
    assert pair.rows("source", "orders", shard) == {} == pair.rows("source", "order_items", shard)
    assert pair.count("source", f"SELECT count(*) FROM orders WHERE (id & {MASK}) <> {shard}"
                      ) == others
    assert backend.delete_source_rows(batch_size=10) == 0  # rerunnable
    with pytest.raises(InvalidArgumentError, match="pause_ratio -1"):
        backend.delete_source_rows(pause_ratio=-1)
