"""Per-table and per-engine generators, shard-aware defaults and IDs at object construction."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from snowflake_db import InvalidArgumentError, Layout, SnowflakeGenerator
from snowflake_db.sqlalchemy import (
    SnowflakeDefault,
    assign_ids_on_init,
    bind_generator,
    generator_for,
    is_snowflake_column,
    snowflake_column,
    snowflake_mapped_column,
    stop_assigning_ids_on_init,
    unbind_generator,
)
from tests.plugins.databases import ScratchDatabase

pytestmark = pytest.mark.static_worker(3)

SHARDED = Layout(time_bits=41, worker_bits=8, sequence_bits=10, shard_bits=4)


def _shard_of_customer(row: Any) -> int:
    return int(row["customer_id"]) % 16


meta = MetaData()
tickets = Table("tickets", meta, snowflake_column("id"), Column("n", Integer))
notes = Table("notes", meta, snowflake_column("id"), Column("n", Integer))
sharded_orders = Table(
    "sharded_orders",
    meta,
    snowflake_column(
        "id",
        default=SnowflakeDefault(
            SnowflakeGenerator(9, layout=SHARDED), shard_for=_shard_of_customer
        ),
    ),
    Column("customer_id", Integer, nullable=False),
)


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "invoices"
    id: Mapped[int] = snowflake_mapped_column()
    label: Mapped[str] = mapped_column(String(20), default="")


class Shipment(Base):
    __tablename__ = "shipments"
    id: Mapped[int] = snowflake_mapped_column(
        default=SnowflakeDefault(
            SnowflakeGenerator(11, layout=SHARDED), shard_for=_shard_of_customer
        )
    )
    customer_id: Mapped[int] = mapped_column(Integer)


def test_table_binding_beats_engine_binding_beats_process_default(
    sqlite_db: ScratchDatabase,
) -> None:
    engine = create_engine(sqlite_db.url)
    meta.create_all(engine)
    by_table, by_engine = SnowflakeGenerator(100), SnowflakeGenerator(200)
    bind_generator(by_table, table="tickets")
    bind_generator(lambda: by_engine, engine=engine)
    try:
        with engine.begin() as conn:
            conn.execute(tickets.insert(), [{"n": i} for i in range(50)])
            conn.execute(notes.insert().values([{"n": i} for i in range(50)]))
        unbind_generator(engine=engine)
        with engine.begin() as conn:
            conn.execute(notes.insert(), [{"n": -1}])
        with engine.connect() as conn:
            workers = {Layout().decode(i).worker_id for i in conn.scalars(select(tickets.c.id))}
            assert workers == {100}
            note_workers = [Layout().decode(i).worker_id for i in conn.scalars(select(notes.c.id))]
            assert sorted(set(note_workers)) == [3, 200] and note_workers.count(3) == 1
        assert generator_for(table=tickets) is by_table
        assert generator_for(table="other").worker_id == 3
    finally:
        unbind_generator(table="tickets", engine=engine)
        engine.dispose()


def test_shard_for_embeds_the_row_shard_in_every_path(sqlite_db: ScratchDatabase) -> None:
    engine = create_engine(sqlite_db.url)
    meta.create_all(engine)
    Base.metadata.create_all(engine)
    rows = [{"customer_id": c} for c in range(40)]
    try:
        with engine.begin() as conn:
            conn.execute(sharded_orders.insert(), rows)
            conn.execute(sharded_orders.insert().values(rows))
            conn.execute(sharded_orders.insert().returning(sharded_orders.c.id), rows)
        with Session(engine) as session:
            session.execute(insert(Shipment), rows)
            session.add_all([Shipment(customer_id=c) for c in range(40)])
            session.commit()
        with engine.connect() as conn:
            for table, expected in ((sharded_orders, 120), (Shipment.__table__, 80)):
                found = conn.execute(select(table.c.id, table.c.customer_id)).all()
                assert len(found) == len({i for i, _ in found}) == expected
                for snowflake_id, customer in found:
                    assert SHARDED.decode(snowflake_id).shard == customer % 16
    finally:
        engine.dispose()


def test_ids_at_construction(sqlite_db: ScratchDatabase) -> None:
    engine = create_engine(sqlite_db.url)
    Base.metadata.create_all(engine)
    assign_ids_on_init(Base)
    try:
        invoice = Invoice(label="early")
        given = Invoice(id=5, label="given")
        shipment = Shipment(customer_id=21)
        assert invoice.id is not None and Layout().decode(invoice.id).worker_id == 3
        assert given.id == 5
        assert SHARDED.decode(shipment.id).shard == 21 % 16
        assert SHARDED.decode(shipment.id).worker_id == 11
        with Session(engine) as session:
            session.add_all([invoice, given, shipment])
            session.commit()
            assert session.scalars(select(Invoice.id).order_by(Invoice.id)).all() == sorted(
                [5, invoice.id]
            )
    finally:
        stop_assigning_ids_on_init(Base)
        engine.dispose()
    assert Invoice(label="late").id is None


def test_helpers_refuse_autoincrement_and_mark_their_columns() -> None:
    with pytest.raises(InvalidArgumentError, match="autoincrement"):
        snowflake_column("id", autoincrement=True)
    with pytest.raises(InvalidArgumentError, match="shard"):
        SnowflakeDefault(shard=1, shard_for=_shard_of_customer)
    assert is_snowflake_column(tickets.c.id)
    assert tickets.c.id.autoincrement is False and tickets.c.id.primary_key
    assert not is_snowflake_column(tickets.c.n)


def test_ids_for_issues_a_batch_from_the_bound_generator_with_the_shard() -> None:
    layout = Layout(sequence_bits=8, shard_bits=4)
    bind_generator(SnowflakeGenerator(21, layout=layout), table="batch_orders")
    try:
        ids = SnowflakeDefault(shard=5).ids_for(600, table="batch_orders")
    finally:
        unbind_generator(table="batch_orders")
    assert len(ids) == 600 and ids == sorted(set(ids))
    assert {(layout.decode(i).worker_id, layout.decode(i).shard) for i in ids} == {(21, 5)}
    with pytest.raises(InvalidArgumentError, match="shard_for"):
        SnowflakeDefault(shard_for=_shard_of_customer).ids_for(2)
    with pytest.raises(InvalidArgumentError, match="shard"):
        SnowflakeDefault(SnowflakeGenerator(1, layout=layout), shard=16).ids_for(2)  # 0..15


def test_id_for_takes_the_generators_lock_free_next_id() -> None:
    # SnowflakeGenerator.next_id on the class is the locked slow path (about 5x slower); every
    # id_for and every ORM flush key must go through the instance's lock-free closure.
    generator = SnowflakeGenerator(12)
    fast = generator.next_id
    calls: list[int] = []

    def counting() -> int:
        calls.append(1)
        return fast()

    generator.next_id = counting  # type: ignore[method-assign]
    bind_generator(generator, table=tickets)
    try:
        issued = [SnowflakeDefault().id_for(table=tickets), SnowflakeDefault(generator).id_for()]
    finally:
        unbind_generator(table=tickets)
    assert len(calls) == 2
    assert {generator.layout.decode(i).worker_id for i in issued} == {12}
