"""``assign_ids_in_bulk``: multi-row INSERTs get their keys from one ``next_ids`` call, on
PostgreSQL, MariaDB and SQLite, and every other statement behaves as without it."""

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
    create_engine,
    insert,
    select,
)
from sqlalchemy.engine import Engine
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
from snowflake_db.sqlalchemy.bulk import (
    _snowflake_key,
    assign_ids_in_bulk,
    stop_assigning_ids_in_bulk,
)
from tests.plugins.databases import ScratchDatabase

WORKER_ID = 41
LAYOUT = snowflake_db.Layout()
SHARDED = snowflake_db.Layout(sequence_bits=8, shard_bits=4)

core = MetaData()
events = Table("bulk_events", core, snowflake_column("id"), Column("n", Integer, nullable=False))
plain = Table(  # the README's one-liner, without the helpers
    "bulk_plain",
    core,
    Column("id", BigInteger, primary_key=True, default=snowflake_default, autoincrement=False),
    Column("n", Integer, nullable=False),
)
sharded = Table(
    "bulk_sharded",
    core,
    snowflake_column("id", default=SnowflakeDefault(shard=3)),
    Column("n", Integer, nullable=False),
)


class Base(DeclarativeBase):
    pass


class Ticket(Base):
    __tablename__ = "bulk_tickets"
    id: Mapped[int] = snowflake_mapped_column()
    code: Mapped[str] = mapped_column(String(20), unique=True)


@pytest.fixture(autouse=True)
def configured() -> Iterator[None]:
    snowflake_db.configure(worker_id=WORKER_ID)
    yield
    snowflake_db.reset()


@pytest.fixture
def engine(any_db: ScratchDatabase) -> Iterator[Engine]:
    engine = create_engine(any_db.url)
    core.create_all(engine)
    Base.metadata.create_all(engine)
    assign_ids_in_bulk(engine)
    yield engine
    engine.dispose()


def _stored_ids(engine: Engine, table: Table) -> list[int]:
    with engine.connect() as connection:
        return list(connection.scalars(select(table.c.id).order_by(table.c.n)))


def test_core_executemany_takes_ids_in_bulk_without_touching_the_rows(engine: Engine) -> None:
    rows = [{"n": n} for n in range(5000)]
    with engine.begin() as connection:
        connection.execute(events.insert(), rows)
    assert rows == [{"n": n} for n in range(5000)]  # the caller's dicts are not changed
    ids = _stored_ids(engine, events)
    assert len(ids) == len(set(ids)) == 5000
    assert all(a < b for a, b in pairwise(ids))  # issued in row order, one batch
    assert {LAYOUT.decode(i).worker_id for i in ids} == {WORKER_ID}


def test_rows_with_their_own_ids_and_single_rows_are_left_to_sqlalchemy(engine: Engine) -> None:
    own = snowflake_db.SnowflakeGenerator(7).next_ids(3)
    with engine.begin() as connection:
        connection.execute(events.insert(), [{"id": i, "n": n} for n, i in enumerate(own)])
        connection.execute(events.insert(), {"n": 3})  # one row: the per-row default
        connection.execute(events.insert().values(n=4))
    ids = _stored_ids(engine, events)
    assert ids[:3] == own
    assert {LAYOUT.decode(i).worker_id for i in ids[3:]} == {WORKER_ID}
    assert len(set(ids)) == 5


def test_orm_flush_and_bulk_insert_get_matching_ids(engine: Engine) -> None:
    tickets = [Ticket(code=f"t{n}") for n in range(2000)]
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add_all(tickets)
    by_code = {ticket.code: ticket.id for ticket in tickets}
    with Session(engine) as session, session.begin():
        session.execute(insert(Ticket), [{"code": f"b{n}"} for n in range(2000)])
    with Session(engine) as session:
        stored = dict(session.execute(select(Ticket.code, Ticket.id)).all())
    assert len(stored) == 4000 and len(set(stored.values())) == 4000
    assert all(stored[code] == pk for code, pk in by_code.items())  # the objects know their IDs
    assert {LAYOUT.decode(i).worker_id for i in stored.values()} == {WORKER_ID}


def test_bound_generators_and_fixed_shards_are_honoured(engine: Engine) -> None:
    table_generator = snowflake_db.SnowflakeGenerator(5)
    bind_generator(table_generator, table=events)
    try:
        with engine.begin() as connection:
            connection.execute(events.insert(), [{"n": n} for n in range(100)])
    finally:
        unbind_generator(table=events)
    assert {LAYOUT.decode(i).worker_id for i in _stored_ids(engine, events)} == {5}

    shard_generator = snowflake_db.SnowflakeGenerator(6, layout=SHARDED)
    bind_generator(shard_generator, table=sharded)
    try:
        with engine.begin() as connection:
            connection.execute(sharded.insert(), [{"n": n} for n in range(100)])
    finally:
        unbind_generator(table=sharded)
    decoded = [SHARDED.decode(i) for i in _stored_ids(engine, sharded)]
    assert {(d.worker_id, d.shard) for d in decoded} == {(6, 3)}


class CountingSource:
    """A generator source that counts how often a default resolved it (once per use)."""

    def __init__(self, generator: snowflake_db.SnowflakeGenerator) -> None:
        self.generator = generator
        self.calls = 0

    def __call__(self) -> snowflake_db.SnowflakeGenerator:
        self.calls += 1
        return self.generator


def _insert_counting(engine: Engine, rows: int) -> int:
    source = CountingSource(snowflake_db.SnowflakeGenerator(9))
    bind_generator(source, table=events)
    try:
        with engine.begin() as connection:
            connection.execute(events.insert(), [{"n": n} for n in range(rows)])
    finally:
        unbind_generator(table=events)
    return source.calls


def test_one_generator_call_per_statement_and_per_row_without_the_hook(engine: Engine) -> None:
    assert _insert_counting(engine, 500) == 1
    stop_assigning_ids_in_bulk(engine)
    stop_assigning_ids_in_bulk(engine)  # idempotent, like assign_ids_in_bulk
    assert _insert_counting(engine, 500) == 500
    assign_ids_in_bulk(engine)
    assign_ids_in_bulk(engine)
    assert _insert_counting(engine, 500) == 1
    ids = _stored_ids(engine, events)
    assert len(set(ids)) == 1500


def test_the_plain_one_liner_default_is_filled_from_the_process_generator(engine: Engine) -> None:
    assert _snowflake_key(plain.insert()) is plain.c.id
    assert _snowflake_key(plain.insert().values(n=1)) is None  # explicit values: left alone
    bind_generator(snowflake_db.SnowflakeGenerator(5), table=plain)  # ignored by a plain default
    try:
        with engine.begin() as connection:
            connection.execute(plain.insert(), [{"n": n} for n in range(300)])
    finally:
        unbind_generator(table=plain)
    ids = _stored_ids(engine, plain)
    assert len(set(ids)) == 300
    assert {LAYOUT.decode(i).worker_id for i in ids} == {WORKER_ID}
