"""Snowflake defaults through every SQLAlchemy insert path, on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import pytest
from sqlalchemy import (
    BigInteger,
    func,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.orm import Session

import snowflake_db
from tests.plugins.databases import ScratchDatabase
from tests.sqlalchemy.sqlalchemy_support import Base, Item, Order, core, event_refs, events, plain

WORKER_ID = 37
pytestmark = pytest.mark.static_worker(WORKER_ID)
LAYOUT = snowflake_db.Layout()


def _check_ids(ids: list[int], expected: int) -> None:
    assert len(ids) == expected
    assert len(set(ids)) == expected
    assert all(LAYOUT.decode(i).worker_id == WORKER_ID for i in ids)


def test_every_insert_path_issues_one_id_per_row(any_db: ScratchDatabase) -> None:
    engine = any_db.engine(Base.metadata, core)
    try:
        with Session(engine) as session:
            # ORM unit of work: ids at flush
            orders = [
                Order(customer=f"c{i}", items=[Item(sku="a"), Item(sku="b")]) for i in range(5)
            ]
            session.add_all(orders)
            session.flush()
            assert all(o.id is not None for o in orders)
            assert all(item.order_id == o.id for o in orders for item in o.items)
            # ORM bulk INSERT with a list of dicts
            session.execute(insert(Order), [{"customer": f"bulk{i}"} for i in range(50)])
            # ORM bulk INSERT ... RETURNING
            returned = session.scalars(
                insert(Order).returning(Order.id), [{"customer": f"ret{i}"} for i in range(20)]
            ).all()
            assert len(set(returned)) == 20
            session.commit()
        with engine.begin() as conn:
            # Core multi-VALUES
            conn.execute(events.insert().values([{"n": i} for i in range(30)]))
            # Core executemany (insertmanyvalues where the dialect has it)
            conn.execute(events.insert(), [{"n": i} for i in range(40)])
            # single row with RETURNING
            one = conn.execute(events.insert().returning(events.c.id), {"n": -1}).scalar_one()
            many = conn.execute(
                events.insert().returning(events.c.id), [{"n": i} for i in range(25)]
            ).scalars().all()
            assert one not in many and len(set(many)) == 25
            # the plain Column(..., default=snowflake_default) form
            conn.execute(plain.insert(), [{"n": i} for i in range(10)])
            conn.execute(plain.insert().values([{"n": i} for i in range(10)]))
            conn.execute(event_refs.insert(), [{"event_id": one}, {"event_id": many[0]}])
        with engine.connect() as conn:
            order_ids = conn.scalars(select(Order.id)).all()
            _check_ids(list(order_ids), 5 + 50 + 20)
            assert set(returned) <= set(order_ids)
            _check_ids(list(conn.scalars(select(Item.id)).all()), 10)
            _check_ids(list(conn.scalars(select(events.c.id)).all()), 30 + 40 + 1 + 25)
            _check_ids(list(conn.scalars(select(plain.c.id)).all()), 20)
            assert conn.scalar(select(func.count()).select_from(event_refs)) == 2
    finally:
        engine.dispose()


def test_ddl_is_plain_bigint_without_autoincrement(any_db: ScratchDatabase) -> None:
    engine = any_db.engine(Base.metadata, core)
    try:
        inspector = inspect(engine)
        for table in ("orders", "order_items", "events"):
            columns = {c["name"]: c for c in inspector.get_columns(table)}
            assert isinstance(columns["id"]["type"], BigInteger), columns["id"]
            assert not columns["id"].get("autoincrement"), columns["id"]
            assert columns["id"]["default"] is None
            assert "identity" not in columns["id"] or not columns["id"]["identity"]
        fk = {c["name"]: c for c in inspector.get_columns("order_items")}["order_id"]
        assert isinstance(fk["type"], BigInteger)
        with engine.connect() as conn:
            if any_db.backend == "postgresql":
                assert conn.scalar(text("SELECT count(*) FROM pg_class WHERE relkind = 'S'")) == 0
            elif any_db.backend == "mariadb":
                extra = conn.scalar(
                    text(
                        "SELECT extra FROM information_schema.columns WHERE table_schema = "
                        "DATABASE() AND table_name = 'orders' AND column_name = 'id'"
                    )
                )
                assert "auto_increment" not in (extra or "").lower()
            else:
                sql = conn.scalar(text("SELECT sql FROM sqlite_master WHERE name = 'orders'"))
                assert "id BIGINT NOT NULL" in sql and "AUTOINCREMENT" not in sql.upper()
    finally:
        engine.dispose()


def test_ten_thousand_rows_get_distinct_ids_of_the_worker(any_db: ScratchDatabase) -> None:
    engine = any_db.engine(Base.metadata, core)
    try:
        with engine.begin() as conn:
            conn.execute(events.insert(), [{"n": i} for i in range(10_000)])
        with Session(engine) as session:
            session.execute(insert(Order), [{"customer": str(i)} for i in range(10_000)])
            session.commit()
        with engine.connect() as conn:
            _check_ids(list(conn.scalars(select(events.c.id)).all()), 10_000)
            _check_ids(list(conn.scalars(select(Order.id)).all()), 10_000)
    finally:
        engine.dispose()


def test_largest_id_round_trips_through_bigint(any_db: ScratchDatabase) -> None:
    engine = any_db.engine(Base.metadata, core)
    largest = LAYOUT.max_id
    assert largest == 2**63 - 1
    try:
        with engine.begin() as conn:
            conn.execute(events.insert(), [{"id": largest, "n": 1}, {"id": 0, "n": 2}])
            conn.execute(event_refs.insert(), {"event_id": largest})
        with engine.connect() as conn:
            assert conn.scalar(select(events.c.id).where(events.c.n == 1)) == largest
            assert conn.scalar(select(event_refs.c.event_id)) == largest
            assert conn.scalar(select(func.max(events.c.id))) == largest
        assert LAYOUT.decode(largest).worker_id == LAYOUT.max_worker_id
    finally:
        engine.dispose()
