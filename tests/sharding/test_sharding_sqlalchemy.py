"""ShardedSession choosers and the table-per-shard helper on 4 real databases per backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, create_engine, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import sessionmaker

from example_project.common import SHOP_LAYOUT
from example_project.sqlalchemy_shop import RULES, Base, Customer, Order, OrderItem, count_queries
from snowflake_db import SnowflakeGenerator
from snowflake_db.sharding import ShardingError, ShardRouter, ShardRule
from snowflake_db.sqlalchemy.sharding import ShardedRouting, TablePerShard, sharded_sessionmaker
from snowflake_db.testing import FakeClock
from tests.plugins.databases import ScratchDatabase

NAMES = ["shard0", "shard1", "shard2", "shard3"]


@pytest.fixture(params=["postgresql", "sqlite"])
def shard_engines(
    request: pytest.FixtureRequest, database_factory: Callable[[str], ScratchDatabase]
) -> Iterator[dict[str, Engine]]:
    engines = {name: create_engine(database_factory(request.param).url) for name in NAMES}
    for engine in engines.values():
        Base.metadata.create_all(engine)
    yield engines
    for engine in engines.values():
        engine.dispose()


@pytest.fixture
def generator() -> SnowflakeGenerator:
    return SnowflakeGenerator(11, layout=SHOP_LAYOUT, clock=FakeClock(step_ms=1))


def make_factory(
    engines: dict[str, Engine], generator: SnowflakeGenerator
) -> tuple[ShardRouter, sessionmaker[ShardedSession]]:
    router = ShardRouter(NAMES, layout=SHOP_LAYOUT)
    routing = ShardedRouting(router, RULES, generator=generator)
    return router, sharded_sessionmaker(routing, engines, expire_on_commit=False)


def stored_ids(engines: dict[str, Engine], table: str) -> dict[str, set[int]]:
    result = {}
    for name, engine in engines.items():
        with engine.connect() as connection:
            result[name] = set(connection.exec_driver_sql(f"SELECT id FROM {table}").scalars())
    return result


def test_writes_reads_and_queries_hit_the_right_shards(
    shard_engines: dict[str, Engine], generator: SnowflakeGenerator
) -> None:
    router, factory = make_factory(shard_engines, generator)
    with factory() as session, session.begin():
        customers = [Customer(name=f"c{i}") for i in range(40)]
        session.add_all(customers)
    orders = []
    for customer in customers:
        with factory() as session, session.begin():
            order = Order(customer_id=customer.id, total_cents=100,
                          items=[OrderItem(sku="A", quantity=1, price_cents=100),
                                 OrderItem(sku="B", quantity=2, price_cents=50)])
            session.add(order)
        orders.append(order)

    # Writes: every row in the database its ID (or key) names; a customer's rows together.
    customer_rows = stored_ids(shard_engines, "shop_customer")
    order_rows = stored_ids(shard_engines, "shop_order")
    item_rows = stored_ids(shard_engines, "shop_orderitem")
    for customer, order in zip(customers, orders, strict=True):
        home = router.target_for_key(customer.id)
        assert customer.id in customer_rows[home]
        assert order.id in order_rows[home] and router.target_for_id(order.id) == home
        assert all(item.id in item_rows[home] for item in order.items)
    assert sum(map(len, order_rows.values())) == 40
    assert len([rows for rows in order_rows.values() if rows]) > 1

    with factory() as session:
        # get() by ID: one shard.
        for order in orders[:10]:
            with count_queries(shard_engines) as counts:
                found = session.get(Order, order.id)
                assert found is not None and found.customer_id == order.customer_id
                assert len(found.items) == 2  # lazy load stays on the parent's shard
            assert set(counts) == {router.target_for_id(order.id)}
        # Query by shard key: one shard.
        customer = customers[3]
        with count_queries(shard_engines) as counts:
            mine = session.scalars(select(Order).where(Order.customer_id == customer.id)).all()
        assert [o.id for o in mine] == [orders[3].id]
        assert set(counts) == {router.target_for_key(customer.id)}
        # IN over two IDs: their shards only.
        pair = [orders[0].id, orders[1].id]
        with count_queries(shard_engines) as counts:
            got = session.scalars(select(Order.id).where(Order.id.in_(pair))).all()
        assert sorted(got) == sorted(pair)
        assert set(counts) == {router.target_for_id(i) for i in pair}
        # OR with a non-routing condition, or no routing condition: every shard.
        with count_queries(shard_engines) as counts:
            session.scalars(select(Order).where(
                or_(Order.id == orders[0].id, Order.total_cents > 1000))).all()
        assert set(counts) == set(NAMES)
        with count_queries(shard_engines) as counts:
            everything = session.scalars(select(Order)).all()
        assert len(everything) == 40 and set(counts) == set(NAMES)
        # A time window: an ID range, on every shard.
        times = sorted(SHOP_LAYOUT.decode(o.id).timestamp_ms for o in orders)
        low, high = router.id_range(times[5], times[20])
        window = session.scalars(select(Order.id).where(Order.id.between(low, high))).all()
        assert len(window) == 16
        # A bulk INSERT cannot be split: a clear error instead of writing to every shard.
        from sqlalchemy import insert

        with pytest.raises(ShardingError, match="bulk INSERT"):
            session.execute(insert(Order), [{"id": 1, "customer_id": 1, "total_cents": 1}])


def test_remapped_router_reads_moved_rows(
    shard_engines: dict[str, Engine], generator: SnowflakeGenerator
) -> None:
    """Moving logical shard 5 to another database: copy its rows, switch the map, same IDs."""
    router, factory = make_factory(shard_engines, generator)
    with factory() as session, session.begin():
        customers = [Customer(name=f"c{i}") for i in range(64)]
        session.add_all(customers)
    on_five = [c for c in customers if router.shard_for_key(c.id) == 5]
    assert on_five
    with factory() as session, session.begin():
        session.add_all([Order(customer_id=c.id, total_cents=7) for c in on_five])
    old = router.target_of_shard(5)
    new = "shard0" if old != "shard0" else "shard2"
    with shard_engines[old].begin() as source, shard_engines[new].begin() as target:
        for table in ("shop_customer", "shop_order"):
            rows = [dict(r._mapping) for r in source.execute(
                select(Base.metadata.tables[table]))]
            moving = [r for r in rows if (router.shard_for_key(r["id"]) == 5 if table ==
                                          "shop_customer" else router.shard_of_id(r["id"]) == 5)]
            target.execute(Base.metadata.tables[table].insert(), moving)
    moved = router.moved(5, new)
    factory2 = sharded_sessionmaker(ShardedRouting(moved, RULES, generator=generator),
                                    shard_engines)
    with factory2() as session:
        for customer in on_five:
            with count_queries(shard_engines) as counts:
                got = session.scalars(select(Order).where(Order.customer_id == customer.id)).all()
            assert len(got) == 1
            assert set(counts) == {new}


def test_mixing_rules_must_be_single_field() -> None:
    router = ShardRouter(NAMES, logical_shards=16)
    with pytest.raises(ShardingError, match="shard_bits"):
        ShardedRouting(router, {"shop_order": ShardRule(id_fields=("id",),
                                                        key_fields=("customer_id",))})


def test_table_per_shard_in_one_database(
    postgres_db: ScratchDatabase, generator: SnowflakeGenerator
) -> None:
    engine = create_engine(postgres_db.url)
    metadata = MetaData()
    orders = Table("orders", metadata,
                   Column("id", BigInteger, primary_key=True, autoincrement=False),
                   Column("customer_id", BigInteger, nullable=False),
                   Column("total_cents", Integer, nullable=False))
    router = ShardRouter([f"orders_{i:02d}" for i in range(16)], layout=SHOP_LAYOUT)
    per_shard = TablePerShard(orders, router, generator=generator,
                              rule=ShardRule(id_fields=("id",), key_fields=("customer_id",)))
    try:
        per_shard.create_all(engine)
        with engine.connect() as connection:
            names = set(connection.exec_driver_sql(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'orders_%%'").scalars())
        assert names == {f"orders_{i:02d}" for i in range(16)}
        with engine.begin() as connection:
            ids = per_shard.insert(connection, [
                {"customer_id": c, "total_cents": c} for c in range(200)])
        for customer, order_id in enumerate(ids):
            assert router.shard_of_id(order_id) == router.shard_for_key(customer)
            table = per_shard.table_for_id(order_id)
            assert table.name == f"orders_{router.shard_for_key(customer):02d}"
            assert table is per_shard.table_for_key(customer)
        with engine.connect() as connection:
            row = per_shard.get(connection, ids[17])
            assert row is not None and row.customer_id == 17
            assert per_shard.get(connection, ids[17] ^ 1 << 40) is None
            a_year_on = datetime.now(UTC) + timedelta(days=366)  # (replace(year=) fails on Feb 29)
            total = sum(len(connection.execute(s).all())
                        for s in per_shard.select_time_range(datetime(2020, 1, 2, tzinfo=UTC),
                                                             a_year_on))
            assert total == 200
    finally:
        per_shard.drop_all(engine)
        engine.dispose()
