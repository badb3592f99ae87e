"""Django integration: Snowflake primary keys with one settings line.

``INSTALLED_APPS += ["snowflake_db.django"]`` and
``DEFAULT_AUTO_FIELD = "snowflake_db.django.fields.SnowflakeAutoField"``. One module per Django
extension point: ``fields``, ``apps``, ``models`` (worker tables) and ``migrations``, ``routers``,
``conf`` (the ``SNOWFLAKE_DB`` setting), ``checks``, ``management`` (``manage.py snowflake``),
``rest_framework``, ``json`` and ``admin``; for sharded tables, ``sharding`` (database router,
manager) and ``operations`` (PostgreSQL partitioning migrations); ``public_ids`` (public order
numbers on models, URLs, the admin and REST framework); ``database_keys`` (``KeyFunction``, a
column's database default for raw SQL inserts, ``KeyTriggerCheck``, MariaDB's guard for it, and
its migration operations).
"""

from __future__ import annotations

from ..layout import SnowflakeId
from .database_keys import KeyFunction, KeyTriggerCheck
from .fields import (
    EagerSnowflakeAutoField,
    SnowflakeAutoField,
    SnowflakeField,
    is_snowflake_field,
)

__all__ = [
    "EagerSnowflakeAutoField",
    "KeyFunction",
    "KeyTriggerCheck",
    "SnowflakeAutoField",
    "SnowflakeField",
    "decode",
    "is_snowflake_field",
]


def decode(snowflake_id: int) -> SnowflakeId:
    """Decode an ID with the layout of ``SNOWFLAKE_DB`` (which may differ from the default)."""
    from .conf import get_layout

    return get_layout().decode(snowflake_id)
