"""The Snowflake column defaults issue a multi-row INSERT's keys with one ``next_ids`` call, on
PostgreSQL, MariaDB and SQLite, and every other statement still gets one ID per row."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import snowflake_db
from snowflake_db.sqlalchemy import (
    SnowflakeDefault,
    bind_generator,
    snowflake_column,
    snowflake_default,
    snowflake_mapped_column,
    unbind_generator,
)
from tests.plugins.databases import ScratchDatabase

WORKER_ID = 41
pytestmark = pytest.mark.static_worker(WORKER_ID)
LAYOUT = snowflake_db.Layout()
SHARDED = snowflake_db.Layout(sequence_bits=8, shard_bits=4)

core = MetaData()
events = Table("batch_events", core, snowflake_column("id"), Column("n", Integer, nullable=False))
plain = Table(  # the README's one-liner, without the helpers: one generator call per row
    "batch_plain",
    core,
    Column("id", BigInteger, primary_key=True, default=snowflake_default, autoincrement=False),
    Column("n", Integer, nullable=False),
)
fixed_shard = Table(
    "batch_fixed_shard",
    core,
    snowflake_column("id", default=SnowflakeDefault(shard=3)),
    Column("n", Integer, nullable=False),
)
row_shard = Table(
    "batch_row_shard",
    core,
    snowflake_column("id", default=SnowflakeDefault(shard_for=lambda row: row["n"] % 4)),
    Column("n", Integer, nullable=False),
)
two_keys = Table(  # two Snowflake columns in one table: one batch each
    "batch_two_keys",
    core,
    snowflake_column("id"),
    Column("public_id", BigInteger, nullable=False, unique=True, default=SnowflakeDefault()),
    Column("n", Integer, nullable=False),
)


class Base(DeclarativeBase):
    pass


class Ticket(Base):
    __tablename__ = "batch_tickets"
    id: Mapped[int] = snowflake_mapped_column()
    code: Mapped[str] = mapped_column(String(20), unique=True)


@pytest.fixture
def engine(any_db: ScratchDatabase) -> Engine:
    return any_db.engine(core, Base.metadata)


class CountingSource:
    """A generator source that counts how often a default resolved it (once per ID issue)."""

    def __init__(self, *generators: snowflake_db.SnowflakeGenerator) -> None:
        self.generators = generators
        self.calls = 0

    def __call__(self) -> snowflake_db.SnowflakeGenerator:
        self.calls += 1
        return self.generators[min(self.calls, len(self.generators)) - 1]


@pytest.fixture
def counted() -> Iterator[CountingSource]:
    """The events table's IDs come from worker 9, through a source that counts its uses."""
    source = CountingSource(snowflake_db.SnowflakeGenerator(9))
    bind_generator(source, table=events)
    yield source
    unbind_generator(table=events)


def _stored_ids(engine: Engine, table: Table) -> list[int]:
    with engine.connect() as connection:
        return list(connection.scalars(select(table.c.id).order_by(table.c.n)))


def test_core_executemany_takes_one_batch_and_leaves_the_rows_alone(
    engine: Engine, counted: CountingSource
) -> None:
    rows = [{"n": n} for n in range(5000)]
    with engine.begin() as connection:
        connection.execute(events.insert(), rows)
        assert counted.calls == 1
        connection.execute(events.insert(), [{"n": n} for n in range(5000, 5100)])
        assert counted.calls == 2  # the next statement takes a batch of its own
    assert rows == [{"n": n} for n in range(5000)]
    ids = _stored_ids(engine, events)
    assert len(ids) == len(set(ids)) == 5100
    assert all(a < b for a, b in pairwise(ids))  # issued in row order, statement after statement
    assert {LAYOUT.decode(i).worker_id for i in ids} == {9}


def test_single_rows_and_multi_values_get_one_id_per_row(
    engine: Engine, counted: CountingSource
) -> None:
    own = snowflake_db.SnowflakeGenerator(7).next_ids(3)
    with engine.begin() as connection:
        connection.execute(events.insert(), [{"id": i, "n": n} for n, i in enumerate(own)])
        assert counted.calls == 0  # rows that carry their keys never reach the default
        connection.execute(events.insert(), {"n": 3})
        assert counted.calls == 1
        connection.execute(events.insert().values([{"n": n} for n in range(4, 9)]))
        assert counted.calls == 6  # one multi-VALUES statement: SQLAlchemy asks per row
    ids = _stored_ids(engine, events)
    assert ids[:3] == own
    assert {LAYOUT.decode(i).worker_id for i in ids[3:]} == {9}
    assert len(set(ids)) == 9


def test_orm_bulk_insert_takes_one_batch(engine: Engine) -> None:
    source = CountingSource(snowflake_db.get_generator())
    bind_generator(source, table=Ticket.__table__)
    try:
        with Session(engine) as session, session.begin():
            session.execute(insert(Ticket), [{"code": f"b{n}"} for n in range(2000)])
    finally:
        unbind_generator(table=Ticket.__table__)
    assert source.calls == 1
    with Session(engine) as session:
        stored = dict(session.execute(select(Ticket.code, Ticket.id)).all())
    assert len(stored) == len(set(stored.values())) == 2000
    assert all(a < b for a, b in pairwise(stored[f"b{n}"] for n in range(2000)))
    assert {LAYOUT.decode(i).worker_id for i in stored.values()} == {WORKER_ID}


def test_bound_generators_and_fixed_shards_are_honoured_in_batches(engine: Engine) -> None:
    shard_generator = snowflake_db.SnowflakeGenerator(6, layout=SHARDED)
    bind_generator(shard_generator, table=fixed_shard)
    try:
        with engine.begin() as connection:
            connection.execute(fixed_shard.insert(), [{"n": n} for n in range(100)])
    finally:
        unbind_generator(table=fixed_shard)
    decoded = [SHARDED.decode(i) for i in _stored_ids(engine, fixed_shard)]
    assert {(d.worker_id, d.shard) for d in decoded} == {(6, 3)}


def test_a_shard_from_each_row_keeps_one_id_per_row(engine: Engine) -> None:
    source = CountingSource(snowflake_db.SnowflakeGenerator(6, layout=SHARDED))
    bind_generator(source, table=row_shard)
    try:
        with engine.begin() as connection:
            connection.execute(row_shard.insert(), [{"n": n} for n in range(100)])
    finally:
        unbind_generator(table=row_shard)
    assert source.calls == 100
    with engine.connect() as connection:
        stored = connection.execute(select(row_shard.c.n, row_shard.c.id)).all()
    assert all(SHARDED.decode(i).shard == n % 4 for n, i in stored)
    assert len({i for _, i in stored}) == 100


def test_two_snowflake_columns_get_a_batch_each(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(two_keys.insert(), [{"n": n} for n in range(300)])
        rows = connection.execute(
            select(two_keys.c.id, two_keys.c.public_id).order_by(two_keys.c.n)
        ).all()
    keys = [row.id for row in rows]
    public = [row.public_id for row in rows]
    assert all(a < b for a, b in pairwise(keys)) and all(a < b for a, b in pairwise(public))
    assert len(set(keys) | set(public)) == 600  # one generator, two disjoint batches


def test_a_failed_statement_leaves_nothing_behind(engine: Engine, counted: CountingSource) -> None:
    with engine.begin() as connection:
        connection.execute(events.insert(), [{"n": n} for n in range(50)])
    first = _stored_ids(engine, events)
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(events.insert(), [{"n": 50}, {"n": 51}])  # takes a batch...
        connection.execute(insert(Ticket), [{"code": "same"}, {"code": "same"}])  # ...fails
    assert counted.calls == 2
    with engine.begin() as connection:
        connection.execute(events.insert(), [{"n": n} for n in range(50, 100)])
    ids = _stored_ids(engine, events)
    assert ids[:50] == first and min(ids[50:]) > max(first)
    assert len(set(ids)) == 100 and counted.calls == 3


def test_a_generator_replaced_in_flight_is_looked_up_again(engine: Engine) -> None:
    replaced = snowflake_db.SnowflakeGenerator(4)
    replaced.close()  # as configure() closes the old process generator
    source = CountingSource(replaced, snowflake_db.SnowflakeGenerator(5))
    bind_generator(source, table=events)
    try:
        with engine.begin() as connection:
            connection.execute(events.insert(), [{"n": n} for n in range(20)])
            connection.execute(events.insert(), {"n": 20})
    finally:
        unbind_generator(table=events)
    assert source.calls == 3  # the closed one, the new one for the batch, the single row
    ids = _stored_ids(engine, events)
    assert len(set(ids)) == 21
    assert {LAYOUT.decode(i).worker_id for i in ids} == {5}


def test_the_plain_one_liner_default_issues_one_id_per_row(engine: Engine) -> None:
    bind_generator(snowflake_db.SnowflakeGenerator(5), table=plain)  # ignored by a plain default
    try:
        with engine.begin() as connection:
            connection.execute(plain.insert(), [{"n": n} for n in range(300)])
    finally:
        unbind_generator(table=plain)
    ids = _stored_ids(engine, plain)
    assert len(set(ids)) == 300 and all(a < b for a, b in pairwise(ids))
    assert {LAYOUT.decode(i).worker_id for i in ids} == {WORKER_ID}
