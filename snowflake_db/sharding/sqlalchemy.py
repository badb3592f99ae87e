"""Moved to :mod:`snowflake_db.sqlalchemy.sharding`; this old path keeps working."""

from ..sqlalchemy.sharding import ShardedRouting, TablePerShard, sharded_sessionmaker

__all__ = ["ShardedRouting", "TablePerShard", "sharded_sessionmaker"]
