"""The shop's shard router: 16 logical shards over the shard aliases of the settings."""

from __future__ import annotations

from django.conf import settings

from snowflake_db.sharding import ShardRouter

from ..common import SHOP_LAYOUT


def router() -> ShardRouter:
    return ShardRouter(settings.SHARD_ALIASES, layout=SHOP_LAYOUT)
