"""The shop on SQLAlchemy: orders sharded over N databases with ``ShardedSession``.

``python -m example_project.sqlalchemy_shop`` runs on SQLite files; ``--control-url URL
--shard-url URL --shard-url URL ...`` runs on PostgreSQL/MariaDB. Same flow as the Django shop
(``python -m example_project``): create tables, place orders from several processes, verify.
``--engine postgresql-fdw|spider`` places the orders through a distributed engine instead
(:mod:`example_project.engine_shop`).
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Integer, String, create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, sessionmaker

from snowflake_db.sharding import ShardRouter, ShardRule
from snowflake_db.sqlalchemy.public_ids import public_id_property
from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker

from .common import (
    BadInputError,
    Checks,
    Options,
    check_find_and_shard,
    display_url,
    iso,
    one_line,
    parse_options,
    place_orders_in_processes,
    plural,
    report_worker,
)
from .public_numbers import check_public_numbers, ensure_demo_key


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "shop_customer"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(100))


class Order(Base):
    __tablename__ = "shop_order"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    customer_id: Mapped[int] = mapped_column(ForeignKey("shop_customer.id"), index=True)
    total_cents: Mapped[int] = mapped_column(Integer)
    items: Mapped[list[OrderItem]] = relationship(back_populates="order")

    # What customers see: derived from id, nothing stored (keys: SNOWFLAKE_DB_PUBLIC_ID_KEYS).
    public_id = public_id_property("orders", group=4)


class OrderItem(Base):
    __tablename__ = "shop_orderitem"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    order_id: Mapped[int] = mapped_column(ForeignKey("shop_order.id"), index=True)
    sku: Mapped[str] = mapped_column(String(32))
    quantity: Mapped[int] = mapped_column(Integer)
    price_cents: Mapped[int] = mapped_column(Integer)
    order: Mapped[Order] = relationship(back_populates="items")


#: Customers live on the shard of their ID's hash; orders embed their customer's shard; items
#: embed their order's shard. So a customer, their orders and items share one database.
RULES = {
    Customer: ShardRule(key_fields=("id",)),
    Order: ShardRule(id_fields=("id",), key_fields=("customer_id",)),
    OrderItem: ShardRule(id_fields=("id", "order_id")),
}
#: The same tables with every row's shard in its own ID's low bits (a customer's ID embeds a
#: shard, orders and items embed their customer's): what a shard move moves, by ``(id & 15)``
#: on each table (``python -m example_project --grow``).
MOVABLE_RULES = {
    Customer: ShardRule(id_fields=("id",)),
    Order: ShardRule(id_fields=("id", "customer_id")),
    OrderItem: ShardRule(id_fields=("id", "order_id")),
}
BATCH = 50


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")

        return engine
    return create_engine(url, pool_pre_ping=True)


def connect_all(urls: dict[str, str]) -> dict[str, Engine]:
    """Engines by name; a database that does not answer is a one-line :class:`BadInputError`."""
    engines = {}
    for name, url in urls.items():
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql("SELECT 1")
        except Exception as error:
            raise BadInputError(
                f"cannot connect to {name} ({display_url(url)}): {one_line(error)}"
            ) from None
        engines[name] = engine
    return engines


def session_factory(
    router: ShardRouter, engines: dict[str, Engine]
) -> sessionmaker[ShardedSession]:
    return sharded_sessionmaker(ShardedRouting(router, RULES), engines, expire_on_commit=False)


def place_orders(
    factory: sessionmaker[ShardedSession],
    router: ShardRouter,
    *,
    customer_ids: Sequence[int],
    count: int,
    seed: int,
    progress: Callable[[int], None] = lambda n: None,
) -> list[int]:
    """The demo's insert path: orders with 1-3 items, one transaction per shard and batch.

    A transaction never spans shards (there is no cross-database atomicity, and on SQLite two
    processes each holding one shard's write lock would wait for each other).
    """
    rng = random.Random(seed)
    ids: list[int] = []
    done = 0
    while done < count:
        size = min(BATCH, count - done)
        by_shard: dict[str, list[Order]] = {}
        for _ in range(size):
            items = [
                OrderItem(sku=f"SKU-{rng.randrange(1000):04d}", quantity=rng.randint(1, 3),
                          price_cents=rng.randrange(100, 10_000))
                for _ in range(rng.randint(1, 3))
            ]
            customer_id = rng.choice(customer_ids)
            order = Order(customer_id=customer_id, items=items,
                          total_cents=sum(i.quantity * i.price_cents for i in items))
            by_shard.setdefault(router.target_for_key(customer_id), []).append(order)
        for orders in by_shard.values():
            with factory() as session, session.begin():
                session.add_all(orders)
            ids.extend(order.id for order in orders)
        done += size
        progress(size)
    return ids


def _child(options: Options, customer_ids: list[int], count: int, seed: int, queue: Any) -> None:
    from .workers import configure_worker

    report_worker(queue, seed, configure_worker(options.control_url).ensure_worker())
    router = options.router()
    engines = {n: make_engine(u) for n, u in options.shard_urls_by_name.items()}
    factory = session_factory(router, engines)
    ids = place_orders(factory, router, customer_ids=customer_ids, count=count, seed=seed,
                       progress=queue.put)
    queue.put(ids)


@contextmanager
def count_queries(engines: dict[str, Engine]) -> Iterator[Counter[str]]:
    """Count the statements each engine runs inside the block."""
    counts: Counter[str] = Counter()
    listeners = []
    for name, engine in engines.items():
        def listener(*args: Any, _name: str = name) -> None:
            counts[_name] += 1

        event.listen(engine, "before_cursor_execute", listener)
        listeners.append((engine, listener))
    try:
        yield counts
    finally:
        for engine, listener in listeners:
            event.remove(engine, "before_cursor_execute", listener)


def run(options: Options) -> int:
    router = options.router()
    ensure_demo_key()
    find_ids = check_find_and_shard(options, router)
    engines = connect_all(
        {"control": options.control_url, **options.shard_urls_by_name}
    )
    control = engines.pop("control")
    control.dispose()
    print(f"SQLAlchemy shop: {plural(len(engines), 'shard database')}, "
          f"{plural(router.logical_shards, 'logical shard')}, worker table on "
          f"{display_url(options.control_url)}")
    for name, url in zip(options.shard_names, options.shard_urls, strict=True):
        print(f"  {name}: {display_url(url)}  logical shards {router.shards_on(name)}")

    # 1. migrate: the shop tables on every shard (recreated: the demo owns them).
    for engine in engines.values():
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)

    from .workers import configure_worker

    generator = configure_worker(options.control_url)
    print(f"  this process (pid {os.getpid()}) leased worker ID {generator.ensure_worker()} "
          "for the customers")
    factory = session_factory(router, engines)
    with factory() as session, session.begin():
        customers = [Customer(name=f"customer {i}") for i in range(options.customers)]
        session.add_all(customers)
    customer_ids = [c.id for c in customers]

    # 2. place orders from several processes at once.
    placed, elapsed = place_orders_in_processes(options, customer_ids, _child)
    return verify(options, router=router, engines=engines, factory=factory, placed=placed,
                  elapsed=elapsed, find_ids=find_ids)


def verify(
    options: Options,
    *, router: ShardRouter, engines: dict[str, Engine],
    factory: sessionmaker[ShardedSession], placed: list[int], elapsed: float, find_ids: list[int],
) -> int:
    checks = Checks()
    print(f"placed {plural(len(placed), 'order')} in {elapsed:.2f} s: "
          f"{len(placed) / max(elapsed, 1e-9):,.0f} orders/s")
    checks.check(len(placed) == options.orders,
                 f"{options.orders} orders reported by the processes")

    # 3. zero duplicates, every order on the shard its ID names.
    stored: dict[str, list[int]] = {}
    for name, engine in engines.items():
        with engine.connect() as connection:
            stored[name] = list(connection.scalars(select(Order.id)))
    all_ids = [i for ids in stored.values() for i in ids]
    checks.check(len(all_ids) == len(set(all_ids)) == len(set(placed)) == len(placed),
                 f"zero duplicate IDs ({len(all_ids)} stored, {len(set(all_ids))} distinct)")
    misplaced = [i for name, ids in stored.items() for i in ids if router.target_for_id(i) != name]
    checks.check(not misplaced, f"every order is on the shard its ID names ({len(misplaced)} not)")
    print("orders per shard:")
    for name, ids in stored.items():
        print(f"  {name}: {len(ids)}")

    # 4. look orders up by ID: one shard touched per lookup.
    sample = random.Random(7).sample(placed, min(20, len(placed)))
    wrong = []
    with factory() as session:
        for order_id in sample + find_ids:
            with count_queries(engines) as counts:
                order = session.get(Order, order_id)
                items = list(order.items) if order is not None else []
            expected = router.target_for_id(order_id)
            if order_id in find_ids:
                found = f"on {expected}, {plural(len(items), 'item')}" if order else "not found"
                print(f"  --find {order_id}: {found} (queried {sorted(counts)})")
            one_shard = set(counts) == {expected}
            if order_id in sample and (order is None or not one_shard
                                       or any(i.order_id != order_id for i in items)):
                wrong.append(order_id)
    checks.check(not wrong, f"{len(sample)} lookups by ID each found the order querying only "
                 f"its shard ({len(wrong)} did not)")

    # 5. orders of one customer: one shard; a time range: a primary-key range on each shard.
    customer_id = session_customer = None
    with factory() as session:
        customer_id = session.scalars(select(Order.customer_id).limit(1)).first()
        with count_queries(engines) as counts:
            statement = select(Order).where(Order.customer_id == customer_id)
            session_customer = session.scalars(statement).all()
    checks.check(len(counts) == 1, f"orders of customer {customer_id}: {len(session_customer)} "
                 f"found querying {plural(len(counts), 'shard')}")
    def find_by_number(number: str) -> tuple[int | None, int]:
        with factory() as session, count_queries(engines) as counts:
            found = session.scalars(select(Order.id).where(Order.public_id == number)).first()
        return found, len(counts)

    check_public_numbers(checks, placed[0], find_by_number)

    times = sorted(router.layout.decode(i).timestamp_ms for i in placed)
    start, end = times[0], times[len(times) // 2]
    low, high = router.id_range(start, end)
    expected_count = sum(1 for t in times if start <= t <= end)
    with factory() as session, count_queries(engines) as counts:
        in_window = session.scalars(select(Order.id).where(Order.id.between(low, high))).all()
    checks.check(len(in_window) == expected_count,
                 f"time range {iso(start)}..{iso(end)}: {len(in_window)} orders (expected "
                 f"{expected_count}) via "
                 f"id BETWEEN {low} AND {high} on {plural(len(counts), 'shard')}")

    if options.shard is not None:
        target = router.target_of_shard(options.shard)
        with engines[target].connect() as connection:
            rows = list(connection.scalars(select(Order.id).where(Order.id.in_(
                [i for i in stored[target] if router.shard_of_id(i) == options.shard][:5]))))
        print(f"logical shard {options.shard} lives on {target}; first orders: {rows}")
    for engine in engines.values():
        engine.dispose()
    return checks.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_options(argv, "example_project.sqlalchemy_shop", __doc__.splitlines()[0],
                                data_subdir="sqlalchemy", engines=True)
        if options.engine:
            from .engine_shop import run as run_on_engine

            return run_on_engine(options)
        return run(options)
    except BadInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
