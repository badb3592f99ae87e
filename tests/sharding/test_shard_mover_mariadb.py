"""The journaled shard mover (ShardMover, ``snowflake-db shards``, ``manage.py snowflake
shards``) between two throwaway MariaDB servers: what only MariaDB has.

The claims every backend shares (a whole move under writers, a mover killed after each
journaled step, an abort, a second mover, a server restarted or unreachable during the copy, a
stale router, a frozen writer) run on both backends in test_shard_mover.py and
test_shard_move_faults.py. Here: writes of every MariaDB kind while the copy is held by a lock
on the target, a blocked fence ended by ``--terminate-blockers``, the commands' MariaDB cases,
``manage.py`` on MySQL-backend aliases, and the journal on a MariaDB control database. Each test
makes its own databases (two sharded tables of 3000 rows each, 16 logical shards, all on ``a``)
and a control database on one of the servers (``tests.plugins.shard_moves``); writer threads
route every write by the map and retry a write the fence refused. Without the MariaDB binaries
the tests skip with the reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from contextlib import suppress

import pymysql
import pytest
from sqlalchemy import MetaData, create_engine, select
from sqlalchemy.exc import OperationalError

from snowflake_db.cli import main
from snowflake_db.sharding.moves import wait_until
from snowflake_db.sharding.shard_map import add_target, read_shard_map, shard_map_tables
from snowflake_db.worker import worker_tables

from ..plugins.shard_moves import (
    MASK,
    SHARD,
    InThread,
    MoveThread,
    Setup,
    assert_exactly_once,
    assert_fence_left,
    kill_mover_after,
    make_setup,
    manage_shards,
    start_writers,
)
from ..plugins.shard_moves_mariadb import KIND, Servers, copy_waiting

# One process for the module, on that process's MariaDB servers (tests.plugins.shard_moves).
pytestmark = pytest.mark.xdist_group("shard_mover_mariadb")
BACKEND = "mariadb"


# -- writes of every kind on the moving shard during the copy ------------------------------------

#: Orders added to the moving shard: with the loaded ones, more than the 2000 rows of one copy
#: chunk, so some rows are above the chunk the held copy read.
EXTRA_ROWS = 4500


def test_ignore_upsert_rollback_and_deletes_while_the_copy_is_held(setup: Setup) -> None:
    """While the copy's first chunk waits on b (read from a, not written yet): INSERT IGNORE
    of new and existing rows, ON DUPLICATE KEY UPDATE of rows in the chunk and above it, a
    transaction whose captured writes roll back, DELETEs of rows the copy has not reached and
    of one it has read. The move carries exactly what a holds."""
    setup.pair.execute("source", f"""INSERT INTO orders (id, customer_id, total_cents)
        SELECT ((seq + 10000) << 4) | {SHARD}, seq, seq FROM seq_1_to_{EXTRA_ROWS}""")
    preloaded = setup.all_rows("a")
    ids = sorted(oid for oid in preloaded["orders"] if oid & MASK == SHARD)
    chunk, ahead = ids[:2000], ids[2000:]  # the first chunk of the copy, and past it
    parents = {row[1] for row in preloaded["order_items"].values()}
    bare = [oid for oid in chunk if oid not in parents]  # deletable: no item refers to them
    assert len(bare) > 100 and not parents & set(ahead)
    writers = start_writers(setup)
    hold = KIND.hold_copy(setup)
    moving = MoveThread(setup.mover(progress_every_s=0.2))
    changed: dict[int, str | None] = {}
    try:
        hold.wait(moving)
        new_ignored, new_upserted = ((1 << 40) | SHARD, (1 << 40) | (2 << 4) | SHARD)
        values = "INTO orders (id, customer_id, total_cents, status) VALUES"
        setup.pair.execute(
            "source",
            f"INSERT IGNORE {values} ({new_ignored}, 1, 1, 'ignore new')",
            f"INSERT IGNORE {values} ({chunk[0]}, 1, 1, 'ignored'), ({ahead[0]}, 1, 1, 'x')",
            f"INSERT {values} ({chunk[1]}, 1, 1, 'x') ON DUPLICATE KEY UPDATE "
            "status = 'upserted in chunk'",
            f"INSERT {values} ({ahead[1]}, 1, 1, 'x') ON DUPLICATE KEY UPDATE "
            "status = 'upserted ahead'",
            f"INSERT {values} ({new_upserted}, 1, 1, 'upsert new') ON DUPLICATE KEY UPDATE "
            "status = 'never'",
            f"DELETE FROM orders WHERE id IN ({ahead[2]}, {ahead[-1]}, {bare[0]})",
        )
        rolled_back = (1 << 40) | (3 << 4) | SHARD
        changed.update({new_ignored: "ignore new", chunk[1]: "upserted in chunk",
                        ahead[1]: "upserted ahead", new_upserted: "upsert new",
                        ahead[2]: None, ahead[-1]: None, bare[0]: None, rolled_back: None})
        writer = setup.connect("a", autocommit=False)
        try:
            with writer.cursor() as cursor:
                cursor.execute(f"INSERT {values} ({rolled_back}, 1, 1, 'rolled back')")
                cursor.execute(f"UPDATE orders SET status = 'rolled back' WHERE id IN "
                               f"({chunk[3]}, {ahead[3]})")
                cursor.execute(f"DELETE FROM orders WHERE id IN ({bare[1]}, {ahead[4]})")
                move_id = setup.mover().moves(limit=1)[0].id
                cursor.execute(f"SELECT id FROM sfdb_changes_{move_id} WHERE id IN "
                               f"({rolled_back}, {chunk[3]}, {ahead[3]}, {bare[1]}, "
                               f"{ahead[4]})")
                captured = {int(row[0]) for row in cursor.fetchall()}
            assert captured == {rolled_back, chunk[3], ahead[3], bare[1], ahead[4]}
            writer.rollback()
        finally:
            writer.close()
        # What the capture logged while the copy was held: each write above, none rolled back.
        logged = {int(row[0]) for row in setup.pair.query(
            "source", f"SELECT id FROM sfdb_changes_{move_id}")}
        assert {new_ignored, chunk[1], ahead[1], new_upserted, ahead[2], ahead[-1],
                bare[0]} <= logged
        assert not {chunk[0], ahead[0], rolled_back, chunk[3], ahead[3], bare[1],
                    ahead[4]} & logged
        assert copy_waiting(setup)  # all of it while the copy's first chunk waited
    finally:
        hold.release()
        moving.join()
        writers.stop()
    assert moving.error is None, moving.error
    assert moving.result == move_id
    assert_exactly_once(setup, writers, preloaded, changed)
    assert_fence_left(setup, move_id)


# -- the fence's blockers ------------------------------------------------------------------------


def test_a_blocked_fence_stops_the_move_then_terminate_blockers_finishes_it(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transaction that wrote the moving shard and stays open keeps the fence row's lock:
    the command stops (exit 1, one line naming the connection), then ``--resume
    --terminate-blockers`` ends that session (its write rolls back, never acknowledged) and
    finishes the move."""
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    straggler_id = (7777 << 4) | SHARD
    straggler = setup.connect("a", autocommit=False)
    try:
        move_id = kill_mover_after(setup, SHARD, "catch_up")  # captured, copied, not fenced
        with straggler.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                           (straggler_id,))
        assert main(setup.cli_move("--resume", str(move_id), "--force")) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"move {move_id} of shard {SHARD}" in err and "stopped at step fence" in err
        assert f"connection {straggler.thread_id()} (Sleep" in err, err
        assert setup.map_of(SHARD) == ("a", "moving")
        assert setup.pair.query("source", f"SELECT fenced FROM sfdb_fence_{move_id}") == [(0,)]
        assert main(setup.cli_move("--resume", str(move_id), "--terminate-blockers")) == 0
        out = capsys.readouterr().out
        # The straggler, and perhaps a writer's statement of the shard caught holding the
        # fence row's lock at that moment (seen at load 13: "[48, 50]"); a writer's write
        # ended so is in doubt, never acknowledged (assert_exactly_once judges it).
        [terminated] = re.findall(r"terminated blocking sessions \[([\d, ]+)\]", out)
        ended = {int(session) for session in terminated.split(",")}
        assert straggler.thread_id() in ended and len(ended) <= 1 + len(writers.writers), out
        assert f"move {move_id}: shard {SHARD} a -> b, done" in out
        with pytest.raises(pymysql.err.OperationalError), straggler.cursor() as cursor:
            cursor.execute("SELECT 1")  # its session was ended
    finally:
        with suppress(pymysql.MySQLError):
            straggler.close()
        writers.stop()
    assert straggler_id not in setup.all_rows("b")["orders"]  # rolled back, never acked
    assert_exactly_once(setup, writers, preloaded)
    assert_fence_left(setup, move_id)


# -- the commands: plan, dry run, move, bad input -------------------------------------------------


def test_plan_dry_run_and_move_through_the_command(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    preloaded = setup.all_rows("a")
    before = setup.control_counts()
    assert main([*setup.cli("plan", "--shard", "3", "--to", "b"), "--table", "orders",
                 "--table", "order_items"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("shard 3: a -> b, 376 rows (orders 188, order_items 188)"), out
    assert main([*setup.cli("plan", "--shard", "3", "--to", "b", "--json"), "--table",
                 "orders"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["backend"] == "mariadb" and plan["rows"] == {"orders": 188}
    assert plan["bytes"] > 0 and plan["placement"]["b"] == [3]
    assert main([*setup.cli("plan"), "--table", "orders", "--balance"]) == 0
    assert "8 move(s) balance the shards" in capsys.readouterr().out
    assert main(setup.cli_move("--shard", "3", "--to", "b", "--dry-run")) == 0
    assert "dry run: shard 3: a -> b, 376 rows" in capsys.readouterr().out
    assert setup.control_counts() == before
    setup.pair.assert_nothing_left()
    writers = start_writers(setup)
    try:
        assert main(setup.cli_move("--shard", "3", "--to", "b")) == 0
    finally:
        writers.stop()
    out = capsys.readouterr().out
    assert "shard 3 is on b, done" in out and "move 1 fence: fence up at changelog:" in out
    assert_exactly_once(setup, writers, preloaded)
    assert_fence_left(setup, 1)


BAD_MOVES: dict[str, tuple[list[str], str]] = {
    "unknown target": (["--shard", "3", "--to", "c"], "unknown shard target 'c'"),
    "unknown shard": (["--shard", "16", "--to", "b"], "unknown logical shard 16"),
    "where it is": (["--shard", "3", "--to", "a"], "shard 3 is already on a"),
    "cross-backend": (["--shard", "3", "--to", "pg", "--pg"],
                      "a move runs between two servers of the same backend: source a is "
                      "mariadb, target pg is postgresql"),
    "a URL of another backend": (
        ["--shard", "3", "--to", "b", "--b-is-pg"],
        "the target 'b' is a mariadb server in the shard map, but its URL is a postgresql URL"),
    "missing table": (["--shard", "3", "--to", "b", "--table", "nope"],
                      "check 'tables': table nope does not exist on the source"),
    "unknown move": (["--resume", "999"], "no shard move with id 999"),
    "no table": (["--shard", "3", "--to", "b", "--no-table"], "give the sharded tables"),
}
#: A PostgreSQL URL the refused commands are given: never connected to.
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.mark.parametrize("case", list(BAD_MOVES))
def test_bad_input_exits_2_with_one_line_and_changes_nothing(
    setup: Setup, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    args, fragment = BAD_MOVES[case]
    add_target(setup.control, "pg", backend="postgresql")
    flags = {"--pg", "--b-is-pg", "--no-table"}
    argv = setup.cli_move(*[a for a in args if a not in flags],
                          tables=() if "--no-table" in args else ("orders", "order_items"))
    if "--pg" in args:
        argv += ["--target", f"pg={PG_URL}"]
    if "--b-is-pg" in args:
        argv[argv.index(f"b={setup.url('b')}")] = f"b={PG_URL}"
    before = setup.control_counts()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert setup.control_counts() == before
    assert read_shard_map(setup.control).rows[3].target == "a"
    setup.pair.assert_nothing_left()


# -- manage.py snowflake shards ------------------------------------------------------------------



def test_manage_py_shards_on_mariadb_aliases(servers: Servers) -> None:
    """MySQL-backend DATABASES aliases (PyMySQL as MySQLdb) as targets, the control alias on
    MariaDB: init, plan, a dry run, a move; a mistake exits 2 with one line and changes
    nothing."""
    with make_setup("mariadb", servers, prefix="mvrdj") as setup:
        name = f"{setup.pair.db}_djctl"
        with servers.source.connect() as connection, connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        control = servers.source.url(name)
        engine = create_engine(control)
        try:
            worker_tables(MetaData()).slots.metadata.create_all(engine)

            def manage(*args: str) -> subprocess.CompletedProcess[str]:
                return manage_shards({"default": control, "shard_a": setup.url("a"),
                                      "shard_b": setup.url("b")}, *args)

            done = manage("init", "--assign", "shard_a")
            assert done.returncode == 0, done.stderr
            assert "shard_a (mariadb): 16 shard(s)" in done.stdout
            assert "shard_b (mariadb): 0 shard(s)" in done.stdout
            tables = ("--table", "orders", "--table", "order_items",
                      "--assume-no-static-workers")
            done = manage("plan", "--shard", "8", "--to", "shard_b", *tables[:4])
            assert done.returncode == 0, done.stderr
            assert "shard 8: shard_a -> shard_b, 376 rows" in done.stdout
            done = manage("move", "--shard", "8", "--to", "shard_b", "--dry-run", *tables)
            assert done.returncode == 0 and "dry run: shard 8: shard_a -> shard_b" in done.stdout
            before = setup.rows("a", 8)
            done = manage("move", "--shard", "8", "--to", "shard_b", *tables)
            assert done.returncode == 0, done.stderr
            assert "shard 8 is on shard_b, done" in done.stdout
            assert setup.rows("b", 8) == before
            assert setup.rows("a", 8) == {"orders": {}, "order_items": {}}
            setup.pair.assert_no_capture_left()
            moved = read_shard_map(engine)
            assert moved.rows[8].target == "shard_b" and moved.rows[8].state == "serving"
            version = moved.version
            done = manage("move", "--shard", "9", "--to", "shard_c", *tables)
            assert done.returncode == 2, done.stderr
            assert done.stderr.strip().count("\n") == 0, done.stderr
            assert "unknown shard target 'shard_c'" in done.stderr, done.stderr
            assert read_shard_map(engine).version == version
        finally:
            engine.dispose()
            with servers.source.connect() as connection, connection.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {name}")


# -- the journal on a MariaDB control database --------------------------------------------------


def test_two_movers_journal_lines_at_once_never_deadlock(setup: Setup) -> None:
    """Mover A appends two lines to the newest move's journal in one transaction (a step's
    ``done`` and the next one's ``started``) while mover B writes a just created move's first
    line. Numbered by ``INSERT ... SELECT MAX(seq) + 1``, each held a shared lock on the gap
    after the last line that the other's insert needed: B waited for A, then A for B, and
    InnoDB rolled one back (error 1213; seen on a move's plan line in a grow demo run). Read
    plainly and inserted by value, neither waits."""
    from snowflake_db.sharding.moves._journal import _append, create_move

    tables = shard_map_tables(MetaData())
    first = create_move(setup.control, tables, shard=1, source="a", target="b",
                        backend="mariadb", token="ta", lease_ms=30_000, plan={})
    second = create_move(setup.control, tables, shard=2, source="a", target="b",
                         backend="mariadb", token="tb", lease_ms=30_000, plan={})
    # The second move's row without its line yet, as create_move has it before its append:
    # the newest line is then the first move's.
    with setup.control.begin() as connection:
        connection.execute(tables.move_steps.delete()
                           .where(tables.move_steps.c.move_id == second))
    errors: list[BaseException] = []

    def mover_b() -> None:
        with setup.control.begin() as connection:
            _append(connection, tables, second, "plan", status="done")

    with setup.control.connect() as a:
        with a.begin():
            _append(a, tables, first, "check", status="done")
            b = InThread(mover_b)
            _wait_until_lock_wait_or_done(setup, b, "mover B's line written or waiting")
            try:
                _append(a, tables, first, "capture", status="started")
            except OperationalError as error:
                errors.append(error)
                raise AssertionError(f"mover A: {error.orig!r}") from None
        b.join(30)
    assert b.error is None and errors == [], (b.error, errors)
    with setup.control.connect() as connection:
        lines = connection.execute(
            select(tables.move_steps.c.move_id, tables.move_steps.c.seq,
                   tables.move_steps.c.step, tables.move_steps.c.status)
            .where(tables.move_steps.c.move_id.in_([first, second]))
            .order_by(tables.move_steps.c.move_id, tables.move_steps.c.seq)).all()
    assert [tuple(line) for line in lines] == [
        (first, 1, "plan", "done"), (first, 2, "check", "done"),
        (first, 3, "capture", "started"), (second, 1, "plan", "done")]


def _wait_until_lock_wait_or_done(setup: Setup, b: InThread, what: str) -> None:
    """Until ``b`` has ended or a transaction on the control database waits for a row lock."""

    def waiting_or_done() -> bool:
        if not b.thread.is_alive():
            return True
        with setup.control.connect() as probe:
            return bool(probe.exec_driver_sql(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                "WHERE trx_state = 'LOCK WAIT'").scalar())

    wait_until(waiting_or_done, timeout_s=30, what=what)


def test_processes_reporting_their_map_for_the_first_time_at_once_never_deadlock(
    setup: Setup,
) -> None:
    """Three leases report the map they route with for the first time, A's two reports in
    one transaction around B's. By UPDATE then INSERT, A's and B's UPDATEs of missing rows
    each locked the gap the other's INSERT went into: B waited for A, A for B, and InnoDB
    rolled one back (error 1213, an order process of the grow demo dead at its start). The
    upsert locks the row only."""
    from sqlalchemy import insert

    from snowflake_db.sharding.shard_map import report_seen

    slots = worker_tables(MetaData()).slots
    with setup.control.begin() as connection:
        now_ms = int(time.time() * 1000)
        for worker in (11, 12, 13):
            connection.execute(insert(slots).values(
                worker_id=worker, lease_token=f"{worker}" * 16, expires_at_ms=now_ms + 120_000,
                **{c.name: 0 if c.type.python_type is int else "" for c in slots.columns
                   if c.name not in ("worker_id", "lease_token", "expires_at_ms")
                   and not c.nullable and c.default is None and c.server_default is None}))
    errors: list[BaseException] = []

    def process_b() -> None:
        with setup.control.begin() as connection:
            report_seen(connection, worker_id=12, lease_token="12" * 16, version=1)

    with setup.control.connect() as a:
        with a.begin():
            assert report_seen(a, worker_id=11, lease_token="11" * 16, version=1)
            b = InThread(process_b)
            _wait_until_lock_wait_or_done(setup, b, "B's report written or waiting")
            try:
                report_seen(a, worker_id=13, lease_token="13" * 16, version=1)
            except OperationalError as error:
                errors.append(error)
        b.join(30)
    assert b.error is None and errors == [], (b.error, errors)
    with setup.control.connect() as connection:
        seen = connection.exec_driver_sql(
            "SELECT worker_id, map_version FROM snowflake_shard_map_seen WHERE worker_id "
            "IN (11, 12, 13) ORDER BY worker_id").all()
    assert [tuple(row) for row in seen] == [(11, 1), (12, 1), (13, 1)]
    assert report_seen(setup.control, worker_id=12, lease_token="12" * 16, version=2)
    with setup.control.connect() as connection:
        assert connection.exec_driver_sql("SELECT map_version FROM snowflake_shard_map_seen "
                                          "WHERE worker_id = 12").scalar() == 2
