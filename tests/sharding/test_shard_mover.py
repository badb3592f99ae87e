"""The journaled shard mover (ShardMover and ``snowflake-db shards``) between two throwaway
servers of one backend.

The claims every backend shares run on both (``move_backend``: PostgreSQL clusters with
``wal_level = logical``, MariaDB servers, the source with a row-based binary log): a whole
move under writers, a mover killed with a real SIGKILL (a subprocess running ``move()``)
after each journaled step then resumed with ``shards move --resume``, an abort, a second
mover refused. Writer threads route every write by the map in the control database and
retry a write the fence refused (:class:`tests.plugins.shard_moves.MapWriter`), and each case
ends with every acknowledged order exactly once, as acknowledged, on the target the final map
names. The rest are PostgreSQL's own (MariaDB's are in test_shard_mover_mariadb.py). Each test
has its own databases: two sharded tables of a few thousand rows, every logical shard on
``a`` at first, and a control database on the first server. Without the binaries the tests
skip with the reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import MetaData, create_engine, insert, update

from snowflake_db.cli import main
from snowflake_db.errors import ShardMoveError, UnknownShardError
from snowflake_db.sharding.moves import (
    FENCE_SQLSTATE,
    FORWARD_STEPS,
    MoveStoppedError,
    ShardMover,
    wait_until,
)
from snowflake_db.sharding.shard_map import (
    create_shard_map_tables,
    read_shard_map,
    report_seen,
    shard_map_tables,
)
from snowflake_db.worker import worker_tables

from ..plugins.fence_events import FenceClock
from ..plugins.shard_moves import (
    MASK,
    SHARD,
    TABLES,
    Setup,
    assert_exactly_once,
    assert_fence_did,
    assert_fence_left,
    assert_fenced_on_a,
    assert_moved,
    kill_mover_after,
    manage_shards,
    on_every_backend,
    start_writers,
)
from ..plugins.shard_moves_postgres import Clusters, make_pair

# PostgreSQL's own tests; the shared ones run in a group per backend (on_every_backend).
pytestmark = pytest.mark.xdist_group("shard_mover_postgresql")
BACKEND = "postgresql"
EVERY_BACKEND = on_every_backend("shard_mover")


# -- the whole move under writers -----------------------------------------------------------------


@EVERY_BACKEND
def test_full_move_under_writers_keeps_every_acknowledged_order_once(setup: Setup) -> None:
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    clock = FenceClock()
    events = clock.events
    try:
        move_id = setup.mover(progress_every_s=0.2).move(SHARD, "b", progress=clock)
    finally:
        writers.stop(after=40)
    assert clock.fence_up is not None, events
    assert_fence_did(setup, writers, move_id, clock.fence_up)
    assert setup.kind.write_kinds <= writers.kinds()
    # Every acknowledged order exactly once, where the final map says, as acknowledged.
    assert_exactly_once(setup, writers, preloaded)
    final = read_shard_map(setup.control).mapping
    assert final[SHARD] == "b" and all(final[s] == "a" for s in range(MASK + 1) if s != SHARD)
    status = setup.mover().status(move_id)
    steps = [(row.step, row.status) for row in status.journal]
    assert steps == [("plan", "done")] + [(name, s) for name, _ in FORWARD_STEPS
                                         for s in ("started", "done")]
    assert json.loads(status.journal[0].detail or "{}")["backend"] == setup.backend
    assert status.move.backend == setup.backend and status.move.flipped_version is not None
    assert any("catch_up" in e for e in events) and any(f"done: shard {SHARD} on b" in e
                                                        for e in events)
    assert_fence_left(setup, move_id)


# -- killed after each journaled step, then resumed --------------------------------------------

# One shard per kill point (16). Killed while the barrier waits is the same move as killed
# after the flip is done (the barrier only reads), so it is not a point of its own.
KILL_POINTS = [(name, "done") for name, _ in FORWARD_STEPS[:-1]] + [
    ("fence", "started"), ("flip", "started"), ("cleanup", "started")]
# Two halves, each in a pytest-xdist group of its own: the kills take most of the module's
# time, which would otherwise run in one process.
KILL_HALVES = {"first": KILL_POINTS[: len(KILL_POINTS) // 2],
               "second": KILL_POINTS[len(KILL_POINTS) // 2:]}


@pytest.mark.parametrize(("move_backend", "half"), [
    pytest.param(backend, half, id=f"{backend}-{half}",
                 marks=pytest.mark.xdist_group(f"shard_mover_kills_{backend}_{half}"))
    for backend in ("postgresql", "mariadb") for half in KILL_HALVES
])
def test_mover_killed_after_each_journaled_step_then_resumed(
    setup: Setup, capsys: pytest.CaptureFixture[str], half: str
) -> None:
    assert len(KILL_POINTS) <= MASK + 1
    assert sum(map(len, KILL_HALVES.values())) == len(KILL_POINTS)
    offset = 0 if half == "first" else len(KILL_HALVES["first"])
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    moves: list[int] = []
    fenced_checked = False
    try:
        for shard, (step, status) in enumerate(KILL_HALVES[half], start=offset):
            move_id = kill_mover_after(setup, shard, step, status)
            moves.append(move_id)
            flipped = setup.mover().status(move_id).move.flipped
            assert setup.map_of(shard)[0] == ("b" if flipped else "a"), step
            if (step, status) == ("fence", "done"):
                assert_fenced_on_a(setup, shard, move_id)
                fenced_checked = True
            # Its lease (30 s) has not lapsed: a plain resume is refused, --force takes over.
            assert main(setup.cli_move("--resume", str(move_id))) == 2
            assert "held by a running mover" in capsys.readouterr().err
            assert main(setup.cli_move("--resume", str(move_id), "--force")) == 0, step
            out = capsys.readouterr().out
            assert f"move {move_id}: shard {shard} a -> b, done" in out, (step, out)
            assert setup.map_of(shard) == ("b", "serving")
    finally:
        writers.stop()
    # Whether a writer happened to meet a fence between a kill and its resume is chance; the
    # fence left by the mover killed after it is checked above, once, exactly.
    assert ("fence", "done") not in KILL_HALVES[half] or fenced_checked
    assert_exactly_once(setup, writers, preloaded)
    for move_id in moves:
        assert_fence_left(setup, move_id)


# -- abort, a second mover -----------------------------------------------------------------------


@EVERY_BACKEND
def test_abort_before_the_flip_leaves_nothing_and_the_shard_moves_again(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed once the copy started, and once verified (fenced, the map in cutover): the
    command's abort drops the fence and the capture, deletes the copied rows on b and serves
    the shard from a again; the shard then takes writes on a and moves all the way; after the
    flip an abort is refused, and says why."""
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    try:
        for shard, step, state in ((7, "copy", "moving"), (SHARD, "verify", "cutover")):
            move_id = kill_mover_after(setup, shard, step)
            assert setup.map_of(shard) == ("a", state)
            assert setup.rows("b", shard)["orders"] or step == "copy"
            assert main(setup.cli_move("--abort", str(move_id), "--force")) == 0
            assert f"move {move_id}: shard {shard} a -> b, aborted" in capsys.readouterr().out
            assert setup.map_of(shard) == ("a", "serving")
            assert setup.rows("b", shard) == {"orders": {}, "order_items": {}}
            mover = setup.mover()
            assert mover.leftovers(move_id).empty
            setup.pair.assert_no_capture_left()
            record = mover.status(move_id).move
            assert record.state == "aborted" and record.mover_token is None
        # The fence is gone: the shard takes writes on a again.
        done = writers.ops
        wait_until(lambda: writers.ops >= done + 30, timeout_s=60, what="writes after the abort")
        # The shard is free again: a new move takes it all the way; an abort is then refused.
        again = setup.mover().move(SHARD, "b")
        assert again != move_id
        with pytest.raises(ShardMoveError, match=r"has flipped .* cannot be aborted"):
            setup.mover().abort(again)
    finally:
        writers.stop()
    assert_exactly_once(setup, writers, preloaded)
    assert_fence_left(setup, again)


@EVERY_BACKEND
def test_a_second_mover_is_refused_until_the_first_lease_lapses(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    try:
        move_id = kill_mover_after(setup, SHARD, "copy")
        mover = setup.mover()
        before = setup.control_counts()
        with pytest.raises(ShardMoveError, match=f"shard {SHARD} is already moving: move "
                                                 f"{move_id}"):
            mover.move(SHARD, "b")
        assert main(setup.cli_move("--shard", str(SHARD), "--to", "b")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"already moving: move {move_id}" in err, err
        with pytest.raises(ShardMoveError, match="held by a running mover"):
            mover.resume(move_id)
        with pytest.raises(ShardMoveError, match="held by a running mover"):
            mover.abort(move_id)
        assert setup.control_counts() == before
        # The lease lapses by the database clock (shortened here instead of waiting 30 s).
        tables = shard_map_tables(MetaData())
        with setup.control.begin() as connection:
            connection.execute(tables.moves.update().where(tables.moves.c.id == move_id)
                               .values(mover_expires_at_ms=tables.moves.c.mover_expires_at_ms
                                       - 31_000))
        assert mover.resume(move_id).state == "done"
    finally:
        writers.stop()
    assert_exactly_once(setup, writers, preloaded)
    assert_fence_left(setup, move_id)


# -- PostgreSQL's own: a journal of the PostgreSQL-only releases, moving back, the barrier -------


def test_a_journal_written_before_other_backends_resumes_from_its_fence_lsn(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A move killed after its fence by a mover of the PostgreSQL-only releases: its capture
    record held the drain point as ``fence_lsn`` (and the fence line ``lsn``). The resume
    drains to that LSN, not to a new one (a later LSN would also drain: only the journaled
    drain point tells them apart)."""
    shard = 12
    before = setup.rows("a", shard)
    # Killed once the drain began: the fence's line (and the capture record) committed.
    move_id = kill_mover_after(setup, shard, "drain", "started")
    tables = shard_map_tables(MetaData())
    mover = setup.mover()
    written = mover.status(move_id).move.capture
    old_lsn = written["fence_position"]
    # The capture record and journal lines exactly as the old mover wrote them.
    old_capture = {"publication": f"sfdb_move_{move_id}", "slot": f"sfdb_move_{move_id}",
                   "subscription": f"sfdb_move_{move_id}",
                   "subscription_oid": written["subscription_oid"], "fence_lsn": old_lsn}
    with setup.control.begin() as connection:
        connection.execute(update(tables.moves).where(tables.moves.c.id == move_id)
                           .values(capture=json.dumps(old_capture)))
        steps = tables.move_steps
        for step, detail in (("copy", {"subscription_oid": written["subscription_oid"]}),
                             ("fence", {"lsn": old_lsn, "attempts": 1, "terminated": []})):
            connection.execute(update(steps).where(
                steps.c.move_id == move_id, steps.c.step == step, steps.c.status == "done")
                .values(detail=json.dumps(detail)))
    with setup.pair.connect("source") as a:  # the WAL moves on past the old fence LSN
        a.execute("SELECT pg_logical_emit_message(false, 'test', 'x')")
    assert main(setup.cli_move("--resume", str(move_id), "--force")) == 0
    assert f"move {move_id}: shard {shard} a -> b, done" in capsys.readouterr().out
    drain = [row for row in mover.status(move_id).journal
             if row.step == "drain" and row.status == "done"]
    assert [json.loads(row.detail or "{}") for row in drain] == [{"fence_position": old_lsn}]
    assert_moved(setup, shard, before, move_id)




def test_moving_back_drops_the_old_fence_before_the_flip(setup: Setup) -> None:
    shard = 11
    mover = setup.mover()
    before = setup.rows("a", shard)
    there = mover.move(shard, "b")
    assert_moved(setup, shard, before, there)
    with setup.pair.connect("target") as b:
        b.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                  ((77 << 4) | shard,))
    before = setup.rows("b", shard)
    back = mover.move(shard, "a")
    assert setup.rows("a", shard) == before
    assert setup.map_of(shard) == ("a", "serving")
    journal = {row.step: row.detail for row in mover.status(back).journal
               if row.status == "done"}
    assert "sfdb_fence_" in (journal["drop_old_fence"] or "")
    assert mover.leftovers(there).fence_triggers == ()  # move 1's fence on a is gone
    with setup.pair.connect("source") as a:  # a takes the shard's writes again
        a.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                  ((78 << 4) | shard,))
    with setup.pair.connect("target") as b, pytest.raises(psycopg.Error) as refused:
        b.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)",
                  ((79 << 4) | shard,))
    assert refused.value.sqlstate == FENCE_SQLSTATE
    setup.pair.assert_nothing_left()


def test_announce_and_barrier_wait_for_a_live_lease_to_report_the_map(setup: Setup) -> None:
    shard = 4
    slots = worker_tables(MetaData()).slots
    with setup.control.begin() as connection:
        now_ms = int(time.time() * 1000)
        connection.execute(insert(slots).values(
            worker_id=3, lease_token="t" * 32, expires_at_ms=now_ms + 120_000,
            **_slot_defaults(slots)))
    events: list[str] = []
    mover = setup.mover(progress_every_s=0.2)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(
        id=mover.move(shard, "b", progress=lambda e: events.append(str(e)))), daemon=True)
    thread.start()

    def waiting_at(step: str) -> bool:
        return any(f"{step}: waiting for worker IDs [3]" in e for e in events)

    # Before the fence: worker 3 must route with a map that says the shard is moving.
    wait_until(lambda: waiting_at("announce"), timeout_s=60, what="the announce waiting for 3")
    assert setup.map_of(shard) == ("a", "moving")
    version = read_shard_map(setup.control).version
    assert report_seen(setup.control, worker_id=3, lease_token="t" * 32, version=version)
    # After the flip: it must route with the flipped map before the source's rows go.
    wait_until(lambda: waiting_at("barrier"), timeout_s=60, what="the barrier waiting for 3")
    assert setup.map_of(shard) == ("b", "serving")  # flipped; the source's rows still there
    assert setup.rows("a", shard)["orders"]
    version = read_shard_map(setup.control).version
    assert report_seen(setup.control, worker_id=3, lease_token="t" * 32, version=version)
    thread.join(60)
    assert "id" in result
    status = mover.status(result["id"])
    assert status.move.state == "done"
    assert setup.rows("a", shard) == {"orders": {}, "order_items": {}}


def _slot_defaults(slots: Any) -> dict[str, Any]:
    """Values for the slot columns a test row needs besides worker_id, token and expiry."""
    values: dict[str, Any] = {}
    for column in slots.columns:
        if column.name in ("worker_id", "lease_token", "expires_at_ms"):
            continue
        if not column.nullable and column.default is None and column.server_default is None:
            values[column.name] = 0 if column.type.python_type is int else ""
    return values


# -- bad input ---------------------------------------------------------------------------------


BAD_MOVES: dict[str, tuple[list[str], str]] = {
    "unknown target": (["--shard", "3", "--to", "c"], "unknown shard target 'c'"),
    "unknown shard": (["--shard", "16", "--to", "b"], "unknown logical shard 16"),
    "where it is": (["--shard", "3", "--to", "a"], "shard 3 is already on a"),
    "no shard": (["--to", "b"], "give --shard K --to NAME"),
    "no table": (["--shard", "3", "--to", "b", "--no-table"], "give the sharded tables"),
    "missing table": (["--shard", "3", "--to", "b", "--table", "nope"],
                      "check 'tables': table nope does not exist"),
    "unknown move": (["--resume", "999"], "no shard move with id 999"),
    "target not given": (["--shard", "3", "--to", "b", "--only-a"],
                         "the move's target 'b' is not among the given targets (a)"),
    "bad target option": (["--shard", "3", "--to", "b", "--target", "c"], "must be NAME=URL"),
    # The announce step and the barrier read the leases there: refused before anything starts.
    "no slots table": (["--shard", "3", "--to", "b", "--slots-table", "nope_slots"],
                       "the control database has no worker slots table nope_slots"),
}


@pytest.mark.parametrize("case", list(BAD_MOVES))
def test_bad_input_exits_2_with_one_line_and_changes_nothing(
    setup: Setup, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    args, fragment = BAD_MOVES[case]
    argv = setup.cli_move(*[a for a in args if a not in ("--no-table", "--only-a")],
                          only=("a",) if "--only-a" in args else ("a", "b"),
                          tables=() if "--no-table" in args else ("orders", "order_items"))
    before = setup.control_counts()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert setup.control_counts() == before
    setup.pair.assert_nothing_left()


def test_a_moving_shard_and_a_layout_without_shard_bits_are_refused(setup: Setup) -> None:
    move_id = kill_mover_after(setup, 6, "capture")
    before = setup.control_counts()
    with pytest.raises(ShardMoveError, match=f"already moving: move {move_id}"):
        setup.mover().plan(6, "b")
    from snowflake_db import Layout
    from snowflake_db.errors import LayoutMismatchError

    with pytest.raises(ShardMoveError, match=r"no shard bits \(shard_bits=0\)"):
        ShardMover(setup.control, setup.targets, layout=Layout(sequence_bits=8), tables=TABLES)
    with pytest.raises(LayoutMismatchError):  # another layout than the map's
        setup.mover().__class__(setup.control, setup.targets,
                                layout=Layout(sequence_bits=7, shard_bits=4),
                                tables=TABLES).plan(6, "b")
    with pytest.raises(UnknownShardError, match="unknown shard target 'zz'"):
        setup.mover().move(1, "zz")
    assert setup.control_counts() == before
    setup.mover().abort(move_id, force=True)
    setup.pair.assert_nothing_left()


def test_plan_and_dry_run_change_nothing(setup: Setup, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    mover = setup.mover()
    before = setup.control_counts()
    plan = mover.plan(3, "b")
    assert plan.source == "a" and plan.rows == {"orders": 188, "order_items": 188}
    assert plan.bytes > 0 and plan.placement["b"] == [3]
    assert mover.move(3, "b", dry_run=True).rows == plan.rows
    assert main(setup.cli_move("--shard", "3", "--to", "b", "--dry-run")) == 0
    assert "dry run: shard 3: a -> b, 376 rows" in capsys.readouterr().out
    proposals = mover.plan_balance()
    assert len(proposals) == 8 and {p.target for p in proposals} == {"b"}
    assert main([*setup.cli("plan"), "--table", "orders", "--balance"]) == 0
    assert "8 move(s) balance the shards" in capsys.readouterr().out
    assert setup.control_counts() == before
    setup.pair.assert_nothing_left()


def test_shards_init_and_show(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    url = setup.pair.clusters.source.url(setup.pair.db)  # any PostgreSQL database
    name = f"{setup.pair.db}_ctlinit"
    setup.pair.clusters.source.create_database(name)
    control = setup.pair.clusters.source.url(name)
    argv = ["shards", "init", "--control", control, "--target", f"a={url}", "--target",
            f"b={url}", "--target", f"c={url}", "--assign", "a", "--assign", "b",
            "--sequence-bits", "8", "--shard-bits", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "shard map version 1, 16 logical shards" in out
    assert "a (postgresql): 8 shard(s): 0, 2, 4" in out and "c (postgresql): 0 shard(s)" in out
    assert main(argv) == 0  # again: nothing changes
    assert "version 1," in capsys.readouterr().out
    # Again without the layout's options, registering a target: the map's own layout.
    assert main([*argv[:10], "--target", f"d={url}"]) == 0
    out = capsys.readouterr().out
    assert "version 1, 16 logical shards" in out and "d (postgresql): 0 shard(s)" in out
    assert main([*argv[:10], "--sequence-bits", "9", "--shard-bits", "3"]) == 2  # another layout
    assert "layout" in capsys.readouterr().err
    assert main(["shards", "show", "--control", control, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["targets"]["b"]["shards"] == list(range(1, 16, 2))
    engine = create_engine(control)
    try:
        assert read_shard_map(engine).targets == {"a": "postgresql", "b": "postgresql",
                                                  "c": "postgresql", "d": "postgresql"}
    finally:
        engine.dispose()


def test_move_stopped_by_a_failing_step_exits_1_and_can_be_aborted(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blocker holds the lock of the change tracking (the verification's first pass, at the
    end of catch_up; the same SHARE ROW EXCLUSIVE as the fence) past its budget: the move
    stops (exit 1, one line naming the move and the step), then the abort undoes it."""
    shard = 9
    # A lock like a writer's, without a transaction ID (a write would also hold up the slot's
    # creation, which waits for running write transactions).
    with setup.pair.connect("source", autocommit=False) as blocker:
        blocker.execute("LOCK TABLE orders IN ROW EXCLUSIVE MODE")
        mover = setup.mover(fence_attempts=2)
        with pytest.raises(MoveStoppedError) as stopped:
            mover.move(shard, "b")
        blocker.rollback()
    assert stopped.value.step == "catch_up" and "resume or abort" in str(stopped.value)
    assert "change tracking's lock on the source" in str(stopped.value)
    move_id = stopped.value.move_id
    record = mover.status(move_id)
    assert record.move.mover_token is None  # released: no wait for a lease
    assert ("catch_up", "failed") in [(r.step, r.status) for r in record.journal]
    assert main(setup.cli_move("--abort", str(move_id))) == 0
    assert setup.map_of(shard) == ("a", "serving")
    setup.pair.assert_nothing_left()
    capsys.readouterr()
    # Through the command: the budget (50 attempts of 100 ms) runs out: exit 1, one line.
    with setup.pair.connect("source", autocommit=False) as blocker:
        blocker.execute("LOCK TABLE orders IN ROW EXCLUSIVE MODE")
        status = main(setup.cli_move("--shard", str(shard), "--to", "b"))
        blocker.rollback()
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "stopped at step catch_up" in err, err
    again = mover.moves(limit=1)[0]
    assert f"move {again.id} of shard {shard}" in err
    mover.abort(again.id)
    setup.pair.assert_nothing_left()


# -- manage.py snowflake shards ------------------------------------------------------------------



def test_manage_py_shards_init_plan_and_move_on_database_aliases(servers: Clusters) -> None:
    """DATABASES aliases as targets, the control alias of SNOWFLAKE_DB: init, a dry run, a
    move, show; a mistake exits 2 with one line."""
    with make_pair(servers, prefix="djmover") as pair:
        name = f"{pair.db}_ctl"
        servers.source.create_database(name)
        databases = {"default": servers.source.url(name),
                     "shard_a": servers.source.url(pair.db),
                     "shard_b": servers.target.url(pair.db)}
        engine = create_engine(databases["default"])
        try:
            create_shard_map_tables(engine)
            worker_tables(MetaData()).slots.metadata.create_all(engine)
        finally:
            engine.dispose()

        def manage(*args: str) -> subprocess.CompletedProcess[str]:
            return manage_shards(databases, *args)

        done = manage("init", "--assign", "shard_a")
        assert done.returncode == 0, done.stderr
        assert "shard_a (postgresql): 16 shard(s)" in done.stdout
        assert "shard_b (postgresql): 0 shard(s)" in done.stdout
        tables = ("--table", "orders", "--table", "order_items", "--assume-no-static-workers")
        done = manage("move", "--shard", "8", "--to", "shard_b", "--dry-run", *tables)
        assert done.returncode == 0 and "dry run: shard 8: shard_a -> shard_b" in done.stdout
        before = {t: pair.rows("source", t, 8) for t in ("orders", "order_items")}
        done = manage("move", "--shard", "8", "--to", "shard_b", *tables)
        assert done.returncode == 0, done.stderr
        assert "shard 8 is on shard_b, done" in done.stdout
        assert {t: pair.rows("target", t, 8) for t in ("orders", "order_items")} == before
        assert pair.rows("source", "orders", 8) == {}
        pair.assert_nothing_left()
        done = manage("show")
        assert done.returncode == 0 and "shard_b (postgresql): 1 shard(s): 8" in done.stdout
        done = manage("move", "--shard", "8", "--to", "shard_c", *tables)
        assert done.returncode == 2
        assert done.stderr.strip().count("\n") == 0
        assert "unknown shard target 'shard_c'" in done.stderr
