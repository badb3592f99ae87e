"""SQLAlchemy sessions routed by the control database's shard map, and a moving shard's fence
(a real ``SFM01`` trigger on PostgreSQL, as the design's fence) refused, mapped and retried."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import MetaData, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import Session, sessionmaker

from example_project.common import SHOP_LAYOUT
from example_project.sqlalchemy_shop import RULES, Base, Customer, Order
from snowflake_db import SnowflakeGenerator
from snowflake_db.errors import ShardingError, ShardMovedError
from snowflake_db.sharding import ControlledShardRouter, ShardRouter
from snowflake_db.sharding.moved import retry_shard_moved, shard_moved_error
from snowflake_db.sharding.shard_map import (
    VERSION_TABLE,
    add_target,
    create_shard_map_tables,
    flip_shard,
    init_shard_map,
)
from snowflake_db.sqlalchemy.sharding import ShardedRouting, run_transaction, sharded_sessionmaker
from snowflake_db.testing import FakeClock
from snowflake_db.worker import worker_tables
from tests.plugins.databases import ScratchDatabase

NAMES = ["s0", "s1"]
MASK = (1 << SHOP_LAYOUT.shard_bits) - 1
#: The design's fence function (docs/design/shard-moves.md, "The fence").
FENCE_FUNCTION = """
CREATE OR REPLACE FUNCTION sfdb_fence_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SFM01',
        MESSAGE = format('shard %s of %s moved to %s', TG_ARGV[0], TG_TABLE_NAME, TG_ARGV[1]),
        DETAIL = format('shard=%s target=%s move=%s', TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]),
        HINT = 'reload the shard map and retry the transaction';
END $$
"""


def fence(engine: Engine, shard: int, target: str, move_id: int) -> None:
    """The design's write fence on ``shop_order`` for one shard."""
    with engine.begin() as connection:
        connection.execute(text(FENCE_FUNCTION))
        connection.execute(text(
            f"CREATE TRIGGER sfdb_fence_{move_id}_w BEFORE INSERT OR UPDATE ON shop_order "
            f"FOR EACH ROW WHEN ((NEW.id & {MASK}) = {shard}) "
            f"EXECUTE FUNCTION sfdb_fence_refuse('{shard}', '{target}', '{move_id}')"
        ))


@dataclass
class Shop:
    control: Engine
    engines: dict[str, Engine]
    router: ControlledShardRouter
    factory: sessionmaker[ShardedSession]
    generator: SnowflakeGenerator


def open_shop(backend: str, database_factory: Callable[[str], ScratchDatabase]) -> Shop:
    """A control database with the map (``s0``, ``s1``; ``s2`` registered) and three shards."""
    control = database_factory(backend).engine(worker_tables(MetaData()).slots.metadata)
    create_shard_map_tables(control)
    init_shard_map(control, layout=SHOP_LAYOUT, assignment=NAMES, backend=backend)
    add_target(control, "s2", backend=backend)
    engines = {name: database_factory(backend).engine(Base.metadata)
               for name in [*NAMES, "s2"]}
    # A long refresh period and no background check: the router learns of a flip only when
    # the test (or the retry helper) refreshes it.
    router = ShardRouter.from_control(control, layout=SHOP_LAYOUT, refresh_s=600,
                                      background=False)
    assert isinstance(router, ControlledShardRouter)
    generator = SnowflakeGenerator(11, layout=SHOP_LAYOUT, clock=FakeClock(step_ms=1))
    factory = sharded_sessionmaker(ShardedRouting(router, RULES, generator=generator), engines,
                                   expire_on_commit=False)
    return Shop(control, engines, router, factory, generator)


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def shop(
    request: pytest.FixtureRequest, database_factory: Callable[[str], ScratchDatabase]
) -> Iterator[Shop]:
    opened = open_shop(request.param, database_factory)
    yield opened
    opened.router.close()


@pytest.fixture
def pg_shop(database_factory: Callable[[str], ScratchDatabase]) -> Iterator[Shop]:
    """PostgreSQL only: the fence is a PostgreSQL trigger (MariaDB's is issue 32)."""
    opened = open_shop("postgresql", database_factory)
    yield opened
    opened.router.close()


def where_is(shop: Shop, order_id: int) -> list[str]:
    found = []
    for name, engine in shop.engines.items():
        with engine.connect() as connection:
            if connection.execute(select(Order.id).where(Order.id == order_id)).first():
                found.append(name)
    return found


def copy_customer(shop: Shop, customer: Customer, target: str) -> None:
    """What a move's copy does for the customer row: the row on the new target too."""
    with shop.engines[target].begin() as connection:
        connection.execute(insert(Customer).values(id=customer.id, name=customer.name))


def test_sessions_route_by_the_map_after_a_flip(shop: Shop) -> None:
    with shop.factory() as session, session.begin():
        customer = Customer(name="c")
        session.add(customer)
    shard = shop.router.shard_for_key(customer.id)
    source = shop.router.target_of_shard(shard)
    with shop.factory() as session, session.begin():
        before = Order(customer_id=customer.id, total_cents=1)
        session.add(before)
    assert where_is(shop, before.id) == [source]

    copy_customer(shop, customer, "s2")
    flip_shard(shop.control, shard, "s2")
    assert shop.router.target_of_shard(shard) == source  # not refreshed yet
    assert shop.router.refresh() == 2
    with shop.factory() as session, session.begin():
        after = Order(customer_id=customer.id, total_cents=2)
        session.add(after)
    assert where_is(shop, after.id) == ["s2"]
    with shop.factory() as session:
        assert session.get(Order, after.id) is not None  # read from s2
        assert session.get(Order, before.id) is None  # the copy of old rows is the mover's job
        assert session.get(Customer, customer.id) is not None


def test_a_session_factory_needs_every_target_of_the_map(shop: Shop) -> None:
    routing = ShardedRouting(shop.router, RULES)
    with pytest.raises(ShardingError, match=r"no engine for shard target\(s\) \['s2'\]"):
        sharded_sessionmaker(routing, {name: shop.engines[name] for name in NAMES})


# -- the fence, on PostgreSQL ----------------------------------------------------------------


def test_a_fence_error_is_mapped_through_sqlalchemy(pg_shop: Shop) -> None:
    shop = pg_shop
    fence(shop.engines["s0"], 0, "s2", 7)
    with pytest.raises(DBAPIError) as raised, shop.engines["s0"].begin() as connection:
        connection.execute(text("INSERT INTO shop_order (id, customer_id, total_cents) "
                                "VALUES (16, 1, 1)"))
    moved = shard_moved_error(raised.value)
    assert moved is not None
    assert (moved.shard, moved.target, moved.move_id) == (0, "s2", 7)
    assert "shard 0 of shop_order moved to s2" in str(moved)
    with shop.engines["s0"].begin() as connection:  # another shard passes the fence
        connection.execute(text("INSERT INTO shop_customer (id, name) VALUES (1, 'c')"))
        connection.execute(text("INSERT INTO shop_order (id, customer_id, total_cents) "
                                "VALUES (17, 1, 1)"))
    assert shard_moved_error(ValueError("other")) is None


def test_run_transaction_retries_on_the_new_target_after_the_flip(pg_shop: Shop) -> None:
    shop = pg_shop
    with shop.factory() as session, session.begin():
        customer = Customer(name="c")
        session.add(customer)
    shard = shop.router.shard_for_key(customer.id)
    source = shop.router.target_of_shard(shard)
    # The mover: copy, fence the source, flip. This router still has the old map.
    copy_customer(shop, customer, "s2")
    fence(shop.engines[source], shard, "s2", 41)
    flip_shard(shop.control, shard, "s2")
    targets_tried: list[str] = []

    def work(session: Session) -> int:
        targets_tried.append(shop.router.target_of_shard(shard))
        order = Order(customer_id=customer.id, total_cents=3)
        session.add(order)
        session.flush()
        return order.id

    order_id = run_transaction(shop.factory, work, router=shop.router)
    assert targets_tried == [source, "s2"]
    assert where_is(shop, order_id) == ["s2"]


def move_order_rows(shop: Shop, customer: Customer, order_id: int, source: str) -> None:
    """What a finished move leaves: the customer and the order on s2 only, the map flipped."""
    copy_customer(shop, customer, "s2")
    with shop.engines[source].connect() as connection:
        row = connection.execute(select(Order.__table__).where(Order.id == order_id)).one()
    with shop.engines["s2"].begin() as connection:
        connection.execute(insert(Order.__table__).values(**row._mapping))
    with shop.engines[source].begin() as connection:
        connection.execute(text("DELETE FROM shop_order WHERE id = :id"), {"id": order_id})
    flip_shard(shop.control, shop.router.shard_for_key(customer.id), "s2")


def test_an_update_that_reached_the_old_target_after_its_rows_left_runs_again(shop: Shop) -> None:
    """An UPDATE routed with the map of before a move's flip, run on the source after the move
    deleted the shard's rows there, matches nothing: no fence can refuse it. ``run_transaction``
    confirms the routes before the commit, so it is rolled back and run on the new target."""
    with shop.factory() as session, session.begin():
        customer = Customer(name="c")
        session.add(customer)
        session.flush()
        order = Order(customer_id=customer.id, total_cents=1)
        session.add(order)
    source = shop.router.target_of_shard(shop.router.shard_for_key(customer.id))
    move_order_rows(shop, customer, order.id, source)  # the router has not looked since
    tries: list[tuple[str, int]] = []

    def work(session: Session) -> int:
        result = session.execute(update(Order).where(Order.id == order.id)
                                 .values(total_cents=Order.total_cents + 10))
        tries.append((shop.router.target_for_id(order.id), result.rowcount))  # type: ignore[attr-defined]
        return int(result.rowcount)  # type: ignore[attr-defined]

    assert run_transaction(shop.factory, work, router=shop.router) == 1
    assert tries == [(source, 0), ("s2", 1)]
    with shop.engines["s2"].connect() as connection:
        assert connection.execute(select(Order.total_cents).where(Order.id == order.id)
                                  ).scalar_one() == 11
    # Without a router given, the session's own routing is confirmed just the same.
    tries.clear()
    assert run_transaction(shop.factory, work) == 1
    assert tries == [("s2", 1)]


def test_routes_are_confirmed_against_the_control_database_without_a_lease(shop: Shop) -> None:
    """The process holds no lease (no barrier waits for it), so confirming reads the control
    database's map: a flip the router has not seen refuses the transaction, and a check that
    fails is raised (a route that cannot be confirmed is never committed)."""
    shard = 3
    source = shop.router.target_of_shard(shard)
    with shop.router.recording_routes() as routes:
        assert shop.router.target_of_shard(shard) == source
        routes.confirm()  # the map has not changed
        assert routes.targets == {shard: source}
        with shop.control.begin() as connection:  # the control database's map unreadable
            connection.exec_driver_sql(f"ALTER TABLE {VERSION_TABLE} RENAME TO sfdb_hidden")
        try:
            with pytest.raises(DBAPIError, match=f"{VERSION_TABLE}"):
                routes.confirm()
        finally:
            with shop.control.begin() as connection:
                connection.exec_driver_sql(f"ALTER TABLE sfdb_hidden RENAME TO {VERSION_TABLE}")
        flip_shard(shop.control, shard, "s2")
        with pytest.raises(ShardMovedError, match=rf"logical shard {shard} moved from {source} "
                           rf"to s2 \(map version 2\) while this transaction ran on {source}"):
            routes.confirm()
    with shop.router.recording_routes() as routes:
        pass
    routes.confirm()  # nothing routed: nothing to confirm


def test_retrying_ends_with_a_clear_error_while_the_fence_stays(pg_shop: Shop) -> None:
    shop = pg_shop
    with shop.factory() as session, session.begin():
        customer = Customer(name="c")
        session.add(customer)
    shard = shop.router.shard_for_key(customer.id)
    source = shop.router.target_of_shard(shard)
    fence(shop.engines[source], shard, "s2", 42)  # fenced, never flipped
    calls: list[int] = []

    def work(session: Session) -> None:
        calls.append(1)
        session.add(Order(customer_id=customer.id, total_cents=4))

    with pytest.raises(ShardMovedError, match=r"gave up after 3 attempt\(s\) in .* s \(limits: "
                       r"3 attempts, 15 s\): shard \d+ of shop_order moved to s2") as raised:
        run_transaction(shop.factory, work, router=shop.router, attempts=3)
    assert len(calls) == 3
    assert (raised.value.shard, raised.value.target, raised.value.move_id) == (shard, "s2", 42)
    assert where_is(shop, 0) == []  # nothing written anywhere
    with shop.engines[source].connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM shop_order")).scalar() == 0


def test_retry_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="attempts"):
        retry_shard_moved(lambda: 1, attempts=0)
    with pytest.raises(ValueError, match="timeout_s"):
        retry_shard_moved(lambda: 1, timeout_s=0)
