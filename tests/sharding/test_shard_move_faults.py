"""The faults a shard move must survive (issue 31), each on two throwaway servers of each
backend.

The source restarted during the copy, the target unreachable during the copy, a router with a
stale map after the flip (writes refused by the fence and retried on the new target, reads by
ID that must not miss), a writer process frozen (SIGSTOP) across the whole move: on both
backends (``move_backend``), under writer threads that route every write by the map
(:class:`tests.plugins.shard_moves.MapWriter`). PostgreSQL's own: a router that saw the shard
moving, and the static-worker rule (the source's rows stay until the operator says no static
worker routes). Each ends with every acknowledged order exactly once, on the target the final
map names, none of the moved shard left on the source, and nothing of the move's capture left.

The copy is held deterministically (``Kind.hold_copy``): on PostgreSQL an ``ALWAYS`` trigger on
the target's orders waits for an advisory lock a session holds; on MariaDB a transaction on the
target holds a lock on the end of the empty orders table. Either way the mover's checks read
past it.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import BigInteger, MetaData, String, create_engine, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from snowflake_db import SnowflakeGenerator
from snowflake_db.cli import main
from snowflake_db.errors import MoveServerUnreachableError, ShardMovedError
from snowflake_db.sharding import ShardRule
from snowflake_db.sharding.moved import retry_shard_moved, shard_moved_error
from snowflake_db.sharding.moves import (
    RECOPY_STEP,
    STATIC_WORKERS_STEP,
    MoveStoppedError,
    StaticWorkersUnconfirmedError,
    wait_until,
)
from snowflake_db.sharding.routing import ControlledShardRouter
from snowflake_db.sharding.shard_map import read_shard_map
from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker
from snowflake_db.worker import worker_tables

from ..plugins.core_support import is_stopped
from ..plugins.shard_moves import (
    LAYOUT,
    MASK,
    SHARD,
    FrozenWriter,
    MoveThread,
    assert_exactly_once,
    assert_fence_did,
    assert_fence_left,
    make_setup,
    on_every_backend,
    start_writers,
)
from ..plugins.shard_moves_postgres import Clusters, StrandedCopy

# PostgreSQL's own tests; the shared ones run in a group per backend (on_every_backend).
pytestmark = pytest.mark.xdist_group("shard_move_faults_postgresql")
BACKEND = "postgresql"
EVERY_BACKEND = on_every_backend("shard_move_faults")


# -- 1. the source restarted during the copy -----------------------------------------------------


@pytest.mark.parametrize(("move_backend", "how"), [
    pytest.param(backend, how, id=f"{backend}-{how}",
                 marks=pytest.mark.xdist_group(f"shard_move_faults_{backend}"))
    for backend, how in (("postgresql", "immediate"), ("mariadb", "stop"), ("mariadb", "kill"))
])
def test_source_restarted_during_the_copy(move_backend: str, servers: Any, how: str
                                          ) -> None:
    """The copy's first write on b waits while the source goes down (PostgreSQL: an
    immediate shutdown, a crash; MariaDB: a clean stop, or SIGKILL and crash recovery), then
    starts again; the move goes on or stops naming the source, and a resume finishes it."""
    # The control database lives on the target here: this fault is the source's alone.
    with make_setup(move_backend, servers, prefix="fsrc", control_on="target") as setup:
        preloaded = setup.all_rows("a")
        writers = start_writers(setup)
        hold = setup.kind.hold_copy(setup)
        mover = setup.mover(progress_every_s=0.2)
        moving = MoveThread(mover)
        source = servers.source
        try:
            hold.wait(moving)
            setup.kind.bring_down(source, how)
            failed = writers.failed
            wait_until(lambda: writers.failed > failed, timeout_s=30,
                       what="a write failing while the source is down")
            source.start()
        finally:
            if setup.kind.is_down(source):
                source.start()
            hold.release()  # the copy goes on
        moving.join()
        move_id = moving.result
        if moving.error is not None:  # stopped with a clear error: resume it
            assert isinstance(moving.error, MoveStoppedError), moving.error
            if move_backend == "mariadb":
                assert isinstance(moving.error.__cause__, MoveServerUnreachableError)
                assert f"the source {source.host}:{source.port}/" in str(moving.error)
            move_id = moving.error.move_id
            assert mover.resume(move_id).state == "done"
        assert move_id is not None
        fence_up = moving.clock.fence_up or time.monotonic()  # up by the end of the move
        writers.stop()
        assert_fence_did(setup, writers, move_id, fence_up)
        assert any(oid & MASK == SHARD for oid in writers.acked())
        hold.drop()
        assert_exactly_once(setup, writers, preloaded)
        assert_fence_left(setup, move_id)


def test_a_table_copy_stranded_by_its_lost_slot_is_copied_again(servers: Clusters) -> None:
    """PostgreSQL drops a table's copy slot on the source before it commits the table's next
    state on the target: a source that crashes between the two leaves the table copied
    (``f``) and its slot gone, and the subscription can never finish (``f`` for ever). Made
    deterministically here (:class:`StrandedCopy`) while the mover waits for the copy under
    writers: the mover finds it, undoes the copy and copies again, and the move finishes."""
    with make_setup(BACKEND, servers, prefix="fstrand") as setup:
        preloaded = setup.all_rows("a")
        stranded = StrandedCopy(setup)
        writers = start_writers(setup)
        moving = MoveThread(setup.mover(progress_every_s=0.2))
        try:
            slot = stranded.make(moving)
        finally:
            stranded.close()
        moving.join()
        writers.stop()
        assert moving.error is None, moving.error
        move_id = moving.result
        assert move_id is not None
        target = servers.target
        lost = (f"the copy of order_items ended on the target {target.host}:{target.port}/"
                f"{setup.pair.db} but its table-sync slot {slot} is gone from the source ")
        journal = setup.mover().status(move_id).journal
        [failed] = [row.detail for row in journal if (row.step, row.status)
                    == ("catch_up", "failed")]
        assert (failed or "").startswith(f"CopyLostError: {lost}"), failed
        [recopied] = [json.loads(row.detail or "{}") for row in journal
                      if (row.step, row.status) == (RECOPY_STEP, "done")]
        assert recopied["lost"].startswith(lost), recopied
        said = f"move {move_id} {RECOPY_STEP}: "
        assert [e.startswith(said + lost) for e in moving.events if e.startswith(said)] == [
            True], moving.events
        assert_fence_did(setup, writers, move_id, moving.clock.fence_up or time.monotonic())
        assert_exactly_once(setup, writers, preloaded)
        assert_fence_left(setup, move_id)


# -- 2. the target unreachable during the copy ---------------------------------------------------


@EVERY_BACKEND
def test_target_unreachable_during_the_copy_stops_clearly_then_resumes(
    move_backend: str, servers: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_setup(move_backend, servers, prefix="ftgt") as setup:
        preloaded = setup.all_rows("a")
        writers = start_writers(setup)
        hold = setup.kind.hold_copy(setup)
        mover = setup.mover(progress_every_s=0.2)
        moving = MoveThread(mover)
        target = servers.target
        try:
            hold.wait(moving)
            # A crash: it ends the hold's session too.
            setup.kind.bring_down(target, "immediate" if move_backend == "postgresql" else "kill")
            moving.join()
        finally:
            hold.release()
            if setup.kind.is_down(target):
                target.start()
        # The mover cannot go on with the copy: it stops, naming the step and the server.
        assert isinstance(moving.error, MoveStoppedError), moving.error
        move_id = moving.error.move_id
        assert moving.error.step == "catch_up"
        # Lost mid-query or refused at connect: either way the server is named.
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
        hold.drop()
        assert_exactly_once(setup, writers, preloaded)
        assert_fence_left(setup, move_id)


# -- 3. a router with a stale map after the flip ---------------------------------------------------


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(40))
    total_cents: Mapped[int] = mapped_column(BigInteger)


@EVERY_BACKEND
def test_a_stale_router_writes_through_the_fence_and_reads_never_miss(
    move_backend: str, servers: Any
) -> None:
    with make_setup(move_backend, servers, prefix="fstale") as setup:
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
            # A write through the stale router meets the fence a keeps: ShardMovedError,
            # retried by the helper onto b after a refresh.
            oid = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(SHARD)
            tried: list[str] = []

            def work() -> None:
                target = stale.target_of_shard(SHARD)
                tried.append(target)
                with engines[target].begin() as connection:
                    connection.exec_driver_sql(
                        "INSERT INTO orders (id, customer_id, total_cents, status) "
                        "VALUES (%s, 3, 3, 'stale')", (oid,))

            with pytest.raises(DBAPIError) as refused:  # one attempt: the fence's error
                work()
            moved = shard_moved_error(refused.value)
            assert isinstance(moved, ShardMovedError)
            assert (moved.shard, moved.target, moved.move_id) == (SHARD, "b", move_id)
            assert stale.target_of_shard(SHARD) == "a"  # nothing refreshed it
            retry_shard_moved(work, refresh=stale.refresh)
            assert tried == ["a", "a", "b"]  # refused on a, landed on b after the refresh
            # Reads by ID through the stale reader: an order from before the move (its row on
            # a deleted by the cleanup) and the one just written on b.
            version = read_shard_map(setup.control).version
            with sessions() as session:
                found = session.get(Order, old_order)
                assert found is not None and session.identity_key(instance=found)[2] == "b"
                assert reader.version == version  # the miss refreshed it once
                written = session.get(Order, oid)
                assert written is not None and written.status == "stale"
            # A miss on a fresh map is a miss (one version read, no reload).
            with sessions() as session:
                assert session.get(Order, (123456 << 4) | SHARD) is None
        finally:
            writers.stop()
            stale.close()
            reader.close()
            for engine in engines.values():
                engine.dispose()
        assert_exactly_once(setup, writers, preloaded, {oid: "stale"})
        assert_fence_left(setup, move_id)


# -- PostgreSQL's own: a router that saw the shard moving ---------------------------------------


def test_a_router_that_saw_the_shard_moving_routes_it_by_the_map_of_each_call(
    servers: Clusters,
) -> None:
    """Reads by customer find nothing to miss: a router that has seen the shard ``moving``
    checks the map at each call that routes it, so right after the flip it names the new
    target although its own refresh is an hour away."""
    with make_setup("postgresql", servers, prefix="fseen") as setup:
        router = ControlledShardRouter(setup.control, layout=LAYOUT, refresh_s=3600,
                                       background=False)
        try:
            seen: list[str] = []

            def progress(event: Any) -> None:
                if event.step == "announce" and not seen:
                    router.refresh()  # its last look at the map by itself
                    seen.append(router.state_of(SHARD))

            setup.mover().move(SHARD, "b", progress=progress)
            assert seen == ["moving"]
            assert router.target_of_shard(SHARD) == "b"
            assert router.state_of(SHARD) == "serving"
            # Once serving again, the shard is routed by the refresh interval as before.
            assert router.target_of_shard(SHARD - 1) == "a"
        finally:
            router.close()


def test_a_fixed_router_never_refreshes_after_a_miss() -> None:
    from snowflake_db.sharding import ShardRouter

    assert ShardRouter(["a", "b"], layout=LAYOUT).refresh_after_miss() is False


# -- 4. a writer process frozen across the whole move ------------------------------------------


@EVERY_BACKEND
def test_a_writer_frozen_across_the_whole_move(
    move_backend: str, servers: Any, tmp_path: Path
) -> None:
    with make_setup(move_backend, servers, prefix="ffrozen") as setup:
        preloaded = setup.all_rows("a")
        frozen = FrozenWriter(setup, tmp_path / "stop")
        process = frozen.process
        # Static worker IDs the frozen writer's allocator never hands out here (it numbers
        # its slots from 1 in this fresh control database): beside its worker 1 the threads'
        # worker 1 made the same key once (the same millisecond, sequence and shard).
        writers = start_writers(setup, ids=(LAYOUT.max_worker_id - 1, LAYOUT.max_worker_id))
        try:
            wait_until(lambda: frozen.acked_since() >= 20 or process.poll() is not None,
                       timeout_s=60, what="the writer process writing")
            worker_id = frozen.lines[0]["worker_id"]
            process.send_signal(signal.SIGSTOP)
            wait_until(lambda: is_stopped(process.pid), timeout_s=10, what="the writer stopped")
            frozen_ms = int(time.time() * 1000)
            # Frozen with a live lease: the mover's announce step (before the fence) waits for
            # it to report the moving map or to lapse. Judged by the database's clock: the
            # journal's announce line against the lease's end (frozen, it renews no more), as
            # on a loaded machine the copy alone can outlast the 3 s lease.
            mover = setup.mover(progress_every_s=0.2)
            move_id = mover.move(SHARD, "b")
            # It stayed frozen throughout: nothing it printed was made after the freeze (lines
            # it wrote before it, still in the pipe, may be read meanwhile).
            assert all(LAYOUT.decode(line["acked"]).timestamp_ms <= frozen_ms
                       for line in list(frozen.lines) if "acked" in line)
            frozen_at = len(frozen.lines)
            slots = worker_tables(MetaData()).slots
            with setup.control.connect() as connection:
                expired_at_ms = connection.execute(
                    select(slots.c.expires_at_ms).where(slots.c.worker_id == worker_id)
                ).scalar_one()
            [announced_ms] = [row.at_ms for row in mover.status(move_id).journal
                              if (row.step, row.status) == ("announce", "done")]
            assert announced_ms >= expired_at_ms, (announced_ms, expired_at_ms)
            process.send_signal(signal.SIGCONT)
            wait_until(lambda: frozen.acked_since(frozen_at) >= 20 or process.poll() is not None,
                       timeout_s=60, what="the writer writing again")
            frozen.stop()
        finally:
            writers.stop()
            frozen.end()
        assert process.returncode == 0, (process.stderr.read() if process.stderr else "")
        lines = frozen.lines
        acked = {line["acked"] for line in lines if "acked" in line}
        # Written after the resume: IDs made after the freeze (a write acknowledged before the
        # SIGSTOP may be printed after the SIGCONT; the move carried it, checked below).
        after = [line for line in lines[frozen_at:] if "acked" in line
                 and LAYOUT.decode(line["acked"]).timestamp_ms > frozen_ms]
        assert all(line["on"] == "b" for line in after if line["acked"] & MASK == SHARD)
        assert any(line["acked"] & MASK == SHARD for line in after)
        assert_exactly_once(setup, writers, preloaded, dict.fromkeys(acked, "new"))
        assert_fence_left(setup, move_id)


# -- the static-worker rule ----------------------------------------------------------------------


def test_without_the_operators_word_the_source_rows_stay_until_resumed_with_it(
    servers: Clusters, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_setup("postgresql", servers, prefix="fstatic") as setup:
        preloaded = setup.rows("a", SHARD)
        all_loaded = setup.all_rows("a")
        mover = setup.mover(assume_no_static_workers=False)
        with pytest.raises(MoveStoppedError) as stopped:
            mover.move(SHARD, "b")
        assert stopped.value.step == STATIC_WORKERS_STEP
        assert isinstance(stopped.value.__cause__, StaticWorkersUnconfirmedError)
        assert "--assume-no-static-workers" in str(stopped.value)
        move_id = stopped.value.move_id
        # Flipped and cleaned up (nothing holds WAL), the source's copy kept, the fence up.
        assert setup.map_of(SHARD) == ("b", "serving")
        assert setup.rows("a", SHARD) == preloaded == setup.rows("b", SHARD)
        left = mover.leftovers(move_id)
        assert left.replication_empty and len(left.fence_triggers) == 6
        setup.pair.assert_nothing_left()
        # The command without the word stops again, exit 1, one line.
        argv = [a for a in setup.cli_move("--resume", str(move_id))
                if a != "--assume-no-static-workers"]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "static worker IDs" in err, err
        assert setup.rows("a", SHARD) == preloaded
        # With it, the move finishes.
        assert main(setup.cli_move("--resume", str(move_id))) == 0
        assert f"move {move_id}: shard {SHARD} a -> b, done" in capsys.readouterr().out
        assert setup.map_of(SHARD) == ("b", "serving")
        assert_exactly_once(setup, None, all_loaded)
        assert_fence_left(setup, move_id)
