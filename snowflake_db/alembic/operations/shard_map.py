"""``op.create_snowflake_shard_map_tables()`` / ``op.drop_snowflake_shard_map_tables()``: the
shard map's six tables, exactly as :mod:`snowflake_db.sharding.shard_map` defines them."""

from __future__ import annotations

import dataclasses

from alembic.operations import Operations
from alembic.operations.ops import CreateTableOp, DropTableOp
from sqlalchemy import MetaData

from ...sharding.shard_map import ShardMapTables, shard_map_tables
from ._base import SnowflakeOp, operation


@dataclasses.dataclass(eq=False)
class _ShardMapTablesOp(SnowflakeOp):
    """Where the shard map tables are (in the control database, beside the worker tables)."""

    _: dataclasses.KW_ONLY
    schema: str | None = None

    def tables(self) -> ShardMapTables:
        return shard_map_tables(MetaData(), schema=self.schema)


@operation("create_snowflake_shard_map_tables")
@dataclasses.dataclass(eq=False)
class CreateSnowflakeShardMapTablesOp(_ShardMapTablesOp):
    """Create the shard map tables (targets, version, map, moves, move steps, seen) exactly as
    :mod:`snowflake_db.sharding.shard_map` defines them (works offline too)."""

    def reverse(self) -> DropSnowflakeShardMapTablesOp:
        return self.carry(DropSnowflakeShardMapTablesOp)


@operation("drop_snowflake_shard_map_tables")
@dataclasses.dataclass(eq=False)
class DropSnowflakeShardMapTablesOp(_ShardMapTablesOp):
    """Drop the shard map tables (the map, its version and every move's journal go with them)."""

    def reverse(self) -> CreateSnowflakeShardMapTablesOp:
        return self.carry(CreateSnowflakeShardMapTablesOp)


@Operations.implementation_for(CreateSnowflakeShardMapTablesOp)
def _create_shard_map_tables(operations: Operations, op: CreateSnowflakeShardMapTablesOp) -> None:
    for table in op.tables():  # in dependency order: targets first
        operations.invoke(CreateTableOp.from_table(table))


@Operations.implementation_for(DropSnowflakeShardMapTablesOp)
def _drop_shard_map_tables(operations: Operations, op: DropSnowflakeShardMapTablesOp) -> None:
    for table in reversed(op.tables()):
        operations.invoke(DropTableOp.from_table(table))
