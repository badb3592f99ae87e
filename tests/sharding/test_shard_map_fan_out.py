"""Queries without a shard key read each shard once while a moved shard's rows are on two
targets (between a move's copy and its cleanup): each target's rows are kept to the logical
shards the control database's map gives it. SQLAlchemy on PostgreSQL, MariaDB and SQLite; the
Django half is in ``shard_map_django_scenario.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Engine

from example_project.sqlalchemy_shop import MOVABLE_RULES, Customer, Order, OrderItem
from snowflake_db.sharding import ControlledShardRouter, ShardRouter
from snowflake_db.sharding.shard_map import flip_shard
from snowflake_db.sqlalchemy.sharding import ShardedRouting, sharded_sessionmaker
from tests.plugins.databases import ScratchDatabase
from tests.sharding.test_shard_map_sqlalchemy import Shop, open_shop


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def shop(
    request: pytest.FixtureRequest, database_factory: Callable[[str], ScratchDatabase]
) -> Iterator[Shop]:
    opened = open_shop(request.param, database_factory)
    # Customers embed their shard in their ID too: every table moves by (id & 15).
    opened.factory = sharded_sessionmaker(
        ShardedRouting(opened.router, MOVABLE_RULES, generator=opened.generator),
        opened.engines, expire_on_commit=False,
    )
    yield opened
    opened.router.close()


def place(shop: Shop, marker: int, count: int) -> tuple[int, list[int]]:
    """``count`` orders (one item each) of one new customer; returns its shard and the IDs."""
    with shop.factory() as session, session.begin():
        customer = Customer(name="c")
        session.add(customer)
        session.flush()
        orders = [Order(customer_id=customer.id, total_cents=marker) for _ in range(count)]
        session.add_all(orders)
        session.add_all(OrderItem(order=o, sku="s", quantity=1, price_cents=1) for o in orders)
    return shop.router.shard_of_id(customer.id), sorted(o.id for o in orders)


def copy_shard(shop: Shop, shard: int, source: str, target: str) -> None:
    """What a move's copy does: the shard's rows of every table on the target too."""
    mask = shop.router.layout.max_shard
    with shop.engines[source].connect() as reader, shop.engines[target].begin() as writer:
        for model in (Customer, Order, OrderItem):
            table = model.__table__
            rows = reader.execute(
                select(table).where(table.c.id.bitwise_and(mask) == shard)
            ).mappings().all()
            if rows:
                writer.execute(insert(table), [dict(r) for r in rows])


def fan_out_reads(shop: Shop, marker: int) -> tuple[list[int], int, int, dict[int, str]]:
    """Orders of ``marker`` by a fan-out select, a fan-out count, a join's count, and the
    shards each read order came from (its identity token)."""
    with shop.factory() as session:
        orders = session.scalars(select(Order).where(Order.total_cents == marker)).all()
        # One count per target (a fan-out merges rows, it does not add them up).
        count = sum(session.scalars(
            select(func.count()).select_from(Order).where(Order.total_cents == marker)
        ))
        joined = sum(session.scalars(
            select(func.count(OrderItem.id)).join(Order, OrderItem.order_id == Order.id)
            .where(Order.total_cents == marker)
        ))
        tokens = {o.id: session.identity_key(instance=o)[2] for o in orders}
    return sorted(o.id for o in orders), count, joined, tokens


def raw_count(engine: Engine, marker: int) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(
            select(func.count()).select_from(Order).where(Order.total_cents == marker)
        ) or 0)


def test_a_moved_shard_is_read_once_before_during_and_after_the_flip(shop: Shop) -> None:
    router = shop.router
    assert isinstance(router, ControlledShardRouter)
    marker = 4242
    shard, ids = place(shop, marker, 3)
    _, other_ids = place(shop, marker, 2)  # another customer, maybe on another shard
    everything = sorted(ids + other_ids)
    source = router.target_of_shard(shard)
    copy_shard(shop, shard, source, "s2")
    assert raw_count(shop.engines["s2"], marker) >= 3  # the copy is there, twice in total

    # Copied, not flipped: s2 serves no shard, nothing is read there.
    found, count, joined, _ = fan_out_reads(shop, marker)
    assert (found, count, joined) == (everything, 5, 5)

    flip_shard(shop.control, shard, "s2")
    router.refresh()
    assert router.fan_out().keep["s2"] == (shard,)
    found, count, joined, tokens = fan_out_reads(shop, marker)
    assert (found, count, joined) == (everything, 5, 5)  # the source's copy is not counted
    assert {tokens[i] for i in ids} == {"s2"}
    assert raw_count(shop.engines[source], marker) >= 3  # still there until the cleanup

    # A fan-out UPDATE changes the rows where the map says they are, never the stale copy.
    with shop.factory() as session, session.begin():
        session.execute(update(Order).where(Order.total_cents == marker)
                        .values(total_cents=marker + 1),
                        execution_options={"synchronize_session": False})
    with shop.engines[source].connect() as connection:
        stale = connection.execute(
            select(Order.id, Order.total_cents).where(Order.id.in_(ids))
        ).all()
    assert sorted(stale) == [(i, marker) for i in ids]  # the stale copy was not touched
    found, count, joined, _ = fan_out_reads(shop, marker + 1)
    assert (found, count, joined) == (everything, 5, 5)

    # The cleanup: the source's rows go; the reads do not change.
    mask = router.layout.max_shard
    with shop.engines[source].begin() as connection:
        for model in (OrderItem, Order, Customer):
            table = model.__table__
            connection.execute(table.delete().where(table.c.id.bitwise_and(mask) == shard))
    assert fan_out_reads(shop, marker + 1)[:3] == (everything, 5, 5)


def test_a_fixed_router_filters_nothing(shop: Shop) -> None:
    fixed = ShardRouter(["s0", "s1"], layout=shop.router.layout)
    plan = fixed.fan_out()
    assert plan.keep == {} and plan.targets == ("s0", "s1")
    routing = ShardedRouting(fixed, MOVABLE_RULES)
    statement = select(Order)
    assert routing.restrict(statement, (1, 2), 15) is not None
    assert routing.restrict(select(func.now()), (1,), 15) is None
