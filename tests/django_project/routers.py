"""Test router: every query goes to the alias the running test chose (``use_alias``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

active_alias: ContextVar[str] = ContextVar("active_alias", default="default")


@contextmanager
def use_alias(alias: str) -> Iterator[None]:
    token = active_alias.set(alias)
    try:
        yield
    finally:
        active_alias.reset(token)


class ActiveAliasRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str:
        return active_alias.get()

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return active_alias.get()

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        # Every table on every alias, the worker tables included, so each backend is tested.
        return True
