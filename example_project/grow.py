"""``python -m example_project --grow [--backend mariadb]``: the shop grows from two PostgreSQL
(or MariaDB) servers to four while orders keep coming.

It starts four throwaway servers of the backend (two serve the shop, two are new): PostgreSQL
clusters with ``wal_level = logical``, or ``mariadbd`` servers as they come (a MariaDB move
captures the shard's changes with triggers and needs no server setting; see
``docs/design/shard-moves.md``). On the first one a control database holds the worker table and
the shard map; each holds the SQLAlchemy
shop's tables with :data:`~example_project.sqlalchemy_shop.MOVABLE_RULES` (every row's logical
shard in its own ID). Order processes lease worker IDs, route by the shard map and place and
update orders the whole time, retrying a write the moving shard's fence refused
(:func:`~snowflake_db.sqlalchemy.sharding.run_transaction`). Meanwhile half of the 16 logical
shards move to the new servers, one :class:`~snowflake_db.sharding.moves.ShardMover` per old
server. Then it checks: every acknowledged order exactly once, on the server the final map
names, with its last acknowledged total and its items; none of the moved shards' rows left on
the old servers; a fan-out count through a session equal to the orders placed. Exit status 0
when every check passes.

The writer and the cluster helpers are shared with ``benchmarks/bench_shard_moves.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue as queue_module
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from sqlalchemy import MetaData, create_engine, func, select, text
from sqlalchemy.engine import Engine

import snowflake_db.process

from .common import SHOP_LAYOUT, Checks, plural
from .local_servers import (
    ServerUnavailableError,
    ThrowawayMariaDB,
    ThrowawayPostgres,
    mariadb_servers,
    postgres_clusters,
)

#: Appended to every cluster's ``postgresql.conf`` before it starts (``wal_level`` needs a
#: restart; the short retry interval starts a subscription's workers at once).
LOGICAL_CONF = """
wal_level = logical
wal_retrieve_retry_interval = '200ms'
max_replication_slots = 20
max_wal_senders = 20
max_logical_replication_workers = 8
max_worker_processes = 16
"""
#: The shop's sharded tables, parents first: what a move moves.
SHOP_TABLES = ("shop_customer", "shop_order", "shop_orderitem")
#: How often the order processes' routers re-read the map's version (seconds).
REFRESH_S = 0.2
#: The backends the grow mode runs on (the shard map's names).
BACKENDS = ("postgresql", "mariadb")
#: Per backend: the servers that serve the shop at first, and the new ones.
SERVER_NAMES = {
    "postgresql": (("pg_a", "pg_b"), ("pg_c", "pg_d")),
    "mariadb": (("maria_a", "maria_b"), ("maria_c", "maria_d")),
}
#: What the demo says it started, per backend.
SERVER_KIND = {"postgresql": "PostgreSQL clusters (wal_level = logical)",
               "mariadb": "MariaDB servers"}
Server = ThrowawayPostgres | ThrowawayMariaDB


# -- throwaway clusters ------------------------------------------------------------------------


def start_logical_clusters(names: Sequence[str]) -> list[ThrowawayPostgres]:
    """Start one throwaway cluster per name with :data:`LOGICAL_CONF` (one ``initdb``, copied
    for the others). The caller closes them (:func:`logical_clusters`)."""
    return postgres_clusters(len(names), names=names, conf=LOGICAL_CONF)


@contextmanager
def logical_clusters(names: Sequence[str]) -> Iterator[dict[str, ThrowawayPostgres]]:
    clusters = start_logical_clusters(names)
    try:
        yield dict(zip(names, clusters, strict=True))
    finally:
        for cluster in clusters:
            cluster.close()


@contextmanager
def throwaway_servers(names: Sequence[str], backend: str = "postgresql", *,
                      mariadb_options: Sequence[str] = ()) -> Iterator[dict[str, Server]]:
    """One running throwaway server of ``backend`` per name, closed (stopped by PID, their
    directories deleted) at the end: PostgreSQL clusters with :data:`LOGICAL_CONF`, or
    ``mariadbd`` servers from one install (a MariaDB move needs no server setting;
    ``mariadb_options`` are more ``mariadbd`` options)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    servers: Sequence[Server] = (
        start_logical_clusters(names) if backend == "postgresql"
        else mariadb_servers(len(names), names=list(names), options=mariadb_options))
    try:
        yield dict(zip(names, servers, strict=True))
    finally:
        for server in servers:
            server.close()


# -- the shop on the clusters ------------------------------------------------------------------


@dataclass
class GrowingShop:
    """URLs of the control database and of each shop database, by target name, and their
    backend (the shard map's name: ``postgresql`` or ``mariadb``)."""

    control_url: str
    urls: dict[str, str]
    backend: str = "postgresql"

    def engines(self) -> dict[str, Engine]:
        return {name: create_engine(url, pool_pre_ping=True) for name, url in self.urls.items()}


def prepare_shop(clusters: Mapping[str, Server], serving: Sequence[str],
                 backend: str = "postgresql") -> GrowingShop:
    """A ``control`` database on the first server (worker tables, shard map serving from
    ``serving``, every server registered as a target of ``backend``) and a ``shop`` database
    with the shop's tables on each server."""
    from snowflake_db.sharding.shard_map import add_target, create_shard_map_tables, init_shard_map
    from snowflake_db.worker import worker_tables

    from .sqlalchemy_shop import Base

    first = next(iter(clusters.values()))
    first.create_database("control")
    control_url = first.url("control")
    urls = {}
    for name, cluster in clusters.items():
        cluster.create_database("shop")
        urls[name] = cluster.url("shop")
        engine = create_engine(urls[name])
        Base.metadata.create_all(engine)
        engine.dispose()
    control = create_engine(control_url)
    worker_tables(MetaData()).slots.metadata.create_all(control)
    create_shard_map_tables(control)
    init_shard_map(control, layout=SHOP_LAYOUT, assignment=list(serving), backend=backend)
    for name in clusters:
        add_target(control, name, backend=backend)
    control.dispose()
    return GrowingShop(control_url, urls, backend)


@contextmanager
def shop_session(shop: GrowingShop, *, generator: Any = None) -> Iterator[tuple[Any, Any]]:
    """``(router, session factory)`` following the shop's shard map; closed at the end."""
    from snowflake_db.sharding import ShardRouter
    from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker

    from .sqlalchemy_shop import MOVABLE_RULES

    router = ShardRouter.from_control(shop.control_url, layout=SHOP_LAYOUT, refresh_s=REFRESH_S)
    engines = shop.engines()
    try:
        routing = ShardedRouting(router, MOVABLE_RULES, generator=generator)
        yield router, sharded_sessionmaker(routing, engines, expire_on_commit=False)
    finally:
        close = getattr(router, "close", None)
        if close is not None:
            close()
        for engine in engines.values():
            engine.dispose()


def add_customers(factory: Any, count: int) -> list[int]:
    """``count`` customers, each on the shard its new ID embeds."""
    from .sqlalchemy_shop import Customer

    with factory() as session, session.begin():
        customers = [Customer(name=f"customer {n}") for n in range(count)]
        session.add_all(customers)
    return [c.id for c in customers]


# -- the order processes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """One acknowledged write of an order process (wall-clock seconds, comparable between
    processes on one machine)."""

    op: str  # "place" or "update"
    order_id: int
    shard: int
    started: float
    latency: float
    total_cents: int
    items: int


def order_process(shop: GrowingShop, customers: list[int], seed: int, stop: Any,
                  results: Any, *, acknowledged: Any = None, think_s: float = 0.005,
                  pace: Any = None, update_share: float = 0.3, max_seconds: float = 600.0
                  ) -> None:
    """Place orders (one or two items) for random customers and update some of its own, until
    ``stop`` is set (or ``max_seconds``); every write through ``run_transaction``, so a write
    the fence refused is retried on the shard's new server; any other error ends the process
    (reported by its exit code). Puts its list of :class:`Write` on ``results``.

    Writes follow each other after ``think_s``, as fast as the servers answer; while ``pace``
    (a shared ``Value('d')``) holds a positive rate, they start on a schedule of that many per
    second instead, as a shop's orders arrive: a write the servers held up is late, and a
    schedule more than 0.1 s behind is not caught up (the writes it missed are not made)."""
    from snowflake_db.sqlalchemy.sharding import run_transaction

    from .sqlalchemy_shop import Order, OrderItem
    from .workers import configure_worker

    rng = random.Random(seed)
    generator = configure_worker(shop.control_url)
    writes: list[Write] = []
    mine: list[int] = []
    deadline = time.monotonic() + max_seconds
    due = time.monotonic()
    try:
        with shop_session(shop, generator=generator) as (router, factory):
            while not stop.is_set() and time.monotonic() < deadline:
                rate = pace.value if pace is not None else 0.0
                if rate > 0:
                    now = time.monotonic()
                    due = max(due + 1 / rate, now - 0.1)
                    if due > now:
                        time.sleep(due - now)
                total = rng.randrange(100, 100_000)
                started, clock = time.time(), time.perf_counter()
                if mine and rng.random() < update_share:
                    order_id = rng.choice(mine)

                    def update(session: Any, order_id: int = order_id, total: int = total
                               ) -> int:
                        order = session.get(Order, order_id)
                        order.total_cents = total
                        return 0

                    run_transaction(factory, update, router=router)
                    op, items = "update", 0
                else:
                    customer = rng.choice(customers)
                    items = rng.randint(1, 2)

                    def place(session: Any, customer: int = customer, total: int = total,
                              items: int = items) -> int:
                        order = Order(customer_id=customer, total_cents=total)
                        session.add(order)
                        session.add_all(OrderItem(order=order, sku=f"sku-{n}", quantity=1,
                                                  price_cents=total) for n in range(items))
                        session.flush()
                        return order.id

                    order_id = run_transaction(factory, place, router=router)
                    mine.append(order_id)
                    op = "place"
                latency = time.perf_counter() - clock
                writes.append(Write(op, order_id, order_id & SHOP_LAYOUT.max_shard, started,
                                    latency, total, items))
                if acknowledged is not None:
                    with acknowledged.get_lock():
                        acknowledged.value += 1
                if think_s and not (pace is not None and pace.value > 0):
                    time.sleep(think_s)
    finally:
        results.put((seed, writes))
        snowflake_db.process.reset()  # release the worker ID's lease


class OrderProcesses:
    """``count`` spawned :func:`order_process` es; :meth:`stop` returns every acknowledged
    write (a process that died is reported by its exit code)."""

    def __init__(self, shop: GrowingShop, customers: list[int], count: int, **options: Any
                 ) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results = context.Queue()
        #: Writes acknowledged so far, by all processes.
        self.acknowledged = context.Value("q", 0)
        #: Each process's scheduled writes per second; 0: one after the other (order_process).
        self.pace = context.Value("d", 0.0)
        self.processes = [
            context.Process(target=order_process, args=(shop, customers, seed, self._stop,
                                                        self._results),
                            kwargs={"acknowledged": self.acknowledged, "pace": self.pace,
                                    **options})
            for seed in range(count)
        ]
        for process in self.processes:
            process.start()

    def wait_for_writes(self, count: int, timeout_s: float = 120.0) -> None:
        """Wait (bounded) until ``count`` writes were acknowledged: the processes run."""
        deadline = time.monotonic() + timeout_s
        while self.acknowledged.value < count:
            if time.monotonic() > deadline or any(
                    p.exitcode is not None for p in self.processes):
                raise RuntimeError(f"the order processes acknowledged {self.acknowledged.value}"
                                   f" writes in {timeout_s} s, not {count}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 120.0) -> tuple[list[Write], list[str]]:
        self._stop.set()
        writes: list[Write] = []
        problems: list[str] = []
        received = 0
        deadline = time.monotonic() + timeout_s
        while received < len(self.processes) and time.monotonic() < deadline:
            try:
                _, batch = self._results.get(timeout=1)
            except queue_module.Empty:
                if all(p.exitcode is not None for p in self.processes):
                    break
                continue
            writes.extend(batch)
            received += 1
        for process in self.processes:
            process.join(timeout=30)
            if process.exitcode != 0:
                problems.append(f"order process {process.pid} exited with {process.exitcode}")
                if process.exitcode is None:
                    process.kill()
        return writes, problems


# -- moving ------------------------------------------------------------------------------------


def shard_mover(shop: GrowingShop, **options: Any) -> Any:
    """A :class:`~snowflake_db.sharding.moves.ShardMover` for the shop's tables. Every process
    of the demo leases its worker ID (none is static), so the barrier sees them all."""
    from snowflake_db.sharding.moves import ShardMover

    options.setdefault("assume_no_static_workers", True)
    return ShardMover(shop.control_url, shop.urls, layout=SHOP_LAYOUT, tables=SHOP_TABLES,
                      **options)


def move_shard(mover: Any, shard: int, to: str,
               progress: Callable[[Any], object] | None = None) -> int:
    """Move ``shard`` to target ``to``; the move's id. The one place the demo and the
    benchmark start a move."""
    return int(mover.move(shard, to, progress=progress))


def grow_plan(serving: Sequence[str], new: Sequence[str], mapping: Mapping[int, str]
              ) -> dict[str, list[tuple[int, str]]]:
    """Half of each old server's shards go to the new server paired with it:
    ``{old server: [(shard, new server), ...]}``."""
    plan: dict[str, list[tuple[int, str]]] = {}
    for old, fresh in zip(serving, new, strict=True):
        shards = sorted(s for s, name in mapping.items() if name == old)
        plan[old] = [(shard, fresh) for shard in shards[: len(shards) // 2]]
    return plan


def run_moves(shop: GrowingShop, plan: Mapping[str, list[tuple[int, str]]],
              log: Callable[[str], None]) -> list[str]:
    """One thread per old server, moving its shards one after the other; the errors."""
    errors: list[str] = []

    def moves_of(old: str, moves: list[tuple[int, str]]) -> None:
        mover = shard_mover(shop, barrier_timeout_s=60.0, copy_timeout_s=300.0)
        try:
            for shard, to in moves:
                started = time.perf_counter()
                move_id = move_shard(mover, shard, to)
                log(f"  moved shard {shard:2d} {old} -> {to} (move {move_id}) in "
                    f"{time.perf_counter() - started:.1f} s")
        except Exception as error:
            errors.append(f"moving from {old}: {type(error).__name__}: {error}")
        finally:
            mover.close()

    threads = [threading.Thread(target=moves_of, args=(old, moves), name=f"mover-{old}")
               for old, moves in plan.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


# -- checking ----------------------------------------------------------------------------------


def rows_by_server(shop: GrowingShop, table: str, columns: str = "id"
                   ) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``table`` on each server, read directly (not through the router)."""
    found = {}
    for name, url in shop.urls.items():
        engine = create_engine(url)
        with engine.connect() as connection:
            found[name] = [tuple(r) for r in connection.execute(
                text(f"SELECT {columns} FROM {table}"))]
        engine.dispose()
    return found


@dataclass
class Audit:
    """Acknowledged orders against the servers' rows (read directly, not routed)."""

    final: dict[int, str]
    placed: dict[int, Write]
    lost: list[int]  # acknowledged, found nowhere
    doubled: list[int]  # on two servers
    misplaced: list[int]  # not (only) on the server the final map names
    stale: list[int]  # total differs from the last acknowledged one


def audit_orders(shop: GrowingShop, writes: Sequence[Write]) -> Audit:
    from snowflake_db.sharding.shard_map import read_shard_map

    control = create_engine(shop.control_url)
    final = read_shard_map(control).mapping
    control.dispose()
    mask = SHOP_LAYOUT.max_shard
    placed = {w.order_id: w for w in writes if w.op == "place"}
    last_total = {w.order_id: w.total_cents for w in sorted(writes, key=lambda w: w.started)}
    where: dict[int, list[str]] = {}
    totals: dict[int, int] = {}
    for name, rows in rows_by_server(shop, "shop_order", "id, total_cents").items():
        for order_id, total in rows:
            where.setdefault(order_id, []).append(name)
            totals[order_id] = total
    return Audit(
        final, placed,
        lost=[i for i in placed if i not in where],
        doubled=[i for i, names in where.items() if len(names) > 1],
        misplaced=[i for i, names in where.items() if names != [final[i & mask]]],
        stale=[i for i, total in last_total.items() if i in totals and totals[i] != total],
    )


def check_grown_shop(shop: GrowingShop, writes: Sequence[Write], moved: Mapping[int, str],
                     seeded_orders: int = 0) -> Checks:
    """The self-checks of the grow mode (see the module docstring)."""
    from .sqlalchemy_shop import Order

    checks = Checks()
    audit = audit_orders(shop, writes)
    final, placed = audit.final, audit.placed
    lost, doubled, misplaced, stale = audit.lost, audit.doubled, audit.misplaced, audit.stale
    mask = SHOP_LAYOUT.max_shard
    checks.check(not lost, f"every acknowledged order found: {len(placed)} placed, "
                           f"{len(lost)} missing")
    checks.check(not doubled, f"no order on two servers ({len(doubled)} doubled)")
    checks.check(not misplaced, f"every order on the server the final map names "
                                f"({len(misplaced)} elsewhere)")
    checks.check(not stale, f"every order has its last acknowledged total "
                            f"({plural(sum(1 for w in writes if w.op == 'update'), 'update')}; "
                            f"{len(stale)} wrong)")
    items = rows_by_server(shop, "shop_orderitem", "order_id")
    item_counts = Counter(order_id for rows in items.values() for (order_id,) in rows)
    short = [i for i, w in placed.items() if item_counts.get(i, 0) != w.items]
    checks.check(not short, f"every order has its items ({len(short)} with a wrong count)")
    left = {}
    for table in SHOP_TABLES:
        for name, rows in rows_by_server(shop, table).items():
            count = sum(1 for (row_id,) in rows if final[row_id & mask] != name)
            if count:
                left[f"{table}@{name}"] = count
    checks.check(not left, f"none of the moved shards' rows left on their old servers "
                           f"{left or ''}".rstrip())
    checks.check(all(final[shard] == to for shard, to in moved.items()),
                 f"the final map names the new server of each of the {len(moved)} moved shards")
    with shop_session(shop) as (_, factory), factory() as session:
        counted = sum(session.scalars(select(func.count()).select_from(Order)))
    checks.check(counted == len(placed) + seeded_orders,
                 f"a fan-out count through a session finds {counted} orders "
                 f"(placed {len(placed) + seeded_orders})")
    return checks


# -- the mode ----------------------------------------------------------------------------------


def describe_writes(writes: Sequence[Write]) -> str:
    """What the order processes acknowledged."""
    placed = sum(1 for w in writes if w.op == "place")
    line = (f"{plural(placed, 'order')} placed and {plural(len(writes) - placed, 'update')} "
            f"acknowledged during the growth")
    return line


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project --grow",
        description="Grow the shop from two PostgreSQL (or MariaDB) servers to four while "
                    "orders keep coming: half of the logical shards move online.",
    )
    parser.add_argument("--backend", choices=BACKENDS, default="postgresql",
                        help="the servers' database: throwaway PostgreSQL clusters (default) "
                             "or throwaway mariadbd servers")
    parser.add_argument("--processes", type=int, default=3,
                        help="order processes placing and updating orders (default 3)")
    parser.add_argument("--customers", type=int, default=64,
                        help="customers, spread over the 16 logical shards (default 64)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds of orders before the first move and after the last")
    args = parser.parse_args(argv)
    for name in ("processes", "customers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.settle <= 60:
        parser.error(f"--settle must be between 0 and 60 seconds, got {args.settle}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    serving, new = SERVER_NAMES[args.backend]
    kind = SERVER_KIND[args.backend]
    started = time.perf_counter()
    try:
        clusters_cm = throwaway_servers([*serving, *new], args.backend)
        clusters = clusters_cm.__enter__()
    except ServerUnavailableError as error:
        print(f"error: the grow mode on {args.backend} needs its server binaries: {error}",
              file=sys.stderr)
        return 2
    processes: OrderProcesses | None = None
    closing: list[Callable[[], object]] = []
    try:
        ports = ", ".join(f"{n} :{c.port}" for n, c in clusters.items())
        print(f"started four throwaway {kind}: {ports}")
        shop = prepare_shop(clusters, serving, args.backend)
        from .workers import configure_worker

        configure_worker(shop.control_url)  # this process's IDs: a lease, as the others
        # Its router stays open to the end: a lease whose holder stops reporting the map's
        # version holds up every move's cleanup barrier.
        session_cm = shop_session(shop)
        _, factory = session_cm.__enter__()
        closing.append(lambda: session_cm.__exit__(None, None, None))
        customers = add_customers(factory, args.customers)
        print(f"the shop serves 16 logical shards from {' and '.join(serving)}; "
              f"{plural(len(customers), 'customer')}")
        processes = OrderProcesses(shop, customers, args.processes)
        processes.wait_for_writes(5 * args.processes)
        time.sleep(args.settle)
        from snowflake_db.sharding.shard_map import read_shard_map

        control = create_engine(shop.control_url)
        plan = grow_plan(serving, new, read_shard_map(control).mapping)
        control.dispose()
        moved = {shard: to for moves in plan.values() for shard, to in moves}
        print(f"moving {plural(len(moved), 'logical shard')} to {' and '.join(new)} while "
              f"{plural(args.processes, 'process', 'processes')} place orders")
        errors = run_moves(shop, plan, print)
        time.sleep(args.settle)
        writes, problems = processes.stop()
        processes = None
        for problem in [*errors, *problems]:
            print(f"error: {problem}", file=sys.stderr)
        print(describe_writes(writes))
        checks = check_grown_shop(shop, writes, moved)
        checks.check(not errors and not problems, "every move and order process finished")
        print(f"done in {time.perf_counter() - started:.1f} s")
        return checks.exit_status
    finally:
        if processes is not None:
            with suppress(Exception):
                processes.stop(timeout_s=30)
        for close in closing:
            close()
        snowflake_db.process.reset()  # release the lease while the control database runs
        clusters_cm.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
