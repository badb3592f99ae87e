"""The MariaDB steps of an online shard move, on two throwaway servers (the steps every backend
shares are in test_shard_move_steps.py).

One pair of servers for the pytest process (``tests.plugins.shard_moves``: the fixtures
``servers`` and ``pair``; ``example_project.local_servers``, stopped by PID at the end): the
source with a row-based binary log, the target without. Each test makes its own database on each
server with two sharded tables of a few thousand rows (4 shard bits: shard = id & 15). Writers
are real threads on real connections; each acknowledged write's final state is known exactly.
Without the MariaDB binaries the tests skip with the reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pymysql
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from example_project import local_servers
from snowflake_db import Layout
from snowflake_db.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ShardMovedError,
    ShardMoveError,
)
from snowflake_db.sharding.moved import shard_moved_error
from snowflake_db.sharding.moves import (
    FenceBlockedError,
    Leftovers,
    MovedTable,
    VerificationMismatchError,
    _mariadb,
    wait_until,
)
from snowflake_db.sharding.moves._mariadb import FENCE_ERRNO

from ..plugins.shard_moves import (
    MASK,
    STEP_TIMEOUT_S,
    InThread,
    SourceWriter,
    StepClock,
    assert_aborted_after_the_fence,
    assert_undone,
    refused_check,
    start_source_writers,
    wait_refused_and_passing,
)
from ..plugins.shard_moves_mariadb import (
    FENCE_OBJECTS,
    KIND,
    Pair,
    is_fence_refusal,
    run_steps,
)

# The servers of this process, in one xdist process.
pytestmark = pytest.mark.xdist_group("shard_moves_mariadb")
BACKEND = "mariadb"


def _progress(pair: Pair, move_id: int) -> dict[str, tuple[Any, int, int]]:
    return {row[0]: (row[1], int(row[2]), int(row[3])) for row in pair.query(
        "target", f"SELECT tbl, last_id, rows_copied, done FROM sfdb_copy_{move_id}")}


def _changelog(pair: Pair, move_id: int) -> list[tuple[str, int, int]]:
    return [(str(tbl), int(i), int(applied)) for tbl, i, applied in pair.query(
        "source", f"SELECT tbl, id, applied FROM sfdb_changes_{move_id} WHERE seq > 1 "
                  "ORDER BY seq")]


def _assert_expected(pair: Pair, writers: list[SourceWriter], shard: int, which: str) -> None:
    """Every acknowledged write of ``writers`` to ``shard`` is on ``which`` as acknowledged,
    every acknowledged delete gone."""
    rows = pair.rows(which, "orders", shard)
    expected = {oid: status for w in writers for oid, status in w.alive.items()
                if oid & MASK == shard}
    assert {oid: rows[oid][2] if oid in rows else None for oid in expected} == expected
    assert not {oid for w in writers for oid in w.deleted if oid & MASK == shard} & set(rows)


# -- the whole path under writers ----------------------------------------------------------------


def test_move_under_writers_carries_every_acknowledged_write_exactly_once(pair: Pair) -> None:
    shard = 5
    backend = pair.backend(shard=shard, chunk_rows=20)
    loaded_others = {table: {oid: row for s in range(MASK + 1) if s != shard
                             for oid, row in pair.rows("source", table, s).items()}
                     for table in ("orders", "order_items")}

    def then(name: str) -> None:
        if name == "copy":  # the shard is written while the copy runs (not by chance)
            wait_until(lambda: any(op.ok and op.shard == shard and op.start > steps[name][0]
                                   for w in writers for op in w.ops),
                       timeout_s=30, what="a write of the shard during the copy")
        if name == "pre_verify":  # some of the shard's rows change between the two passes
            wait_until(lambda: sum(op.ok and op.shard == shard and op.start > steps[name][1]
                                   for w in writers for op in w.ops) >= 3,
                       timeout_s=30, what="writes of the shard after the first pass")

    record = StepClock(then)
    steps = record.steps
    writers, stop = start_source_writers(KIND, pair)
    try:
        wait_until(lambda: all(len(w.ops) >= 20 for w in writers), timeout_s=30,
                   what="writers running")
        record.start()
        results = run_steps(backend, on_step=record)
        wait_refused_and_passing(writers, shard, since=steps["fence"][1])
    finally:
        stop()
    assert [w.errors for w in writers] == [[], [], []]

    ops = [op for w in writers for op in w.ops]
    refused = [op for op in ops if not op.ok]
    assert {op.shard for op in refused} == {shard}
    assert all(op.end > steps["fence"][0] for op in refused)  # nothing refused before the fence
    copying = steps["copy"][0], steps["synced"][1]
    assert any(op.ok and op.shard == shard and copying[0] < op.start < copying[1] for op in ops)

    # Every acknowledged write of the shard is on the target exactly once, as acknowledged.
    on_target = pair.rows("target", "orders", shard)
    assert on_target == pair.rows("source", "orders", shard)
    _assert_expected(pair, writers, shard, "target")
    assert pair.rows("target", "order_items", shard) == pair.rows("source", "order_items", shard)
    assert pair.count("target", f"SELECT COUNT(*) FROM orders WHERE (id & {MASK}) <> {shard}"
                      ) == 0
    # Other shards on the source: loaded rows untouched, the writers' rows as acknowledged.
    for other in range(MASK + 1):
        if other != shard:
            _assert_expected(pair, writers, other, "source")
    for table, loaded in loaded_others.items():
        now = {oid: row for s in range(MASK + 1) if s != shard
               for oid, row in pair.rows("source", table, s).items() if oid in loaded}
        assert now == loaded

    first, second = results["pre_verify"], results["verify"]
    assert first.scope == "before_fence" and first.source == first.target
    assert second.scope == "changed" and second.source == second.target
    assert 0 < second.source["orders"].rows <= second.changed["orders"]
    assert first.source["orders"].rows + second.source["orders"].rows >= len(on_target)

    # Cleaned: only the fence stays; then the source's copy of the shard goes.
    assert results["cleanup"].source_pending is False
    left = backend.leftovers()
    assert left.replication_empty and len(left.fence_triggers) == 2 * 3 + 1
    pair.assert_no_capture_left()
    items = len(pair.rows("source", "order_items", shard))
    assert backend.delete_source_rows(batch_size=50, pause_ratio=0.0) == len(on_target) + items
    assert pair.rows("source", "orders", shard) == {} == pair.rows("source", "order_items", shard)
    assert backend.delete_source_rows(batch_size=50) == 0  # rerunnable
    assert backend.unfence() and backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_insert_ignore_upsert_replace_and_deletes_during_the_copy(pair: Pair) -> None:
    """Each kind of write, on a row the copy has passed and on one it has not reached yet,
    between two chunks of the copy: the target ends as the source."""
    shard = 5
    backend = pair.backend(shard=shard, chunk_rows=40)
    run_steps(backend, stop_after="copy")
    backend.advance()
    backend.advance()
    cursor = _progress(pair, backend.move_id)["orders"][0]
    assert cursor is not None
    ids = sorted(pair.rows("source", "orders", shard))
    passed = [oid for oid in ids if oid <= cursor]
    ahead = [oid for oid in ids if oid > cursor]
    assert len(passed) >= 4 and len(ahead) >= 4
    new_row, moved_away = (1 << 40) | shard, (1 << 41) | shard
    item_ahead = max(pair.rows("source", "order_items", shard))
    pair.execute(
        "source",
        f"INSERT IGNORE INTO orders (id, customer_id, total_cents) VALUES ({new_row}, 1, 1)",
        f"INSERT IGNORE INTO orders (id, customer_id, total_cents, status) "
        f"VALUES ({passed[0]}, 1, 1, 'ignored')",  # a duplicate: nothing changes
        f"INSERT INTO orders (id, customer_id, total_cents) VALUES ({passed[1]}, 1, 1) "
        "ON DUPLICATE KEY UPDATE status = 'upserted'",
        f"INSERT INTO orders (id, customer_id, total_cents) VALUES ({ahead[0]}, 1, 1) "
        "ON DUPLICATE KEY UPDATE status = 'upserted ahead'",
        f"INSERT INTO orders (id, customer_id, total_cents) VALUES ({moved_away}, 1, 1)",
        f"UPDATE orders SET id = id + 1 WHERE id = {moved_away}",  # out of the shard
        f"DELETE FROM order_items WHERE order_id IN ({passed[2]}, {ahead[1]}, {passed[3]}) "
        f"OR id = {item_ahead}",
        f"DELETE FROM orders WHERE id IN ({passed[2]}, {ahead[1]})",
        f"REPLACE INTO orders (id, customer_id, total_cents, status) "
        f"VALUES ({passed[3]}, 2, 2, 'replaced')",
    )
    logged = {(tbl, i) for tbl, i, _ in _changelog(pair, backend.move_id)}
    assert {("orders", passed[1]), ("orders", ahead[0]), ("orders", passed[2]),
            ("orders", ahead[1]), ("orders", passed[3]), ("orders", new_row),
            ("orders", moved_away), ("order_items", item_ahead)} <= logged
    assert ("orders", passed[0]) not in logged  # the ignored duplicate wrote nothing
    results = run_steps(backend, start_at="synced")
    assert results["verify"].source == results["verify"].target
    on_target = pair.rows("target", "orders", shard)
    assert on_target == pair.rows("source", "orders", shard)
    assert on_target[passed[0]][2] == "new"
    assert on_target[passed[1]][2] == "upserted"
    assert on_target[ahead[0]][2] == "upserted ahead"
    assert on_target[passed[3]][1:4] == (2, "replaced", 2)
    assert {passed[2], ahead[1], moved_away} & set(on_target) == set()
    assert new_row in on_target
    items = pair.rows("target", "order_items", shard)
    assert items == pair.rows("source", "order_items", shard) and item_ahead not in items


def test_a_rolled_back_transaction_leaves_nothing_on_the_target(pair: Pair) -> None:
    """Its changelog rows are written in the transaction (the capture saw the writes) and
    roll back with it; an advance while it is open sees none of them."""
    shard = 5
    backend = pair.backend(shard=shard)
    run_steps(backend, stop_after="synced")
    before = pair.rows("target", "orders", shard)
    victim, updated = sorted(before)[:2]
    fresh = (1 << 40) | shard
    writer = pair.connect("source", autocommit=False)
    try:
        with writer.cursor() as cursor:
            cursor.execute("DELETE FROM order_items WHERE order_id = %s", (victim,))
            cursor.execute("DELETE FROM orders WHERE id = %s", (victim,))
            cursor.execute("UPDATE orders SET status = 'rolled back' WHERE id = %s", (updated,))
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                           (fresh,))
            cursor.execute(f"SELECT tbl, id FROM sfdb_changes_{backend.move_id} WHERE seq > 1")
            captured = {(str(t), int(i)) for t, i in cursor.fetchall()}
        assert {("orders", victim), ("orders", updated), ("orders", fresh)} <= captured
        assert _changelog(pair, backend.move_id) == []  # uncommitted: no other session sees them
        backend.advance()  # reads committed changes only: none of these
        assert pair.rows("target", "orders", shard) == before
        writer.rollback()
    finally:
        writer.close()
    assert _changelog(pair, backend.move_id) == []
    results = run_steps(backend, start_at="caught_up", stop_after="verify")
    assert results["verify"].source == results["verify"].target
    assert pair.rows("target", "orders", shard) == before == pair.rows("source", "orders", shard)


# -- the fence ---------------------------------------------------------------------------------


def _lock_waits(pair: Pair, waiting_sql: str) -> list[tuple[int, int]]:
    """(waiting connection, blocking connection) of InnoDB's lock waits whose waiter runs a
    statement containing ``waiting_sql``."""
    return [(int(r[0]), int(r[1])) for r in pair.query("source", """
        SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id
        FROM information_schema.INNODB_LOCK_WAITS w
        JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id
        JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
        WHERE r.trx_query LIKE %s""", (f"%{waiting_sql}%",))]


def test_fence_waits_out_an_open_transaction_then_refuses_every_write_of_the_shard(
    pair: Pair,
) -> None:
    """Through SQLAlchemy engines: the fence waits for a transaction that wrote shard 5 before
    it (InnoDB records the wait), that row reaches the target; later writes of every kind to
    shard 5 fail with the fence's error, which maps to ShardMovedError; other shards pass."""
    shard = 5
    engines = [create_engine(pair.url(which)) for which in ("source", "target")]
    backend = pair.backend(shard=shard, source=engines[0], target=engines[1],
                           lock_timeout_ms=200)
    run_steps(backend, stop_after="pre_verify")
    straggler_id = (7777 << 4) | shard
    blocked_while_open = (7778 << 4) | 1  # another shard's open transaction blocks nothing
    straggler, other = (pair.connect("source", autocommit=False) for _ in range(2))
    try:
        with straggler.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                           (straggler_id,))
        with other.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                           (blocked_while_open,))

        fencing = InThread(backend.fence)
        waits: list[tuple[int, int]] = []

        def fence_waiting() -> bool:
            waits[:] = _lock_waits(pair, "SET fenced = 1")
            return bool(waits)

        def state() -> object:
            faulthandler.dump_traceback(all_threads=True)  # where the fence's thread is
            return fencing.error, pair.query(
                "source",
                "SELECT ID, COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST")

        # Polled every 0.2 s: InnoDB refreshes its lock views only after 0.1 s without a read.
        wait_until(fence_waiting, timeout_s=30, what="the fence waiting for the straggler",
                   describe=state, poll_s=0.2)
        assert {blocker for _, blocker in waits} == {straggler.thread_id()}
        straggler.commit()
        fencing.join(STEP_TIMEOUT_S)
    finally:
        straggler.close()
        other.rollback()
        other.close()
    assert fencing.error is None, fencing.error
    fenced = fencing.result
    assert fenced.attempts >= 1 and fenced.position.startswith("changelog:")
    # The straggler's change was captured before the fence's position.
    seq = pair.query("source", f"SELECT MAX(seq) FROM sfdb_changes_{backend.move_id} "
                               "WHERE id = %s", (straggler_id,))[0][0]
    assert seq is not None and int(seq) <= int(fenced.position.split(":")[1])
    wait_until(lambda: backend.drained(fenced.position), timeout_s=STEP_TIMEOUT_S, what="drain")
    assert straggler_id in pair.rows("target", "orders", shard)

    insert = "INTO orders (id, customer_id, total_cents) VALUES"
    new5, new6, new7, new5b = ((9000 + n) << 4 | s for n, s in ((1, 5), (2, 6), (3, 7), (4, 5)))
    refused_statements = [
        f"INSERT {insert} ({new5}, 1, 1)",
        f"INSERT IGNORE {insert} ({new5}, 1, 1)",
        f"INSERT IGNORE {insert} ({new6}, 1, 1), ({new5}, 1, 1), ({new7}, 1, 1)",
        f"INSERT {insert} ({straggler_id}, 1, 1) ON DUPLICATE KEY UPDATE status = 'x'",
        f"REPLACE {insert} ({straggler_id}, 1, 1)",
        f"UPDATE orders SET status = 'x' WHERE id = {straggler_id}",
        f"UPDATE IGNORE orders SET status = 'x' WHERE id = {straggler_id}",
        f"DELETE FROM orders WHERE id = {straggler_id}",
        f"DELETE IGNORE FROM orders WHERE id = {straggler_id}",
        f"INSERT {insert.replace(' VALUES', '')} SELECT {new5b}, 1, 1",
        f"INSERT INTO order_items (id, order_id, sku, qty, price) VALUES ({new5}, 1, 'a', 1, 1)",
        "UPDATE orders SET note = 'everyone'",  # touches every shard: refused as a whole
    ]
    with engines[0].connect() as connection:
        for statement in refused_statements:
            with pytest.raises(OperationalError) as refused:
                connection.execute(text(statement))
            connection.rollback()
            assert refused.value.orig.args[0] == FENCE_ERRNO, statement
            assert refused.value.orig.sqlstate == "SFM01"  # PyMySQL 1.2 reports it
            moved = shard_moved_error(refused.value)
            assert isinstance(moved, ShardMovedError), statement
            assert (moved.shard, moved.target, moved.move_id) == (shard, "maria_b",
                                                                   backend.move_id)
            assert "reload the shard map" in str(moved)
    assert pair.count("source", f"SELECT COUNT(*) FROM orders WHERE id IN ({new5}, {new6}, "
                                f"{new7}, {new5b}) OR note = 'everyone' OR status = 'x'") == 0
    # A transaction that wrote another shard, then met the fence: nothing of it commits.
    with pytest.raises(OperationalError) as refused_tx, engines[0].begin() as connection:
        connection.execute(text(f"INSERT {insert} ({(7779 << 4) | 6}, 1, 1)"))
        connection.execute(text(f"INSERT {insert} ({(7779 << 4) | shard}, 1, 1)"))
    assert is_fence_refusal(refused_tx.value.orig)
    assert pair.count("source", f"SELECT COUNT(*) FROM orders WHERE id IN "
                                f"({(7779 << 4) | 6}, {(7779 << 4) | shard})") == 0
    other_id = (7780 << 4) | 6
    pair.execute("source", f"INSERT {insert} ({other_id}, 1, 1)",
                 f"UPDATE orders SET status = 'paid' WHERE id = {other_id}",
                 f"DELETE FROM orders WHERE id = {other_id}",
                 "DELETE FROM order_items WHERE order_id = 102",  # loaded, shard 6
                 "DELETE FROM orders WHERE id = 102")
    assert straggler_id in pair.rows("source", "orders", shard)

    # The source's rows stay while the capture exists; then the abort leaves nothing (the
    # shard takes writes again once the fence is down).
    assert_aborted_after_the_fence(pair, backend, shard, FENCE_OBJECTS, lambda: pair.execute(
        "source", f"UPDATE orders SET status = 'after abort' WHERE id = {straggler_id}"))
    for engine in engines:
        engine.dispose()


def test_fence_reports_its_blocker_then_terminates_it(pair: Pair) -> None:
    shard = 5
    backend = pair.backend(shard=shard, fence_attempts=3)
    backend.capture()
    idle_id = (8888 << 4) | shard
    idle = pair.connect("source", autocommit=False)
    try:
        with idle.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                           (idle_id,))
        idle_thread = idle.thread_id()
        with pytest.raises(FenceBlockedError) as blocked:
            backend.fence()
        assert [b.pid for b in blocked.value.blockers] == [idle_thread]
        assert blocked.value.blockers[0].state == "Sleep"  # idle in its transaction
        assert f"connection {idle_thread} (Sleep" in str(blocked.value)
        # Nothing changed: the fence is down, the shard's writes pass.
        pair.execute("source", "INSERT INTO orders (id, customer_id, total_cents) "
                               f"VALUES ({(8889 << 4) | shard}, 1, 1)")

        fenced = backend.fence(terminate_blockers=True)
        assert fenced.terminated == (idle_thread,) and fenced.attempts > 3
        with pytest.raises(pymysql.err.OperationalError), idle.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        with suppress(pymysql.MySQLError):
            idle.close()
    assert idle_id not in pair.rows("source", "orders", shard)  # rolled back, never acked
    assert backend.fence().attempts == 0  # already up: a rerun changes nothing
    with pytest.raises(pymysql.MySQLError) as refused:
        pair.execute("source", "INSERT INTO orders (id, customer_id, total_cents) "
                               f"VALUES ({(8890 << 4) | shard}, 1, 1)")
    assert is_fence_refusal(refused.value)
    # Without its row (deleted by hand), the fence refuses: it never fails open.
    pair.execute("source", f"DELETE FROM sfdb_fence_{backend.move_id}")
    with pytest.raises(pymysql.MySQLError) as refused:
        pair.execute("source", f"DELETE FROM orders WHERE id = {(8889 << 4) | shard}")
    assert is_fence_refusal(refused.value)
    backend.unfence()
    backend.cleanup()
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_fence_names_its_blocker_however_short_its_attempts(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watched attempt lasts until a second session has named whom it waits for, not a
    fixed window: with 1 ms attempts the old 1 s window's failure is certain (on a loaded CI
    machine the 1 s window itself passed unseen, and ``--terminate-blockers`` then had nobody
    to end). The watch ends the attempt once it has named the blocker, long before its own
    bound."""
    monkeypatch.setattr(_mariadb, "WATCHED_ATTEMPT_S", 0.001)
    monkeypatch.setattr(_mariadb, "WATCHED_ATTEMPT_MAX_S", 60.0)
    shard = 5
    backend = pair.backend(shard=shard, fence_attempts=2, lock_timeout_ms=1)
    backend.capture()
    idle = pair.connect("source", autocommit=False)
    try:
        with idle.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                           ((8888 << 4) | shard,))
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(FenceBlockedError) as blocked:
                backend.fence()
            assert [b.pid for b in blocked.value.blockers] == [idle.thread_id()]
            assert time.monotonic() - started < 60.0  # ended by the watch, not by its bound
        fenced = backend.fence(terminate_blockers=True)
        assert fenced.terminated == (idle.thread_id(),)
    finally:
        with suppress(pymysql.MySQLError):
            idle.close()
    backend.unfence()
    backend.cleanup()
    assert backend.leftovers() == Leftovers()


def test_open_transactions_hold_up_neither_the_apply_nor_the_deletes(pair: Pair) -> None:
    """A transaction left open with an uncommitted row (of the moving shard: its changelog
    row is uncommitted too; of another shard) must not hold up the move's writes of listed
    rows: those are looked up by key, never a locking scan of a small table, which waits for
    every uncommitted row it meets (the apply of committed changes stood so until the lock
    wait timeout, measured). Lock waits end after 1 s here (the servers' global
    ``innodb_lock_wait_timeout``, which the backend's new sessions take): a wait fails the
    step with error 1205."""
    shard = 5
    backend = pair.backend(shard=shard)
    run_steps(backend, stop_after="synced")
    ids = sorted(pair.rows("source", "orders", shard))
    open_ids = ((9990 << 4) | shard, (9991 << 4) | 6)
    insert = "INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)"
    for which in ("source", "target"):
        pair.execute(which, "SET GLOBAL innodb_lock_wait_timeout = 1")
    holders = {which: pair.connect(which, autocommit=False) for which in ("source", "target")}
    try:
        with holders["source"].cursor() as cursor:
            for oid in open_ids:
                cursor.execute(insert, (oid,))
        changed = ids[:10]  # most of the changelog's rows: a scan is the cheaper plan
        for status in ("first", "second"):  # changes consumed by deletes from the changelog,
            pair.execute("source", f"UPDATE orders SET status = '{status}' WHERE id IN "
                                   f"({', '.join(map(str, changed))})")  # then by updates
            backend.advance()
            assert backend.backlog() == 0
            on_target = pair.rows("target", "orders", shard)
            assert {on_target[oid][2] for oid in changed} == {status}
            if status == "first":
                backend.verify_before_fence(timeout_s=STEP_TIMEOUT_S)
        holders["source"].rollback()  # the fence waits for a writer of the shard
        run_steps(backend, start_at="fence")  # fence, drain, verify, cleanup
        # Each side's rows of the shard deleted past another shard's open insert there.
        for holder in holders.values():
            with holder.cursor() as cursor:
                cursor.execute(insert, (open_ids[1],))
        loaded = len(ids) + len(pair.rows("source", "order_items", shard))
        assert backend.delete_source_rows(batch_size=7, pause_ratio=0.0) == loaded
        assert backend.delete_target_rows(batch_size=7, pause_ratio=0.0) == loaded
        holders["source"].rollback()  # dropping the fence's triggers waits for it
        backend.unfence()
    finally:
        for which, holder in holders.items():
            holder.rollback()
            holder.close()
            pair.execute(which, "SET GLOBAL innodb_lock_wait_timeout = 50")
    assert pair.rows("source", "orders", shard) == {} == pair.rows("target", "orders", shard)
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_trigger_statements_of_1_ms_attempts_never_leave_a_trigger_half_parsed(
    pair: Pair,
) -> None:
    """MariaDB parses a table's triggers when a statement opens the table. A statement that
    ``max_statement_time`` interrupts during that parse leaves the opened table in the table
    cache with a trigger marked broken: the next statement given it, any session's, fails
    with 'Trigger ... has an error in its body' (seen under load: a capture failed so, and
    so would the application's writes of every shard). The move's trigger statements bound
    only their wait for the metadata lock (``lock_wait_timeout``), so even with attempts of
    1 ms, on a table whose 40 triggers take longer than that to parse, every write passes."""
    body = ("BEGIN DECLARE v INT DEFAULT 0; IF (NEW.id & 15) = {n} + 16 AND "
            "NOT (@nobody <=> {n}) THEN SELECT COUNT(*) INTO v FROM orders WHERE id = NEW.id "
            "LOCK IN SHARE MODE; IF v THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = "
            "'never'; END IF; END IF; END")
    pair.execute("source", *(f"CREATE TRIGGER app_{n} BEFORE INSERT ON orders FOR EACH ROW "
                             + body.format(n=n) for n in range(40)))
    backend = pair.backend(shard=5, lock_timeout_ms=1, fence_attempts=20)
    writer = pair.connect("source")
    try:
        for round_ in range(2):
            backend.capture()
            backend.cleanup()
            backend.unfence()
            with writer.cursor() as cursor:  # a table from the cache: no broken trigger
                cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES "
                               "(%s, 1, 1)", ((9900 + round_) << 4 | 6,))
                cursor.execute("UPDATE orders SET status = 'passed' WHERE id = %s",
                               ((9900 + round_) << 4 | 6,))
    finally:
        writer.close()
    assert backend.leftovers() == Leftovers()
    pair.execute("source", *(f"DROP TRIGGER app_{n}" for n in range(40)))
    pair.assert_nothing_left()


# -- crashes and cleanup -----------------------------------------------------------------------

COPIER = textwrap.dedent("""
    import sys, time
    from snowflake_db import Layout
    from snowflake_db.sharding.moves import MovedTable
    from snowflake_db.sharding.moves._mariadb import MariaDBMoveBackend
    source, target, move_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
    backend = MariaDBMoveBackend(
        source=source, target=target, layout=Layout(sequence_bits=8, shard_bits=4), shard=5,
        move_id=move_id, target_name="maria_b",
        tables=[MovedTable("orders"), MovedTable("order_items")], chunk_rows=5)
    backend.check()
    backend.capture()
    backend.copy()
    with backend.held():
        for _ in range(100_000):
            backend.advance()
            time.sleep(0.01)
""")


def test_copier_killed_mid_copy_then_resumed_ends_exact(pair: Pair) -> None:
    """A real process runs the steps and is SIGKILLed while it copies (the target's progress
    table shows the copy half done); a new backend of the same move finishes it under the
    same writers: every acknowledged row on the target as acknowledged, checksums equal."""
    shard, move_id = 5, 41
    writers, stop = start_source_writers(KIND, pair)
    try:
        copier = subprocess.Popen(
            [sys.executable, "-c", COPIER, pair.url("source"), pair.url("target"), str(move_id)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            def half_copied() -> bool:
                if copier.poll() is not None:
                    output = copier.stdout.read().decode() if copier.stdout else ""
                    raise AssertionError(f"the copier ended before it was killed:\n{output}")
                try:
                    progress = _progress(pair, move_id)
                except pymysql.MySQLError:
                    return False  # no progress table yet
                orders, items = (progress.get(t, (None, 0, 0)) for t in ("orders",
                                                                          "order_items"))
                return orders[1] >= 30 and not items[2]
            wait_until(half_copied, timeout_s=60, what="the copier half way")
        finally:
            os.kill(copier.pid, signal.SIGKILL)
            copier.wait(30)
        killed_at = _progress(pair, move_id)
        assert not all(done for _, _, done in killed_at.values())
        resumed = pair.backend(shard=shard, move_id=move_id, chunk_rows=50)
        results = run_steps(resumed, start_at="synced", stop_after="verify")
        assert results["verify"].source == results["verify"].target
        wait_until(lambda: sum(not op.ok for w in writers for op in w.ops) >= 1,
                   timeout_s=30, what="a refused write after the fence")
    finally:
        stop()
    assert [w.errors for w in writers] == [[], [], []]
    assert pair.rows("target", "orders", shard) == pair.rows("source", "orders", shard)
    assert pair.rows("target", "order_items", shard) == pair.rows("source", "order_items",
                                                                  shard)
    _assert_expected(pair, writers, shard, "target")
    resumed.cleanup()
    resumed.unfence()
    assert resumed.leftovers() == Leftovers()
    pair.assert_nothing_left()


@pytest.mark.parametrize(("which", "how"), [("source", "kill"), ("source", "stop"),
                                            ("target", "kill")])
def test_server_restarted_mid_copy_then_resumed_ends_exact(pair: Pair, which: str,
                                                            how: str) -> None:
    """A server SIGKILLed (crash recovery) or stopped cleanly while the copy is half done, with
    captured changes not applied yet: the step fails naming the server; once it is back a new
    backend of the move finishes with both sides equal."""
    shard = 5
    backend = pair.backend(shard=shard, chunk_rows=20)
    run_steps(backend, stop_after="copy")
    for _ in range(3):
        backend.advance()
    ids = sorted(pair.rows("source", "orders", shard))
    pair.execute("source", f"UPDATE orders SET status = 'before restart' WHERE id IN "
                           f"({ids[0]}, {ids[-1]})")
    assert len(_changelog(pair, backend.move_id)) == 2
    server = pair.server(which)
    KIND.bring_down(server, how)
    try:
        with pytest.raises(ShardMoveError, match=f"cannot connect to the {which}"):
            backend.advance()
    finally:
        server.start()
    assert len(_changelog(pair, backend.move_id)) == 2  # committed changes survive
    resumed = pair.backend(shard=shard, move_id=backend.move_id, chunk_rows=20)
    results = run_steps(resumed, start_at="synced", stop_after="verify")
    assert results["verify"].source == results["verify"].target
    on_target = pair.rows("target", "orders", shard)
    assert on_target == pair.rows("source", "orders", shard)
    assert {on_target[ids[0]][2], on_target[ids[-1]][2]} == {"before restart"}
    resumed.cleanup()
    resumed.unfence()
    resumed.delete_target_rows()
    pair.assert_nothing_left()


def test_copy_resumes_when_the_progress_table_lost_a_row(pair: Pair) -> None:
    """A copy step that died between creating the progress table and filling it: the chunks
    are still recorded (an upsert), so none is copied twice."""
    backend = pair.backend(shard=5, chunk_rows=50)
    run_steps(backend, stop_after="copy")
    pair.execute("target", f"DELETE FROM sfdb_copy_{backend.move_id} WHERE tbl = 'orders'")
    results = run_steps(backend, start_at="synced", stop_after="verify")
    assert results["verify"].source == results["verify"].target
    assert backend.rows_copied() == len(pair.rows("source", "orders", 5)) + len(
        pair.rows("source", "order_items", 5))
    backend.cleanup()
    backend.unfence()
    backend.delete_target_rows()
    pair.assert_nothing_left()


def test_a_chunk_read_in_parts_is_written_whole_or_not_at_all(pair: Pair) -> None:
    """The copy reads a chunk in parts and inserts each while the next is read: a part the
    target refuses (the chunk's 13th row of 20, by a CHECK constraint added there after the
    check step) rolls the whole chunk back with its progress, and once the constraint is gone
    the copy goes on from the same place."""
    shard = 5
    backend = pair.backend(shard=shard, chunk_rows=20)
    run_steps(backend, stop_after="copy")
    refused = sorted(pair.rows("source", "orders", shard))[12]
    pair.execute("target", f"ALTER TABLE orders ADD CONSTRAINT refuse_one CHECK (id <> {refused})")
    with pytest.raises(pymysql.MySQLError, match="refuse_one"):
        backend.advance()
    assert pair.rows("target", "orders", shard) == {}
    assert _progress(pair, backend.move_id)["orders"] == (None, 0, 0)
    pair.execute("target", "ALTER TABLE orders DROP CONSTRAINT refuse_one")
    results = run_steps(backend, start_at="synced", stop_after="verify")
    assert results["verify"].source == results["verify"].target
    assert pair.rows("target", "orders", shard) == pair.rows("source", "orders", shard)
    assert backend.rows_copied() == len(pair.rows("source", "orders", shard)) + len(
        pair.rows("source", "order_items", shard))
    backend.cleanup()
    backend.unfence()
    backend.delete_target_rows()
    pair.assert_nothing_left()


def test_rows_too_wide_to_join_are_copied_row_by_row(pair: Pair) -> None:
    """The copy has the source join each part's rows into one text of at most 4 MiB: a table
    whose part is wider (50 rows of 100 kB, one row of 5 MB) is read again row by row, the
    5 MB row inserted alone, while the narrow table beside it is still joined; every value
    (multi-byte text included) arrives exactly."""
    shard = 5
    for which in ("source", "target"):
        pair.execute(which, "ALTER TABLE orders MODIFY note MEDIUMTEXT CHARACTER SET utf8mb4")
    ids = sorted(pair.rows("source", "orders", shard))
    pair.execute("source", f"UPDATE orders SET note = REPEAT('ü€', 25000) "
                           f"WHERE (id & {MASK}) = {shard}",
                 f"UPDATE orders SET note = REPEAT('x', 5000000) WHERE id = {ids[60]}")
    backend = pair.backend(shard=shard, chunk_rows=200)
    results = run_steps(backend, stop_after="verify")
    assert results["verify"].source == results["verify"].target
    assert backend._wide == {"orders"}
    assert pair.rows("target", "orders", shard) == pair.rows("source", "orders", shard)
    assert pair.query("target", "SELECT LENGTH(note), CHAR_LENGTH(note) FROM orders "
                                f"WHERE id IN ({ids[0]}, {ids[60]}) ORDER BY id") == [
        (125_000, 50_000), (5_000_000, 5_000_000)]
    assert backend.rows_copied() == len(ids) + len(pair.rows("source", "order_items", shard))
    backend.cleanup()
    backend.unfence()
    backend.delete_target_rows()
    pair.assert_nothing_left()


GONE_CAPTURE = textwrap.dedent("""
    import sys
    from snowflake_db import Layout
    from snowflake_db.sharding.moves import MovedTable
    from snowflake_db.sharding.moves._mariadb import MariaDBMoveBackend
    source, target, move_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
    MariaDBMoveBackend(
        source=source, target=target, layout=Layout(sequence_bits=8, shard_bits=4), shard=5,
        move_id=move_id, target_name="maria_b",
        tables=[MovedTable("orders"), MovedTable("order_items")],
        lock_timeout_ms=120_000, fence_attempts=1, ddl_timeout_s=120).capture()
""")


def _server_counter(pair: Pair, name: str) -> int:
    return int(pair.query("source", "SHOW GLOBAL STATUS LIKE %s", (name,))[0][1])


def test_a_capture_whose_mover_died_leaves_nothing_after_cleanup(pair: Pair) -> None:
    """A mover SIGKILLed while its capture cannot get ``orders``' metadata lock (a transaction
    that read the table is open), then unfence and cleanup by a new mover, then that
    transaction ends: no trigger appears afterwards. A ``CREATE TRIGGER`` that waited for the
    lock on the server (``lock_wait_timeout``, up to 120 s with these options) outlived its
    client, was granted once the reader ended, after cleanup had listed the triggers, and
    stayed behind (a fence trigger naming a fence table cleanup had dropped, so every write
    of the shard then failed). The move's statements never wait for the lock now, and each of
    its steps on the source holds the move's lock there, which the dead mover's session keeps
    until its last statement has ended."""
    move_id = 61
    reader = pair.connect("source", autocommit=False)
    try:
        with reader.cursor() as cursor:
            cursor.execute("SELECT id FROM orders LIMIT 1")  # its metadata lock, held
        before = _server_counter(pair, "Com_create_trigger")
        mover = subprocess.Popen(
            [sys.executable, "-c", GONE_CAPTURE, pair.url("source"), pair.url("target"),
             str(move_id)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            def trying() -> bool:
                if mover.poll() is not None:
                    output = mover.stdout.read().decode() if mover.stdout else ""
                    raise AssertionError(f"the mover ended before it was killed:\n{output}")
                return _server_counter(pair, "Com_create_trigger") > before
            wait_until(trying, timeout_s=60, what="the mover's first CREATE TRIGGER")
        finally:
            os.kill(mover.pid, signal.SIGKILL)
            mover.wait(30)
        fresh = pair.backend(shard=5, move_id=move_id)
        fresh.unfence()
        assert fresh.cleanup().source_pending is False
        reader.commit()
    finally:
        with suppress(pymysql.MySQLError):
            reader.close()

    def statements_left() -> list[Any]:
        return pair.query("source", "SELECT ID, STATE, INFO FROM information_schema.PROCESSLIST "
                                    "WHERE INFO LIKE 'SET STATEMENT lock_wait_timeout%%'")
    wait_until(lambda: not statements_left(), timeout_s=60, what="no move statement running",
               describe=statements_left)
    assert fresh.leftovers() == Leftovers()
    pair.assert_nothing_left()
    pair.execute("source", "INSERT INTO orders (id, customer_id, total_cents) VALUES "
                           f"({(7700 << 4) | 5}, 1, 1)")


def test_capture_that_never_gets_the_lock_fails_naming_the_table_then_passes(
    pair: Pair,
) -> None:
    """An open transaction that read ``orders``: the capture's attempts take the table's
    metadata lock at once or give up, for ``ddl_timeout_s``, then the step fails naming the
    table, the time and the transaction; the reader's writes afterwards pass (nothing queued
    ahead of them). Once it commits, the capture completes."""
    backend = pair.backend(shard=5, ddl_timeout_s=0.5)
    reader = pair.connect("source", autocommit=False)
    try:
        with reader.cursor() as cursor:
            cursor.execute("SELECT status FROM orders WHERE id = %s", ((1 << 4) | 1,))
        with pytest.raises(FenceBlockedError) as blocked:
            backend.capture()
        message = str(blocked.value)
        assert message.startswith(f"capture: trigger sfdb_fence_{backend.move_id}_i_orders not "
                                  f"created on orders: the metadata lock of `{pair.db}`."
                                  "`orders` on the source"), message
        assert re.search(r"at each of \d+ attempts in 0\.\d s \(ddl_timeout_s=0\.5;", message)
        assert [b.pid for b in blocked.value.blockers] == [reader.thread_id()]
        with reader.cursor() as cursor:  # the read-then-write of another shard passes
            cursor.execute("UPDATE orders SET status = 'after' WHERE id = %s", ((1 << 4) | 1,))
        reader.commit()
    finally:
        with suppress(pymysql.MySQLError):
            reader.close()
    assert backend.capture()["triggers"] == 12
    backend.cleanup()
    backend.unfence()
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_capture_and_cleanup_make_no_other_shards_transaction_a_deadlock_victim(
    pair: Pair,
) -> None:
    """Three clients run transactions on the other shards that read an order, then update it
    and add an item to it (the ORM's ``session.get`` before a change), while three moves of
    shard 5 capture, clean up and unfence. A trigger statement that waited for the table's
    metadata lock made such transactions deadlock victims (error 1213: 137-237 in five
    rounds of capture and cleanup beside four such clients, measured); the move's statements
    never wait for it, so every transaction commits."""
    stop = threading.Event()
    done: list[int] = [0, 0, 0]
    errors: list[str] = []
    others = [n for n in range(MASK + 1) if n != 5]

    def client(n: int) -> None:
        connection = pair.connect("source", autocommit=False)
        try:
            step = 0
            while not stop.is_set() and step < 20_000:
                step += 1
                shard = others[(step + n) % len(others)]
                seq = ((step * 7 + n * 13) % 180 + 1) * 16 + shard  # a loaded order's
                order = (seq << 4) | shard
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT status FROM orders WHERE id = %s", (order,))
                        cursor.fetchall()
                        cursor.execute("UPDATE orders SET status = %s WHERE id = %s",
                                       (f"c{n}-{step}", order))
                        cursor.execute("INSERT INTO order_items (id, order_id, sku, qty, price) "
                                       "VALUES (%s, %s, 'x', 1, 1)",
                                       (((500_000 + n * 50_000 + step) << 4) | (order & MASK),
                                        order))
                    connection.commit()
                    done[n] += 1
                except pymysql.MySQLError as error:
                    errors.append(repr(error.args))
                    connection.rollback()
                time.sleep(0.002)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: min(done) >= 20, timeout_s=60, what="the clients running")
        for _ in range(3):
            backend = pair.backend(shard=5)
            start = list(done)
            backend.capture()
            backend.cleanup()
            backend.unfence()
            assert backend.leftovers() == Leftovers()
            assert errors == []
            assert sum(done) > sum(start)  # the clients went on meanwhile
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == [], errors[:5]
    pair.assert_nothing_left()


def test_cleanup_with_the_source_unreachable_then_back(pair: Pair) -> None:
    backend = pair.backend(shard=9)
    run_steps(backend, stop_after="synced")
    port = local_servers.free_port()
    nowhere = f"mysql+pymysql://root:hunter2-s3cret@127.0.0.1:{port}/{pair.db}"
    blind = pair.backend(shard=9, move_id=backend.move_id, source=nowhere)
    report = blind.cleanup()
    assert report.source_pending
    assert f"cannot connect to the source 127.0.0.1:{port}/{pair.db}" in (report.source_error
                                                                          or "")
    assert "hunter2" not in (report.source_error or "")
    assert f"dropped sfdb_copy_{backend.move_id} on the target" in report.done
    with pytest.raises(ShardMoveError, match="cannot connect to the source"):
        blind.leftovers()
    assert pair.move_objects("target") == []
    assert f"source:sfdb_changes_{backend.move_id}" in backend.leftovers().verify_objects
    again = pair.backend(shard=9, move_id=backend.move_id).cleanup()
    assert again.source_pending is False
    backend.unfence()
    backend.delete_target_rows()
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


# -- verification ------------------------------------------------------------------------------


def test_verify_detects_a_tampered_row_on_the_target(pair: Pair) -> None:
    """Through PyMySQL connections the caller holds. The second pass compares the rows the
    changelog names; one written on the source before the fence and tampered with on the
    target after the drain is caught, and so is any row once the pass compares every row."""
    shard = 3
    source, target = pair.connect("source"), pair.connect("target")
    try:
        backend = pair.backend(shard=shard, source=source, target=target)
        results = run_steps(backend, stop_after="pre_verify")
        first = results["pre_verify"]
        assert first.source == first.target and first.source["orders"].rows == 188
        written = min(pair.rows("source", "orders", shard))
        pair.execute("source", f"UPDATE orders SET status = 'paid' WHERE id = {written}")
        backend.advance()
        fenced = backend.fence()
        wait_until(lambda: backend.drained(fenced.position), timeout_s=STEP_TIMEOUT_S,
                   what="drain")
        clean = backend.verify()
        assert clean.scope == "changed" and clean.changed == {"orders": 1, "order_items": 0}
        assert clean.source == clean.target and clean.source["orders"].rows == 1
        with target.cursor() as cursor:
            cursor.execute("UPDATE orders SET status = 'tampered' WHERE id = %s", (written,))
        with pytest.raises(VerificationMismatchError) as mismatch:
            backend.verify()
        found = mismatch.value.verification
        assert found.scope == "changed" and found.changed["orders"] == 1
        assert found.source["orders"] != found.target["orders"]
        assert found.source["order_items"] == found.target["order_items"]
        assert "(changed rows)" in str(mismatch.value)
        assert "orders: source (1, " in str(mismatch.value)
        with target.cursor() as cursor:
            cursor.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (written,))
        backend.verify()  # repaired
        # Without the first pass's mark, every row is compared: any tampered row is found.
        with source.cursor() as cursor:
            cursor.execute(f"DELETE FROM sfdb_changes_{backend.move_id} WHERE seq = 1")
        untouched = max(pair.rows("target", "order_items", shard))
        with target.cursor() as cursor:
            cursor.execute("UPDATE order_items SET qty = qty + 1 WHERE id = %s", (untouched,))
        with pytest.raises(VerificationMismatchError, match=r"verify: .*order_items: source"
                           ) as full:
            backend.verify()
        assert full.value.verification.scope == "full"
        assert full.value.verification.source["orders"].rows == 188
        assert_undone(backend)
    finally:
        source.close()
        target.close()
    pair.assert_nothing_left()


# -- a shard moving back -----------------------------------------------------------------------


def test_a_shard_moves_back_past_the_fence_its_first_move_left(pair: Pair) -> None:
    """Shard 5 moves from the source to the target, then back: the copy back passes the old
    fence (still up on the first source), which the second move finds and its own move ID's
    unfence drops before the shard is served there again."""
    shard = 5
    there = pair.backend(shard=shard, move_id=1)
    run_steps(there)
    there.delete_source_rows(pause_ratio=0.0)
    moved = pair.rows("target", "orders", shard)
    back = pair.backend(shard=shard, move_id=2, source=pair.url("target"),
                        target=pair.url("source"), target_name="maria_a")
    results = run_steps(back, stop_after="verify")
    assert results["verify"].source == results["verify"].target
    assert pair.rows("source", "orders", shard) == moved
    old = back.shard_fences_on_target()
    assert sorted(old) == sorted(name.partition(".")[2] for name in
                                 there.leftovers().fence_triggers if "." in name)
    assert all(name.startswith("sfdb_fence_1_") for name in old)
    with pytest.raises(pymysql.MySQLError) as refused:  # the old fence: still up until dropped
        pair.execute("source", f"UPDATE orders SET status = 'x' WHERE id = {min(moved)}")
    assert is_fence_refusal(refused.value)
    assert len(there.unfence()) == 7
    assert back.shard_fences_on_target() == []
    pair.execute("source", f"UPDATE orders SET status = 'home' WHERE id = {min(moved)}")
    back.cleanup()
    back.delete_source_rows(pause_ratio=0.0)  # the target's copy, the source of move 2
    assert pair.rows("target", "orders", shard) == {}
    back.unfence()
    pair.assert_nothing_left()


# -- bad input ---------------------------------------------------------------------------------


def _on(which: str, *statements: str) -> Callable[[Pair], Callable[[], None]]:
    def setup(pair: Pair) -> Callable[[], None]:
        pair.execute(which, *statements)
        return lambda: None
    return setup


def _account(*grants: str) -> Callable[[Pair], Callable[[], None]]:
    """A source account with only ``grants`` on the test's database; the backend connects as
    it (see PRECHECKS)."""
    def setup(pair: Pair) -> Callable[[], None]:
        user = f"mover_{pair.db}"
        pair.execute("source", f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'",
                     *(f"GRANT {grant} ON {pair.db}.* TO '{user}'@'%'" for grant in grants))

        def undo() -> None:
            pair.execute("source", f"DROP USER '{user}'@'%'")
        return undo
    return setup


_ALL_BUT_TRIGGER = "SELECT, INSERT, UPDATE, DELETE, CREATE, DROP"
PRECHECKS: dict[str, tuple[Callable[[Pair], Callable[[], None]], dict[str, Any], list[str]]] = {
    "layout": (_on("source"), {"layout": Layout(sequence_bits=8)},
               ["check 'layout'", "shard_bits"]),
    "shard": (_on("source"), {"shard": 16}, ["check 'shard'", "0..15"]),
    "unknown table": (_on("source"), {"tables": [MovedTable("orders"), MovedTable("nosuch")]},
                      ["check 'tables'", "nosuch does not exist on the source"]),
    "missing table on the target": (
        _on("target", "DROP TABLE order_items"), {},
        ["check 'tables'", "order_items does not exist on the target", "migrations"]),
    "missing column on the target": (
        _on("target", "ALTER TABLE orders DROP COLUMN note"), {},
        ["check 'columns'", "('note', 'text'", "run the same migrations"]),
    "column type": (_on("target", "ALTER TABLE orders MODIFY note VARCHAR(40)"), {},
                    ["check 'columns'", "'varchar(40)'"]),
    "column character set": (
        _on("target", "ALTER TABLE orders MODIFY label VARCHAR(20) CHARACTER SET utf8mb4"), {},
        ["check 'columns'", "'latin1'"]),
    "target rows": (_on("target", "INSERT INTO orders (id, customer_id, total_cents) "
                                  "VALUES (37, 1, 1)"), {},
                    ["check 'target rows'", "shard 5", "delete them"]),
    "no key on id": (
        _on("source", "ALTER TABLE order_items DROP PRIMARY KEY, ADD PRIMARY KEY (id, qty)"),
        {}, ["check 'primary key'", "order_items", "ADD PRIMARY KEY (id)"]),
    "id column": (_on("source"), {"tables": [MovedTable("orders", "status")]},
                  ["check 'id column'", "orders.status", "varchar(40)"]),
    "engine": (_on("source", "CREATE TABLE notes (id BIGINT PRIMARY KEY) ENGINE=MyISAM"),
               {"tables": [MovedTable("notes")]}, ["check 'engine'", "MyISAM", "InnoDB"]),
    "cascading foreign key": (
        _on("source", "ALTER TABLE order_items DROP FOREIGN KEY order_items_ibfk_1",
            "ALTER TABLE order_items ADD CONSTRAINT items_cascade FOREIGN KEY (order_id) "
            "REFERENCES orders (id) ON DELETE CASCADE"), {},
        ["check 'foreign keys'", "items_cascade", "ON DELETE CASCADE", "no trigger"]),
    "trigger on the target": (
        _on("target", "CREATE TRIGGER audit AFTER INSERT ON orders FOR EACH ROW SET @x = 1"),
        {}, ["check 'target triggers'", "['audit']"]),
    "no trigger privilege": (_account(_ALL_BUT_TRIGGER), {"account": True},
                             ["check 'privileges'", "TRIGGER", "GRANT TRIGGER ON"]),
    "binlog without trusted creators": (
        _account(_ALL_BUT_TRIGGER, "TRIGGER"), {"account": True},
        ["check 'binlog'", "log_bin_trust_function_creators = 1", "SUPER"]),
}


@pytest.mark.parametrize("case", list(PRECHECKS))
def test_bad_input_gets_one_clear_error_and_changes_nothing(pair: Pair, case: str) -> None:
    setup, options, fragments = PRECHECKS[case]
    options = dict(options)
    if options.pop("account", False):
        options["source"] = pair.url("source", user=f"mover_{pair.db}", password="pw")
    before = {which: (pair.move_objects(which), pair.count(which, "SELECT COUNT(*) FROM orders"))
              for which in ("source", "target")}
    _, message = refused_check(pair, setup, options)
    for fragment in fragments:
        assert fragment in message, message
    assert {which: (pair.move_objects(which), pair.count(which, "SELECT COUNT(*) FROM orders"))
            for which in ("source", "target")} == {
        which: (objects, rows + (1 if case == "target rows" and which == "target" else 0))
        for which, (objects, rows) in before.items()}
    pair.assert_nothing_left()


def test_binlog_check_passes_once_creators_are_trusted(pair: Pair) -> None:
    undo = _account(_ALL_BUT_TRIGGER, "TRIGGER")(pair)
    try:
        pair.execute("source", "SET GLOBAL log_bin_trust_function_creators = 1")
        backend = pair.backend(source=pair.url("source", user=f"mover_{pair.db}",
                                               password="pw"))
        backend.check()
        results = run_steps(backend, stop_after="verify")  # the account can do every step
        assert results["verify"].source == results["verify"].target
        backend.cleanup()
        backend.unfence()
    finally:
        pair.execute("source", "SET GLOBAL log_bin_trust_function_creators = 0")
        undo()
    backend.delete_target_rows()
    pair.assert_nothing_left()


def test_another_moves_triggers_on_the_target_are_allowed(pair: Pair) -> None:
    """The target may be the source of another shard's move at the same time: its fence and
    capture triggers act on their own shard only, so the check lets them be."""
    other = pair.backend(shard=3, move_id=77, source=pair.url("target"),
                         target=pair.url("source"))
    other.capture()
    backend = pair.backend(shard=5)
    backend.check()
    results = run_steps(backend, stop_after="verify")
    assert results["verify"].source == results["verify"].target
    assert other.backlog() == 0  # the copy of shard 5 fired them, for nothing of shard 3
    for move in (backend, other):
        move.cleanup()
        move.unfence()
    backend.delete_target_rows()
    pair.assert_nothing_left()


def test_advance_names_a_missing_changelog_or_progress_table(pair: Pair) -> None:
    """advance() finds the move's own tables by reading them (no catalogue query first): a
    missing one is still named, with the step to run."""
    backend = pair.backend(shard=5)
    backend.capture()
    with pytest.raises(ShardMoveError, match=r"the copy has not started .* run copy first"):
        backend.advance()
    backend.copy()
    pair.execute("source", f"DROP TABLE sfdb_changes_{backend.move_id}")
    with pytest.raises(ShardMoveError, match=f"advance: no changelog sfdb_changes_"
                                             f"{backend.move_id} on the source; run capture"):
        backend.advance()
    backend.capture()  # made again
    assert backend.advance() > 0
    backend.cleanup()
    backend.unfence()
    backend.delete_target_rows()
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_arguments_of_the_wrong_kind_are_refused(pair: Pair) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="not int"):
        pair.backend(source=5)
    with pytest.raises(InvalidArgumentError, match="postgresql URL"):
        pair.backend(source="postgresql://postgres@127.0.0.1/x")
    with pytest.raises(InvalidArgumentError, match="chunk_rows 0"):
        pair.backend(chunk_rows=0)
    for bad in (0, -1.5, True, "30", 3601):
        with pytest.raises(InvalidArgumentError, match=r"ddl_timeout_s .* \(0, 3600\]"):
            pair.backend(ddl_timeout_s=bad)
    with pytest.raises(InvalidArgumentError, match="position 'lsn:0/1'"):
        pair.backend().drained("lsn:0/1")
    latin1 = pymysql.connect(host="127.0.0.1", port=pair.servers.source.port, user="root",
                             charset="latin1")
    try:
        with pytest.raises(InvalidArgumentError, match="charset 'latin1'"):
            pair.backend(source=latin1)
    finally:
        latin1.close()
    with pytest.raises(ShardMoveError, match="run copy first"):
        pair.backend().advance()
