"""Admin support for public numbers (:class:`PublicIdAdminMixin` says how it behaves)."""

from __future__ import annotations

from typing import Any

__all__ = ["PublicIdAdminMixin"]


class PublicIdAdminMixin:
    """Adds ``public_id_field`` (default ``"public_id"``) to the read-only and search fields:
    the number is shown on the change form and searchable.

    ``list_display = ["public_id", ...]`` and ``readonly_fields = ["public_id"]`` work on their
    own (a :class:`~snowflake_db.django.public_ids.PublicId` is an attribute of every object),
    and ``search_fields = ["=public_id"]`` finds the one object whose number is searched for;
    this mixin does both for you. A search text that is no number of the namespace matches
    nothing through this field; the other search fields still apply.
    """

    public_id_field = "public_id"

    def get_readonly_fields(self, request: Any, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        if self.public_id_field not in fields:
            fields = (self.public_id_field, *fields)
        return fields

    def get_search_fields(self, request: Any) -> tuple[str, ...]:
        fields = tuple(super().get_search_fields(request))  # type: ignore[misc]
        exact = f"={self.public_id_field}"
        if exact not in fields and self.public_id_field not in fields:
            fields = (exact, *fields)
        return fields
