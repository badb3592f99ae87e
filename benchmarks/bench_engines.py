"""Orders/s into one database, through a PostgreSQL coordinator (postgres_fdw), through MariaDB
Spider, and straight to the shards by the library; one customer's history read through the
coordinator vs from its shard. Ratios are taken in the same run.

Run it with ``.venv/bin/python benchmarks/bench_engines.py`` (``--orders 1000 --rounds 1`` for a
quick run, ``--engine postgresql-fdw`` or ``spider`` for one engine). It starts its own
throwaway servers with ``example_project.local_servers`` (never the shared ones) and stops them
by PID at the end: per engine one server for the "one database" baseline, a coordinator (Spider
front) and ``--shards`` shard servers, whose tables come from the library's DDL
(``snowflake_db.sharding.ddl``: the shards' tables in the baseline too, so every path writes the
same tables and indexes).

Every path loads the same orders (1-3 items each, every key made up front by ``next_ids``)
into empty tables, in transactions of ``--batch`` orders with their items:

* **one database**: ``executemany`` INSERTs (PostgreSQL: psycopg's pipelined executemany;
  MariaDB: PyMySQL's multi-row INSERTs), and the library's bulk loader
  (``snowflake_db.bulk.load_rows``: COPY; ``LOAD DATA LOCAL INFILE`` on MariaDB);
* **through the coordinator / Spider**: the same INSERTs, and the bulk loader, sent to the
  partitioned table (postgres_fdw as the DDL creates it: ``batch_size`` 1, one remote INSERT
  per row; Spider with its defaults);
* **straight to the shards**: rows grouped by owning shard with
  ``ShardRouter(engine=ROUTER_ENGINES[engine])`` (timed) and written to each shard directly,
  one shard after another, with the bulk loader (and with INSERTs).

Paths alternate every round (background load hits all alike); the best round of each is
reported. Reads (after ``ANALYZE`` everywhere): the history query (orders joined to their
items, one customer) for ``--reads`` customers, through the coordinator, from the shard the
router names, and from the one database (also through one connection per shard in turn: the
shard path's switching between server processes, without the shards). All servers share this
machine's CPUs: more shards add no CPU here, so this measures each path's overhead, not what a
cluster of machines would do. No targets: a report.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from example_project import local_servers
from snowflake_db import SnowflakeGenerator
from snowflake_db.bulk import BulkTable, load_rows
from snowflake_db.sharding import ShardRouter
from snowflake_db.sharding import ddl as d

ORDERS = BulkTable("orders", ("id", "customer_id", "total_cents"), key="id")
ITEMS = BulkTable("order_items",
                  ("id", "order_id", "customer_id", "sku", "quantity", "price_cents"), key="id")
HISTORY = (
    "SELECT o.id, o.total_cents, i.id, i.sku, i.quantity, i.price_cents FROM orders o "
    "JOIN order_items i ON i.customer_id = o.customer_id AND i.order_id = o.id "
    "WHERE o.customer_id = %s AND i.customer_id = %s ORDER BY o.id, i.id"
)

Order = tuple[list[Any], list[list[Any]]]  # an order row and its item rows
#: postgres_fdw's batch_size for the one path that sets it (the DDL leaves the default, 1).
FDW_BATCH = 500


def make_orders(orders: int, customers: int, seed: int) -> list[Order]:
    """Orders of 1-3 items for ``customers`` customers, every key from ``next_ids``."""
    rng = random.Random(seed)
    generator = SnowflakeGenerator(1)
    customer_ids = generator.next_ids(customers)
    made: list[Order] = []
    for _ in range(orders):
        count = rng.randint(1, 3)
        keys = generator.next_ids(1 + count)
        customer = rng.choice(customer_ids)
        items: list[list[Any]] = [[keys[1 + k], keys[0], customer, f"SKU-{rng.randrange(1000):04d}",
                  rng.randint(1, 3), rng.randrange(100, 10_000)] for k in range(count)]
        made.append(([keys[0], customer, sum(i[4] * i[5] for i in items)], items))
    return made


@dataclass
class Engine:
    """One engine's servers: DB-API connections to the baseline, the coordinator, the shards."""

    name: str
    vendor: str
    connect: Callable[[Any], Any]
    single: Any = None
    #: More connections to the one database, one per shard: the reads' control path.
    single_more: list[Any] = field(default_factory=list)
    coordinator: Any = None
    shards: list[Any] = field(default_factory=list)
    router: ShardRouter | None = None
    #: Paths of this engine only: label -> (where, how, coordinator SQL before, SQL after).
    extra: dict[str, tuple[str, Callable[..., None], list[str], list[str]]] = field(
        default_factory=dict)

    def paths(self) -> dict[str, tuple[str, Callable[..., None], list[str], list[str]]]:
        common: dict[str, tuple[str, Callable[..., None], list[str], list[str]]] = {
            label: (where, how, [], []) for label, (where, how) in PATHS.items()}
        return {**common, **self.extra}

    def truncate(self, connection: Any) -> None:
        with connection.cursor() as cursor:
            if self.vendor == "postgresql":
                cursor.execute("TRUNCATE order_items, orders")
            else:
                cursor.execute("SET foreign_key_checks = 0")
                cursor.execute("TRUNCATE order_items")
                cursor.execute("TRUNCATE orders")
                cursor.execute("SET foreign_key_checks = 1")
        connection.commit()

    def count(self, connection: Any) -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM "
                           "order_items)")
            orders, items = cursor.fetchone()
        connection.commit()
        return int(orders), int(items)


def _batches(orders: Sequence[Order], size: int) -> Iterator[tuple[list[Any], list[Any]]]:
    for start in range(0, len(orders), size):
        chunk = orders[start:start + size]
        yield [o for o, _ in chunk], [i for _, items in chunk for i in items]


def insert(engine: Engine, connection: Any, orders: Sequence[Order], size: int) -> None:
    marks = {"orders": ", ".join(["%s"] * 3), "order_items": ", ".join(["%s"] * 6)}
    for order_rows, item_rows in _batches(orders, size):
        with connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO orders VALUES ({marks['orders']})", order_rows)
            cursor.executemany(f"INSERT INTO order_items VALUES ({marks['order_items']})",
                               item_rows)
        connection.commit()


def insert_multirow(engine: Engine, connection: Any, orders: Sequence[Order], size: int) -> None:
    """One INSERT with a VALUES row per order (and one per item) per batch: a statement that
    postgres_fdw can send to each shard in batches of the server's ``batch_size``."""
    for order_rows, item_rows in _batches(orders, size):
        with connection.cursor() as cursor:
            for table, rows in (("orders", order_rows), ("order_items", item_rows)):
                row = "(" + ", ".join(["%s"] * len(rows[0])) + ")"
                cursor.execute(f"INSERT INTO {table} VALUES " + ", ".join([row] * len(rows)),
                               [value for values in rows for value in values])
        connection.commit()


METHODS: dict[str, str] = {}
ORDERS_MADE: list[Order] = []


def bulk(engine: Engine, connection: Any, orders: Sequence[Order], size: int) -> None:
    for order_rows, item_rows in _batches(orders, size):
        METHODS[engine.vendor] = load_rows(connection, engine.vendor, ORDERS, order_rows)
        load_rows(connection, engine.vendor, ITEMS, item_rows)
        connection.commit()


def direct(write: Callable[[Engine, Any, Sequence[Order], int], None]) -> Callable[..., None]:
    """``write`` to each shard the rows the engine-matching router says it owns."""
    def load(engine: Engine, _: Any, orders: Sequence[Order], size: int) -> None:
        assert engine.router is not None
        grouped: dict[str, list[Order]] = {}
        for order in orders:
            grouped.setdefault(engine.router.target_for_key(order[0][1]), []).append(order)
        for index, shard in enumerate(engine.shards):
            write(engine, shard, grouped.get(f"shard{index}", []), size)
    return load


# -- servers -----------------------------------------------------------------------------------


def _pg_connect(server: Any) -> Any:
    import psycopg

    return psycopg.connect(host=server.host, port=server.port, user="postgres", dbname="shop")


def _my_connect(server: Any) -> Any:
    import pymysql

    return pymysql.connect(host=server.host, port=server.port, user="root", database="shop",
                           local_infile=True, autocommit=False)


def _run_all(connection: Any, statements: Sequence[str]) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    connection.commit()


@contextmanager
def postgres(shards: int) -> Iterator[Engine]:
    names = ["single", "coordinator", *(f"shard{i}" for i in range(shards))]
    with local_servers.running_postgres_clusters(len(names), names=names) as clusters:
        for cluster in clusters:
            cluster.create_database("shop")
        engine = Engine("PostgreSQL 15", "postgresql", _pg_connect)
        engine.single = _pg_connect(clusters[0])
        engine.single_more = [_pg_connect(clusters[0]) for _ in range(shards)]
        _run_all(engine.single, d.postgres_shard_sql(0, 1))
        servers = [d.ShardServer(c.host, c.port, "shop", "postgres") for c in clusters[2:]]
        for index, cluster in enumerate(clusters[2:]):
            shard = _pg_connect(cluster)
            _run_all(shard, d.postgres_shard_sql(index, shards))
            engine.shards.append(shard)
        engine.coordinator = _pg_connect(clusters[1])
        _run_all(engine.coordinator, d.postgres_coordinator_sql(servers)
                 + d.postgres_user_mappings_secret_sql(servers))
        engine.router = ShardRouter([f"shard{i}" for i in range(shards)], logical_shards=shards,
                                    engine=d.ROUTER_ENGINES["postgresql-fdw"])
        names = [d.server_name("sfdb_shard", i) for i in range(shards)]
        engine.extra[f"through the coordinator, multi-row INSERT, batch_size {FDW_BATCH}"] = (
            "coordinator", insert_multirow,
            [f"ALTER SERVER {n} OPTIONS (ADD batch_size '{FDW_BATCH}')" for n in names],
            [f"ALTER SERVER {n} OPTIONS (DROP batch_size)" for n in names])
        try:
            yield engine
        finally:
            for connection in (engine.single, engine.coordinator, *engine.shards,
                               *engine.single_more):
                with suppress(Exception):
                    connection.close()


@contextmanager
def spider(shards: int) -> Iterator[Engine]:
    plugin = local_servers.find_spider_plugin()
    servers = local_servers.mariadb_servers(
        2 + shards, plugin_dir=plugin.parent,
        names=["single", "spider", *(f"backend{i}" for i in range(shards))])
    try:
        local_servers.install_spider(servers[1], plugin)
        for server in servers:
            with server.connect().cursor() as cursor:
                cursor.execute("CREATE DATABASE shop")
                cursor.execute("SET GLOBAL local_infile = 1")
        engine = Engine("MariaDB 10.11", "mariadb", _my_connect)
        engine.single = _my_connect(servers[0])
        engine.single_more = [_my_connect(servers[0]) for _ in range(shards)]
        _run_all(engine.single, d.spider_backend_sql())
        for server in servers[2:]:
            shard = _my_connect(server)
            _run_all(shard, d.spider_backend_sql())
            engine.shards.append(shard)
        backends = [d.ShardServer(s.host, s.port, "shop", "root") for s in servers[2:]]
        engine.coordinator = _my_connect(servers[1])
        _run_all(engine.coordinator, d.spider_servers_secret_sql(backends)
                 + d.spider_tables_sql(shards))
        engine.router = ShardRouter([f"shard{i}" for i in range(shards)], logical_shards=shards,
                                    engine=d.ROUTER_ENGINES["spider"])
        try:
            yield engine
        finally:
            for connection in (engine.single, engine.coordinator, *engine.shards,
                               *engine.single_more):
                with suppress(Exception):
                    connection.close()
    finally:
        for server in servers:
            server.close()


# -- measure -----------------------------------------------------------------------------------

PATHS: dict[str, tuple[str, Callable[..., None]]] = {
    # label: (where it writes, how)
    "one database, INSERT": ("single", insert),
    "one database, bulk loader": ("single", bulk),
    "through the coordinator, INSERT": ("coordinator", insert),
    "through the coordinator, bulk loader": ("coordinator", bulk),
    "straight to the shards, INSERT": ("shards", direct(insert)),
    "straight to the shards, bulk loader": ("shards", direct(bulk)),
}


def _empty(engine: Engine, where: str) -> None:
    for connection in ([engine.single] if where == "single" else engine.shards):
        engine.truncate(connection)


def _stored(engine: Engine, where: str) -> tuple[int, int]:
    counts = [engine.count(c) for c in ([engine.single] if where == "single" else engine.shards)]
    return sum(o for o, _ in counts), sum(i for _, i in counts)


def measure_loads(engine: Engine, orders: list[Order], rounds: int, size: int
                  ) -> dict[str, float | str]:
    """Best orders/s per path (or the error that stopped a path)."""
    expected = (len(orders), sum(len(items) for _, items in orders))
    best: dict[str, float | str] = {}
    paths = engine.paths()
    labels = list(paths)
    for round_number in range(rounds):
        for label in labels if round_number % 2 == 0 else list(reversed(labels)):
            where, write, before, after = paths[label]
            if isinstance(best.get(label), str):
                continue
            _empty(engine, where)
            _run_all(engine.coordinator, before)
            target = engine.coordinator if where == "coordinator" else engine.single
            started = time.perf_counter()
            try:
                write(engine, target, orders, size)
            except Exception as error:  # a path the engine refuses: reported, not fatal
                with suppress(Exception):
                    target.rollback()
                best[label] = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:90]})"
                continue
            finally:
                _run_all(engine.coordinator, after)
            rate = len(orders) / (time.perf_counter() - started)
            stored = _stored(engine, where)
            if stored != expected:
                raise SystemExit(f"{engine.name} {label}: stored {stored}, expected {expected}")
            previous = best.get(label, 0.0)
            best[label] = max(rate, previous if isinstance(previous, float) else 0.0)
            print(f"  round {round_number + 1} {engine.name} {label}: {rate:,.0f} orders/s",
                  file=sys.stderr)
    return best


def measure_reads(engine: Engine, orders: list[Order], reads: int, rounds: int
                  ) -> dict[str, float]:
    """Histories per second: through the coordinator, from the owning shard, from one
    database (the last load left the same rows in the shards and in the one database)."""
    assert engine.router is not None
    router = engine.router
    for where in ("single", "shards"):  # reload: the last round may have emptied either
        _empty(engine, where)
    bulk(engine, engine.single, orders, 1000)
    direct(bulk)(engine, None, orders, 1000)
    for connection in (engine.single, *engine.shards, engine.coordinator):  # fresh statistics
        with suppress(Exception), connection.cursor() as cursor:
            cursor.execute("ANALYZE orders, order_items" if engine.vendor == "postgresql"
                           else "ANALYZE TABLE orders, order_items")
            with suppress(Exception):
                cursor.fetchall()
        connection.commit()
    customers = sorted({order[1] for order, _ in orders})
    sample = random.Random(3).sample(customers, min(reads, len(customers)))
    paths: dict[str, Callable[[int], Any]] = {
        "from its shard (ShardRouter picks it)":
            lambda c: engine.shards[int(router.target_for_key(c)[5:])],
        "through the coordinator": lambda c: engine.coordinator,
        "one database": lambda c: engine.single,
        # The shard path's pattern on one server: the next query on another connection (and
        # server process) whenever the customer's shard changes.
        "one database, a connection per shard in turn":
            lambda c: engine.single_more[int(router.target_for_key(c)[5:])],
    }
    best: dict[str, float] = {}
    rows: dict[str, int] = {}
    for round_number in range(rounds):
        for label, pick in paths.items() if round_number % 2 == 0 else reversed(paths.items()):
            total = 0
            started = time.perf_counter()
            for customer in sample:
                connection = pick(customer)
                with connection.cursor() as cursor:
                    cursor.execute(HISTORY, (customer, customer))
                    total += len(cursor.fetchall())
                connection.commit()
            rate = len(sample) / (time.perf_counter() - started)
            best[label] = max(best.get(label, 0.0), rate)
            rows[label] = total
    if len(set(rows.values())) != 1:
        raise SystemExit(f"{engine.name}: the history reads disagree: {rows}")
    return best


def routing_cost(engine: Engine, orders: Sequence[Order]) -> float:
    """Microseconds per order of the grouping the direct paths do (included in their rates)."""
    assert engine.router is not None
    target = engine.router.target_for_key
    started = time.perf_counter()
    for order, _ in orders:
        target(order[1])
    return (time.perf_counter() - started) * 1e6 / max(len(orders), 1)


def _rate(value: float | str | None) -> str:
    return value if isinstance(value, str) else "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | str | None, reference: float | str | None) -> str:
    if not isinstance(value, float) or not isinstance(reference, float):
        return "-"
    return f"{value / reference:.2f}"


def report(engine: Engine, shards: int, loads: dict[str, float | str],
           reads: dict[str, float]) -> None:
    name = engine.name
    insert_base = loads.get("one database, INSERT")
    bulk_base = loads.get("one database, bulk loader")
    method = METHODS.get("postgresql" if name.startswith("Postgre") else "mariadb", "bulk")
    print(f"\n{name}, {shards} shards (bulk loader: {method}; routing an order with "
          f"ShardRouter(engine={engine.router.engine if engine.router else None!r}): "
          f"{routing_cost(engine, ORDERS_MADE):.1f} µs)\n")
    print("| path | orders/s | vs one database, INSERT | vs one database, same method |")
    print("|---|---:|---:|---:|")
    for label in engine.paths():
        value = loads.get(label)
        same = bulk_base if "bulk" in label else insert_base
        print(f"| {label} | {_rate(value)} | {_ratio(value, insert_base)} | "
              f"{_ratio(value, same)} |")
    shard_rate = reads.get("from its shard (ShardRouter picks it)")
    print("\n| one customer's order history | reads/s | vs its shard |")
    print("|---|---:|---:|")
    for label, value in reads.items():
        print(f"| {label} | {_rate(value)} | {_ratio(value, shard_rate)} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["postgresql-fdw", "spider", "both"], default="both")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--orders", type=int, default=5000, help="orders per round and path")
    parser.add_argument("--customers", type=int, default=500)
    parser.add_argument("--batch", type=int, default=500, help="orders per transaction")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=300, help="customers whose history is read")
    args = parser.parse_args()
    if not 1 <= args.shards <= 8:
        parser.error(f"--shards={args.shards}: 1 to 8 (each shard is a server on this machine)")
    orders = make_orders(args.orders, args.customers, seed=1)
    ORDERS_MADE[:] = orders
    items = sum(len(i) for _, i in orders)
    print(f"Engines benchmark: {args.orders} orders ({items} items) per path and round, batches "
          f"of {args.batch} orders, best of {args.rounds}; CPython {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, every server on this machine; load average "
          f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    chosen = ["postgresql-fdw", "spider"] if args.engine == "both" else [args.engine]
    for name in chosen:
        setup = postgres if name == "postgresql-fdw" else spider
        try:
            with setup(args.shards) as engine:
                loads = measure_loads(engine, orders, args.rounds, args.batch)
                reads = measure_reads(engine, orders, args.reads, args.rounds)
        except local_servers.ServerUnavailableError as error:
            print(f"\n{name}: skipped, {error}")
            continue
        report(engine, args.shards, loads, reads)
    print(f"\nload average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
