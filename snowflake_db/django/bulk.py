"""``bulk_load(orders, items)``: Django model instances by COPY (PostgreSQL), ``LOAD DATA LOCAL
INFILE`` or multi-row INSERTs (MariaDB/MySQL), executemany (SQLite).

The fast path that only application-made keys allow: every object without a key gets one
from a single ``next_ids`` call before anything is sent, so related objects (items of new
orders) are loaded in the same call with no read-back. Objects are left as ``bulk_create``
leaves them: ``pk`` set, ``_state.adding`` False, ``_state.db`` the alias. Each field's
``pre_save`` runs (``auto_now_add``), then its ``get_db_prep_save``, as in an INSERT.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections, router, transaction

from ..bulk.load import load_rows
from ..bulk.table import BulkTable
from ..errors import BulkLoadError
from .fields import SnowflakeAutoField, _next_keys

__all__ = ["bulk_load"]


def _model_of(objs: list[Any]) -> Any:
    model = type(objs[0])
    concrete = model._meta.concrete_model
    for obj in objs:
        if getattr(getattr(obj, "_meta", None), "concrete_model", None) is not concrete:
            raise BulkLoadError(
                f"one bulk_load group holds one model: {model.__name__} and "
                f"{type(obj).__name__}; pass each model's objects as a group of their own"
            )
    for parent in model._meta.get_parent_list():
        if parent._meta.concrete_model is not concrete:
            raise BulkLoadError(
                f"{model._meta.label} uses multi-table inheritance (parent "
                f"{parent._meta.label}): its rows span several tables; bulk_load writes one "
                "table per model (as bulk_create, which refuses it too)"
            )
    return concrete


def _fields(meta: Any) -> list[Any]:
    return [field for field in meta.concrete_fields if not getattr(field, "generated", False)]


def _give_keys(batches: list[tuple[Any, list[Any]]]) -> list[tuple[str, Any]]:
    """Keys for every object without one, in all groups, from one ``next_ids`` call;
    returns ``(key attname, object)`` of those objects."""
    waiting: list[tuple[str, Any]] = []
    for model, objs in batches:
        pk = model._meta.pk
        mine = [(pk.attname, obj) for obj in objs if getattr(obj, pk.attname) is None]
        if mine and not isinstance(pk, SnowflakeAutoField):
            raise BulkLoadError(
                f"{model._meta.label}.{pk.name} is not a SnowflakeAutoField, so objects "
                f"without a key cannot get one up front ({len(mine)} have none)"
            )
        waiting += mine
    for (attname, obj), key in zip(waiting, _next_keys(len(waiting)), strict=True):
        obj.__dict__[attname] = key
    return waiting


def _rows(
    model: Any, objs: list[Any], connection: Any, linked: list[tuple[str, Any]]
) -> tuple[BulkTable, list[list[Any]]]:
    """Each object's row; foreign keys taken from related objects are noted in ``linked``."""
    fields = _fields(model._meta)
    table = BulkTable(model._meta.db_table, tuple(field.column for field in fields))
    relations = [field.attname for field in fields if field.many_to_one or field.one_to_one]
    rows = []
    for obj in objs:
        state = obj.__dict__
        linked += [(attname, obj) for attname in relations if state.get(attname) is None]
        obj._prepare_related_fields_for_save(operation_name="bulk_load")
        rows.append(
            [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]
        )
    return table, rows


def bulk_load(
    *groups: Iterable[Any],
    using: str | None = None,
    mariadb_method: str = "auto",
    ignore_conflicts: bool = False,
    update_conflicts: bool = False,
    update_fields: Any = None,
    unique_fields: Any = None,
) -> list[list[Any]]:
    """Load each group of model instances (one model per group, parents before children) in
    one transaction on one database; returns the groups as lists.

    ``bulk_load(orders, items)`` with ``item.order = order`` set on unsaved orders: the orders
    get their keys first, each item's ``order_id`` is taken from its order, then both tables
    are streamed. ``using`` defaults to the router's database for the first group's first
    object. Conflict options are refused: a bulk load writes every row or none, and a
    duplicate key fails the whole call (``IntegrityError``, or
    :class:`~snowflake_db.errors.BulkLoadRejectedError` from MariaDB's ``LOAD DATA``). On
    failure no row is left and the keys this call made are taken back (``pk`` None again).
    On MariaDB, ``LOAD DATA LOCAL INFILE`` needs ``"OPTIONS": {"local_infile": True}`` in
    the alias's settings (and the server's ``local_infile``); ``mariadb_method="load_data"``
    requires it, ``"insert"`` always uses multi-row INSERTs.
    """
    if ignore_conflicts or update_conflicts or update_fields or unique_fields:
        raise BulkLoadError(
            "bulk_load does not handle conflicts (ignore_conflicts, update_conflicts): it "
            "writes every row or none; use QuerySet.bulk_create for conflict handling"
        )
    lists = [list(group) for group in groups]
    batches = [(_model_of(objs), objs) for objs in lists if objs]
    if not batches:
        return lists
    first_model, first_objs = batches[0]
    alias = using or router.db_for_write(first_model, instance=first_objs[0])
    connection = connections[alias]
    made: list[tuple[str, Any]] = []
    try:
        with transaction.atomic(using=alias):
            made += _give_keys(batches)
            for model, objs in batches:
                table, rows = _rows(model, objs, connection, made)
                connection.ensure_connection()
                with connection.wrap_database_errors:
                    load_rows(
                        connection.connection, _vendor(connection), table, rows,
                        mariadb_method=mariadb_method,
                    )
    except BaseException:
        for attname, obj in made:  # the keys made and the foreign keys copied from them
            obj.__dict__[attname] = None
        raise
    for _, objs in batches:
        for obj in objs:
            obj._state.adding = False
            obj._state.db = alias
    return lists


def _vendor(connection: Any) -> str:
    return "mariadb" if connection.vendor == "mysql" else str(connection.vendor)
