"""A database router keeping the worker tables on the control database only.

``DATABASE_ROUTERS = ["snowflake_db.django.routers.ControlDatabaseRouter", ...]`` (first, or
before any router that claims every app). It answers only for this app and returns ``None``
for everything else, so other routers still decide about your models
(https://docs.djangoproject.com/en/stable/topics/db/multi-db/#automatic-database-routing).
"""

from __future__ import annotations

from typing import Any

from .conf import get_settings

APP_LABEL = "snowflake_db"


class ControlDatabaseRouter:
    """Reads, writes and migrations of the worker tables go to ``CONTROL_DATABASE`` only."""

    def _is_ours(self, model: Any) -> bool:
        return bool(model._meta.app_label == APP_LABEL)

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return get_settings().control_database if self._is_ours(model) else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return get_settings().control_database if self._is_ours(model) else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if app_label == APP_LABEL:
            return db == get_settings().control_database
        return None
