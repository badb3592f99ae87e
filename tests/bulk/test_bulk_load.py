"""Bulk loads through SQLAlchemy on real PostgreSQL, MariaDB and SQLite: keys made in one
``next_ids`` call, rows in the caller's transaction, all-or-nothing on failure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    select,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

import snowflake_db
from snowflake_db.bulk import BulkTable, load_rows
from snowflake_db.errors import (
    BulkLoadRejectedError,
    InvalidArgumentError,
    LocalInfileRefusedError,
    UnrepresentableValueError,
)
from snowflake_db.sqlalchemy import (
    bind_generator,
    bulk_load,
    bulk_load_with_children,
    snowflake_column,
    snowflake_fk_column,
    snowflake_fk_mapped_column,
    snowflake_mapped_column,
    unbind_generator,
)
from tests.plugins.databases import ScratchDatabase

WORKER_ID = 21
pytestmark = pytest.mark.static_worker(WORKER_ID)
UTC = dt.UTC

meta = MetaData()
orders = Table(
    "bulk_orders", meta, snowflake_column("id"),
    Column("customer_id", BigInteger, nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("note", Text),
    Column("placed_at", DateTime(timezone=True)),
)
items = Table(
    "bulk_items", meta, snowflake_column("id"),
    snowflake_fk_column("bulk_orders.id", "order_id", nullable=False),
    Column("sku", String(20), nullable=False),
    Column("quantity", Integer, nullable=False),
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "bulk_orm_orders"
    id: Mapped[int] = snowflake_mapped_column()
    customer_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(10), default="new")
    items: Mapped[list[Item]] = relationship(back_populates="order")


class Item(Base):
    __tablename__ = "bulk_orm_items"
    id: Mapped[int] = snowflake_mapped_column()
    order_id: Mapped[int] = snowflake_fk_mapped_column("bulk_orm_orders.id")
    sku: Mapped[str] = mapped_column(String(20))
    order: Mapped[Order] = relationship(back_populates="items")


class CountingGenerator(snowflake_db.SnowflakeGenerator):
    def __init__(self, worker_id: int) -> None:
        super().__init__(worker_id)
        self.batches: list[int] = []

    def next_ids(self, n: int) -> list[int]:
        self.batches.append(n)
        return super().next_ids(n)


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def engine(
    request: pytest.FixtureRequest, database_factory: Callable[[str], ScratchDatabase]
) -> Engine:
    extra = {"local_infile": True} if request.param == "mariadb" else {}
    return database_factory(request.param).engine(meta, Base.metadata, **extra)


def _count(connection: Connection, table: Table) -> int:
    return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def _order_rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "customer_id": 1000 + i % 7, "total_cents": i * 3,
            "note": f"line\t{i}\nwith \\ and 'quotes\"",
            "placed_at": dt.datetime(2026, 1, 1, tzinfo=UTC),
        }
        for i in range(n)
    ]


def test_keys_come_from_one_next_ids_call_and_rows_land(engine: Engine) -> None:
    generator = CountingGenerator(WORKER_ID)
    bind_generator(generator, table=orders)
    try:
        rows = _order_rows(1500)
        rows[3]["id"] = 5  # a key the caller gave is kept
        with engine.begin() as connection:
            keys = bulk_load(connection, orders, rows)
        assert generator.batches == [1499]
        assert keys[3] == 5 and len(set(keys)) == 1500
        made = [key for i, key in enumerate(keys) if i != 3]
        assert made == sorted(made)
        assert {snowflake_db.Layout().decode(k).worker_id for k in made} == {WORKER_ID}
        assert "id" not in rows[0]  # the caller's dicts are not changed
        with engine.connect() as connection:
            back = {r.id: r for r in connection.execute(select(orders))}
        assert back.keys() == set(keys)
        for key, row in zip(keys, rows, strict=True):
            got = back[key]
            assert (got.customer_id, got.total_cents, got.note) == (
                row["customer_id"], row["total_cents"], row["note"],
            )
            placed = got.placed_at if got.placed_at.tzinfo else got.placed_at.replace(tzinfo=UTC)
            assert placed == row["placed_at"]
    finally:
        unbind_generator(table=orders)


def test_joins_the_callers_transaction(engine: Engine) -> None:
    with engine.connect() as connection:
        bulk_load(connection, orders, _order_rows(10))
        assert _count(connection, orders) == 10
        connection.rollback()
        assert _count(connection, orders) == 0
        bulk_load(connection, orders, _order_rows(10))
        connection.commit()
    with engine.connect() as connection:
        assert _count(connection, orders) == 10


def test_work_beside_the_server_runs_once_every_row_is_sent(engine: Engine) -> None:
    """``load_rows(beside_server=...)`` runs once per load: on PostgreSQL inside the COPY
    (the server still storing rows), elsewhere after the load; what it raises comes out as
    itself and aborts the load."""
    table = BulkTable("bulk_orders", ("id", "customer_id", "total_cents"))
    rows = [[key, 1, 2] for key in snowflake_db.get_generator().next_ids(5_000)]
    seen: list[Any] = []
    with engine.connect() as connection:
        dbapi = connection.connection.dbapi_connection
        vendor = engine.dialect.name

        def beside() -> None:  # PostgreSQL: COPY IN is still open on the connection
            seen.append(getattr(dbapi, "pgconn", None) and dbapi.pgconn.transaction_status)

        load_rows(dbapi, vendor, table, rows, beside_server=beside)
        assert _count(connection, orders) == 5_000
        if vendor == "postgresql":
            assert seen == [TransactionStatus.ACTIVE]
        else:
            assert len(seen) == 1

        def refuse() -> None:
            raise InvalidArgumentError("refused beside the server")

        later = [[key, 1, 2] for key in snowflake_db.get_generator().next_ids(5_000)]
        with (
            pytest.raises(InvalidArgumentError, match="refused beside the server"),
            connection.begin_nested(),
        ):
            load_rows(dbapi, vendor, table, later, beside_server=refuse)
        assert _count(connection, orders) == 5_000


def test_a_duplicate_key_fails_the_whole_load_and_the_transaction_goes_on(engine: Engine) -> None:
    with engine.connect() as connection:
        [existing] = bulk_load(connection, orders, _order_rows(1))
        rows = _order_rows(500)
        rows[250]["id"] = existing
        with pytest.raises((IntegrityError, BulkLoadRejectedError)) as caught:
            bulk_load(connection, orders, rows)
        assert any(word in str(caught.value) for word in (str(existing), "uplicate", "UNIQUE"))
        assert _count(connection, orders) == 1  # none of the 500, the first load kept
        connection.commit()
    with engine.connect() as connection:
        assert _count(connection, orders) == 1


def test_parents_and_children_in_one_pass_all_or_nothing(engine: Engine) -> None:
    families = [(row, [{"sku": f"s{i}-{j}", "quantity": j + 1} for j in range(3)])
                for i, row in enumerate(_order_rows(200))]
    with engine.connect() as connection:
        keys = bulk_load_with_children(connection, orders, items, families,
                                       parent_column="order_id")
        connection.commit()
        pairs = connection.execute(select(items.c.order_id, items.c.sku)).all()
    assert len(pairs) == 600
    by_sku = dict((sku, order_id) for order_id, sku in pairs)
    assert all(by_sku[f"s{i}-{j}"] == keys[i] for i in range(200) for j in range(3))
    # A child that cannot be written (NULL in a NOT NULL column) takes its parents with it.
    families = [(row, [{"sku": "x", "quantity": None if i == 150 else 1}])
                for i, row in enumerate(_order_rows(200))]
    with engine.connect() as connection:
        with pytest.raises((IntegrityError, BulkLoadRejectedError)):
            bulk_load_with_children(connection, orders, items, families,
                                    parent_column="order_id")
        assert (_count(connection, orders), _count(connection, items)) == (200, 600)


def test_orm_objects_get_their_keys_and_defaults(engine: Engine) -> None:
    objects = [Order(customer_id=i) for i in range(50)]
    family = [(Order(customer_id=7), [Item(sku="a"), Item(sku="b")])]
    with Session(engine) as session:
        keys = bulk_load(session, Order, objects)
        [parent_key] = bulk_load_with_children(session, Order, Item, family,
                                               parent_column="order_id")
        session.commit()
        assert [o.id for o in objects] == keys
        assert family[0][1][0].order_id == parent_key == family[0][0].id
        assert all(item.id is not None for item in family[0][1])
        statuses = set(session.scalars(select(Order.status)))
        assert statuses == {"new"}
        assert session.scalar(select(func.count()).select_from(Item)) == 2


def test_nul_in_postgresql_text_is_refused_by_name(postgres_db: ScratchDatabase) -> None:
    engine = postgres_db.engine(meta, Base.metadata)
    rows = _order_rows(30)
    rows[17]["note"] = "a\x00b"
    with engine.connect() as connection:
        with pytest.raises(UnrepresentableValueError) as caught:
            bulk_load(connection, orders, rows)
        assert (caught.value.column, caught.value.row, caught.value.value) == (
            "note", 17, "a\x00b",
        )
        assert "bulk_orders.note, row 17" in str(caught.value)
        assert _count(connection, orders) == 0


def test_naive_time_for_a_zoned_column_is_refused(postgres_db: ScratchDatabase) -> None:
    # (MariaDB's DATETIME has no zone: aware values are written in UTC, naive ones as given.)
    engine = postgres_db.engine(meta, Base.metadata)
    rows = _order_rows(5)
    rows[2]["placed_at"] = dt.datetime(2026, 1, 1)
    with engine.connect() as connection, pytest.raises(UnrepresentableValueError) as caught:
        bulk_load(connection, orders, rows)
    assert caught.value.column == "placed_at" and caught.value.row == 2
    assert "naive" in str(caught.value)


def test_mariadb_load_data_turns_duplicates_into_a_rejected_load(
    mariadb_db: ScratchDatabase,
) -> None:
    engine = mariadb_db.engine(meta, Base.metadata, local_infile=True)
    with engine.connect() as connection:
        [existing] = bulk_load(connection, orders, _order_rows(1))
        rows = _order_rows(100)
        rows[40]["id"] = existing
        with pytest.raises(BulkLoadRejectedError) as caught:
            bulk_load(connection, orders, rows, mariadb_method="load_data")
        assert any(code == 1062 for _, code, _ in caught.value.warnings)
        assert "took 99 of 100 rows" in str(caught.value)
        assert _count(connection, orders) == 1


def test_mariadb_without_local_infile(mariadb_db: ScratchDatabase) -> None:
    engine = mariadb_db.engine(meta, Base.metadata)  # the driver's default: no local files
    with engine.connect() as connection:
        with pytest.raises(LocalInfileRefusedError, match="local_infile=True"):
            bulk_load(connection, orders, _order_rows(3), mariadb_method="load_data")
        keys = bulk_load(connection, orders, _order_rows(3000))  # auto: multi-row INSERTs
        assert _count(connection, orders) == len(set(keys)) == 3000


def test_per_shard_loads_with_keys_that_carry_their_shard(database_factory: Any) -> None:
    """The sharding pattern: group the families by the shard of their customer, then one
    ``bulk_load_with_children`` per shard connection; a ``shard_for`` default puts each
    order's shard into its key."""
    from snowflake_db import Layout, SnowflakeGenerator
    from snowflake_db.sharding import ShardRouter
    from snowflake_db.sqlalchemy import SnowflakeDefault

    layout = Layout(sequence_bits=10, shard_bits=2)
    router = ShardRouter(["a", "b"], layout=layout)
    generator = SnowflakeGenerator(3, layout=layout)
    sharded = MetaData()
    shard_orders = Table(
        "orders", sharded,
        snowflake_column("id", default=SnowflakeDefault(
            generator, shard_for=lambda row: router.shard_for_key(row["customer_id"]))),
        Column("customer_id", BigInteger, nullable=False),
    )
    shard_items = Table(
        "items", sharded, snowflake_column("id", default=SnowflakeDefault(generator)),
        snowflake_fk_column("orders.id", "order_id"), Column("sku", String(20)),
    )
    engines = {name: database_factory("sqlite").engine(sharded) for name in ("a", "b")}
    by_target: dict[str, list[Any]] = {"a": [], "b": []}
    for customer in range(40):
        family = ({"customer_id": customer}, [{"sku": f"{customer}-{j}"} for j in range(2)])
        by_target[router.target_for_key(customer)].append(family)
    for target, families in by_target.items():
        with engines[target].begin() as connection:
            keys = bulk_load_with_children(connection, shard_orders, shard_items, families,
                                           parent_column="order_id")
        assert [router.target_for_id(key) for key in keys] == [target] * len(families)
        with engines[target].connect() as connection:
            assert _count(connection, shard_items) == 2 * len(families)


def test_rows_of_another_shape_are_named(sqlite_db: ScratchDatabase) -> None:
    from snowflake_db.errors import InvalidArgumentError

    engine = sqlite_db.engine(meta, Base.metadata)
    rows = _order_rows(5)
    del rows[3]["note"]
    with engine.connect() as connection:
        with pytest.raises(InvalidArgumentError, match="row 3 of bulk_orders lacks 'note'"):
            bulk_load(connection, orders, rows)
        rows = _order_rows(5)
        rows[2]["colour"] = "red"
        with pytest.raises(InvalidArgumentError, match=r"row 2 .* \['colour'\]"):
            bulk_load(connection, orders, rows)
        mixed = _order_rows(4)
        mixed[1]["id"] = 77  # keys given for some rows only
        kids = [[{"sku": "a", "quantity": 1, "order_id": None}], [{"sku": "b", "quantity": 2}]]
        keys = bulk_load(connection, orders, mixed[:2])
        assert keys[1] == 77 and keys[0] != 77
        parents = bulk_load_with_children(connection, orders, items,
                                          zip(mixed[2:], kids, strict=True),
                                          parent_column="order_id")
        got = dict(connection.execute(select(items.c.sku, items.c.order_id)).all())
        assert got == {"a": parents[0], "b": parents[1]}


def test_chunked_rows_are_made_once_in_order_and_read_whole_on_demand() -> None:
    from snowflake_db.bulk.table import ChunkedRows
    from snowflake_db.errors import InvalidArgumentError

    made: list[tuple[int, int]] = []

    def make(start: int, end: int) -> list[list[Any]]:
        made.append((start, end))
        return [list(range(start, end)), [f"r{i}" for i in range(start, end)]]

    rows = ChunkedRows(5, make)
    assert rows.chunk(0, 2) == [[0, 1], ["r0", "r1"]]
    assert list(rows.made()) == [(0, "r0"), (1, "r1")]  # what an error report may name
    with pytest.raises(InvalidArgumentError, match="start=3, but the next block starts at 2"):
        rows.chunk(3, 5)
    assert (len(rows), rows[4], rows.column(1)) == (5, (4, "r4"), ["r0", "r1", "r2", "r3", "r4"])
    assert made == [(0, 2), (2, 5)]  # each row made once
