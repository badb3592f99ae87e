"""What the shard-move tests share whatever the backend: the layout and tables, a control
database with the shard map over a database pair, writers that route every write by that map
while a move runs, a writer process frozen across a move, a mover SIGKILLed after a journal
line, and the checks that every acknowledged write ended exactly once where the map says.

The backend's own parts live beside it: :mod:`tests.plugins.shard_moves_postgres` (clusters
with logical replication: publications, slots, subscriptions) and
:mod:`tests.plugins.shard_moves_mariadb` (servers with capture triggers, changelogs and
``GET_LOCK``). Each offers a :class:`Kind` (``KIND``): how to start its pair of throwaway
servers, make a database pair on them, write one statement, hold the copy and bring a server
down. :func:`kind` finds one by backend name (``postgresql``, ``mariadb``).

Throwaway servers are shared by the tests of one pytest process (``move_servers``, a fixture
of this plugin): every test makes its own databases on them, and a test that stops or kills a
server starts it again before it ends.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
from sqlalchemy import Engine, MetaData, create_engine, select

from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.errors import ShardMovedError, ShardMoveError
from snowflake_db.sharding.moved import retry_shard_moved, shard_moved_error
from snowflake_db.sharding.moves import Leftovers, MovedTable, ShardMover, wait_until
from snowflake_db.sharding.routing import ControlledShardRouter, RoutedShards
from snowflake_db.sharding.shard_map import (
    add_target,
    create_shard_map_tables,
    init_shard_map,
    read_shard_map,
    shard_map_tables,
)
from snowflake_db.worker import worker_tables

from .fence_events import Attempt, Attempts, FenceClock, assert_fence_judged

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = Layout(sequence_bits=8, shard_bits=4)
MASK = LAYOUT.max_shard
TABLES = [MovedTable("orders"), MovedTable("order_items")]
TABLE_NAMES = ("orders", "order_items")
STEP_TIMEOUT_S = 60.0
#: A writer's bound on a connect (a server down refuses at once; a loaded one may take
#: seconds: 3 s expired once beside four other suites).
CONNECT_TIMEOUT_S = 10
#: The shard most writes go to, and most tests move.
SHARD = 5
BACKENDS = ("postgresql", "mariadb")
#: What a backend that ran up to each step leaves: its capture (PostgreSQL: publication and
#: slot; MariaDB: triggers and changelog), the copy (subscription; progress table), the fence.
LEFT_AFTER: dict[str, tuple[bool, bool, bool]] = {
    "check": (False, False, False),
    "capture": (True, False, False),
    "copy": (True, True, False),
    "synced": (True, True, False),
    "caught_up": (True, True, False),
    "pre_verify": (True, True, False),
    "fence": (True, True, True),
    "drained": (True, True, True),
    "verify": (True, True, True),
}


# -- what each backend offers ------------------------------------------------------------------


@dataclass
class BasePair:
    """One database on each server (``source``, ``target``) with the same sharded tables, rows
    only on the source: what both backends' pairs share."""

    servers: Any
    db: str
    move_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def server(self, which: str) -> Any:
        return self.servers.source if which == "source" else self.servers.target

    def query(self, which: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def rows(self, which: str, table: str, shard: int) -> dict[int, tuple[Any, ...]]:
        return {row[0]: row for row in self.query(
            which, f"SELECT * FROM {table} WHERE (id & {MASK}) = %s", (shard,))}

    def count(self, which: str, query: str) -> int:
        return int(self.query(which, query)[0][0])

    def move_options(self, shard: int, move_id: int | None, target_name: str
                     ) -> dict[str, Any]:
        """A backend's options but its endpoints: the next move ID unless given."""
        return {"layout": LAYOUT, "shard": shard, "tables": TABLES, "target_name": target_name,
                "move_id": next(self.move_ids) if move_id is None else move_id}


@contextmanager
def server_pair(source: Any, make_target: Callable[[], Any], start: Callable[[Any, Any], None]
                ) -> Iterator[tuple[Any, Any]]:
    """``source`` and the target ``make_target`` makes, started by ``start``; both closed
    (stopped by PID) at the end."""
    target: Any = None
    try:
        target = make_target()
        start(source, target)
        assert not {source.port, target.port} & {5432, 3306}  # never the shared servers
        yield source, target
    finally:
        source.close()
        if target is not None:
            target.close()


class Hold(Protocol):
    """The copy's first write into ``orders`` on the target, held until :meth:`release`."""

    def wait(self, moving: MoveThread) -> None: ...
    def release(self) -> None: ...
    def drop(self) -> None: ...


class Kind(Protocol):
    """A backend's part of the move tests."""

    name: str
    #: The fence's objects one move leaves on its source (triggers, and the fence table).
    fence_objects: int
    #: The writer's kinds of write on this backend (:func:`choose_write`).
    write_kinds: frozenset[str]
    #: What a write raises when its server is down or its connection is lost: in doubt.
    down_errors: tuple[type[BaseException], ...]

    def start_servers(self, *, both_logical: bool = True) -> AbstractContextManager[Any]: ...
    def make_pair(self, servers: Any, prefix: str) -> AbstractContextManager[Any]: ...
    def open(self, url: str) -> Any: ...
    def write(self, url: str, query: str, params: tuple[Any, ...]) -> int: ...
    def run(self, connection: Any, query: str, params: tuple[Any, ...]) -> int: ...
    def hold_copy(self, setup: Setup) -> Hold: ...
    def bring_down(self, server: Any, how: str) -> None: ...
    def is_down(self, server: Any) -> bool: ...
    def drop_database(self, server: Any, name: str) -> None: ...
    def run_steps(self, backend: Any, *, stop_after: str | None = None) -> dict[str, Any]: ...
    def assert_left_after(self, pair: Any, left: Any, step: str, move_id: int, *,
                          captured: bool, copying: bool, fenced: bool) -> None: ...
    def assert_not_fenced(self, pair: Any, backend: Any) -> None: ...


def kind(name: str) -> Kind:
    """The backend's :class:`Kind` by its name (``postgresql``, ``mariadb``)."""
    if name == "postgresql":
        from . import shard_moves_postgres as module
    elif name == "mariadb":
        from . import shard_moves_mariadb as module  # type: ignore[no-redef]
    else:
        raise ValueError(f"no move tests for backend {name!r}")
    return module.KIND


def backend_params(group: str, backends: tuple[str, ...] = BACKENDS) -> list[Any]:
    """``move_backend`` parameters, each in the pytest-xdist group ``{group}_{backend}``: a
    module's tests of one backend run in one process, on that process's servers."""
    return [pytest.param(name, marks=pytest.mark.xdist_group(f"{group}_{name}"))
            for name in backends]


def on_every_backend(group: str) -> pytest.MarkDecorator:
    """A test of a claim every backend shares: once per backend (:func:`backend_params`)."""
    return pytest.mark.parametrize("move_backend", backend_params(group))


class MoveServers:
    """Throwaway server pairs started on first use and kept for the pytest process (stopped by
    PID at its end), by backend and configuration."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._started: dict[tuple[str, bool], Any] = {}

    def get(self, backend: str, *, both_logical: bool = True) -> Any:
        key = (backend, both_logical or backend != "postgresql")  # MariaDB's are one kind
        if key not in self._started:
            self._started[key] = self._stack.enter_context(
                kind(backend).start_servers(both_logical=both_logical))
        return self._started[key]

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="session")
def move_servers() -> Iterator[MoveServers]:
    started = MoveServers()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def move_backend(request: pytest.FixtureRequest) -> str:
    """The backend of a move test: its ``move_backend`` parameter (:func:`backend_params`),
    else its module's ``BACKEND``."""
    return str(request.module.BACKEND)


@pytest.fixture
def move_kind(move_backend: str) -> Kind:
    return kind(move_backend)


@pytest.fixture
def servers(request: pytest.FixtureRequest, move_backend: str, move_servers: MoveServers
            ) -> Any:
    """This process's pair of throwaway servers of the test's backend; PostgreSQL's with
    ``wal_level = logical`` on both, or on the source only where the module says
    ``BOTH_LOGICAL = False``."""
    return move_servers.get(move_backend,
                            both_logical=getattr(request.module, "BOTH_LOGICAL", True))


@pytest.fixture
def pair(move_kind: Kind, servers: Any) -> Iterator[Any]:
    """A database pair of the test's own on ``servers``."""
    with move_kind.make_pair(servers, "moves") as made:
        yield made


@pytest.fixture
def setup(move_backend: str, servers: Any) -> Iterator[Setup]:
    """A database pair, a control database and the map (:func:`make_setup`) on ``servers``."""
    with make_setup(move_backend, servers) as made:
        yield made


# -- a control database and the map ------------------------------------------------------------

_controls = itertools.count(1)


@dataclass
class Setup:
    """A database pair (``a`` = the source server, ``b`` = the target server), the control
    database and the map: every shard on ``a``, ``b`` registered, both of the pair's backend."""

    kind: Kind
    pair: Any
    control_url: str
    control: Engine
    movers: list[ShardMover] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.kind.name

    def url(self, name: str) -> str:
        return str(self.pair.url("source" if name == "a" else "target"))

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
        # The tests' writers hold leases or route by the map on every call.
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
def make_setup(backend: str, servers: Any, prefix: str = "mover", control_on: str = "source"
               ) -> Iterator[Setup]:
    """A database pair, a control database on the ``control_on`` server (``source`` = the
    server of ``a``, ``target`` = of ``b``) with the worker and map tables, and the map."""
    moves = kind(backend)
    with moves.make_pair(servers, prefix) as pair:
        name = f"{pair.db}_ctl{next(_controls)}"
        home = pair.server(control_on)
        home.create_database(name)
        url = home.url(name)
        control = create_engine(url)
        made = Setup(moves, pair, url, control)
        try:
            create_shard_map_tables(control)
            worker_tables(MetaData()).slots.metadata.create_all(control)
            init_shard_map(control, layout=LAYOUT, assignment=["a"], backend=backend)
            add_target(control, "b", backend=backend)
            yield made
        finally:
            for mover in made.movers:
                mover.close()
            control.dispose()
            moves.drop_database(home, name)


# -- writers on the source ---------------------------------------------------------------------


@dataclass
class Op:
    start: float
    end: float
    shard: int
    kind: str
    ok: bool


@dataclass
class SourceWriter:
    """Autocommit writes on every shard of the source, on one connection, own rows only, so
    that what each acknowledged write left behind is known exactly: every kind of write the
    backend has (:func:`choose_write`); a write the fence refused is recorded as not ``ok``."""

    worker_id: int
    kind: Kind
    pair: Any
    stop: threading.Event
    ops: list[Op] = field(default_factory=list)
    alive: dict[int, str] = field(default_factory=dict)  # acknowledged rows -> status
    deleted: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        generator = SnowflakeGenerator(self.worker_id, layout=LAYOUT)
        rng = random.Random(self.worker_id)
        try:
            connection = self.pair.connect("source")
            try:
                while not self.stop.is_set() and len(self.ops) < 50_000:
                    self._one(connection, generator, rng)
                    time.sleep(0.001)
            finally:
                connection.close()
        except Exception as error:  # reported by the test, never swallowed
            self.errors.append(repr(error))

    def _one(self, connection: Any, generator: SnowflakeGenerator, rng: random.Random) -> None:
        status = f"s{rng.randrange(10_000)}"
        oid, kind_, after, _rows, query, params = choose_write(
            self.kind.write_kinds, rng, self.alive,
            generator.next_id_in_shard(rng.randrange(MASK + 1)), status)
        start = time.monotonic()
        try:
            self.kind.run(connection, query, params)  # autocommit: acknowledged when it returns
            ok = True
        except Exception as error:
            if shard_moved_error(error) is None:
                raise
            ok = False
        self.ops.append(Op(start, time.monotonic(), oid & MASK, kind_, ok))
        if not ok:
            return
        if after is None:
            del self.alive[oid]
            self.deleted.add(oid)
        else:
            self.alive[oid] = after


def start_source_writers(kind_: Kind, pair: Any, count: int = 3
                         ) -> tuple[list[SourceWriter], Callable[[], None]]:
    """``count`` writer threads on the source; returns them and a stop (joins, bounded)."""
    stop = threading.Event()
    writers = [SourceWriter(worker, kind_, pair, stop) for worker in range(1, count + 1)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    for thread in threads:
        thread.start()

    def stopped() -> None:
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
    return writers, stopped


class StepClock:
    """When each step of a driver ran, as its ``on_step``: ``steps[name] = (start, end)``;
    ``then(name)`` runs after a step is timed, before the next one starts."""

    def __init__(self, then: Callable[[str], None] = lambda name: None) -> None:
        self.steps: dict[str, tuple[float, float]] = {}
        self._then = then
        self._last = time.monotonic()

    def start(self) -> None:
        self._last = time.monotonic()

    def __call__(self, name: str, _result: object) -> None:
        self.steps[name] = (self._last, time.monotonic())
        self._then(name)
        self._last = time.monotonic()


def wait_refused_and_passing(writers: list[SourceWriter], shard: int, since: float) -> None:
    """Until the fence refused writes of ``shard`` and writes of the other shards passed
    after ``since``."""
    wait_until(lambda: sum(not op.ok for w in writers for op in w.ops) >= 3
               and sum(op.ok and op.shard != shard and op.start > since
                       for w in writers for op in w.ops) >= 10,
               timeout_s=30, what="refused and passing writes after the fence")


# -- writers routed by the map -----------------------------------------------------------------


def choose_write(kinds: frozenset[str], rng: random.Random, acked: dict[int, str],
                 new_id: int, status: str
                 ) -> tuple[int, str, str | None, int, str, tuple[Any, ...]]:
    """One write of the kinds given: (order, kind, its status once acknowledged (``None``:
    deleted), the rows it affects, the statement, its parameters). Updates, deletes, a
    duplicate ``INSERT IGNORE`` (changes nothing), ``ON DUPLICATE KEY UPDATE`` and ``REPLACE``
    take an acknowledged order; inserts and ``INSERT IGNORE`` a new one."""
    roll = rng.random()
    existing = rng.choice(list(acked)) if acked else None
    values = "INTO orders (id, customer_id, total_cents, status) VALUES (%s, 7, 70, %s)"
    if existing is not None and roll < 0.15:
        return (existing, "update", status, 1, "UPDATE orders SET status = %s WHERE id = %s",
                (status, existing))
    if existing is not None and roll < 0.25:
        return existing, "delete", None, 1, "DELETE FROM orders WHERE id = %s", (existing,)
    if "insert_ignore" in kinds:
        if existing is not None and roll < 0.32:
            return (existing, "insert_ignore_dup", acked[existing], 0, f"INSERT IGNORE {values}",
                    (existing, status))
        if roll < 0.4:
            return new_id, "insert_ignore", status, 1, f"INSERT IGNORE {values}", (new_id, status)
    if "upsert" in kinds and existing is not None and roll < 0.5:  # 2: an existing row changed
        return (existing, "upsert", status, 2,
                f"INSERT {values} ON DUPLICATE KEY UPDATE status = VALUES(status)",
                (existing, status))
    if "replace" in kinds and existing is not None and roll < 0.56:  # deleted, inserted
        return existing, "replace", status, 2, f"REPLACE {values}", (existing, status)
    return new_id, "insert", status, 1, f"INSERT {values}", (new_id, status)


def confirmed_write(moves: Kind, connection: Any, routes: RoutedShards, query: str,
                    params: tuple[Any, ...]) -> int:
    """One autocommit statement; when it changed no row, its route is confirmed after it: a
    statement routed before a flip and run after the move deleted the source's rows matches
    nothing there (no fence can refuse it), and a statement that changed nothing can run
    again on the new target. (In a transaction, held open across the confirmation, the
    writers kept the tables' locks from the move's DDL under load: the cleanup's lock was not
    granted in 50 tries beside a second suite.)"""
    affected = moves.run(connection, query, params)
    if affected == 0:
        routes.confirm()
    return affected


@dataclass
class MapWriter:
    """Writes orders (most on :data:`SHARD`) through a map-following router, each write one
    autocommit statement on the writer's connection to its target (:meth:`Kind.open`, kept
    as a pool keeps it, opened again after a failure), its route confirmed when it changed no
    row (:func:`confirmed_write`), retried by :func:`retry_shard_moved` after a fence's or the
    confirmation's refusal; every kind of write the backend has
    (:func:`choose_write`). Each acknowledged write's affected-row count is checked (a row
    missing where the map routes shows there); a write whose connection failed is in doubt."""

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
    #: Every try of every write, with its outcome (:mod:`tests.plugins.fence_events`).
    attempts: Attempts = field(default_factory=Attempts)
    _connections: dict[str, Any] = field(default_factory=dict)

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
            self._close()

    def _connection(self, target: str) -> Any:
        """This writer's connection to ``target``, opened on first use (as a pool's)."""
        if target not in self._connections:
            self._connections[target] = self.setup.kind.open(self.setup.url(target))
        return self._connections[target]

    def _close(self) -> None:
        for connection in self._connections.values():
            with suppress(Exception):  # a server down: nothing to close
                connection.close()
        self._connections.clear()

    def _one(self, router: ControlledShardRouter, generator: SnowflakeGenerator,
             rng: random.Random) -> None:
        moves = self.setup.kind
        status = f"w{self.worker_id}-{self.ops}"  # never the row's current status
        shard = SHARD if rng.random() < 0.6 else rng.randrange(MASK + 1)
        oid, kind_, after, rows, query, params = choose_write(
            moves.write_kinds, rng, self.acked, generator.next_id_in_shard(shard), status)

        def work() -> int:
            with router.recording_routes() as routes:
                target = router.target_of_shard(oid & MASK)
                return self.attempts.run(
                    oid, target, lambda: confirmed_write(moves, self._connection(target), routes,
                                                         query, params))

        def refresh() -> int:
            self.refused += 1
            return router.refresh()

        try:
            affected = retry_shard_moved(work, refresh=refresh, attempts=40, timeout_s=45)
        except moves.down_errors:  # a server down: the write is in doubt
            self._close()  # reconnect at the next write
            self.failed += 1
            self.doubtful.add(oid)
            self.acked.pop(oid, None)
            time.sleep(0.05)
            return
        assert affected == rows, (kind_, oid, affected, [  # each try: where, when, answered
            (a.target, round(a.began, 3), round(a.ended, 3), a.answered, a.refused_by)
            for a in self.attempts.recorded if a.oid == oid], router.version)
        self.ops += 1
        self.kinds[kind_] = self.kinds.get(kind_, 0) + 1
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

    def kinds(self) -> set[str]:
        return {kind_ for w in self.writers for kind_ in w.kinds}

    def acked(self) -> dict[int, str]:
        return {oid: status for w in self.writers for oid, status in w.acked.items()}

    def deleted(self) -> set[int]:
        return set().union(*(w.deleted for w in self.writers))

    def doubtful(self) -> set[int]:
        return set().union(*(w.doubtful for w in self.writers))

    def attempts(self) -> list[Attempt]:
        """Every writer's attempts (read once the writers stopped)."""
        return [a for w in self.writers for a in w.attempts.recorded]


#: Writers started by the running test, stopped after it whatever happened (a test that failed
#: before :meth:`Writers.stop` left them issuing IDs and writing in the pytest worker).
_running: list[Writers] = []


@pytest.fixture(autouse=True)
def _writers_stopped() -> Iterator[None]:
    """After every test: stop and join (bounded) the writers it started and left running."""
    yield
    while _running:
        running = _running.pop()
        running.stop_event.set()
        for thread in running.threads:
            thread.join(60)


def start_writers(setup: Setup, ids: tuple[int, ...] = (1, 2)) -> Writers:
    """Writer threads, running (each has acknowledged writes) when this returns."""
    stop = threading.Event()
    writers = [MapWriter(w, setup, stop) for w in ids]
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    running = Writers(writers, stop, threads)
    _running.append(running)
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


# -- what a move must leave --------------------------------------------------------------------


def assert_exactly_once(setup: Setup, writers: Writers | None,
                        preloaded: dict[str, dict[int, tuple[Any, ...]]],
                        changed: dict[int, str | None] | None = None) -> None:
    """Against the final map: every acknowledged order once, as acknowledged, on the target
    the map names and not on the other; every acknowledged delete gone; an order in doubt at
    most once; every loaded row (orders and items) once on its target as loaded, but those of
    ``changed`` (an order's status, or ``None``: deleted); no order nobody wrote; each server
    holding only rows of the shards the map gives it (no copy left of a moved or an aborted
    shard); nothing of any move's capture left."""
    final = read_shard_map(setup.control).mapping
    on = {name: setup.all_rows(name) for name in ("a", "b")}
    changed = changed or {}

    def found(table: str, oid: int) -> list[str]:
        return [name for name in ("a", "b") if oid in on[name][table]]

    known = set(preloaded["orders"]) | set(changed)
    if writers is not None:
        known |= set(writers.acked()) | writers.doubtful()
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
        assert sorted(set(on[name]["orders"]) - known) == [], name  # no order nobody wrote
        assert sorted(set(on[name]["order_items"]) - set(preloaded["order_items"])) == [], name
        for table in TABLE_NAMES:
            strays = sorted({oid & MASK for oid in on[name][table]} - {
                shard for shard, target in final.items() if target == name})
            assert strays == [], (name, table, strays)
    setup.pair.assert_no_capture_left()


def assert_fence_left(setup: Setup, move_id: int) -> None:
    """The move is done, its mover gone, and only its fence stays on the old source."""
    mover = setup.mover()
    record = mover.status(move_id).move
    assert record.state == "done" and record.mover_token is None
    left = mover.leftovers(move_id)
    assert left.replication_empty and len(left.fence_triggers) == setup.kind.fence_objects


def assert_fenced_on_a(setup: Setup, shard: int, move_id: int) -> None:
    """The move's fence is up on a (once the mover committed it, until a cleanup of a later
    move): a write of ``shard`` there is refused with the fence's error naming the shard, the
    new target b and the move."""
    oid = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(shard)
    with pytest.raises(Exception) as refused:  # the fence's error, whatever the driver
        setup.kind.write(setup.url("a"), "INSERT INTO orders (id, customer_id, total_cents, "
                                         "status) VALUES (%s, 4, 4, 'fenced')", (oid,))
    moved = shard_moved_error(refused.value)
    assert isinstance(moved, ShardMovedError), refused.value
    assert (moved.shard, moved.target, moved.move_id) == (shard, "b", move_id)


def assert_fence_did(setup: Setup, writers: Writers, move_id: int, fence_up: float) -> None:
    """What the fence of ``move_id`` (shard :data:`SHARD`, a -> b) did to the stopped
    ``writers``, exactly: whether a writer met it before the flip is chance (the router follows
    the map within 0.1 s), so "at least one refusal" is no claim. Every refusal was a write of
    the shard on a, by this move's fence; no write of the shard that began after ``fence_up``
    (when the mover reported it up, or a moment by which it surely was) was answered by a; each
    refusal refreshed the router (the retry polls it, so refreshes may outnumber them); and a
    write there now is still refused naming the move."""
    refused = assert_fence_judged(writers.attempts(), shard=SHARD, mask=MASK, source="a",
                                  target="b", move_id=move_id, fence_up=fence_up)
    assert refused <= writers.refused, (refused, writers.refused)
    assert_fenced_on_a(setup, SHARD, move_id)


# -- a mover killed after a journal line -------------------------------------------------------

_KILLER = """
import sys
from tests.plugins.shard_moves import killed_mover_main
killed_mover_main(sys.argv[1:])
"""


def killed_mover_main(argv: list[str]) -> None:
    """In a subprocess: ``move(shard, 'b')`` SIGKILLed right after the journal line
    ``step``/``status`` (argv: step, status, control URL, shard, NAME=URL...)."""
    from snowflake_db.sharding.moves import _journal

    kill_after, status, control, shard, *targets = argv
    original = {"done": _journal.Journal.done, "started": _journal.Journal.started}

    def wrap(kind_: str) -> Callable[..., None]:
        def journaled(self: Any, step: str, *args: Any, **kwargs: Any) -> None:
            original[kind_](self, step, *args, **kwargs)
            if step == kill_after and kind_ == status:
                os.kill(os.getpid(), signal.SIGKILL)
        return journaled

    _journal.Journal.done = wrap("done")  # type: ignore[method-assign]
    _journal.Journal.started = wrap("started")  # type: ignore[method-assign]
    mover = ShardMover(control, dict(arg.split("=", 1) for arg in targets), layout=LAYOUT,
                       tables=TABLES, lease_s=30, assume_no_static_workers=True)
    mover.move(int(shard), "b")
    sys.exit(3)  # never reached: the mover was killed


def kill_mover_after(setup: Setup, shard: int, step: str, status: str = "done") -> int:
    """Run ``move(shard, 'b')`` in a subprocess SIGKILLed right after the journal line
    ``step``/``status``; the move's id."""
    args = [sys.executable, "-c", _KILLER, step, status, setup.control_url, str(shard),
            *(f"{name}={url}" for name, url in setup.targets.items())]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    record = setup.mover().moves(limit=1)[0]
    assert record.shard == shard and record.state not in ("done", "aborted")
    return record.id


# -- a writer process frozen across a move -----------------------------------------------------

_FROZEN = """
import sys
from tests.plugins.shard_moves import frozen_writer_main
frozen_writer_main(sys.argv[1:])
"""


def open_across_a_freeze(moves: Kind, url: str, *, attempts: int = 3) -> Any:
    """``moves.open(url)``, connecting again after a failed connect (bounded): a SIGSTOP that
    lands while the driver connects keeps the process stopped past the driver's wall-clock
    connect deadline, so the connect fails the moment it runs again. Nothing was sent on it:
    connecting again is what a real writer's pool does, and cannot write anything twice."""
    for attempt in range(1, attempts):
        try:
            return moves.open(url)
        except Exception as error:
            print(json.dumps({"reconnect": repr(error), "attempt": attempt}), flush=True)
    return moves.open(url)


def frozen_writer_main(argv: list[str]) -> None:
    """In a subprocess: a leased writer that routes inserts (most on :data:`SHARD`) by the
    map, retried after a fence's refusal, and prints a JSON line per acknowledged write until
    ``stop_file`` exists (argv: backend, control URL, URL of a, URL of b, stop file)."""
    import snowflake_db
    from snowflake_db.worker import TableWorkerAllocator

    backend, control, url_a, url_b, stop_file = argv
    moves = kind(backend)
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
        shard = SHARD if rng.random() < 0.6 else rng.randrange(MASK + 1)
        try:
            oid = generator.next_id_in_shard(shard)
        except Exception as error:  # the lease lapsed while frozen: fenced
            print(json.dumps({"fenced": repr(error)}), flush=True)
            time.sleep(0.05)
            continue
        refused: list[int] = []

        def work(oid: int = oid) -> str:
            # Autocommit inserts (the fence refuses them on the old target, no confirmation
            # needed): a freeze inside a transaction would hold it open on the source, and a
            # move's capture waits for every open write transaction there (its step says so).
            target = router.target_of_shard(oid & MASK)
            connection = open_across_a_freeze(moves, urls[target])
            try:
                moves.run(connection, "INSERT INTO orders (id, customer_id, total_cents) "
                                      "VALUES (%s, 7, 7)", (oid,))
            finally:
                connection.close()
            return target

        def refresh(refused: list[int] = refused) -> int:
            refused.append(1)
            return router.refresh()

        # A bound well past the freeze: an attempt sent before the SIGSTOP is answered (the
        # fence's refusal) after the SIGCONT, its time counts the whole freeze (43 s once
        # beside a second suite), and a 30 s bound gave up at the first refusal.
        target = retry_shard_moved(work, refresh=refresh, attempts=20, timeout_s=600)
        print(json.dumps({"acked": oid, "on": target, "refused": len(refused),
                          "worker_id": generator.worker_id}), flush=True)
        time.sleep(0.01)


class FrozenWriter:
    """:func:`frozen_writer_main` in a process; its JSON lines as they come."""

    def __init__(self, setup: Setup, stop_file: Path) -> None:
        self.stop_file = stop_file
        self.process = subprocess.Popen(
            [sys.executable, "-c", _FROZEN, setup.backend, setup.control_url, setup.url("a"),
             setup.url("b"), str(stop_file)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or ():
            self.lines.append(json.loads(line))

    def acked_since(self, start: int = 0) -> int:
        return sum("acked" in line for line in self.lines[start:])

    def stop(self) -> None:
        self.stop_file.touch()
        self.process.wait(30)

    def end(self) -> None:
        """Whatever happened: never left stopped or running."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self.reader.join(10)


# -- a move in a thread ------------------------------------------------------------------------


class InThread:
    """``call()`` in a thread: its result, or its error."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.result = call()
        except BaseException as error:  # read by the test
            self.error = error

    def join(self, timeout: float = 180) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), self.describe()

    def describe(self) -> object:
        return self.error


class MoveThread(InThread):
    """``mover.move`` in a thread: its id or its error, its progress events, and when the
    fence was reported up (:class:`~tests.plugins.fence_events.FenceClock`)."""

    def __init__(self, mover: ShardMover, shard: int = SHARD, to: str = "b") -> None:
        self.clock = FenceClock()
        self.events = self.clock.events
        super().__init__(lambda: mover.move(shard, to, progress=self.clock))

    def describe(self) -> object:
        return self.events[-5:]


def assert_moved(setup: Setup, shard: int, before: dict[str, dict[int, tuple[Any, ...]]],
                 move_id: int, to: str = "b") -> None:
    """The shard's rows are on ``to`` exactly as they were, gone from the other side; the map
    serves it from ``to``; the move is done and only its fence is left."""
    other = "a" if to == "b" else "b"
    assert setup.rows(to, shard) == before
    assert setup.rows(other, shard) == {"orders": {}, "order_items": {}}
    assert setup.map_of(shard) == (to, "serving")
    assert_fence_left(setup, move_id)
    setup.pair.assert_no_capture_left()


# -- manage.py snowflake shards --------------------------------------------------------------

_MANAGE = """
import sys
from tests.plugins.shard_moves import manage_shards_main
manage_shards_main(sys.argv[1:])
"""


def manage_shards_main(argv: list[str]) -> None:
    """In a subprocess: ``manage.py snowflake shards ARGS`` in a Django project whose
    ``DATABASES`` are the aliases given (argv: a JSON object of alias -> SQLAlchemy URL, then
    ARGS); ``default`` is the control database, the others the router's targets."""
    import pymysql

    pymysql.install_as_MySQLdb()  # Django's MySQL backend imports MySQLdb
    import django
    from django.conf import settings
    from django.core.management import execute_from_command_line
    from sqlalchemy.engine import make_url

    def database(text: str) -> dict[str, str]:
        url = make_url(text)
        engine = ("django.db.backends.postgresql" if url.get_backend_name() == "postgresql"
                  else "django.db.backends.mysql")
        return {"ENGINE": engine, "NAME": url.database or "", "USER": url.username or "",
                "HOST": url.host or "", "PORT": str(url.port)}

    aliases: dict[str, str] = json.loads(argv[0])
    settings.configure(
        INSTALLED_APPS=["snowflake_db.django"],
        DATABASES={alias: database(url) for alias, url in aliases.items()},
        SNOWFLAKE_DB={"WORKER_SOURCE": "manual", "LAYOUT": {"sequence_bits": 8,
                                                            "shard_bits": 4}},
        SNOWFLAKE_SHARD_ROUTER={"TARGETS": [alias for alias in aliases if alias != "default"]},
    )
    django.setup()
    execute_from_command_line(["manage.py", "snowflake", "shards", *argv[1:]])


def manage_shards(databases: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py snowflake shards ARGS`` in a subprocess (:func:`manage_shards_main`)."""
    return subprocess.run([sys.executable, "-c", _MANAGE, json.dumps(databases), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)


# -- the steps' shared checks ----------------------------------------------------------------------


def refused_check(pair: Any, prepare: Callable[[Any], Callable[[], None]],
                  options: dict[str, Any]) -> tuple[Any, str]:
    """The backend of ``options`` refused by its check once ``prepare`` made the case (undone
    whatever happens): the backend, and the refusal's message."""
    undo = prepare(pair)
    try:
        backend = pair.backend(**options)
        with pytest.raises(ShardMoveError) as refused:
            backend.check()
    finally:
        undo()
    return backend, str(refused.value)


def assert_aborted_after_the_fence(pair: Any, backend: Any, shard: int, fence_objects: int,
                                   after_unfence: Callable[[], None] = lambda: None) -> None:
    """A fenced move's abort: the source's rows stay while the capture exists (no deletion
    before the cleanup); unfence (``after_unfence`` then), cleanup and the deletion of the
    target's rows leave nothing."""
    with pytest.raises(ShardMoveError, match="run cleanup first"):
        backend.delete_source_rows()
    assert len(backend.unfence()) == fence_objects
    after_unfence()
    assert backend.cleanup().source_pending is False
    assert backend.delete_target_rows() == len(pair.rows("source", "orders", shard)) + len(
        pair.rows("source", "order_items", shard))
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def assert_undone(backend: Any) -> None:
    """A move stopped before its flip, undone: unfence, cleanup and the deletion of the
    target's rows leave nothing of it."""
    backend.unfence()
    backend.cleanup()
    backend.delete_target_rows()
    assert backend.leftovers() == Leftovers()
