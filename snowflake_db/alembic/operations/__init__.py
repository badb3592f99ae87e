"""Every Alembic operation of snowflake_db, one module per family.

Importing :mod:`snowflake_db.alembic` (in ``env.py``) registers:

* ``op.create_snowflake_worker_tables()`` / ``op.drop_snowflake_worker_tables()``
  (:mod:`.worker_tables`)
* ``op.create_snowflake_shard_map_tables()`` / ``op.drop_snowflake_shard_map_tables()``
  (the shard map in the control database, :mod:`.shard_map`)
* ``op.convert_to_snowflake_pk(table, column="id")`` / ``op.revert_snowflake_pk(...)``
  (:mod:`.primary_keys`)
* ``op.create_snowflake_id_function()`` / ``op.drop_snowflake_id_function()`` (PostgreSQL and
  MariaDB) and ``op.create_snowflake_key_trigger(table)`` / ``op.drop_snowflake_key_trigger(...)``
  (MariaDB), thin calls of :mod:`snowflake_db.key_functions` (:mod:`.id_function`)
* ``op.create_shard_partitioned_table(...)``, ``op.create_time_partitioned_table(...)``,
  ``op.add_next_time_partition(...)`` (PostgreSQL, :mod:`.partitions`)
* ``op.create_sharded_orders(engine, shards)`` / ``op.drop_sharded_orders(...)``
  (postgres_fdw shards, local hash partitions or MariaDB Spider, :mod:`.sharded_orders`)

Each operation is a dataclass of its arguments (:mod:`._base`), which gives its constructor,
its ``op.<name>`` method and its autogenerate renderer (the renderers also add
``import snowflake_db.alembic`` to the revision file). Every operation has a ``reverse()``
except ``add_next_time_partition``, whose module says why.
"""

from .id_function import (
    CreateSnowflakeIdFunctionOp,
    CreateSnowflakeKeyTriggerOp,
    DropSnowflakeIdFunctionOp,
    DropSnowflakeKeyTriggerOp,
)
from .partitions import (
    AddNextTimePartitionOp,
    CreateShardPartitionedTableOp,
    CreateTimePartitionedTableOp,
)
from .primary_keys import ConvertToSnowflakePkOp, RevertSnowflakePkOp
from .shard_map import CreateSnowflakeShardMapTablesOp, DropSnowflakeShardMapTablesOp
from .sharded_orders import CreateShardedOrdersOp, DropShardedOrdersOp
from .worker_tables import CreateSnowflakeWorkerTablesOp, DropSnowflakeWorkerTablesOp

__all__ = [
    "AddNextTimePartitionOp",
    "ConvertToSnowflakePkOp",
    "CreateShardPartitionedTableOp",
    "CreateShardedOrdersOp",
    "CreateSnowflakeIdFunctionOp",
    "CreateSnowflakeKeyTriggerOp",
    "CreateSnowflakeShardMapTablesOp",
    "CreateSnowflakeWorkerTablesOp",
    "CreateTimePartitionedTableOp",
    "DropShardedOrdersOp",
    "DropSnowflakeIdFunctionOp",
    "DropSnowflakeKeyTriggerOp",
    "DropSnowflakeShardMapTablesOp",
    "DropSnowflakeWorkerTablesOp",
    "RevertSnowflakePkOp",
]
