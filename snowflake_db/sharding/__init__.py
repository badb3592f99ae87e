"""Sharded order tables: route IDs and shard keys to shards, co-locate, query time ranges.

This package imports no framework: the router (:mod:`snowflake_db.sharding.routing`), the
per-table rules (:mod:`snowflake_db.sharding.rules`) and the PostgreSQL partitioning DDL
(:mod:`snowflake_db.sharding.partitioning`) need only the standard library and the core. The
shard map in the control database (:mod:`snowflake_db.sharding.shard_map`) reads and writes it
through SQLAlchemy Core, as the worker tables do; a router following it
(``ShardRouter.from_control``) imports it only when it is built.
Framework glue lives with its framework:
:mod:`snowflake_db.sqlalchemy.sharding` (horizontal sharding choosers, table-per-shard helper),
:mod:`snowflake_db.django.sharding` (database router, manager) and
:mod:`snowflake_db.django.operations` (partitioning migrations).
"""

from ..errors import ForeignIdError, ShardingError, UnknownShardError
from .engines import (
    citus_shard_index,
    mariadb_hash_partition,
    mariadb_key_partition,
    postgres_hash_partition,
)
from .routing import (
    DEFAULT_FUTURE_SLACK_MS,
    DEFAULT_REFRESH_SECONDS,
    ControlledShardRouter,
    FanOut,
    RoutedShards,
    ShardKey,
    ShardRouter,
    blake2b64,
    id_range_for_time,
    key_hash,
    splitmix64,
)
from .rules import ShardRule

__all__ = [
    "DEFAULT_FUTURE_SLACK_MS",
    "DEFAULT_REFRESH_SECONDS",
    "ControlledShardRouter",
    "FanOut",
    "ForeignIdError",
    "RoutedShards",
    "ShardKey",
    "ShardRouter",
    "ShardRule",
    "ShardingError",
    "UnknownShardError",
    "blake2b64",
    "citus_shard_index",
    "id_range_for_time",
    "key_hash",
    "mariadb_hash_partition",
    "mariadb_key_partition",
    "postgres_hash_partition",
    "splitmix64",
]
