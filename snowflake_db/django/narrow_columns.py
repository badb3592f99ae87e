"""Which columns that hold Snowflake keys are narrower than 64 bits in a database.

One answer for three users: the system checks (``snowflake_db.E010``/``I010``), the widening of
auto-created many-to-many keys after ``migrate`` (:mod:`.widening`), and the write guard on
MySQL/MariaDB (:func:`require_wide_columns`), where ``INSERT IGNORE`` (many-to-many ``add()``,
``bulk_create(ignore_conflicts=True)``) or a non-strict ``sql_mode`` turn an out-of-range key
into a clamped value and a silently dropped row instead of an error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.core.exceptions import FieldError
from django.db import router

from .._column_types import holds_snowflake_keys
from ..errors import NarrowColumnError

__all__ = ["NarrowColumn", "narrow_columns", "require_wide_columns", "snowflake_columns"]

#: The vendors whose column types are judged (:mod:`snowflake_db._column_types`).
_JUDGED_VENDORS = ("postgresql", "mysql", "sqlite")


@dataclass(frozen=True)
class _ColumnType:
    """A column's type as the database reports it, with its decimal precision and scale and
    its text length (``None``: not reported, or unbounded)."""

    declared: str
    precision: int | None = None
    scale: int | None = None
    length: int | None = None


@dataclass(frozen=True)
class NarrowColumn:
    """A column holding Snowflake keys whose database type has fewer than 64 bits."""

    model: Any
    field: Any
    column: str
    db_type: str
    what: str

    @property
    def table(self) -> str:
        return str(self.model._meta.db_table)

    @property
    def is_through_key(self) -> bool:
        """The key of an auto-created many-to-many table: Django's migrations never change it
        (:mod:`.widening` does, after ``migrate``)."""
        return bool(self.model._meta.auto_created) and self.field.primary_key

    @property
    def owner_apps(self) -> set[str]:
        """The apps whose migrations change this column: the model's, and for a foreign key
        the target's (altering a key alters the foreign keys to it)."""
        owners = {self.model._meta.app_label}
        target = getattr(self.field, "target_field", None)
        if self.field.is_relation and target is not None:
            owners.add(target.model._meta.app_label)
        return owners


def _holds_snowflake_keys(field: Any) -> bool:
    """The Snowflake fields say so themselves (``holds_snowflake_keys``, False where the
    database makes the keys: django_migrations, auth's many-to-many tables). This module does
    not import :mod:`.fields`, which calls :func:`require_wide_columns` on every MySQL write."""
    return getattr(field, "holds_snowflake_keys", False) is True


def snowflake_columns(model: Any) -> Iterator[tuple[Any, str]]:
    """(field, label) pairs of a model that must be 64-bit: Snowflake fields and the foreign
    keys to them."""
    for field in model._meta.local_fields:
        if _holds_snowflake_keys(field):
            yield field, f"{model._meta.label}.{field.name}"
        elif field.is_relation and (field.many_to_one or field.one_to_one):
            try:
                target = getattr(field, "target_field", None)
            except FieldError:
                continue  # a relation over several columns (ForeignObject): no single key
            if target is not None and _holds_snowflake_keys(target):
                yield field, f"{model._meta.label}.{field.name} (-> {target.model._meta.label})"


def snowflake_models(alias: str) -> list[Any]:
    """Models (many-to-many tables included) with Snowflake columns that live on ``alias``."""
    return [
        model
        for model in apps.get_models(include_auto_created=True)
        if model._meta.managed
        and not model._meta.proxy
        and any(snowflake_columns(model))
        and router.allow_migrate_model(alias, model)
    ]


def _column_types(connection: Any, tables: Iterable[str]) -> dict[tuple[str, str], _ColumnType]:
    """(table, column) -> database type, for the tables that exist; one query on servers."""
    tables = sorted(set(tables))
    if not tables:
        return {}
    with connection.cursor() as cursor:
        if connection.vendor in ("postgresql", "mysql"):
            schema = "current_schema()" if connection.vendor == "postgresql" else "DATABASE()"
            marks = ", ".join(["%s"] * len(tables))
            cursor.execute(
                "SELECT table_name, column_name, data_type, numeric_precision, numeric_scale, "
                "character_maximum_length FROM information_schema.columns "
                f"WHERE table_schema = {schema} AND table_name IN ({marks})",
                tables,
            )
            return {
                (str(t), str(c)): _ColumnType(str(kind), _int(precision), _int(scale), _int(length))
                for t, c, kind, precision, scale, length in cursor.fetchall()
            }
        if connection.vendor == "sqlite":
            found: dict[tuple[str, str], _ColumnType] = {}
            for table in tables:
                cursor.execute(f"PRAGMA table_info({connection.ops.quote_name(table)})")
                rows = cursor.fetchall()
                found.update({(table, row[1]): _ColumnType(str(row[2])) for row in rows})
            return found
    return {}


def narrow_columns(connection: Any, models: Iterable[Any] | None = None) -> list[NarrowColumn]:
    """Every Snowflake column of ``models`` (default: all on this alias) narrower than 64 bits.

    Tables that do not exist yet are skipped (their migration creates them 64-bit); vendors
    other than PostgreSQL, MySQL/MariaDB and SQLite are not judged.
    """
    vendor = connection.vendor
    if vendor not in _JUDGED_VENDORS:
        return []
    models = snowflake_models(connection.alias) if models is None else list(models)
    types = _column_types(connection, (model._meta.db_table for model in models))
    narrow: list[NarrowColumn] = []
    for model in models:
        for field, what in snowflake_columns(model):
            kind = types.get((model._meta.db_table, field.column))
            if kind is None:
                continue
            if not holds_snowflake_keys(
                vendor,
                kind.declared,
                precision=kind.precision,
                scale=kind.scale,
                length=kind.length,
            ):
                narrow.append(NarrowColumn(model, field, field.column, kind.declared, what))
    return narrow


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


_verified: set[tuple[str, str]] = set()
_verify_lock = threading.Lock()


def require_wide_columns(connection: Any) -> None:
    """Refuse to write Snowflake keys on a MySQL/MariaDB database that still has a Snowflake
    column narrower than 64 bits: MariaDB would clamp the key (``INSERT IGNORE``, non-strict
    ``sql_mode``) and drop rows without an error.

    Checked once per process and database; a database found narrow is checked again at the
    next write, so it is accepted as soon as ``migrate`` has widened it.
    """
    key = (connection.alias, str(connection.settings_dict.get("NAME")))
    if key in _verified:
        return
    with _verify_lock:
        if key in _verified:
            return
        narrow = narrow_columns(connection)
        if not narrow:
            _verified.add(key)
            return
    listed = ", ".join(f"{c.table}.{c.column} ({c.db_type})" for c in narrow[:5])
    more = f" and {len(narrow) - 5} more" if len(narrow) > 5 else ""
    raise NarrowColumnError(
        f"refusing to write a 64-bit Snowflake key on database {connection.alias!r}: "
        f"{listed}{more} hold Snowflake keys but are narrower than 64 bits, and MySQL/MariaDB "
        "would clamp the key (INSERT IGNORE, or a non-strict sql_mode) and lose rows silently. "
        "Run `manage.py migrate` (it widens them); `manage.py check --database "
        f"{connection.alias}` lists them (snowflake_db.E010)",
        [(c.table, c.column, c.db_type) for c in narrow],
    )
