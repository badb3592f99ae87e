"""The journaled shard mover (ShardMover, ``snowflake-db shards``, ``manage.py snowflake
shards``) between two throwaway MariaDB servers, through the faults PostgreSQL's moves survive.

One pair of servers per module and pytest-xdist group (``tests.plugins.shard_moves_mariadb``:
the source with a row-based binary log); each test makes its own databases (two sharded tables
of 3000 rows each, 16 logical shards, all on ``a``) and a control database on one of the
servers. Writer threads route every write by the map in the control database and retry a
write the fence refused (``tests.plugins.shard_mover_mariadb.MapWriter``: INSERT, INSERT
IGNORE, ON DUPLICATE KEY UPDATE, REPLACE, UPDATE, DELETE) through every case, and each case
ends with every acknowledged order exactly once, as acknowledged, on the target the final map
names. A mover is killed with a real SIGKILL (a subprocess running ``move()``); the copy is
held by a lock on the target (``hold_copy``) while a server restarts or writes of every kind
land. Without the MariaDB binaries the tests skip with the reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy import BigInteger, MetaData, String, create_engine, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from snowflake_db import SnowflakeGenerator
from snowflake_db.cli import main
from snowflake_db.errors import MoveServerUnreachableError, ShardMovedError, ShardMoveError
from snowflake_db.sharding import ShardRule
from snowflake_db.sharding.moved import retry_shard_moved, shard_moved_error
from snowflake_db.sharding.moves import FORWARD_STEPS, MoveStoppedError, wait_until
from snowflake_db.sharding.routing import ControlledShardRouter
from snowflake_db.sharding.shard_map import add_target, read_shard_map, shard_map_tables
from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker
from snowflake_db.worker import worker_tables

from ..plugins.core_support import is_stopped
from ..plugins.fence_events import FenceClock, assert_fence_judged
from ..plugins.shard_mover_mariadb import (
    ROOT,
    SHARD,
    MoveThread,
    Setup,
    assert_exactly_once,
    copy_waiting,
    hold_copy,
    kill_mover_after,
    make_setup,
    start_writers,
    stop_leftover_writers,
    wait_copy_held,
)
from ..plugins.shard_moves_mariadb import LAYOUT, MASK, Servers, start_servers

pytestmark = pytest.mark.xdist_group("shard_mover_mariadb")


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with start_servers() as started:
        yield started


@pytest.fixture
def setup(servers: Servers) -> Iterator[Setup]:
    with make_setup(servers) as made:
        yield made


@pytest.fixture(autouse=True)
def _writers_stopped() -> Iterator[None]:
    yield
    stop_leftover_writers()


def _fence_left(setup: Setup, move_id: int) -> None:
    """The move is done and only its fence (six triggers and the fence row's table) stays."""
    mover = setup.mover()
    record = mover.status(move_id).move
    assert record.state == "done" and record.mover_token is None
    left = mover.leftovers(move_id)
    assert left.replication_empty and len(left.fence_triggers) == 2 * 3 + 1


# -- the whole move under writers ----------------------------------------------------------------


def test_full_move_under_writers_keeps_every_acknowledged_order_once(setup: Setup) -> None:
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    clock = FenceClock()
    try:
        move_id = setup.mover(progress_every_s=0.2).move(SHARD, "b", progress=clock)
    finally:
        writers.stop()
    assert clock.fence_up is not None, clock.events
    # What the fence did, exactly (whether a writer met it before the flip is chance).
    refused = assert_fence_judged(writers.attempts(), shard=SHARD, mask=MASK, source="a",
                                  target="b", move_id=move_id, fence_up=clock.fence_up)
    assert refused <= writers.refused  # each refusal refreshed the router (the retry polls it)
    _assert_fenced_on_a(setup, SHARD, move_id)
    kinds = {kind for w in writers.writers for kind in w.kinds}
    assert {"insert", "insert_ignore", "insert_ignore_dup", "upsert", "replace", "update",
            "delete"} <= kinds
    assert_exactly_once(setup, writers, preloaded)
    final = read_shard_map(setup.control).mapping
    assert final[SHARD] == "b" and all(final[s] == "a" for s in range(MASK + 1) if s != SHARD)
    status = setup.mover().status(move_id)
    steps = [(row.step, row.status) for row in status.journal]
    assert steps == [("plan", "done")] + [(name, s) for name, _ in FORWARD_STEPS
                                         for s in ("started", "done")]
    assert json.loads(status.journal[0].detail or "{}")["backend"] == "mariadb"
    assert status.move.backend == "mariadb" and status.move.flipped_version is not None
    assert any("catch_up" in e for e in clock.events) and any(
        f"done: shard {SHARD} on b" in e for e in clock.events)
    _fence_left(setup, move_id)


# -- killed after each journaled step, then resumed ---------------------------------------------

# One shard per kill point (16). Killed while the barrier waits is the same move as killed
# after the flip (the barrier only reads), so it is not a point of its own.
KILL_POINTS = [(name, "done") for name, _ in FORWARD_STEPS[:-1]] + [
    ("fence", "started"), ("flip", "started"), ("cleanup", "started")]
# Two halves, each in a pytest-xdist group of its own (and so on servers of its own).
KILL_HALVES = {"first": KILL_POINTS[: len(KILL_POINTS) // 2],
               "second": KILL_POINTS[len(KILL_POINTS) // 2:]}


@pytest.mark.parametrize("half", [
    pytest.param(name, marks=pytest.mark.xdist_group(f"shard_mover_mariadb_kills_{name}"))
    for name in KILL_HALVES
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
                _assert_fenced_on_a(setup, shard, move_id)
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
        _fence_left(setup, move_id)


def _assert_fenced_on_a(setup: Setup, shard: int, move_id: int) -> None:
    """A mover killed once the fence is up leaves the shard fenced on a: a write there is
    refused with the fence's error naming the move, until the resumed mover flips."""
    oid = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(shard)
    connection = setup.connect("a")
    try:
        with pytest.raises(pymysql.MySQLError) as refused, connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, customer_id, total_cents, status) "
                           "VALUES (%s, 4, 4, 'fenced')", (oid,))
    finally:
        connection.close()
    moved = shard_moved_error(refused.value)
    assert isinstance(moved, ShardMovedError), refused.value
    assert (moved.shard, moved.target, moved.move_id) == (shard, "b", move_id)


# -- abort, a second mover -----------------------------------------------------------------------


def test_abort_before_the_flip_leaves_nothing_and_the_shard_moves_again(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed once the copy started, and once verified (fenced, the map in cutover): the
    command's abort drops the fence, the capture triggers, the changelog and the copy's progress
    table, deletes the copied rows on b and serves the shard from a again."""
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
            setup.pair.assert_nothing_left()  # no trigger, changelog, fence or progress table
            record = mover.status(move_id).move
            assert record.state == "aborted" and record.mover_token is None
        # The fence is gone: the shard takes writes on a again.
        done = writers.ops
        wait_until(lambda: writers.ops >= done + 30, timeout_s=60, what="writes after the abort")
        # The shard is free again: a new move takes it all the way; an abort is then refused.
        again = setup.mover().move(SHARD, "b")
        with pytest.raises(ShardMoveError, match=r"has flipped .* cannot be aborted"):
            setup.mover().abort(again)
    finally:
        writers.stop()
    assert_exactly_once(setup, writers, preloaded)
    _fence_left(setup, again)


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
    _fence_left(setup, move_id)


# -- a server restarted or unreachable during the copy ---------------------------------------------


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_source_restarted_during_the_copy(servers: Servers, how: str) -> None:
    """The copy's first insert waits on b while the source stops cleanly (SIGTERM) or is
    SIGKILLed (crash recovery), then starts again; the move goes on or stops naming the
    source, and a resume finishes it."""
    # The control database lives on the target here: this fault is the source's alone.
    with make_setup(servers, prefix="mvrsrc", control_on="target") as setup:
        preloaded = setup.all_rows("a")
        writers = start_writers(setup)
        blocker = hold_copy(setup)
        mover = setup.mover(progress_every_s=0.2)
        moving = MoveThread(mover)
        source = servers.source
        try:
            wait_copy_held(setup, moving)
            assert source.process is not None
            if how == "kill":
                source.process.kill()
                source.process.wait(30)
                source.process = None
            else:
                source.stop()
            failed = writers.failed
            wait_until(lambda: writers.failed > failed, timeout_s=30,
                       what="a write failing while the source is down")
            source.start()
        finally:
            if source.process is None:
                source.start()
            blocker.rollback()  # the copy goes on
            blocker.close()
        moving.join()
        move_id = moving.result
        if moving.error is not None:  # stopped with a clear error: resume it
            assert isinstance(moving.error, MoveStoppedError), moving.error
            assert isinstance(moving.error.__cause__, MoveServerUnreachableError)
            assert f"the source {source.host}:{source.port}/" in str(moving.error)
            move_id = moving.error.move_id
            assert mover.resume(move_id).state == "done"
        assert move_id is not None
        fence_up = moving.clock.fence_up or time.monotonic()  # up by the end of the move
        writers.stop()
        # What the fence did, exactly (whether a writer met it before the flip is chance): it
        # refused only this shard's writes on a, and none on a was answered once it was up.
        refused = assert_fence_judged(writers.attempts(), shard=SHARD, mask=MASK, source="a",
                                      target="b", move_id=move_id, fence_up=fence_up)
        assert refused <= writers.refused  # each refusal refreshed the router (the retry polls it)
        _assert_fenced_on_a(setup, SHARD, move_id)
        assert any(oid & MASK == SHARD for oid in writers.acked())
        assert_exactly_once(setup, writers, preloaded)
        _fence_left(setup, move_id)


def test_target_unreachable_during_the_copy_stops_clearly_then_resumes(
    servers: Servers, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_setup(servers, prefix="mvrtgt") as setup:
        preloaded = setup.all_rows("a")
        writers = start_writers(setup)
        blocker = hold_copy(setup)
        mover = setup.mover(progress_every_s=0.2)
        moving = MoveThread(mover)
        target = servers.target
        try:
            wait_copy_held(setup, moving)
            assert target.process is not None
            target.process.kill()  # ends the blocker's session too
            target.process.wait(30)
            target.process = None
            moving.join()
        finally:
            with suppress(pymysql.MySQLError):
                blocker.close()
            if target.process is None:
                target.start()
        # The mover cannot go on with the copy: it stops, naming the step and the server.
        assert isinstance(moving.error, MoveStoppedError), moving.error
        move_id = moving.error.move_id
        assert moving.error.step == "catch_up"
        assert re.search(f"(lost the connection to|cannot connect to) the target "
                         f"{target.host}:{target.port}/", str(moving.error)), moving.error
        assert "resume or abort it" in str(moving.error)
        status = setup.mover().status(move_id)
        assert ("catch_up", "failed") in [(r.step, r.status) for r in status.journal]
        assert status.move.mover_token is None  # released: a resume need not wait
        assert setup.map_of(SHARD) == ("a", "moving")
        # The command resumes it once the target answers again.
        assert main(setup.cli_move("--resume", str(move_id))) == 0
        assert f"move {move_id}: shard {SHARD} a -> b, done" in capsys.readouterr().out
        writers.stop()
        assert_exactly_once(setup, writers, preloaded)
        _fence_left(setup, move_id)


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
    blocker = hold_copy(setup)
    moving = MoveThread(setup.mover(progress_every_s=0.2))
    changed: dict[int, str | None] = {}
    try:
        wait_copy_held(setup, moving)
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
        blocker.rollback()
        blocker.close()
        moving.join()
        writers.stop()
    assert moving.error is None, moving.error
    assert moving.result == move_id
    assert_exactly_once(setup, writers, preloaded, changed)
    _fence_left(setup, move_id)


# -- a router with a stale map after the flip ------------------------------------------------------


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(40))
    total_cents: Mapped[int] = mapped_column(BigInteger)


def test_a_stale_router_writes_through_the_fence_and_reads_never_miss(setup: Setup) -> None:
    preloaded = setup.all_rows("a")
    engines = {name: create_engine(setup.url(name)) for name in ("a", "b")}
    # Routers that will not look at the map again by themselves (no lease: the barrier
    # cannot wait for them, like a read-only process or a static worker ID).
    stale = ControlledShardRouter(setup.control, layout=LAYOUT, refresh_s=3600,
                                  background=False)
    reader = ControlledShardRouter(setup.control, layout=LAYOUT, refresh_s=3600,
                                   background=False)
    sessions = sharded_sessionmaker(
        ShardedRouting(reader, {"orders": ShardRule(id_fields=("id",))}), engines)
    writers = start_writers(setup)
    try:
        old_order = min(setup.rows("a", SHARD)["orders"])
        with sessions() as session:  # found on a before the move
            found = session.get(Order, old_order)
            assert found is not None and session.identity_key(instance=found)[2] == "a"
        move_id = setup.mover().move(SHARD, "b")
        assert stale.target_of_shard(SHARD) == "a" and reader.target_of_shard(SHARD) == "a"
        # A write through the stale router meets the fence a keeps: ShardMovedError, retried
        # by the helper onto b after a refresh.
        oid = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(SHARD)
        tried: list[str] = []

        def work() -> None:
            target = stale.target_of_shard(SHARD)
            tried.append(target)
            with engines[target].begin() as connection:
                connection.exec_driver_sql(
                    "INSERT INTO orders (id, customer_id, total_cents, status) "
                    "VALUES (%s, 3, 3, 'stale')", (oid,))

        with pytest.raises(OperationalError) as refused:  # one attempt: the fence's error
            work()
        moved = shard_moved_error(refused.value)
        assert isinstance(moved, ShardMovedError)
        assert (moved.shard, moved.target, moved.move_id) == (SHARD, "b", move_id)
        assert stale.target_of_shard(SHARD) == "a"  # nothing refreshed it
        retry_shard_moved(work, refresh=stale.refresh)
        assert tried == ["a", "a", "b"]  # refused on a, landed on b after the refresh
        # Reads by ID through the stale reader: an order from before the move (its row on a
        # deleted by the cleanup) and the one just written on b.
        version = read_shard_map(setup.control).version
        with sessions() as session:
            found = session.get(Order, old_order)
            assert found is not None and session.identity_key(instance=found)[2] == "b"
            assert reader.version == version  # the miss refreshed it once
            written = session.get(Order, oid)
            assert written is not None and written.status == "stale"
        with sessions() as session:  # a miss on a fresh map is a miss
            assert session.get(Order, (123456 << 4) | SHARD) is None
    finally:
        writers.stop()
        stale.close()
        reader.close()
        for engine in engines.values():
            engine.dispose()
    assert_exactly_once(setup, writers, preloaded, {oid: "stale"})
    _fence_left(setup, move_id)


# -- a writer process frozen across the whole move -----------------------------------------------

_FROZEN = textwrap.dedent("""
    import json, os, random, sys, time
    import pymysql
    from sqlalchemy.engine import make_url
    import snowflake_db
    from snowflake_db.worker import TableWorkerAllocator
    from snowflake_db.sharding.moved import retry_shard_moved, shard_moved_error
    from snowflake_db.sharding.routing import ControlledShardRouter
    from tests.plugins.shard_moves_mariadb import LAYOUT

    control, url_a, url_b, stop_file = sys.argv[1:5]
    urls = {"a": make_url(url_a), "b": make_url(url_b)}
    generator = snowflake_db.configure(
        allocator=TableWorkerAllocator(control, lease_seconds=3), layout=LAYOUT)
    generator.ensure_worker()
    router = ControlledShardRouter(control, layout=LAYOUT, refresh_s=0.2)
    print(json.dumps({"worker_id": generator.worker_id}), flush=True)
    rng = random.Random(os.getpid())
    for _ in range(5000):
        if os.path.exists(stop_file):
            break
        shard = 5 if rng.random() < 0.6 else rng.randrange(16)
        try:
            oid = generator.next_id_in_shard(shard)
        except Exception as error:  # the lease lapsed while frozen: fenced
            print(json.dumps({"fenced": repr(error)}), flush=True)
            time.sleep(0.05)
            continue
        refused = []

        def work():
            target = router.target_of_shard(oid & 15)
            url = urls[target]
            connection = pymysql.connect(host=url.host, port=url.port, user=url.username,
                                         database=url.database, autocommit=True,
                                         connect_timeout=5)
            try:
                with connection.cursor() as cursor:
                    cursor.execute("INSERT INTO orders (id, customer_id, total_cents) "
                                   "VALUES (%s, 7, 7)", (oid,))
            finally:
                connection.close()
            return target

        def refresh():
            refused.append(1)
            return router.refresh()

        target = retry_shard_moved(work, refresh=refresh, attempts=20, timeout_s=30)
        print(json.dumps({"acked": oid, "on": target, "refused": len(refused),
                          "worker_id": generator.worker_id}), flush=True)
        time.sleep(0.01)
""")


def test_a_writer_frozen_across_the_whole_move(setup: Setup, tmp_path: Path) -> None:
    preloaded = setup.all_rows("a")
    stop_file = tmp_path / "stop"
    process = subprocess.Popen(
        [sys.executable, "-c", _FROZEN, setup.control_url, setup.url("a"), setup.url("b"),
         str(stop_file)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: [lines.append(json.loads(line)) for line in process.stdout or ()],
        daemon=True)
    reader.start()
    writers = start_writers(setup)
    try:
        wait_until(lambda: sum("acked" in line for line in lines) >= 20 or
                   process.poll() is not None, timeout_s=60, what="the writer process writing")
        worker_id = lines[0]["worker_id"]
        process.send_signal(signal.SIGSTOP)
        wait_until(lambda: is_stopped(process.pid), timeout_s=10, what="the writer stopped")
        frozen_ms = int(time.time() * 1000)
        # Frozen with a live lease: the announce step (before the fence) waits for it to
        # report the moving map or to lapse. Judged by the database's clock: the journal's
        # announce line against the lease's end (frozen, it renews no more).
        mover = setup.mover(progress_every_s=0.2)
        move_id = mover.move(SHARD, "b")
        # It stayed frozen throughout: nothing it printed was made after the freeze (lines
        # it wrote before it, still in the pipe, may be read meanwhile).
        assert all(LAYOUT.decode(line["acked"]).timestamp_ms <= frozen_ms
                   for line in list(lines) if "acked" in line)
        frozen_at = len(lines)
        slots = worker_tables(MetaData()).slots
        with setup.control.connect() as connection:
            expired_at_ms = connection.execute(
                select(slots.c.expires_at_ms).where(slots.c.worker_id == worker_id)
            ).scalar_one()
        [announced_ms] = [row.at_ms for row in mover.status(move_id).journal
                          if (row.step, row.status) == ("announce", "done")]
        assert announced_ms >= expired_at_ms, (announced_ms, expired_at_ms)
        process.send_signal(signal.SIGCONT)
        wait_until(lambda: sum("acked" in line for line in lines[frozen_at:]) >= 20 or
                   process.poll() is not None, timeout_s=60, what="the writer writing again")
        stop_file.touch()
        process.wait(30)
    finally:
        writers.stop()
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(10)
    reader.join(10)
    assert process.returncode == 0, (process.stderr.read() if process.stderr else "")
    acked = {line["acked"] for line in lines if "acked" in line}
    # Written after the resume: IDs made after the freeze (a write acknowledged before the
    # SIGSTOP may be printed after the SIGCONT; the move carried it, checked below).
    after = [line for line in lines[frozen_at:] if "acked" in line
             and LAYOUT.decode(line["acked"]).timestamp_ms > frozen_ms]
    assert all(line["on"] == "b" for line in after if line["acked"] & MASK == SHARD)
    assert any(line["acked"] & MASK == SHARD for line in after)
    assert_exactly_once(setup, writers, preloaded, dict.fromkeys(acked, "new"))
    _fence_left(setup, move_id)


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
        assert f"terminated blocking sessions [{straggler.thread_id()}]" in out, out
        assert f"move {move_id}: shard {SHARD} a -> b, done" in out
        with pytest.raises(pymysql.err.OperationalError), straggler.cursor() as cursor:
            cursor.execute("SELECT 1")  # its session was ended
    finally:
        with suppress(pymysql.MySQLError):
            straggler.close()
        writers.stop()
    assert straggler_id not in setup.all_rows("b")["orders"]  # rolled back, never acked
    assert_exactly_once(setup, writers, preloaded)
    _fence_left(setup, move_id)


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
    _fence_left(setup, 1)


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

_DJANGO = textwrap.dedent("""
    import sys

    import pymysql

    pymysql.install_as_MySQLdb()  # Django's MySQL backend imports MySQLdb
    import django
    from django.conf import settings
    from sqlalchemy.engine import make_url

    def database(text):
        url = make_url(text)
        return {"ENGINE": "django.db.backends.mysql", "NAME": url.database,
                "USER": url.username, "HOST": url.host, "PORT": str(url.port)}

    control, a, b = sys.argv[1:4]
    settings.configure(
        INSTALLED_APPS=["snowflake_db.django"],
        DATABASES={"default": database(control), "shard_a": database(a),
                   "shard_b": database(b)},
        SNOWFLAKE_DB={"WORKER_SOURCE": "manual", "LAYOUT": {"sequence_bits": 8,
                                                            "shard_bits": 4}},
        SNOWFLAKE_SHARD_ROUTER={"TARGETS": ["shard_a", "shard_b"]},
    )
    django.setup()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "snowflake", "shards", *sys.argv[4:]])
""")


def test_manage_py_shards_on_mariadb_aliases(servers: Servers) -> None:
    """MySQL-backend DATABASES aliases (PyMySQL as MySQLdb) as targets, the control alias on
    MariaDB: init, plan, a dry run, a move; a mistake exits 2 with one line and changes
    nothing."""
    with make_setup(servers, prefix="mvrdj") as setup:
        name = f"{setup.pair.db}_djctl"
        with servers.source.connect() as connection, connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        control = servers.source.url(name)
        engine = create_engine(control)
        try:
            worker_tables(MetaData()).slots.metadata.create_all(engine)

            def manage(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [sys.executable, "-c", _DJANGO, control, setup.url("a"), setup.url("b"),
                     *args], cwd=ROOT, capture_output=True, text=True, timeout=180,
                    check=False)

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
    b_done = threading.Event()

    def mover_b() -> None:
        try:
            with setup.control.begin() as connection:
                _append(connection, tables, second, "plan", status="done")
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            b_done.set()

    with setup.control.connect() as a:
        with a.begin():
            _append(a, tables, first, "check", status="done")
            b = threading.Thread(target=mover_b, daemon=True)
            b.start()

            _wait_until_lock_wait_or_done(setup, b_done, "mover B's line written or waiting")
            try:
                _append(a, tables, first, "capture", status="started")
            except OperationalError as error:
                errors.append(error)
                raise AssertionError(f"mover A: {error.orig!r}") from None
        b.join(30)
    assert not b.is_alive()
    assert errors == []
    with setup.control.connect() as connection:
        lines = connection.execute(
            select(tables.move_steps.c.move_id, tables.move_steps.c.seq,
                   tables.move_steps.c.step, tables.move_steps.c.status)
            .where(tables.move_steps.c.move_id.in_([first, second]))
            .order_by(tables.move_steps.c.move_id, tables.move_steps.c.seq)).all()
    assert [tuple(line) for line in lines] == [
        (first, 1, "plan", "done"), (first, 2, "check", "done"),
        (first, 3, "capture", "started"), (second, 1, "plan", "done")]


def _wait_until_lock_wait_or_done(setup: Setup, done: threading.Event, what: str) -> None:
    """Until ``done`` is set or a transaction on the control database waits for a row lock."""

    def waiting_or_done() -> bool:
        if done.is_set():
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
    b_done = threading.Event()

    def process_b() -> None:
        try:
            with setup.control.begin() as connection:
                report_seen(connection, worker_id=12, lease_token="12" * 16, version=1)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            b_done.set()

    with setup.control.connect() as a:
        with a.begin():
            assert report_seen(a, worker_id=11, lease_token="11" * 16, version=1)
            b = threading.Thread(target=process_b, daemon=True)
            b.start()

            _wait_until_lock_wait_or_done(setup, b_done, "B's report written or waiting")
            try:
                report_seen(a, worker_id=13, lease_token="13" * 16, version=1)
            except OperationalError as error:
                errors.append(error)
        b.join(30)
    assert not b.is_alive()
    assert errors == []
    with setup.control.connect() as connection:
        seen = connection.exec_driver_sql(
            "SELECT worker_id, map_version FROM snowflake_shard_map_seen WHERE worker_id "
            "IN (11, 12, 13) ORDER BY worker_id").all()
    assert [tuple(row) for row in seen] == [(11, 1), (12, 1), (13, 1)]
    assert report_seen(setup.control, worker_id=12, lease_token="12" * 16, version=2)
    with setup.control.connect() as connection:
        assert connection.exec_driver_sql("SELECT map_version FROM snowflake_shard_map_seen "
                                          "WHERE worker_id = 12").scalar() == 2
