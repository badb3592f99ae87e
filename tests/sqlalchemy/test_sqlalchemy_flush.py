"""ORM objects get their Snowflake key at flush (``before_insert``), so the unit of work sends
their INSERTs as one plain executemany, on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy import BigInteger, ForeignKey, Integer, String, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import snowflake_db
from snowflake_db.sqlalchemy import (
    SnowflakeDefault,
    bind_generator,
    snowflake_default,
    snowflake_mapped_column,
    unbind_generator,
)
from tests.plugins.databases import ScratchDatabase

WORKER_ID = 43
pytestmark = pytest.mark.static_worker(WORKER_ID)
LAYOUT = snowflake_db.Layout()
SHARDED = snowflake_db.Layout(sequence_bits=8, shard_bits=4)


class Base(DeclarativeBase):
    pass


class Ticket(Base):
    __tablename__ = "flush_tickets"
    id: Mapped[int] = snowflake_mapped_column()
    code: Mapped[str] = mapped_column(String(20), unique=True)


class PlainTicket(Base):  # the bare one-liner default
    __tablename__ = "flush_plain_tickets"
    id: Mapped[int] = mapped_column(
        BigInteger, primary_key=True, default=snowflake_default, autoincrement=False
    )
    code: Mapped[str] = mapped_column(String(20))


class ShardedTicket(Base):  # the shard comes from the row: left to the INSERT
    __tablename__ = "flush_sharded_tickets"
    id: Mapped[int] = snowflake_mapped_column(
        default=SnowflakeDefault(shard_for=lambda row: row["customer"] % 4)
    )
    customer: Mapped[int] = mapped_column(Integer)


class Vehicle(Base):  # joined-table inheritance: the key lives on the base table
    __tablename__ = "flush_vehicles"
    id: Mapped[int] = snowflake_mapped_column()
    kind: Mapped[str] = mapped_column(String(10))
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "vehicle"}


class Car(Vehicle):
    __tablename__ = "flush_cars"
    id: Mapped[int] = mapped_column(BigInteger, ForeignKey("flush_vehicles.id"), primary_key=True)
    seats: Mapped[int] = mapped_column(Integer)
    __mapper_args__ = {"polymorphic_identity": "car"}


@pytest.fixture
def engine(any_db: ScratchDatabase) -> Engine:
    return any_db.engine(Base.metadata)


@pytest.fixture
def inserts(engine: Engine) -> Iterator[list[tuple[str, int]]]:
    """(statement, number of parameter sets) of every INSERT the engine sends."""
    sent: list[tuple[str, int]] = []

    def record(**kw: Any) -> None:
        statement: str = kw["statement"]
        if statement.lstrip().upper().startswith("INSERT"):
            sent.append((statement, len(kw["parameters"]) if kw["executemany"] else 1))

    event.listen(engine, "before_cursor_execute", record, named=True)
    yield sent
    event.remove(engine, "before_cursor_execute", record)


def test_new_objects_are_inserted_with_one_executemany(
    engine: Engine, inserts: list[tuple[str, int]]
) -> None:
    tickets = [Ticket(code=f"t{n}") for n in range(2000)]
    plain = [PlainTicket(code=f"p{n}") for n in range(300)]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add_all(tickets + plain)
    assert sorted((statement.split()[2], rows) for statement, rows in inserts) == [
        ("flush_plain_tickets", 300),
        ("flush_tickets", 2000),
    ]
    assert not any("RETURNING" in statement.upper() for statement, _ in inserts)
    ids = [ticket.id for ticket in tickets]
    assert all(a < b for a, b in pairwise(ids))  # in the order the objects were added
    with Session(engine) as session:
        stored = dict(session.execute(select(Ticket.code, Ticket.id)).all())
        plain_ids = set(session.scalars(select(PlainTicket.id)))
    assert stored == {ticket.code: ticket.id for ticket in tickets}
    assert plain_ids == {ticket.id for ticket in plain}
    assert {LAYOUT.decode(i).worker_id for i in [*ids, *plain_ids]} == {WORKER_ID}


def test_keys_set_by_the_caller_are_kept(engine: Engine) -> None:
    own = snowflake_db.SnowflakeGenerator(7).next_id()
    with Session(engine, expire_on_commit=False) as session, session.begin():
        mine, theirs = Ticket(id=own, code="mine"), Ticket(code="theirs")
        session.add_all([mine, theirs])
    assert mine.id == own
    assert LAYOUT.decode(theirs.id).worker_id == WORKER_ID


def test_engine_and_table_bindings_apply_at_flush(engine: Engine) -> None:
    bind_generator(snowflake_db.SnowflakeGenerator(11), engine=engine)
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            by_engine = Ticket(code="engine")
            session.add(by_engine)
        bind_generator(snowflake_db.SnowflakeGenerator(12), table=Ticket.__table__)
        with Session(engine, expire_on_commit=False) as session, session.begin():
            by_table = Ticket(code="table")
            session.add(by_table)
    finally:
        unbind_generator(engine=engine, table=Ticket.__table__)
    assert LAYOUT.decode(by_engine.id).worker_id == 11
    assert LAYOUT.decode(by_table.id).worker_id == 12


def test_joined_inheritance_shares_the_base_key(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        cars = [Car(seats=n) for n in range(50)]
        session.add_all([*cars, Vehicle()])
    with Session(engine) as session:
        vehicle_ids = set(session.scalars(select(Vehicle.id)))
        car_ids = set(session.scalars(select(Car.__table__.c.id)))
    assert car_ids == {car.id for car in cars} and len(car_ids) == 50
    assert len(vehicle_ids) == 51 and car_ids < vehicle_ids


def test_a_shard_from_the_row_is_still_computed_at_the_insert(engine: Engine) -> None:
    generator = snowflake_db.SnowflakeGenerator(6, layout=SHARDED)
    bind_generator(generator, table=ShardedTicket.__table__)
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            rows = [ShardedTicket(customer=n) for n in range(40)]
            session.add_all(rows)
    finally:
        unbind_generator(table=ShardedTicket.__table__)
    assert all(SHARDED.decode(row.id).shard == row.customer % 4 for row in rows)
    assert len({row.id for row in rows}) == 40


def test_a_failed_flush_stores_nothing_and_the_retry_gets_unique_keys(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(Ticket(code="taken"))
    session = Session(engine, expire_on_commit=False)
    batch = [Ticket(code=f"r{n}") for n in range(10)] + [Ticket(code="taken")]
    session.add_all(batch)
    with pytest.raises(IntegrityError):
        session.commit()
    session.rollback()
    session.close()
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add_all(batch[:10])  # the same objects again, without the duplicate
    with Session(engine) as session:
        stored = dict(session.execute(select(Ticket.code, Ticket.id)).all())
    assert len(stored) == 11 and len(set(stored.values())) == 11
    assert all(stored[ticket.code] == ticket.id for ticket in batch[:10])
