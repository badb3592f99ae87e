"""Sharded order tables: route IDs and shard keys to shards, co-locate, query time ranges.

The router (:mod:`snowflake_db.sharding.routing`) imports only the standard library and the
snowflake_db core. Framework glue lives in ``snowflake_db.sharding.sqlalchemy`` (horizontal
sharding choosers, table-per-shard helper), ``snowflake_db.sharding.django`` (database router,
manager) and ``snowflake_db.sharding.partitioning`` (PostgreSQL native partitioning DDL).
"""

from .routing import (
    DEFAULT_FUTURE_SLACK_MS,
    ForeignIdError,
    ShardingError,
    ShardKey,
    ShardRouter,
    ShardRule,
    UnknownShardError,
    blake2b64,
    id_range_for_time,
    key_hash,
    splitmix64,
)

__all__ = [
    "DEFAULT_FUTURE_SLACK_MS",
    "ForeignIdError",
    "ShardKey",
    "ShardRouter",
    "ShardRule",
    "ShardingError",
    "UnknownShardError",
    "blake2b64",
    "id_range_for_time",
    "key_hash",
    "splitmix64",
]
