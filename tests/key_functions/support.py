"""Helpers for the key function tests: worker tables, the function, a table using it."""

from __future__ import annotations

from typing import Any

from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import MetaData, select, text
from sqlalchemy.engine import Engine

import snowflake_db.alembic  # noqa: F401  (registers op.create_snowflake_worker_tables)
from snowflake_db import Layout
from snowflake_db.key_functions import (
    FunctionSpec,
    _mariadb,
    install_key_function,
    install_key_trigger,
)
from snowflake_db.worker import worker_tables

LAYOUT = Layout()


def worker_tables_in(engine: Engine, **tables: Any) -> None:
    with engine.begin() as conn:
        Operations(MigrationContext.configure(conn)).create_snowflake_worker_tables(**tables)


def install(engine: Engine, **options: Any) -> int:
    with engine.begin() as conn:
        return install_key_function(conn, **options)


def keyed_table(engine: Engine, table: str = "events", function: str = "snowflake_next_id") -> None:
    """``table (id, who)`` whose key comes from ``function()``: a DEFAULT on PostgreSQL, the
    trigger on MariaDB."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(
                text(
                    f"CREATE TABLE {table} (id bigint PRIMARY KEY DEFAULT {function}(), "
                    "who varchar(20))"
                )
            )
        else:
            conn.execute(
                text(f"CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, who VARCHAR(20))")
            )
            install_key_trigger(conn, table, name=function)


def set_last_id(
    engine: Engine, value: int, function: str = "snowflake_next_id", layout: Layout = LAYOUT
) -> None:
    """Move the function's state to ``value`` (its last issued ID; MariaDB: forward only)."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"SELECT setval('{function}_state', {value}, true)"))
        else:
            _mariadb.move_forward(conn, FunctionSpec(function, None, "mariadb"), layout, value)


def last_id(
    engine: Engine, worker_id: int, function: str = "snowflake_next_id", layout: Layout = LAYOUT
) -> int | None:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return int(conn.scalar(text(f"SELECT last_value FROM {function}_state")))
        spec = FunctionSpec(function, None, "mariadb")
        return _mariadb.last_issued_id(conn, spec, layout, worker_id)


def slots(engine: Engine, table: str = "snowflake_worker_slots") -> list[Any]:
    slot_table = worker_tables(
        MetaData(), slots_table=table, registrations_table=f"{table}_registrations"
    ).slots
    with engine.connect() as conn:
        return list(conn.execute(select(slot_table).order_by(slot_table.c.worker_id)).mappings())


def series_sql(engine: Engine, n: int) -> str:
    """A ``SELECT`` of ``n`` rows (``INSERT ... SELECT`` without the key)."""
    if engine.dialect.name == "postgresql":
        return f"SELECT 'sel' FROM generate_series(1, {n})"
    return f"SELECT 'sel' FROM seq_1_to_{n}"
