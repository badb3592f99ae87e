"""Moved to :mod:`snowflake_db.django.sharding` and :mod:`snowflake_db.django.operations`.

This old path keeps working: settings (``DATABASE_ROUTERS``) and migrations written before the
move name it (a migration freezes ``bases`` and operations by their import path).
"""

from ..django.operations import (
    AddTimePartitions,
    CreateShardPartitionedTable,
    CreateTimePartitionedTable,
)
from ..django.sharding import (
    ShardedDatabaseRouter,
    ShardedManager,
    ShardedModelMixin,
    ShardedQuerySet,
    alias_for_instance,
    ensure_pk,
    get_shard_router,
)

__all__ = [
    "AddTimePartitions",
    "CreateShardPartitionedTable",
    "CreateTimePartitionedTable",
    "ShardedDatabaseRouter",
    "ShardedManager",
    "ShardedModelMixin",
    "ShardedQuerySet",
    "alias_for_instance",
    "ensure_pk",
    "get_shard_router",
]
