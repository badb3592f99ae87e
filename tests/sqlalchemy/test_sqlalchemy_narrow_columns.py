"""``narrow_snowflake_columns`` / ``require_wide_snowflake_columns``: the columns of a real
database that hold the models' Snowflake keys in fewer than 64 bits, on PostgreSQL, MariaDB and
SQLite, and none once the keys are converted."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, create_engine, text
from sqlalchemy.engine import Connection

import snowflake_db
import snowflake_db.alembic  # registers op.convert_to_snowflake_pk
from snowflake_db.errors import NarrowColumnError, SnowflakeError
from snowflake_db.sqlalchemy import (
    narrow_snowflake_columns,
    require_wide_snowflake_columns,
    snowflake_column,
    snowflake_default,
    snowflake_fk_column,
)

from ..plugins.databases import ScratchDatabase

pytestmark = pytest.mark.static_worker(5)

KEY = {
    "postgresql": "SERIAL PRIMARY KEY",
    "mariadb": "INT AUTO_INCREMENT PRIMARY KEY",
    "sqlite": "INTEGER PRIMARY KEY",
}
#: A column type that cannot hold every 64-bit integer exactly, per backend.
LOSSY = {"postgresql": "DECIMAL(10, 0)", "mariadb": "DECIMAL(10, 0)", "sqlite": "REAL"}


def _models() -> MetaData:
    metadata = MetaData()
    Table("orders", metadata, snowflake_column("id"), Column("note", String(20)))
    # a reference declared in the models only: the database has no constraint for it
    Table(
        "notes",
        metadata,
        Column("id", Integer, primary_key=True),
        snowflake_fk_column("orders.id", "order_ref"),
    )
    # the bare one-liner default makes a Snowflake key too
    Table(
        "events",
        metadata,
        Column("id", BigInteger, primary_key=True, default=snowflake_default, autoincrement=False),
    )
    Table("ledger", metadata, snowflake_column("id"))  # NUMERIC(20): wide enough
    Table("archive", metadata, snowflake_column("id"))  # not in the database: not reported
    return metadata


def _create(conn: Connection, backend: str) -> None:
    ddl = [
        f"CREATE TABLE orders (id {KEY[backend]}, note VARCHAR(20))",
        f"CREATE TABLE notes (id {KEY[backend]}, order_ref INTEGER)",
        # not in the models: found through its foreign key to orders
        f"CREATE TABLE audit (id {KEY[backend]}, order_id INTEGER, "
        "CONSTRAINT fk_audit_order FOREIGN KEY (order_id) REFERENCES orders (id))",
        f"CREATE TABLE events (id {LOSSY[backend]} PRIMARY KEY)",
        "CREATE TABLE ledger (id NUMERIC(20, 0) PRIMARY KEY)",
    ]
    for statement in ddl:
        conn.execute(text(statement))


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_finds_every_narrow_key_column_then_none_after_widening(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    db = database_factory(backend)
    engine = create_engine(db.url)
    metadata = _models()
    try:
        with engine.begin() as conn:
            _create(conn, backend)
        found = {c.name: c for c in narrow_snowflake_columns(engine, metadata)}
        if backend == "sqlite":  # INTEGER holds 64 bits there; REAL does not
            assert list(found) == ["events.id"]
            assert found["events.id"].type == "REAL"
        else:
            assert list(found) == ["audit.order_id", "events.id", "notes.order_ref", "orders.id"]
            assert found["orders.id"].references is None
            assert found["orders.id"].fix == "op.convert_to_snowflake_pk('orders', 'id')"
            assert found["audit.order_id"].references == "orders.id"
            assert found["audit.order_id"].fix == (
                "widened by op.convert_to_snowflake_pk('orders', 'id')"
            )
            assert found["notes.order_ref"].fix.startswith(
                "op.alter_column('notes', 'order_ref', type_=sa.BigInteger())"
            )
            assert found["events.id"].type in ("NUMERIC(10, 0)", "DECIMAL(10, 0)")
        with pytest.raises(NarrowColumnError) as caught:
            require_wide_snowflake_columns(engine, metadata)
        assert isinstance(caught.value, SnowflakeError)
        assert not isinstance(caught.value, ValueError)  # the database, not an argument
        assert f"events.id is {found['events.id'].type} (a Snowflake key)" in str(caught.value)
        assert ("events", "id", found["events.id"].type) in caught.value.columns

        with engine.begin() as conn:
            op = Operations(MigrationContext.configure(conn))
            if backend != "sqlite":
                op.convert_to_snowflake_pk("orders")
                op.alter_column("notes", "order_ref", type_=BigInteger(), existing_type=Integer())
            op.drop_table("events")
            conn.execute(text("CREATE TABLE events (id BIGINT PRIMARY KEY)"))
        assert narrow_snowflake_columns(engine, metadata) == []
        require_wide_snowflake_columns(engine, metadata)
    finally:
        engine.dispose()


def test_a_real_column_on_sqlite_really_loses_the_key(sqlite_db: ScratchDatabase) -> None:
    """Why REAL (and FLOAT, DOUBLE) affinity counts as narrow on SQLite."""
    engine = create_engine(sqlite_db.url)
    now = snowflake_db.Layout().decode(snowflake_db.snowflake_default()).timestamp_ms
    key = snowflake_db.Layout().encode(timestamp_ms=now, worker_id=5, sequence=1)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE events (id REAL PRIMARY KEY, n INTEGER)"))
            conn.execute(text("INSERT INTO events (id, n) VALUES (:k, 1)"), {"k": key})
            assert conn.scalar(text("SELECT id FROM events")) != key
            assert conn.scalar(text("SELECT count(*) FROM events WHERE id = :k"), {"k": key}) == 0
    finally:
        engine.dispose()
