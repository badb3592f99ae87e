"""``op.create_snowflake_worker_tables()`` / ``op.drop_snowflake_worker_tables()``, and
``op.create_snowflake_worker_layout_table()`` / ``op.drop_snowflake_worker_layout_table()``.

The layout table (the layout the worker tables serve, :mod:`snowflake_db.worker._layout_record`)
came later than the other two: ``create_snowflake_worker_layout_table`` is the migration that
adds it to an existing install; the tables' first user then records its layout. Because
``create_snowflake_worker_tables`` now creates it too, a revision written before it existed and
one written after can follow each other in either direction: the layout table alone is created
with ``IF NOT EXISTS`` and dropped with ``IF EXISTS`` (PostgreSQL, MariaDB/MySQL and SQLite all
have both).
"""

from __future__ import annotations

import dataclasses

from alembic.operations import Operations
from alembic.operations.ops import CreateTableOp, DropTableOp
from sqlalchemy import MetaData, Table
from sqlalchemy.schema import CreateTable, DropTable

from ...worker._schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    WorkerTables,
    worker_tables,
)
from ._base import SnowflakeOp, operation


@dataclasses.dataclass(eq=False)
class _WorkerTablesOp(SnowflakeOp):
    """Where the worker tables are (names as in :mod:`snowflake_db.worker._schema`)."""

    _: dataclasses.KW_ONLY
    slots_table: str = DEFAULT_SLOTS_TABLE
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE
    schema: str | None = None

    def tables(self) -> WorkerTables:
        return worker_tables(
            MetaData(),
            slots_table=self.slots_table,
            registrations_table=self.registrations_table,
            schema=self.schema,
        )


@operation("create_snowflake_worker_tables")
@dataclasses.dataclass(eq=False)
class CreateSnowflakeWorkerTablesOp(_WorkerTablesOp):
    """Create the worker slots, registrations and layout tables exactly as
    :mod:`snowflake_db.worker._schema` defines them (works offline too)."""

    def reverse(self) -> DropSnowflakeWorkerTablesOp:
        return self.carry(DropSnowflakeWorkerTablesOp)


@operation("drop_snowflake_worker_tables")
@dataclasses.dataclass(eq=False)
class DropSnowflakeWorkerTablesOp(_WorkerTablesOp):
    """Drop the worker slots, registrations and layout tables (every lease, high-water mark
    and the recorded layout go with them)."""

    def reverse(self) -> CreateSnowflakeWorkerTablesOp:
        return self.carry(CreateSnowflakeWorkerTablesOp)


@operation("create_snowflake_worker_layout_table")
@dataclasses.dataclass(eq=False)
class CreateSnowflakeWorkerLayoutTableOp(_WorkerTablesOp):
    """Add the layout table to existing worker tables (``IF NOT EXISTS``; works offline).

    The first process that leases a worker ID afterwards records its layout; processes with
    another layout are refused from then on. ``slots_table`` names the slots table whose layout
    table this is (``registrations_table`` is not needed).
    """

    def reverse(self) -> DropSnowflakeWorkerLayoutTableOp:
        return self.carry(DropSnowflakeWorkerLayoutTableOp)


@operation("drop_snowflake_worker_layout_table")
@dataclasses.dataclass(eq=False)
class DropSnowflakeWorkerLayoutTableOp(_WorkerTablesOp):
    """Drop the layout table (``IF EXISTS``): the recorded layout is forgotten, and the next
    process to lease records its own."""

    def reverse(self) -> CreateSnowflakeWorkerLayoutTableOp:
        return self.carry(CreateSnowflakeWorkerLayoutTableOp)


@Operations.implementation_for(CreateSnowflakeWorkerTablesOp)
def _create_worker_tables(operations: Operations, op: CreateSnowflakeWorkerTablesOp) -> None:
    tables = op.tables()
    for table in (tables.slots, tables.registrations):
        operations.invoke(CreateTableOp.from_table(table))
    _create_layout_table(operations, tables.layout)


@Operations.implementation_for(DropSnowflakeWorkerTablesOp)
def _drop_worker_tables(operations: Operations, op: DropSnowflakeWorkerTablesOp) -> None:
    tables = op.tables()
    _drop_layout_table(operations, tables.layout)
    for table in (tables.registrations, tables.slots):
        operations.invoke(DropTableOp.from_table(table))


@Operations.implementation_for(CreateSnowflakeWorkerLayoutTableOp)
def _create_layout(operations: Operations, op: CreateSnowflakeWorkerLayoutTableOp) -> None:
    _create_layout_table(operations, op.tables().layout)


@Operations.implementation_for(DropSnowflakeWorkerLayoutTableOp)
def _drop_layout(operations: Operations, op: DropSnowflakeWorkerLayoutTableOp) -> None:
    _drop_layout_table(operations, op.tables().layout)


def _create_layout_table(operations: Operations, table: Table) -> None:
    operations.execute(CreateTable(table, if_not_exists=True))


def _drop_layout_table(operations: Operations, table: Table) -> None:
    operations.execute(DropTable(table, if_exists=True))
