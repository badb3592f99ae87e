"""The async path: AsyncSession and async Core on PostgreSQL through psycopg 3's async driver."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, insert, select

import snowflake_db
from snowflake_db.sqlalchemy import bind_generator, unbind_generator
from tests.plugins.databases import ScratchDatabase, unavailable
from tests.sqlalchemy.sqlalchemy_support import Base, Item, Order, events

try:
    import greenlet  # noqa: F401  (SQLAlchemy's asyncio extension runs on it)
except ImportError:  # pragma: no cover - depends on the environment
    unavailable(
        "SQLAlchemy's asyncio extension needs greenlet: pip install 'SQLAlchemy[asyncio]'",
        allow_module_level=True,
    )

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

WORKER_ID = 91
pytestmark = pytest.mark.static_worker(WORKER_ID)
LAYOUT = snowflake_db.Layout()


def test_async_session_and_core_on_postgresql(postgres_db: ScratchDatabase) -> None:
    url = postgres_db.url.set(drivername="postgresql+psycopg_async")

    async def scenario() -> tuple[list[int], list[int]]:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
                await conn.run_sync(events.metadata.create_all)
            sessions = async_sessionmaker(engine, expire_on_commit=False)
            async with sessions() as session:
                orders = [Order(customer=f"a{i}", items=[Item(sku="x")]) for i in range(10)]
                session.add_all(orders)
                await session.flush()
                assert all(o.id for o in orders)
                await session.execute(insert(Order), [{"customer": f"b{i}"} for i in range(2000)])
                returned = (
                    await session.scalars(
                        insert(Order).returning(Order.id), [{"customer": "r"}] * 30
                    )
                ).all()
                assert len(set(returned)) == 30
                await session.commit()
            async with engine.begin() as conn:
                await conn.execute(events.insert(), [{"n": i} for i in range(3000)])
                await conn.execute(events.insert().values([{"n": -i} for i in range(1, 20)]))

            # two tasks inserting at once share the process generator without duplicates
            async def writer(tag: str) -> None:
                async with sessions() as session:
                    for _ in range(5):
                        session.add_all([Order(customer=tag) for _ in range(100)])
                        await session.commit()

            await asyncio.gather(writer("t1"), writer("t2"))
            async with sessions() as session:
                order_ids = list((await session.scalars(select(Order.id))).all())
                assert await session.scalar(select(func.count(Item.id))) == 10
            async with engine.connect() as conn:
                event_ids = list((await conn.scalars(select(events.c.id))).all())
            return order_ids, event_ids
        finally:
            await engine.dispose()

    order_ids, event_ids = asyncio.run(scenario())
    assert len(order_ids) == len(set(order_ids)) == 10 + 2000 + 30 + 1000
    assert len(event_ids) == len(set(event_ids)) == 3000 + 19
    assert {LAYOUT.decode(i).worker_id for i in order_ids + event_ids} == {WORKER_ID}


def test_engine_binding_follows_an_async_engine(postgres_db: ScratchDatabase) -> None:
    url = postgres_db.url.set(drivername="postgresql+psycopg_async")
    other = snowflake_db.SnowflakeGenerator(5)

    async def scenario() -> list[int]:
        engine = create_async_engine(url)
        bind_generator(other, engine=engine)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(events.metadata.create_all)
                await conn.execute(events.insert(), [{"n": i} for i in range(100)])
            async with AsyncSession(engine) as session:
                return list((await session.scalars(select(events.c.id))).all())
        finally:
            unbind_generator(engine=engine)
            await engine.dispose()

    ids = asyncio.run(scenario())
    assert len(set(ids)) == 100
    assert {LAYOUT.decode(i).worker_id for i in ids} == {5}
