"""``op.create_snowflake_worker_tables()`` / ``op.drop_snowflake_worker_tables()``: the slots,
registrations and layout tables, exactly as :mod:`snowflake_db.worker._schema` defines them."""

from __future__ import annotations

import dataclasses

from alembic.operations import Operations
from alembic.operations.ops import CreateTableOp, DropTableOp
from sqlalchemy import MetaData

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


@Operations.implementation_for(CreateSnowflakeWorkerTablesOp)
def _create_worker_tables(operations: Operations, op: CreateSnowflakeWorkerTablesOp) -> None:
    tables = op.tables()
    for table in tables:
        operations.invoke(CreateTableOp.from_table(table))


@Operations.implementation_for(DropSnowflakeWorkerTablesOp)
def _drop_worker_tables(operations: Operations, op: DropSnowflakeWorkerTablesOp) -> None:
    tables = op.tables()
    for table in (tables.layout, tables.registrations, tables.slots):
        operations.invoke(DropTableOp.from_table(table))
