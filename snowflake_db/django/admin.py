"""Admin helpers: show when an object was created, decoded from its Snowflake ID.

Ordering by the ID is ordering by creation time, so the column sorts on the primary key.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin

from ..errors import SnowflakeError
from .conf import get_layout

__all__ = ["SnowflakeAdminMixin", "created_at", "snowflake_created_display"]


def created_at(value: object) -> datetime | None:
    """The creation time (aware UTC) of a Snowflake ID, or ``None`` for no/invalid ID."""
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    try:
        return get_layout().decode(value).datetime
    except SnowflakeError:
        return None


def snowflake_created_display(
    field_name: str = "pk", description: str = "created (from ID)"
) -> Callable[[Any], datetime | None]:
    """A ``list_display``/``readonly_fields`` callable: the creation time of ``field_name``."""

    def display(obj: Any) -> datetime | None:
        return created_at(getattr(obj, field_name, None))

    decorated: Callable[[Any], datetime | None] = admin.display(
        description=description, ordering=field_name
    )(display)
    return decorated


class SnowflakeAdminMixin:
    """Adds a read-only ``snowflake_created`` (decoded from the primary key) to the change form.

    Put ``"snowflake_created"`` in ``list_display`` to show it in the change list too;
    set ``snowflake_field`` to decode another field than the primary key.
    """

    snowflake_field = "pk"

    @admin.display(description="created (from ID)")
    def snowflake_created(self, obj: Any) -> datetime | None:
        return created_at(getattr(obj, self.snowflake_field, None))

    def get_readonly_fields(self, request: Any, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and "snowflake_created" not in fields:
            fields += ("snowflake_created",)
        return fields
