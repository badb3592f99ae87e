"""Lookups on fields that hold Snowflake keys raise instead of finding nothing.

Since Django 5.0, ``filter(offer_id=key)`` on an ``IntegerField`` with a value beyond the
column's range returns an empty result without a query (``IntegerFieldOverflow`` in
``django/db/models/lookups.py``): a Snowflake key compared with a 32-bit column quietly finds
nothing (django-oscar's per-user offer limits, a category view read through an unmanaged model).
For the fields that the checks take as holding keys (:mod:`.key_columns`: a
``GenericForeignKey``'s narrow object ID, ``offer_id``-like names, ``KEY_COLUMNS``), the app
registers these lookups on the field instance at start-up (``ready()``), so they raise
:class:`~snowflake_db.errors.KeyLookupOutOfRangeError`, naming the field, its column and the
value. Every other field, Django's own models included, keeps Django's lookups; a value within
range behaves exactly as before, and SQLite, whose integers all hold 64 bits, never raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import lookups as django_lookups

from ..errors import KeyLookupOutOfRangeError
from .key_columns import field_kind, field_path

__all__ = ["KEY_LOOKUPS", "install_key_lookups"]


def _check_in_range(field: Any, value: Any, connection: Any) -> None:
    """Raise :class:`KeyLookupOutOfRangeError` for an int ``value`` the column cannot hold."""
    if not isinstance(value, int) or isinstance(value, bool):
        return
    low, high = connection.ops.integer_field_range(field.get_internal_type())
    if (low is None or value >= low) and (high is None or value <= high):
        return
    path = field_path(field.model, field)
    table = field.model._meta.db_table
    raise KeyLookupOutOfRangeError(
        f"{path} holds Snowflake keys, but column {table}.{field.column} on database "
        f"{connection.alias!r} is {field_kind(field)} ({low}..{high}), which cannot hold "
        f"{value}: this lookup would find nothing for it, without an error. Widen the field "
        "to PositiveBigIntegerField (see check snowflake_db.E014/E012)",
        [(table, field.column, field.db_type(connection) or "")],
        field=path,
        value=value,
    )


class _RaiseBeyondRange:
    """Raise where Django's ``IntegerFieldOverflow`` would give an empty (or full) result."""

    lhs: Any
    rhs: Any

    def process_rhs(self, compiler: Any, connection: Any) -> Any:
        _check_in_range(self.lhs.output_field, self.rhs, connection)
        return super().process_rhs(compiler, connection)  # type: ignore[misc]


class KeyExact(_RaiseBeyondRange, django_lookups.IntegerFieldExact):
    pass


class KeyGreaterThan(_RaiseBeyondRange, django_lookups.IntegerGreaterThan):
    pass


class KeyGreaterThanOrEqual(_RaiseBeyondRange, django_lookups.IntegerGreaterThanOrEqual):
    pass


class KeyLessThan(_RaiseBeyondRange, django_lookups.IntegerLessThan):
    pass


class KeyLessThanOrEqual(_RaiseBeyondRange, django_lookups.IntegerLessThanOrEqual):
    pass


class KeyIn(django_lookups.In):
    """``__in``: Django sends every value, and the database, comparing them as 64-bit, finds
    nothing for a key the column cannot hold while the other values' rows come back.

    Only on plain integer fields (E014): on a generic relation's object ID Django itself asks
    ``object_id__in`` with the keys of the objects it deletes or prefetches
    (``GenericRelation``), where no row can match and the empty answer is right; raising
    there broke deleting a content type in Django's own suite
    (``RemoveStaleContentTypesTests.test_interactive_true_with_dependent_objects``)."""

    def process_rhs(self, compiler: Any, connection: Any) -> Any:
        if self.rhs_is_direct_value():
            for value in self.rhs:
                _check_in_range(self.lhs.output_field, value, connection)
        return super().process_rhs(compiler, connection)


#: The lookups registered on each key field (Django's own range-aware integer lookups).
KEY_LOOKUPS = (KeyExact, KeyGreaterThan, KeyGreaterThanOrEqual, KeyLessThan, KeyLessThanOrEqual)


def install_key_lookups(fields: Iterable[Any], *, with_in: bool) -> int:
    """Register :data:`KEY_LOOKUPS` (and :class:`KeyIn` if ``with_in``) on these field
    instances (idempotent); return how many."""
    count = 0
    for field in fields:
        for lookup in (*KEY_LOOKUPS, KeyIn) if with_in else KEY_LOOKUPS:
            field.register_lookup(lookup)
        count += 1
    return count
