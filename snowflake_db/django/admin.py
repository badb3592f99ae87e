"""Admin helpers: show when an object was created, decoded from its Snowflake ID; and the
app's admin module, which puts the worker pages on the default admin site.

Ordering by the ID is ordering by creation time, so the column sorts on the primary key.
The admin's autodiscovery (``django.contrib.admin``'s ``AdminConfig``) imports this module, as
it does every app's ``admin.py``. Projects that use ``SimpleAdminConfig`` (no autodiscovery,
Django's advice for a project's own ``AdminSite``) get nothing registered, even when they import
the helpers here, and call ``snowflake_db.django.worker_admin.register(site)`` themselves.
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


def _register_worker_pages() -> None:
    """The worker slot and registration pages on ``admin.site``, when the project's admin
    autodiscovers and SQLAlchemy (which reads the leases) is installed.

    Imported before the models are loaded (from a ``models.py``), this module registers
    nothing, and autodiscovery does not import it again: call ``register(site)`` then.
    """
    from importlib.util import find_spec

    from django.apps import apps
    from django.contrib.admin.apps import AdminConfig

    if not apps.models_ready or find_spec("sqlalchemy") is None:
        return
    try:
        config = apps.get_app_config("admin")
    except LookupError:
        return
    if isinstance(config, AdminConfig):  # not SimpleAdminConfig: autodiscovery is on
        from .worker_admin import register

        register(admin.site)


_register_worker_pages()
