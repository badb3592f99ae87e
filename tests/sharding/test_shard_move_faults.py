"""The faults a shard move must survive (issue 31), each on two throwaway clusters.

The source restarted during the copy, the target unreachable during the copy, a router with a
stale map after the flip (writes refused by the fence and retried on the new target, reads by
ID that must not miss), a writer process frozen (SIGSTOP) across the whole move, and the
static-worker rule (the source's rows stay until the operator says no static worker routes).
Each ends with every acknowledged order exactly once, on the target the final map names, none
of the moved shard left on the source, and no replication slot, publication or subscription.

The copy is held deterministically: a session on the target holds ``SHARE`` on ``orders``, so
the table-copy worker's ``COPY`` into it waits (``SHARE`` lets the mover's checks read).
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import BigInteger, MetaData, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from snowflake_db import SnowflakeGenerator
from snowflake_db.cli import main
from snowflake_db.sharding import ShardRule
from snowflake_db.sharding.moved import retry_shard_moved, shard_moved_error
from snowflake_db.sharding.moves import (
    STATIC_WORKERS_STEP,
    MoveStoppedError,
    ShardMover,
    StaticWorkersUnconfirmedError,
    wait_until,
)
from snowflake_db.sharding.routing import ControlledShardRouter
from snowflake_db.sharding.shard_map import read_shard_map
from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker
from snowflake_db.worker import worker_tables

from ..plugins.core_support import is_stopped
from ..plugins.fence_events import Attempts, FenceClock, assert_fence_judged
from ..plugins.shard_moves import (
    BOTH_CONF,
    LAYOUT,
    MASK,
    Clusters,
    Setup,
    make_setup,
    start_clusters,
)

pytestmark = pytest.mark.xdist_group("shard_move_faults")

ROOT = Path(__file__).resolve().parents[2]
SHARD = 5


@pytest.fixture(scope="module")
def clusters() -> Iterator[Clusters]:
    with start_clusters(BOTH_CONF, BOTH_CONF) as started:
        yield started


def libpq(setup: Setup, name: str) -> str:
    return setup.url(name).replace("+psycopg", "")


def durable(setup: Setup, name: str) -> str:
    """A libpq URI whose commits return once their WAL is written: the clusters run with
    ``synchronous_commit = off``, and a crashed server would lose commits acknowledged a moment
    before (the server's setting, not the move's doing)."""
    return libpq(setup, name) + "?options=-c%20synchronous_commit%3Don"


# -- writers routed by the map -------------------------------------------------------------------


@dataclass
class MapWriter:
    """Inserts orders (most on the moving shard) and updates its own, each write one autocommit
    statement on its own connection, routed by a map-following router, retried by
    :func:`retry_shard_moved` after a fence's refusal. A write whose connection failed is in
    doubt: neither acknowledged nor known absent."""

    worker_id: int
    setup: Setup
    stop: threading.Event
    acked: dict[int, str] = field(default_factory=dict)
    doubtful: set[int] = field(default_factory=set)
    refused: int = 0
    failed: int = 0
    ops: int = 0
    errors: list[str] = field(default_factory=list)
    #: Every try of every write, with its outcome (tests.plugins.fence_events).
    attempts: Attempts = field(default_factory=Attempts)

    def run(self) -> None:
        generator = SnowflakeGenerator(self.worker_id, layout=LAYOUT)
        rng = random.Random(self.worker_id)
        router = ControlledShardRouter(self.setup.control, layout=LAYOUT, refresh_s=0.1)
        try:
            while not self.stop.is_set() and self.ops < 5000:
                self._one(router, generator, rng)
                time.sleep(0.005)
        except Exception as error:  # reported by the test
            self.errors.append(repr(error))
        finally:
            router.close()

    def _one(self, router: ControlledShardRouter, generator: SnowflakeGenerator,
             rng: random.Random) -> None:
        params: tuple[Any, ...]
        if self.acked and rng.random() < 0.25:
            oid = rng.choice(list(self.acked))
            status = f"paid{rng.randrange(999)}"
            query, params = "UPDATE orders SET status = %s WHERE id = %s", (status, oid)
        else:
            shard = SHARD if rng.random() < 0.6 else rng.randrange(MASK + 1)
            oid, status = generator.next_id_in_shard(shard), "new"
            query = "INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 1, 1)"
            params = (oid,)

        def work() -> int:
            target = router.target_of_shard(oid & MASK)

            def attempt() -> int:
                with psycopg.connect(durable(self.setup, target), autocommit=True,
                                     connect_timeout=3) as conn:
                    return int(conn.execute(query, params).rowcount)

            return self.attempts.run(oid, target, attempt)

        def refresh() -> None:
            self.refused += 1
            router.refresh()

        try:
            rowcount = retry_shard_moved(work, refresh=refresh, attempts=30, timeout_s=30)
        except psycopg.OperationalError:  # a server down: the write is in doubt
            self.failed += 1
            self.doubtful.add(oid)
            self.acked.pop(oid, None)
            time.sleep(0.05)
            return
        assert rowcount == 1, oid
        self.ops += 1
        self.acked[oid] = status


#: Writers started by the running test: stopped after it whatever happened (a test that failed
#: before stop_writers left them issuing IDs and writing in the pytest worker, into later tests).
_running: list[tuple[threading.Event, list[threading.Thread]]] = []


@pytest.fixture(autouse=True)
def _writers_stopped() -> Iterator[None]:
    yield
    while _running:
        stop, threads = _running.pop()
        stop.set()
        for thread in threads:
            thread.join(30)


def run_writers(setup: Setup, ids: tuple[int, ...] = (1, 2)
                ) -> tuple[list[MapWriter], threading.Event, list[threading.Thread]]:
    stop = threading.Event()
    writers = [MapWriter(w, setup, stop) for w in ids]
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    _running.append((stop, threads))
    for thread in threads:
        thread.start()
    wait_until(lambda: all(w.ops >= 10 for w in writers), timeout_s=30, what="writers running")
    return writers, stop, threads


def stop_writers(writers: list[MapWriter], stop: threading.Event,
                 threads: list[threading.Thread]) -> None:
    ops = sum(w.ops for w in writers)
    try:
        wait_until(lambda: sum(w.ops for w in writers) >= ops + 20 or stop.is_set(),
                   timeout_s=30, what="writes after the move")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert [w.errors for w in writers] == [[] for _ in writers]


def _assert_fenced_on_a(setup: Setup, move_id: int) -> None:
    """The move's fence stays on a after it: a write of the shard there is refused with the
    fence's error naming the shard, the new target and the move."""
    oid = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(SHARD)
    with setup.pair.connect("source") as a, pytest.raises(psycopg.Error) as refused:
        a.execute("INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, 4, 4)", (oid,))
    moved = shard_moved_error(refused.value)
    assert moved is not None, refused.value
    assert (moved.shard, moved.target, moved.move_id) == (SHARD, "b", move_id)


def assert_exactly_once(setup: Setup, move_id: int, acked: dict[int, str],
                        doubtful: set[int] = frozenset(),  # type: ignore[assignment]
                        preloaded: dict[str, dict[int, tuple[Any, ...]]] | None = None) -> None:
    """Every acknowledged order once, as acknowledged, on the target of the final map and not
    on the other; an order in doubt at most once; the moved shard gone from the source; the
    move done with no replication object left anywhere."""
    final = read_shard_map(setup.control).mapping
    assert final[SHARD] == "b"
    with setup.pair.connect("source") as a, setup.pair.connect("target") as b:
        where = {"a": a, "b": b}
        for oid, status in acked.items():
            found = {name: conn.execute("SELECT status FROM orders WHERE id = %s",
                                        (oid,)).fetchall() for name, conn in where.items()}
            home = final[oid & MASK]
            assert found[home] == [(status,)], (oid, found)
            assert found["b" if home == "a" else "a"] == [], (oid, found)
        for oid in doubtful:
            counts = [len(conn.execute("SELECT 1 FROM orders WHERE id = %s", (oid,)).fetchall())
                      for conn in where.values()]
            assert sum(counts) <= 1, oid
    assert setup.rows("a", SHARD) == {"orders": {}, "order_items": {}}
    if preloaded is not None:
        moved = setup.rows("b", SHARD)
        assert moved["order_items"] == preloaded["order_items"]
        assert {k: moved["orders"][k] for k in preloaded["orders"]} == preloaded["orders"]
    mover = setup.mover()
    assert mover.status(move_id).move.state == "done"
    assert mover.leftovers(move_id).replication_empty
    setup.pair.assert_nothing_left()


# -- holding the copy ------------------------------------------------------------------------------


HOLD_LOCK = 4242


def hold_copy(setup: Setup) -> psycopg.Connection[Any]:
    """A session on the target holding advisory lock ``HOLD_LOCK``, which an ``ALWAYS``
    trigger on orders waits for before each row: the table copy (which runs as a replica,
    where only ``ALWAYS`` triggers fire) waits at its first row. A table lock would hold up
    the apply worker too (it locks a table before skipping the changes of one not yet copied).
    """
    with setup.pair.connect("target") as t:
        t.execute(f"""CREATE FUNCTION hold_copy() RETURNS trigger LANGUAGE plpgsql AS $$
                      BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD_LOCK}); RETURN NEW;
                      END $$""")
        t.execute("CREATE TRIGGER hold_copy BEFORE INSERT ON orders FOR EACH ROW "
                  "EXECUTE FUNCTION hold_copy()")
        t.execute("ALTER TABLE orders ENABLE ALWAYS TRIGGER hold_copy")
    conn = setup.pair.connect("target")
    conn.execute("SELECT pg_advisory_lock(%s)", (HOLD_LOCK,))
    return conn


def drop_hold(setup: Setup) -> None:
    with setup.pair.connect("target") as t:
        t.execute("DROP TRIGGER IF EXISTS hold_copy ON orders")


def wait_copy_started(setup: Setup, moving: MoveThread) -> None:
    """Until the orders table's copy is under way: state 'd' on the target, its table-copy
    slot on the source."""
    def started() -> bool:
        assert moving.error is None, (moving.error, moving.events)
        with setup.pair.connect("target") as t:
            state = t.execute("SELECT srsubstate::text FROM pg_subscription_rel "
                              "WHERE srrelid = 'orders'::regclass").fetchone()
        if state != ("d",):
            return False
        with setup.pair.connect("source") as s:
            return bool(s.execute("SELECT count(*) FROM pg_replication_slots "
                                  "WHERE slot_name LIKE 'pg\\_%\\_sync\\_%'").fetchone()[0])
    wait_until(started, timeout_s=30, what="the orders table's copy under way")


class MoveThread:
    """``mover.move`` in a thread: its id or its error, and its progress events."""

    def __init__(self, mover: ShardMover, shard: int = SHARD, to: str = "b") -> None:
        #: The progress events, and when the fence was reported up.
        self.clock = FenceClock()
        self.events = self.clock.events
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(mover, shard, to), daemon=True)
        self.thread.start()

    def _run(self, mover: ShardMover, shard: int, to: str) -> None:
        try:
            self.result = mover.move(shard, to, progress=self.clock)
        except BaseException as error:  # read by the test
            self.error = error

    def join(self, timeout: float = 120) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), self.events[-5:]


# -- 1. the source restarted during the copy -----------------------------------------------------


def test_source_restarted_during_the_copy(clusters: Clusters) -> None:
    # The control database lives on the target here: this fault is the source's alone.
    with make_setup(clusters, prefix="fsrc", control_on="target") as setup:
        preloaded = setup.rows("a", SHARD)
        writers, stop, threads = run_writers(setup)
        blocker = hold_copy(setup)
        mover = setup.mover(progress_every_s=0.2)
        moving = MoveThread(mover)
        try:
            wait_copy_started(setup, moving)
            # A crash (SIGQUIT): a fast shutdown waits for the walsender of the held copy.
            clusters.source.stop(immediate=True)
            refused_while_down = sum(w.failed for w in writers)
            wait_until(lambda: sum(w.failed for w in writers) > refused_while_down,
                       timeout_s=30, what="a write failing while the source is down")
            clusters.source.start()
        finally:
            blocker.close()  # ends the lock: the copy goes on
        moving.join()
        if moving.error is not None:  # stopped with a clear error: resume it
            assert isinstance(moving.error, MoveStoppedError), moving.error
            moving.result = moving.error.move_id
            assert mover.resume(moving.error.move_id).state == "done"
        assert moving.result is not None
        fence_up = moving.clock.fence_up or time.monotonic()  # up by the end of the move
        stop_writers(writers, stop, threads)
        acked = {oid: s for w in writers for oid, s in w.acked.items()}
        doubtful = set().union(*(w.doubtful for w in writers))
        assert any(oid & MASK == SHARD for oid in acked)
        drop_hold(setup)
        assert_exactly_once(setup, moving.result, acked, doubtful, preloaded)
        # What the fence did, exactly (whether a writer met it before the flip is chance): it
        # refused only this shard's writes on a, and none on a was answered once it was up.
        refused = assert_fence_judged([a for w in writers for a in w.attempts.recorded],
                                      shard=SHARD, mask=MASK, source="a", target="b",
                                      move_id=moving.result, fence_up=fence_up)
        assert refused <= sum(w.refused for w in writers)  # each refusal refreshed the router
        _assert_fenced_on_a(setup, moving.result)


# -- 2. the target unreachable during the copy ---------------------------------------------------


def test_target_unreachable_during_the_copy_stops_clearly_then_resumes(
    clusters: Clusters, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_setup(clusters, prefix="ftgt") as setup:
        preloaded = setup.rows("a", SHARD)
        writers, stop, threads = run_writers(setup)
        blocker = hold_copy(setup)
        mover = setup.mover(progress_every_s=0.2)
        moving = MoveThread(mover)
        try:
            wait_copy_started(setup, moving)
            clusters.target.stop(immediate=True)  # ends the blocker's session too
            moving.join()
        finally:
            blocker.close()
            if clusters.target.pid is None:
                clusters.target.start()
        # The mover cannot see the copy's progress: it stops, naming the step and the server.
        assert isinstance(moving.error, MoveStoppedError), moving.error
        move_id = moving.error.move_id
        assert moving.error.step == "catch_up"
        target = clusters.target
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
        stop_writers(writers, stop, threads)
        acked = {oid: s for w in writers for oid, s in w.acked.items()}
        doubtful = set().union(*(w.doubtful for w in writers))
        drop_hold(setup)
        assert_exactly_once(setup, move_id, acked, doubtful, preloaded)


# -- 3. a router with a stale map after the flip ---------------------------------------------------


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String)
    total_cents: Mapped[int] = mapped_column(BigInteger)


def test_a_stale_router_writes_through_the_fence_and_reads_never_miss(
    clusters: Clusters,
) -> None:
    with make_setup(clusters, prefix="fstale") as setup:
        engines = {name: create_engine(setup.url(name)) for name in ("a", "b")}
        # Routers that will not look at the map again by themselves (no lease: the barrier
        # cannot wait for them, like a read-only process or a static worker ID).
        stale = ControlledShardRouter(setup.control, layout=LAYOUT, refresh_s=3600,
                                      background=False)
        reader = ControlledShardRouter(setup.control, layout=LAYOUT, refresh_s=3600,
                                       background=False)
        routing = ShardedRouting(reader, {"orders": ShardRule(id_fields=("id",))})
        sessions = sharded_sessionmaker(routing, engines)
        try:
            old_order = next(iter(setup.rows("a", SHARD)["orders"]))
            with sessions() as session:  # found on a before the move
                found = session.get(Order, old_order)
                assert found is not None and session.identity_key(instance=found)[2] == "a"
            move_id = setup.mover().move(SHARD, "b")
            assert stale.target_of_shard(SHARD) == "a" and reader.target_of_shard(SHARD) == "a"
            # A write through the stale router meets the fence the source keeps.
            oid = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(SHARD)
            tried: list[str] = []

            def work() -> None:
                target = stale.target_of_shard(SHARD)
                tried.append(target)
                with psycopg.connect(libpq(setup, target), autocommit=True) as conn:
                    conn.execute("INSERT INTO orders (id, customer_id, total_cents) "
                                 "VALUES (%s, 3, 3)", (oid,))

            retry_shard_moved(work, refresh=stale.refresh)
            assert tried == ["a", "b"]  # refused on a, landed on b after the refresh
            # Reads by ID through the stale reader: an order from before the move (its row on
            # a deleted by the cleanup) and the one just written on b.
            version = read_shard_map(setup.control).version
            with sessions() as session:
                found = session.get(Order, old_order)
                assert found is not None and session.identity_key(instance=found)[2] == "b"
                assert reader.version == version  # the miss refreshed it once
                assert session.get(Order, oid) is not None
            # A miss on a fresh map is a miss (one version read, no reload).
            with sessions() as session:
                assert session.get(Order, (123456 << 4) | SHARD) is None
            assert_exactly_once(setup, move_id, {oid: "new"})
        finally:
            stale.close()
            reader.close()
            for engine in engines.values():
                engine.dispose()


def test_a_router_that_saw_the_shard_moving_routes_it_by_the_map_of_each_call(
    clusters: Clusters,
) -> None:
    """Reads by customer find nothing to miss: a router that has seen the shard ``moving``
    checks the map at each call that routes it, so right after the flip it names the new
    target although its own refresh is an hour away."""
    with make_setup(clusters, prefix="fseen") as setup:
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

_FROZEN = textwrap.dedent("""
    import json, os, random, sys, time
    import psycopg
    import snowflake_db
    from snowflake_db.worker import TableWorkerAllocator
    from snowflake_db.sharding.moved import retry_shard_moved
    from snowflake_db.sharding.routing import ControlledShardRouter
    from tests.plugins.shard_moves import LAYOUT

    control, url_a, url_b, stop_file = sys.argv[1:5]
    urls = {"a": url_a, "b": url_b}
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
            with psycopg.connect(urls[target], autocommit=True, connect_timeout=5) as conn:
                conn.execute("INSERT INTO orders (id, customer_id, total_cents) "
                             "VALUES (%s, 7, 7)", (oid,))
            return target

        def refresh():
            refused.append(1)
            router.refresh()

        target = retry_shard_moved(work, refresh=refresh, attempts=20, timeout_s=30)
        print(json.dumps({"acked": oid, "on": target, "refused": len(refused),
                          "worker_id": generator.worker_id}), flush=True)
        time.sleep(0.01)
""")


def test_a_writer_frozen_across_the_whole_move(clusters: Clusters, tmp_path: Path) -> None:
    with make_setup(clusters, prefix="ffrozen") as setup:
        stop_file = tmp_path / "stop"
        process = subprocess.Popen(
            [sys.executable, "-c", _FROZEN, setup.control_url, libpq(setup, "a"),
             libpq(setup, "b"), str(stop_file)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[dict[str, Any]] = []
        reader = threading.Thread(
            target=lambda: [lines.append(json.loads(line)) for line in process.stdout or ()],
            daemon=True)
        reader.start()
        try:
            wait_until(lambda: sum("acked" in line for line in lines) >= 20, timeout_s=30,
                       what="the writer process writing")
            worker_id = lines[0]["worker_id"]
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
            wait_until(lambda: sum("acked" in line for line in lines[frozen_at:]) >= 20,
                       timeout_s=30, what="the writer writing again")
            stop_file.touch()
            process.wait(30)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(10)
        reader.join(10)
        assert process.returncode == 0, (process.stderr.read() if process.stderr else "")
        acked = {line["acked"]: "new" for line in lines if "acked" in line}
        # Written after the resume: IDs made after the freeze (a write acknowledged before the
        # SIGSTOP may be printed after the SIGCONT; the move carried it, checked below).
        after = [line for line in lines[frozen_at:] if "acked" in line
                 and LAYOUT.decode(line["acked"]).timestamp_ms > frozen_ms]
        assert all(line["on"] == "b" for line in after if line["acked"] & MASK == SHARD)
        assert any(line["acked"] & MASK == SHARD for line in after)
        assert_exactly_once(setup, move_id, acked)


# -- the static-worker rule ----------------------------------------------------------------------


def test_without_the_operators_word_the_source_rows_stay_until_resumed_with_it(
    clusters: Clusters, capsys: pytest.CaptureFixture[str]
) -> None:
    with make_setup(clusters, prefix="fstatic") as setup:
        preloaded = setup.rows("a", SHARD)
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
        assert_exactly_once(setup, move_id, {}, preloaded=preloaded)
