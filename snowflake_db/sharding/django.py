"""Moved to :mod:`snowflake_db.django.sharding` and :mod:`snowflake_db.django.operations`.

This old path keeps working: settings (``DATABASE_ROUTERS``) and migrations written before the
move name it (a migration freezes ``bases`` and operations by their import path).
"""

from ..django import operations as _operations
from ..django import sharding as _sharding


def __getattr__(name: str) -> object:
    for module in (_sharding, _operations):
        if name in module.__all__:
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
