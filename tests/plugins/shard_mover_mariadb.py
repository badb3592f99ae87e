"""The control database, the shard map and writers routed by it over two throwaway MariaDB
servers: what tests/sharding/test_shard_mover_mariadb.py shares.

``make_setup`` makes a database pair (:mod:`tests.plugins.shard_moves_mariadb`: target ``a`` is
the source server, ``b`` the target server), a control database on one of the two servers with
the worker and map tables, and the map: every logical shard on ``a``, ``b`` registered, both
``mariadb``. ``MapWriter`` writes orders through a router that follows that map, every kind of
MariaDB write (INSERT, INSERT IGNORE, ON DUPLICATE KEY UPDATE, REPLACE, UPDATE, DELETE), each
retried by ``retry_shard_moved`` after a fence's refusal, and keeps what each acknowledged write
left; ``assert_exactly_once`` checks it against both servers and the final map.
``kill_mover_after`` runs ``ShardMover.move`` in a subprocess SIGKILLed right after a journal
line; ``hold_copy`` makes the copy's first INSERT on the target wait for a row lock.
"""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy import Engine, MetaData, create_engine, select

from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.sharding.moved import retry_shard_moved
from snowflake_db.sharding.moves import ShardMover, wait_until
from snowflake_db.sharding.routing import ControlledShardRouter
from snowflake_db.sharding.shard_map import (
    add_target,
    create_shard_map_tables,
    init_shard_map,
    read_shard_map,
    shard_map_tables,
)
from snowflake_db.worker import worker_tables

from .fence_events import Attempt, Attempts, FenceClock
from .shard_moves_mariadb import LAYOUT, MASK, TABLES, Pair, Servers, make_pair

ROOT = Path(__file__).resolve().parents[2]
#: The shard most writes go to, and most tests move.
SHARD = 5
TABLE_NAMES = ("orders", "order_items")

_controls = itertools.count(1)


@dataclass
class Setup:
    """A database pair (``a`` on the source server, ``b`` on the target server), the control
    database and the map: every shard on ``a``, ``b`` registered."""

    pair: Pair
    control_url: str
    control: Engine
    movers: list[ShardMover] = field(default_factory=list)

    def url(self, name: str) -> str:
        return self.pair.url("source" if name == "a" else "target")

    @property
    def targets(self) -> dict[str, str]:
        return {"a": self.url("a"), "b": self.url("b")}

    def connect(self, name: str, **options: Any) -> Any:
        return self.pair.connect("source" if name == "a" else "target", **options)

    def mover(self, **options: Any) -> ShardMover:
        options.setdefault("lease_s", 5.0)
        options.setdefault("barrier_timeout_s", 30.0)
        options.setdefault("copy_timeout_s", 60.0)
        options.setdefault("catch_up_timeout_s", 60.0)
        # The tests' writers hold no lease and route by the map on every call.
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
                 tables: tuple[str, ...] = TABLE_NAMES) -> list[str]:
        return [*self.cli("move", *args, only=only),
                *(a for table in tables for a in ("--table", table)), "--lease-seconds", "5",
                "--assume-no-static-workers"]

    def rows(self, name: str, shard: int) -> dict[str, dict[int, tuple[Any, ...]]]:
        which = "source" if name == "a" else "target"
        return {table: self.pair.rows(which, table, shard) for table in TABLE_NAMES}

    def all_rows(self, name: str) -> dict[str, dict[int, tuple[Any, ...]]]:
        which = "source" if name == "a" else "target"
        return {table: {row[0]: row for row in self.pair.query(which, f"SELECT * FROM {table}")}
                for table in TABLE_NAMES}

    def control_counts(self) -> tuple[int, int, int]:
        """Moves, journal lines, map version: what a refused command leaves as it was."""
        tables = shard_map_tables(MetaData())
        with self.control.connect() as connection:
            return (len(connection.execute(select(tables.moves.c.id)).all()),
                    len(connection.execute(select(tables.move_steps.c.seq)).all()),
                    read_shard_map(connection).version)


@contextmanager
def make_setup(servers: Servers, prefix: str = "mvr", control_on: str = "source"
               ) -> Iterator[Setup]:
    """A database pair, a control database on the ``control_on`` server (``source`` = the
    server of ``a``, ``target`` = of ``b``) with the worker and map tables, and the map."""
    with make_pair(servers, prefix=prefix) as pair:
        name = f"{pair.db}_ctl{next(_controls)}"
        home = pair.server(control_on)
        with home.connect() as connection, connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        url = home.url(name)
        control = create_engine(url)
        made = Setup(pair, url, control)
        try:
            create_shard_map_tables(control)
            worker_tables(MetaData()).slots.metadata.create_all(control)
            init_shard_map(control, layout=LAYOUT, assignment=["a"], backend="mariadb")
            add_target(control, "b", backend="mariadb")
            yield made
        finally:
            for mover in made.movers:
                mover.close()
            control.dispose()
            with suppress(pymysql.MySQLError), home.connect() as connection, \
                    connection.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {name}")


# -- writers routed by the map -------------------------------------------------------------------


@dataclass
class MapWriter:
    """Writes orders (most on :data:`SHARD`) through a map-following router, each write one
    autocommit statement on its own connection, retried by :func:`retry_shard_moved` after a
    fence's refusal: plain and ``IGNORE`` inserts of new orders, an ``INSERT IGNORE`` of an
    existing one (changes nothing), ``ON DUPLICATE KEY UPDATE`` and ``REPLACE`` of existing ones,
    updates and deletes. Each acknowledged write's affected-row count is checked (a row missing
    where the map routes shows there); a write whose connection failed is in doubt."""

    worker_id: int
    setup: Setup
    stop: threading.Event
    acked: dict[int, str] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    doubtful: set[int] = field(default_factory=set)
    kinds: dict[str, int] = field(default_factory=dict)
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
        roll = rng.random()
        status = f"w{self.worker_id}-{self.ops}"  # never the row's current status
        existing = rng.choice(list(self.acked)) if self.acked else None
        shard = SHARD if rng.random() < 0.6 else rng.randrange(MASK + 1)
        new_id = generator.next_id_in_shard(shard)
        values = "INTO orders (id, customer_id, total_cents, status) VALUES (%s, 7, 70, %s)"
        after: str | None  # the row's status once acknowledged (None: deleted)
        if existing is not None and roll < 0.15:
            oid, kind, after, rows = existing, "update", status, 1
            query, params = "UPDATE orders SET status = %s WHERE id = %s", (status, oid)
        elif existing is not None and roll < 0.25:
            oid, kind, after, rows = existing, "delete", None, 1
            query, params = "DELETE FROM orders WHERE id = %s", (oid,)
        elif existing is not None and roll < 0.32:
            oid, kind, after, rows = existing, "insert_ignore_dup", self.acked[existing], 0
            query, params = f"INSERT IGNORE {values}", (oid, status)
        elif roll < 0.4:
            oid, kind, after, rows = new_id, "insert_ignore", status, 1
            query, params = f"INSERT IGNORE {values}", (oid, status)
        elif existing is not None and roll < 0.5:
            oid, kind, after, rows = existing, "upsert", status, 2  # 2: an existing row changed
            query = f"INSERT {values} ON DUPLICATE KEY UPDATE status = VALUES(status)"
            params = (oid, status)
        elif existing is not None and roll < 0.56:
            oid, kind, after, rows = existing, "replace", status, 2  # deleted, inserted
            query, params = f"REPLACE {values}", (oid, status)
        else:
            oid, kind, after, rows = new_id, "insert", status, 1
            query, params = f"INSERT {values}", (oid, status)

        def work() -> int:
            target = router.target_of_shard(oid & MASK)

            def attempt() -> int:
                connection = self.setup.connect(target)
                try:
                    with connection.cursor() as cursor:
                        return int(cursor.execute(query, params))
                finally:
                    connection.close()

            return self.attempts.run(oid, target, attempt)

        def refresh() -> int:
            self.refused += 1
            return router.refresh()

        try:
            affected = retry_shard_moved(work, refresh=refresh, attempts=40, timeout_s=45)
        except pymysql.err.OperationalError:  # a server down: the write is in doubt
            self.failed += 1
            self.doubtful.add(oid)
            self.acked.pop(oid, None)
            time.sleep(0.05)
            return
        assert affected == rows, (kind, oid, affected)
        self.ops += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if after is None:
            del self.acked[oid]
            self.deleted.add(oid)
        else:
            self.acked[oid] = after


@dataclass
class Writers:
    """Running :class:`MapWriter` threads."""

    writers: list[MapWriter]
    stop_event: threading.Event
    threads: list[threading.Thread]

    @property
    def ops(self) -> int:
        return sum(w.ops for w in self.writers)

    @property
    def refused(self) -> int:
        return sum(w.refused for w in self.writers)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.writers)

    def stop(self, *, after: int = 20) -> None:
        """Once ``after`` more writes were acknowledged (bounded), stop and join them."""
        ops = self.ops
        try:
            wait_until(lambda: self.ops >= ops + after or not self.alive(), timeout_s=60,
                       what="writes after the move")
        finally:
            self.stop_event.set()
            for thread in self.threads:
                thread.join(60)
        assert not self.alive()
        assert [w.errors for w in self.writers] == [[] for _ in self.writers]

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def acked(self) -> dict[int, str]:
        return {oid: status for w in self.writers for oid, status in w.acked.items()}

    def deleted(self) -> set[int]:
        return set().union(*(w.deleted for w in self.writers))

    def doubtful(self) -> set[int]:
        return set().union(*(w.doubtful for w in self.writers))

    def attempts(self) -> list[Attempt]:
        """Every writer's attempts (read once the writers stopped)."""
        return [a for w in self.writers for a in w.attempts.recorded]


#: Writers started by the running test, for :func:`stop_leftover_writers` (a test that failed
#: before ``Writers.stop`` left them issuing IDs and writing in the pytest worker).
RUNNING: list[Writers] = []


def stop_leftover_writers() -> None:
    """Stop and join (bounded) the writers the test started; call it after every test."""
    while RUNNING:
        running = RUNNING.pop()
        running.stop_event.set()
        for thread in running.threads:
            thread.join(60)


def start_writers(setup: Setup, ids: tuple[int, ...] = (1, 2)) -> Writers:
    """Writer threads, running (each has acknowledged writes) when this returns."""
    stop = threading.Event()
    writers = [MapWriter(w, setup, stop) for w in ids]
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    running = Writers(writers, stop, threads)
    RUNNING.append(running)
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: all(w.ops >= 10 for w in writers) or not running.alive(),
                   timeout_s=60, what="writers running")
        assert [w.errors for w in writers] == [[] for _ in writers]
    except BaseException:
        stop.set()
        raise
    return running


def assert_exactly_once(setup: Setup, writers: Writers | None,
                        preloaded: dict[str, dict[int, tuple[Any, ...]]],
                        changed: dict[int, str | None] | None = None) -> None:
    """Against the final map: every acknowledged order once, as acknowledged, on the target
    the map names and not on the other; every acknowledged delete gone; an order in doubt at
    most once; every loaded row (orders and items) once on its target as loaded, but those of
    ``changed`` (an order's status, or ``None``: deleted); and each server holding only rows of
    the shards the map gives it (no copy left of a moved or an aborted shard)."""
    final = read_shard_map(setup.control).mapping
    on = {name: setup.all_rows(name) for name in ("a", "b")}
    changed = changed or {}

    def found(table: str, oid: int) -> list[str]:
        return [name for name in ("a", "b") if oid in on[name][table]]

    if writers is not None:
        for oid, status in writers.acked().items():
            assert found("orders", oid) == [final[oid & MASK]], (oid, found("orders", oid))
            assert on[final[oid & MASK]]["orders"][oid][2] == status, oid
        for oid in writers.deleted():
            assert found("orders", oid) == [], oid
        for oid in writers.doubtful():
            assert len(found("orders", oid)) <= 1, oid
    for table, rows in preloaded.items():
        for oid, row in rows.items():
            if table == "orders" and oid in changed:
                continue
            assert found(table, oid) == [final[oid & MASK]], (table, oid, found(table, oid))
            assert on[final[oid & MASK]][table][oid] == row, (table, oid)
    for oid, status in changed.items():
        if status is None:
            assert found("orders", oid) == [], oid
        else:
            assert found("orders", oid) == [final[oid & MASK]], (oid, found("orders", oid))
            assert on[final[oid & MASK]]["orders"][oid][2] == status, oid
    for name in ("a", "b"):
        for table in TABLE_NAMES:
            strays = sorted({oid & MASK for oid in on[name][table]} - {
                shard for shard, target in final.items() if target == name})
            assert strays == [], (name, table, strays)
    setup.pair.assert_no_capture_left()


# -- a mover killed after a journal line -----------------------------------------------------------

_KILLER = textwrap.dedent("""
    import os, signal, sys
    from snowflake_db import Layout
    from snowflake_db.sharding.moves import _journal, ShardMover

    LAYOUT, TABLES = Layout(sequence_bits=8, shard_bits=4), ["orders", "order_items"]

    kill_after, status = sys.argv[1], sys.argv[2]
    original = {"done": _journal.Journal.done, "started": _journal.Journal.started}

    def wrap(kind):
        def journaled(self, step, *args, **kwargs):
            original[kind](self, step, *args, **kwargs)
            if step == kill_after and kind == status:
                os.kill(os.getpid(), signal.SIGKILL)
        return journaled

    _journal.Journal.done = wrap("done")
    _journal.Journal.started = wrap("started")
    targets = dict(arg.split("=", 1) for arg in sys.argv[5:])
    mover = ShardMover(sys.argv[3], targets, layout=LAYOUT, tables=TABLES, lease_s=30,
                       assume_no_static_workers=True)
    mover.move(int(sys.argv[4]), "b")
    sys.exit(3)  # never reached: the mover was killed
""")


def kill_mover_after(setup: Setup, shard: int, step: str, status: str = "done") -> int:
    """Run ``move(shard, 'b')`` in a subprocess SIGKILLed right after the journal line
    ``step``/``status``; the move's id."""
    assert Layout(sequence_bits=8, shard_bits=4) == LAYOUT  # the subprocess's
    args = [sys.executable, "-c", _KILLER, step, status, setup.control_url, str(shard),
            *(f"{name}={url}" for name, url in setup.targets.items())]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    record = setup.mover().moves(limit=1)[0]
    assert record.shard == shard and record.state not in ("done", "aborted")
    return record.id


# -- holding the copy -----------------------------------------------------------------------------


def hold_copy(setup: Setup) -> Any:
    """A transaction on ``b`` that holds a lock on the end of the empty ``orders`` table (a
    locking read of all of it): every insert into it waits, the copy's first one included,
    for up to ``innodb_lock_wait_timeout`` (50 s); the mover's checks read past it."""
    connection = setup.connect("b", autocommit=False)
    with connection.cursor() as cursor:
        assert cursor.execute("SELECT id FROM orders FOR UPDATE") == 0
    return connection


def copy_waiting(setup: Setup) -> bool:
    """Whether an insert into ``b``'s orders waits for a lock (the held copy). Polled at
    0.2 s at most: InnoDB refreshes its transaction views only 0.1 s after the last read."""
    return bool(setup.pair.query(
        "target", "SELECT 1 FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' "
                  "AND trx_query LIKE '%%INSERT INTO%%orders%%'"))


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

    def join(self, timeout: float = 180) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), self.events[-5:]


def wait_copy_held(setup: Setup, moving: MoveThread) -> None:
    def held() -> bool:
        assert moving.error is None, (moving.error, moving.events)
        return copy_waiting(setup)
    wait_until(held, timeout_s=60, what="the copy's insert waiting on b", poll_s=0.2)
