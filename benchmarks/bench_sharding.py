"""Orders/s of the demo shop's insert path: 4 PostgreSQL shard databases vs one unsharded table.

Run it with ``.venv/bin/python benchmarks/bench_sharding.py`` (``--orders 2000`` for a quicker
run). It creates five scratch databases on the server at ``--url`` (default
``SNOWFLAKE_BENCH_POSTGRES_URL``, else ``SNOWFLAKE_TEST_POSTGRES_URL``, else the local server)
and drops them afterwards.

Both setups run ``example_project.sqlalchemy_shop.place_orders`` -- the demo's insert path:
orders of 1-3 items through a ``ShardedSession``, one transaction per batch of 50 orders and
shard -- with the same generator, customers and random seed. "unsharded" is one database behind
a router with a single target: the same code, so the ratio isolates the cost of routing and of
splitting each batch into one transaction per shard. Setups alternate every round (background
load hits both alike); the best round of each is reported. A report, never a unit test.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(
        "SNOWFLAKE_BENCH_POSTGRES_URL", os.environ.get("SNOWFLAKE_TEST_POSTGRES_URL", DEFAULT_URL)))
    parser.add_argument("--orders", type=int, default=5000, help="orders per round and setup")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--customers", type=int, default=500)
    args = parser.parse_args()

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from example_project.common import SHOP_LAYOUT
    from example_project.sqlalchemy_shop import RULES, Base, Customer, place_orders
    from snowflake_db import SnowflakeGenerator
    from snowflake_db.sharding import ShardRouter
    from snowflake_db.sharding.sqlalchemy import ShardedRouting, sharded_sessionmaker

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
    finally:
        for engine in engines.values():
            engine.dispose()
        with admin.connect() as connection:
            for name in names:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    base = best["1 unsharded database"]
    print(f"Sharded insert path on PostgreSQL ({server.host}), {args.orders} orders per round, "
          f"best of {args.rounds}, one process, CPython {platform.python_version()}")
    print()
    print("| setup | orders/s | ratio vs unsharded |")
    print("|---|---:|---:|")
    for label in ("1 unsharded database", "4 shard databases"):
        print(f"| {label} | {best[label]:,.0f} | {best[label] / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
