"""The shop on a distributed engine: orders placed through a PostgreSQL coordinator whose
partitions are postgres_fdw foreign tables, or through a MariaDB Spider table.

``python -m example_project.sqlalchemy_shop --engine postgresql-fdw|spider`` starts throwaway
local servers (a coordinator or Spider front and ``--shards`` shard servers, stopped at the end
even on failure); with ``--control-url URL --coordinator-url URL --shard-url URL ...`` it runs
on servers you give. The library's migration (``op.create_sharded_orders``) builds the tables;
the engine places each row by its own hash of ``customer_id``, and ``ShardRouter(engine=...)``
predicts where. The checks read every shard directly: each order on the shard the router
named, a customer's orders read from one shard, no ID twice. Worker IDs are leased from the
control database, never from a shard.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine, make_url

import snowflake_db
from snowflake_db import SnowflakeGenerator
from snowflake_db.sharding import ShardRouter
from snowflake_db.sharding.ddl import ROUTER_ENGINES, ShardServer, partition_name

from . import local_servers
from .common import (
    BadInputError,
    Checks,
    Options,
    display_url,
    one_line,
    place_orders_in_processes,
    plural,
    report_worker,
)

#: The demo's foreign servers (``CREATE SERVER shop_shard<i>``): the only ones it drops again.
SERVER_PREFIX = "shop_shard"
BATCH = 50

metadata = MetaData()
#: The columns ``op.create_sharded_orders`` creates (the tables themselves come from it).
orders = Table("orders", metadata, Column("id", BigInteger), Column("customer_id", BigInteger),
               Column("total_cents", BigInteger))
order_items = Table(
    "order_items", metadata, Column("id", BigInteger), Column("order_id", BigInteger),
    Column("customer_id", BigInteger), Column("sku", String(32)), Column("quantity", Integer),
    Column("price_cents", BigInteger),
)


def router_for(engine: str, shards: int) -> ShardRouter:
    """Shard ``i`` owns ``REMAINDER i`` (PostgreSQL) or partition ``p<i>`` (Spider)."""
    return ShardRouter([f"shard{i}" for i in range(shards)], logical_shards=shards,
                       engine=ROUTER_ENGINES[engine])


def shard_server(url: str) -> ShardServer:
    """How the coordinator reaches a shard: the shard URL's host, port, database and user."""
    parsed = make_url(url)
    default_port = 5432 if parsed.get_backend_name() == "postgresql" else 3306
    return ShardServer(parsed.host or "localhost", parsed.port or default_port,
                       parsed.database or "", parsed.username or "",
                       password=parsed.password or "")


# -- throwaway servers -------------------------------------------------------------------------


@contextmanager
def local_engine(options: Options) -> Iterator[Options]:
    """Start a coordinator (Spider front) and ``options.local_shards`` shard servers; yield
    the options with their URLs; stop every server by its PID on the way out, whatever happens.

    The control database is a database of its own on the coordinator's server.
    """
    count = options.local_shards
    servers: list[Any] = []
    with sigterm_exits():  # so that `finally` stops the servers on SIGTERM
        try:
            yield from _started(options, count, servers)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut this short
            for server in servers:
                server.close()
            if servers:
                print(f"stopped the {len(servers)} throwaway servers")


def _started(options: Options, count: int, servers: list[Any]) -> Iterator[Options]:
    try:
        if options.engine == "postgresql-fdw":
            clusters = local_servers.postgres_clusters(
                1 + count, names=["coordinator", *(f"shard{i}" for i in range(count))])
            servers.extend(clusters)
            clusters[0].create_database("shop_control")
            for cluster in clusters:
                cluster.create_database("shop")
            control = clusters[0].url("shop_control")
            urls = [cluster.url("shop") for cluster in clusters]
            kind = "PostgreSQL"
        else:
            spider = local_servers.spider_servers(count)
            servers.extend(spider)
            with spider[0].connect().cursor() as cursor:
                cursor.execute("CREATE DATABASE shop_control")
            for server in spider:
                with server.connect().cursor() as cursor:
                    cursor.execute("CREATE DATABASE shop")
            control = spider[0].url("shop_control")
            urls = [server.url("shop") for server in spider]
            kind = "MariaDB (the first with Spider)"
        print(f"started {len(servers)} throwaway {kind} servers, pids "
              f"{', '.join(str(s.pid) for s in servers)}; they are stopped at the end")
        yield dataclasses.replace(options, control_url=control, coordinator_url=urls[0],
                                  shard_urls=urls[1:])
    except local_servers.ServerUnavailableError as error:
        raise BadInputError(f"cannot start throwaway servers: {error}") from None


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """Inside, SIGTERM raises ``SystemExit(128 + SIGTERM)``, so ``finally`` blocks run.

    Python may run a signal handler inside a weakref or garbage-collection callback, where an
    exception cannot propagate: it is printed ("Exception ignored in ...") and dropped, and
    the demo went on placing orders. ``sys.unraisablehook`` sees such a drop; the SIGTERM is
    then sent again, to be raised where it propagates. The previous handler and hook come
    back on the way out.
    """
    received: list[int] = []
    in_hook = threading.Event()

    def exit_now(signum: int, frame: object) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    def resend(signum: int) -> None:
        while in_hook.is_set():
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    def redeliver(unraisable: Any) -> None:
        # Sent once this hook has returned: a handler run inside the hook (whose exceptions
        # are dropped too) would be lost again.
        in_hook.set()
        try:
            previous_hook(unraisable)
            if received and isinstance(unraisable.exc_value, SystemExit):
                threading.Thread(target=resend, args=(received[-1],), daemon=True).start()
        finally:
            in_hook.clear()

    previous_hook = sys.unraisablehook
    previous = signal.signal(signal.SIGTERM, exit_now)
    sys.unraisablehook = redeliver
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)


# -- migrate -----------------------------------------------------------------------------------


def _drop_leftovers(engine: str, coordinator: Engine, shards: Sequence[Engine]) -> None:
    """What an earlier run left: the demo owns these tables and its ``shop_shard<i>`` servers."""
    pattern = f"^{SERVER_PREFIX}[0-9]+$"
    with coordinator.begin() as connection:
        connection.exec_driver_sql("DROP TABLE IF EXISTS order_items, orders")
        if engine == "postgresql-fdw":
            names = connection.scalars(text(
                "SELECT srvname FROM pg_foreign_server WHERE srvname ~ :p"), {"p": pattern})
            for name in list(names):
                connection.exec_driver_sql(f'DROP SERVER "{name}" CASCADE')
        else:
            names = connection.scalars(text(
                "SELECT Server_name FROM mysql.servers WHERE Server_name REGEXP :p"),
                {"p": pattern})
            for name in list(names):
                connection.exec_driver_sql(f"DROP SERVER `{name}`")
    for shard in shards:
        with shard.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS order_items, orders")


def migrate(options: Options, coordinator: Engine, shards: Sequence[Engine]) -> None:
    """``op.create_sharded_orders`` on the coordinator, as an Alembic revision would run it."""
    try:
        from alembic.migration import MigrationContext
        from alembic.operations import Operations

        import snowflake_db.alembic  # noqa: F401  (registers op.create_sharded_orders)
    except ImportError:
        raise BadInputError(
            "--engine needs Alembic for the migration: pip install 'snowflake-db[alembic]'"
        ) from None
    assert options.engine is not None
    _drop_leftovers(options.engine, coordinator, shards)
    servers = [shard_server(url) for url in options.shard_urls]
    with coordinator.begin() as connection:
        operations: Any = Operations(MigrationContext.configure(connection))
        operations.create_sharded_orders(options.engine, servers, server_prefix=SERVER_PREFIX)
    print(f"migrated: op.create_sharded_orders({options.engine!r}, "
          f"{plural(len(servers), 'shard')}) on the coordinator")


# -- place orders ------------------------------------------------------------------------------


def place_orders(
    connect: Callable[[], Any], generator: SnowflakeGenerator, *, customer_ids: Sequence[int],
    count: int, seed: int, progress: Callable[[int], None] = lambda n: None,
) -> list[int]:
    """Orders of 1-3 items through the coordinator, one transaction per batch of 50 orders;
    every key made in the application (``next_ids``). ``connect()`` is ``engine.begin``."""
    rng = random.Random(seed)
    placed: list[int] = []
    done = 0
    while done < count:
        size = min(BATCH, count - done)
        order_rows, item_rows = order_batch(rng, generator, customer_ids, size)
        with connect() as connection:
            connection.execute(insert(orders), order_rows)
            connection.execute(insert(order_items), item_rows)
        placed.extend(row["id"] for row in order_rows)
        done += size
        progress(size)
    return placed


def order_batch(rng: random.Random, generator: SnowflakeGenerator, customer_ids: Sequence[int],
                size: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``size`` orders and their 1-3 items each, keys from one ``next_ids`` call."""
    counts = [rng.randint(1, 3) for _ in range(size)]
    ids = iter(generator.next_ids(size + sum(counts)))
    order_rows, item_rows = [], []
    for items in counts:
        order_id, customer_id = next(ids), rng.choice(customer_ids)
        prices = [(rng.randint(1, 3), rng.randrange(100, 10_000)) for _ in range(items)]
        item_rows += [{"id": next(ids), "order_id": order_id, "customer_id": customer_id,
                       "sku": f"SKU-{rng.randrange(1000):04d}", "quantity": quantity,
                       "price_cents": price} for quantity, price in prices]
        order_rows.append({"id": order_id, "customer_id": customer_id,
                           "total_cents": sum(q * p for q, p in prices)})
    return order_rows, item_rows


def _child(options: Options, customer_ids: list[int], count: int, seed: int, queue: Any) -> None:
    from .workers import configure_worker

    generator = configure_worker(options.control_url)
    report_worker(queue, seed, generator.ensure_worker())
    coordinator = create_engine(options.coordinator_url)
    ids = place_orders(coordinator.begin, generator, customer_ids=customer_ids, count=count,
                       seed=seed, progress=queue.put)
    coordinator.dispose()
    queue.put(ids)


# -- run and verify ----------------------------------------------------------------------------


def run(options: Options) -> int:
    if options.coordinator_url:
        return _run(options)
    with local_engine(options) as started:
        return _run(started)


def _connect(name: str, url: str) -> Engine:
    engine = create_engine(url, pool_pre_ping=True)
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except Exception as error:
        raise BadInputError(f"cannot connect to {name} ({display_url(url)}): "
                            f"{one_line(error)}") from None
    return engine


@dataclasses.dataclass
class Deployment:
    """The servers of one run: the router predicts, the coordinator places, the shards hold."""

    options: Options
    router: ShardRouter
    coordinator: Engine
    shards: list[Engine]


def _run(options: Options) -> int:
    assert options.engine is not None
    router = router_for(options.engine, len(options.shard_urls))
    coordinator = _connect("the coordinator", options.coordinator_url)
    shards = [_connect(f"shard{i}", url) for i, url in enumerate(options.shard_urls)]
    _connect("the control database", options.control_url).dispose()
    where = "REMAINDER {i} of MODULUS {n}" if options.engine == "postgresql-fdw" else "p{i}"
    print(f"SQLAlchemy shop on {options.engine}: coordinator "
          f"{display_url(options.coordinator_url)}, {plural(len(shards), 'shard server')}, "
          f"worker table on {display_url(options.control_url)}")
    for i, url in enumerate(options.shard_urls):
        print(f"  shard{i}: {display_url(url)}  partition "
              f"{where.format(i=i, n=len(shards))}")
    try:
        migrate(options, coordinator, shards)
        from .workers import configure_worker

        generator = configure_worker(options.control_url)
        print(f"  this process (pid {os.getpid()}) leased worker ID {generator.ensure_worker()} "
              "for the customers")
        customer_ids = generator.next_ids(options.customers)
        placed, elapsed = place_orders_in_processes(options, customer_ids, _child)
        return verify(Deployment(options, router, coordinator, shards), placed, elapsed)
    finally:
        snowflake_db.reset()  # release the worker ID while the control database still runs
        for engine in (coordinator, *shards):
            engine.dispose()


def _read_shard(connection: Connection) -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    item_rows: list[tuple[int, ...]]
    order_rows = [(int(a), int(b)) for a, b in connection.execute(
        select(orders.c.id, orders.c.customer_id))]
    item_rows = [(int(a), int(b), int(c)) for a, b, c in connection.execute(
        select(order_items.c.id, order_items.c.order_id, order_items.c.customer_id))]
    return order_rows, item_rows


def verify(deployment: Deployment, placed: list[int], elapsed: float) -> int:
    options, router, shards = deployment.options, deployment.router, deployment.shards
    checks = Checks()
    print(f"placed {plural(len(placed), 'order')} through the coordinator in {elapsed:.2f} s: "
          f"{len(placed) / max(elapsed, 1e-9):,.0f} orders/s")
    checks.check(len(placed) == options.orders,
                 f"{options.orders} orders reported by the processes")

    # Every shard read directly, not through the coordinator.
    stored: dict[str, tuple[list[tuple[int, int]], list[tuple[int, ...]]]] = {}
    for i, shard in enumerate(shards):
        with shard.connect() as connection:
            stored[f"shard{i}"] = _read_shard(connection)
    order_ids = [row[0] for rows, _ in stored.values() for row in rows]
    item_ids = [row[0] for _, rows in stored.values() for row in rows]
    every_id = order_ids + item_ids
    checks.check(len(every_id) == len(set(every_id)) and sorted(order_ids) == sorted(placed),
                 f"zero duplicate IDs ({len(order_ids)} orders and {len(item_ids)} items stored "
                 f"on the shards, {len(set(every_id))} distinct)")
    misplaced = [row for name, (rows, _) in stored.items() for row in rows
                 if router.target_for_key(row[1]) != name]
    checks.check(not misplaced, f"every order is on the shard ShardRouter(engine="
                 f"{router.engine!r}) predicted ({len(misplaced)} not)")
    astray = [row for name, (rows, items) in stored.items()
              for row in items if row[1] not in {o[0] for o in rows}
              or router.target_for_key(row[2]) != name]
    checks.check(not astray, f"every item is on its order's shard ({len(astray)} not)")
    with deployment.coordinator.connect() as connection:
        seen = connection.scalar(select(func.count()).select_from(orders))
    checks.check(seen == len(placed), f"the coordinator sees {seen} orders")
    print("orders per shard (read from each shard directly):")
    for name, (rows, items) in stored.items():
        print(f"  {name}: {plural(len(rows), 'order')}, {plural(len(items), 'item')}")

    # One customer's orders: the coordinator reads one partition, on the predicted shard.
    counts: dict[int, int] = {}
    for _, customer in (row for rows, _ in stored.values() for row in rows):
        counts[customer] = counts.get(customer, 0) + 1
    if counts:
        customer = max(counts, key=lambda c: (counts[c], c))
        _check_one_customer(checks, deployment, customer)
    return checks.exit_status


def _check_one_customer(checks: Checks, deployment: Deployment, customer: int) -> None:
    home = deployment.router.target_for_key(customer)
    query = select(orders.c.id).where(orders.c.customer_id == customer)
    if deployment.options.engine == "postgresql-fdw":
        with deployment.coordinator.connect() as connection:
            through = sorted(connection.scalars(query))
            read = planned_shards(connection, customer)
        how = "the foreign partitions its plan scans"
    else:
        through, read = _spider_read(deployment, query)
        how = "the shards whose SELECT counter rose"
    direct = {}
    for index, shard in enumerate(deployment.shards):
        with shard.connect() as connection:
            direct[f"shard{index}"] = sorted(connection.scalars(query))
    others = sum(len(rows) for name, rows in direct.items() if name != home)
    checks.check(
        read == [home] and through == direct[home] and others == 0,
        f"customer {customer}'s {plural(len(through), 'order')} through the coordinator: "
        f"read from {', '.join(read) or 'no shard'} ({how}), the router names {home}; "
        f"{home} read directly holds the same {len(direct[home])}, the other shards {others}",
    )


def planned_shards(connection: Connection, customer: int) -> list[str]:
    """The shards whose foreign partitions PostgreSQL's plan for one customer's orders scans
    (pruned at plan time: the customer is a literal)."""
    sql = f"EXPLAIN (FORMAT JSON) SELECT id FROM orders WHERE customer_id = {int(customer)}"
    [plan] = connection.exec_driver_sql(sql).scalar_one()
    prefix = partition_name("orders", 0)[:-1]
    return sorted(f"shard{name[len(prefix):]}" for name in _relations(plan["Plan"]))


def _relations(node: dict[str, Any]) -> Iterator[str]:
    if "Relation Name" in node:
        yield node["Relation Name"]
    for child in node.get("Plans", []):
        yield from _relations(child)


def _spider_read(deployment: Deployment, query: Any) -> tuple[list[int], list[str]]:
    """The rows of ``query`` through the Spider table, and the shards that ran a SELECT for it.

    Spider 10.11 hands such a query to its backend whole ("Storage engine handles GROUP BY"), so
    ``EXPLAIN`` shows no partitions; each shard's ``Com_select`` counter shows where it went.
    """
    connections = [shard.connect() for shard in deployment.shards]
    try:
        before = [_selects(connection) for connection in connections]
        with deployment.coordinator.connect() as coordinator:
            rows = sorted(coordinator.scalars(query))
        after = [_selects(connection) for connection in connections]
    finally:
        for connection in connections:
            connection.close()
    return rows, [f"shard{i}" for i, (a, b) in enumerate(zip(after, before, strict=True))
                  if a > b]


def _selects(connection: Connection) -> int:
    row = connection.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Com_select'").one()
    return int(row[1])

