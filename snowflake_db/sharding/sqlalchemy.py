"""Moved to :mod:`snowflake_db.sqlalchemy.sharding`; this old path keeps working."""

from ..sqlalchemy import sharding as _moved


def __getattr__(name: str) -> object:
    if name in _moved.__all__:
        return getattr(_moved, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
