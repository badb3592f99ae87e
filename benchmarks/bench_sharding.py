"""Orders/s of the demo shop's insert path: 4 PostgreSQL shard databases vs one unsharded table.

Run it with ``.venv/bin/python benchmarks/bench_sharding.py`` (``--orders 2000`` for a quicker
run). It creates five scratch databases on the server at ``--url`` (default
``SNOWFLAKE_BENCH_POSTGRES_URL``, else ``SNOWFLAKE_TEST_POSTGRES_URL``, else the local server)
and drops them afterwards.

Both setups run ``example_project.sqlalchemy_shop.place_orders`` -- the demo's insert path:
orders of 1-3 items through a ``ShardedSession``, one transaction per batch of 50 orders and
shard -- with the same generator, customers and random seed. "unsharded" is one database behind
a router with a single target: the same code, so the ratio isolates the cost of routing and of
splitting each batch into one transaction per shard. Each setup runs in this process, then in
``--processes`` spawned processes at once (own worker IDs, start-up not timed). Setups alternate
every round (background load hits both alike); the best round of each is reported. All shard
databases live on one server here: the ratio shows the routing overhead, not the gain of more
servers. A report, never a unit test.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _child(job: tuple[Any, ...]) -> None:
    """One of ``--processes`` concurrent inserters, with its own worker ID and engines."""
    urls, customer_ids, count, seed, worker_id, ready, go, results = job
    from sqlalchemy import create_engine

    from example_project.common import SHOP_LAYOUT
    from example_project.sqlalchemy_shop import RULES, place_orders
    from snowflake_db import SnowflakeGenerator
    from snowflake_db.sharding import ShardRouter
    from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker

    router = ShardRouter(list(urls), layout=SHOP_LAYOUT)
    engines = {name: create_engine(url) for name, url in urls.items()}
    generator = SnowflakeGenerator(worker_id, layout=SHOP_LAYOUT)
    factory = sharded_sessionmaker(ShardedRouting(router, RULES, generator=generator), engines,
                                   expire_on_commit=False)
    with factory() as session:  # open the pools before the clock starts
        for name in urls:
            session.connection(bind_arguments={"shard_id": name})
    ready.put(worker_id)
    go.wait()
    place_orders(factory, router, customer_ids=customer_ids, count=count, seed=seed)
    results.put(worker_id)
    for engine in engines.values():
        engine.dispose()


def run_concurrently(urls: dict[str, str], customer_ids: list[int], orders: int,
                     processes: int, seed: int) -> float:
    """Orders/s of ``processes`` spawned inserters started together (start-up not timed)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    share = orders // processes
    children = [context.Process(target=_child, args=((urls, customer_ids, share, seed * 100 + i,
                                                      100 + i, ready, go, results),))
                for i in range(processes)]
    for child in children:
        child.start()
    for _ in children:
        ready.get(timeout=120)
    started = time.perf_counter()
    go.set()
    for _ in children:
        results.get(timeout=600)
    elapsed = time.perf_counter() - started
    for child in children:
        child.join()
    return share * processes / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(
        "SNOWFLAKE_BENCH_POSTGRES_URL", os.environ.get("SNOWFLAKE_TEST_POSTGRES_URL", DEFAULT_URL)))
    parser.add_argument("--orders", type=int, default=5000, help="orders per round and setup")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--customers", type=int, default=500)
    parser.add_argument("--processes", type=int, default=4,
                        help="also run this many concurrent inserting processes (0: skip)")
    args = parser.parse_args()

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from example_project.common import SHOP_LAYOUT
    from example_project.sqlalchemy_shop import RULES, Base, Customer, place_orders
    from snowflake_db import SnowflakeGenerator
    from snowflake_db.sharding import ShardRouter
    from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker

    server = make_url(args.url)
    names = [f"sfdb_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}_{i}" for i in range(5)]
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for name in names:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    engines = {name: create_engine(server.set(database=name)) for name in names}
    generator = SnowflakeGenerator(1, layout=SHOP_LAYOUT)
    try:
        setups = {
            "4 shard databases": ShardRouter([f"shard{i}" for i in range(4)], layout=SHOP_LAYOUT),
            "1 unsharded database": ShardRouter(["main"], layout=SHOP_LAYOUT),
        }
        binds = {
            "4 shard databases": {f"shard{i}": engines[names[i]] for i in range(4)},
            "1 unsharded database": {"main": engines[names[4]]},
        }
        factories = {}
        customers: dict[str, list[int]] = {}
        for label, router in setups.items():
            for engine in binds[label].values():
                Base.metadata.create_all(engine)
            factory = sharded_sessionmaker(ShardedRouting(router, RULES, generator=generator),
                                           binds[label], expire_on_commit=False)
            with factory() as session, session.begin():
                rows = [Customer(name=f"c{i}") for i in range(args.customers)]
                session.add_all(rows)
            factories[label] = factory
            customers[label] = [row.id for row in rows]

        best: dict[str, float] = {}
        for round_number in range(args.rounds):
            order = list(setups) if round_number % 2 == 0 else list(reversed(setups))
            for label in order:
                started = time.perf_counter()
                place_orders(factories[label], setups[label], customer_ids=customers[label],
                             count=args.orders, seed=round_number)
                rate = args.orders / (time.perf_counter() - started)
                best[label] = max(best.get(label, 0.0), rate)
                print(f"  round {round_number + 1} {label}: {rate:,.0f} orders/s", file=sys.stderr)
        urls = {
            "4 shard databases": {f"shard{i}": server.set(database=names[i]).render_as_string(
                hide_password=False) for i in range(4)},
            "1 unsharded database": {"main": server.set(database=names[4]).render_as_string(
                hide_password=False)},
        }
        if args.processes > 0:
            for round_number in range(args.rounds):
                order = list(setups) if round_number % 2 == 0 else list(reversed(setups))
                for label in order:
                    rate = run_concurrently(urls[label], customers[label], args.orders,
                                            args.processes, round_number)
                    key = f"{label}, {args.processes} processes"
                    best[key] = max(best.get(key, 0.0), rate)
                    print(f"  round {round_number + 1} {key}: {rate:,.0f} orders/s",
                          file=sys.stderr)
    finally:
        for engine in engines.values():
            engine.dispose()
        with admin.connect() as connection:
            for name in names:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    print(f"Sharded insert path on PostgreSQL ({server.host}), {args.orders} orders per round, "
          f"best of {args.rounds}, CPython {platform.python_version()}, {os.cpu_count()} CPUs")
    print()
    print("| setup | processes | orders/s | ratio vs unsharded (same processes) |")
    print("|---|---:|---:|---:|")
    for suffix, count in (("", 1), (f", {args.processes} processes", args.processes)):
        reference = best.get(f"1 unsharded database{suffix}")
        for label in ("1 unsharded database", "4 shard databases"):
            rate = best.get(f"{label}{suffix}")
            if rate is not None and reference:
                print(f"| {label} | {count} | {rate:,.0f} | {rate / reference:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
