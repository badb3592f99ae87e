"""Autogenerate helpers: keep tables the migrations manage themselves out of the diff."""

from __future__ import annotations

from typing import Any

from ..worker.schema import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE

__all__ = ["include_object"]

_WORKER_TABLES = frozenset({DEFAULT_SLOTS_TABLE, DEFAULT_REGISTRATIONS_TABLE})


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """``context.configure(include_object=...)`` filter that ignores the worker tables when
    they exist only in the database (created by ``op.create_snowflake_worker_tables()``), so
    autogenerate does not propose dropping them."""
    return not (type_ == "table" and reflected and compare_to is None and name in _WORKER_TABLES)
