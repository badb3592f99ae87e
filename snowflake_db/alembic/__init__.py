"""Alembic operations for Snowflake keys: ``import snowflake_db.alembic`` in ``env.py``.

Registers ``op.create_snowflake_worker_tables``, ``op.drop_snowflake_worker_tables``,
``op.convert_to_snowflake_pk``, ``op.revert_snowflake_pk``, ``op.create_snowflake_id_function``,
``op.drop_snowflake_id_function``, ``op.create_snowflake_key_trigger``,
``op.drop_snowflake_key_trigger`` (MariaDB) and, for PostgreSQL partitioned order tables,
``op.create_shard_partitioned_table``, ``op.create_time_partitioned_table`` and
``op.add_next_time_partition``, and for order tables sharded by an engine (postgres_fdw,
Spider) ``op.create_sharded_orders`` and ``op.drop_sharded_orders`` (see
:mod:`snowflake_db.alembic.operations`).
"""

from ..errors import SnowflakeMigrationError
from .autogenerate import include_object, process_revision_directives
from .operations import (
    AddNextTimePartitionOp,
    ConvertToSnowflakePkOp,
    CreateShardedOrdersOp,
    CreateShardPartitionedTableOp,
    CreateSnowflakeIdFunctionOp,
    CreateSnowflakeKeyTriggerOp,
    CreateSnowflakeWorkerTablesOp,
    CreateTimePartitionedTableOp,
    DropShardedOrdersOp,
    DropSnowflakeIdFunctionOp,
    DropSnowflakeKeyTriggerOp,
    DropSnowflakeWorkerTablesOp,
    RevertSnowflakePkOp,
)

__all__ = [
    "AddNextTimePartitionOp",
    "ConvertToSnowflakePkOp",
    "CreateShardPartitionedTableOp",
    "CreateShardedOrdersOp",
    "CreateSnowflakeIdFunctionOp",
    "CreateSnowflakeKeyTriggerOp",
    "CreateSnowflakeWorkerTablesOp",
    "CreateTimePartitionedTableOp",
    "DropShardedOrdersOp",
    "DropSnowflakeIdFunctionOp",
    "DropSnowflakeKeyTriggerOp",
    "DropSnowflakeWorkerTablesOp",
    "RevertSnowflakePkOp",
    "SnowflakeMigrationError",
    "include_object",
    "process_revision_directives",
]
