"""PostgreSQL partitioned order tables: ``op.create_shard_partitioned_table(...)``,
``op.create_time_partitioned_table(...)``, ``op.add_next_time_partition(...)``.

The DDL is :mod:`snowflake_db.sharding.partitioning`'s. The create operations reverse to
``op.drop_table(table)`` (dropping a partitioned table drops its partitions).
``add_next_time_partition`` has no reverse: which partition it adds depends on the catalog at
the time it runs (the period after the highest one), so the operation cannot name the partition
a downgrade should drop; write that ``op.drop_table("<table>_p<period>")`` by hand.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from alembic.operations import MigrateOperation, Operations
from alembic.operations.ops import DropTableOp
from sqlalchemy import text

from ...layout import Layout
from ...sharding import partitioning
from ...sharding.partitioning import Period
from ._base import SnowflakeOp, operation, postgresql_bind

_NEEDS = ("reads the partition catalog", "uses native declarative partitioning")


@dataclasses.dataclass(eq=False)
class _PartitionedTableOp(SnowflakeOp):
    table: str
    columns_sql: str
    layout: Layout

    def reverse(self) -> DropTableOp:
        schema, _, name = self.table.rpartition(".")
        return DropTableOp(name, schema=schema or None)


@operation("create_shard_partitioned_table")
@dataclasses.dataclass(eq=False)
class CreateShardPartitionedTableOp(_PartitionedTableOp):
    """A table partitioned by LIST on the ID's shard bits, one partition per logical shard."""

    _: dataclasses.KW_ONLY
    column: str = "id"


@operation("create_time_partitioned_table")
@dataclasses.dataclass(eq=False)
class CreateTimePartitionedTableOp(_PartitionedTableOp):
    """A table partitioned by RANGE on the ID, with ``periods`` partitions from ``start``."""

    _: dataclasses.KW_ONLY
    start: datetime
    periods: int = 1
    period: Period = "month"
    column: str = "id"


@operation("add_next_time_partition")
@dataclasses.dataclass(eq=False)
class AddNextTimePartitionOp(SnowflakeOp):
    """The partition of the period after the highest existing one (reads the catalog: online)."""

    table: str
    layout: Layout
    _: dataclasses.KW_ONLY
    period: Period = "month"

    def reverse(self) -> MigrateOperation:
        raise NotImplementedError(
            "add_next_time_partition has no reverse: the partition it adds depends on the "
            "catalog when it runs; drop it by name in the downgrade"
        )


@Operations.implementation_for(CreateShardPartitionedTableOp)
def _create_shard_partitioned(operations: Operations, op: CreateShardPartitionedTableOp) -> None:
    postgresql_bind(operations, "create_shard_partitioned_table", *_NEEDS)
    for statement in partitioning.create_shard_partitioned_table_sql(
        op.table, op.columns_sql, op.layout, column=op.column
    ):
        operations.execute(text(statement))


@Operations.implementation_for(CreateTimePartitionedTableOp)
def _create_time_partitioned(operations: Operations, op: CreateTimePartitionedTableOp) -> None:
    postgresql_bind(operations, "create_time_partitioned_table", *_NEEDS)
    for statement in partitioning.create_time_partitioned_table_sql(
        op.table,
        op.columns_sql,
        op.layout,
        start=op.start,
        periods=op.periods,
        period=op.period,
        column=op.column,
    ):
        operations.execute(text(statement))


@Operations.implementation_for(AddNextTimePartitionOp)
def _add_next_time_partition(operations: Operations, op: AddNextTimePartitionOp) -> None:
    bind = postgresql_bind(operations, "add_next_time_partition", *_NEEDS)
    partitioning.add_next_time_partition(bind, op.table, op.layout, period=op.period)
