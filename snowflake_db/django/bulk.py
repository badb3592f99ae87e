"""``bulk_load(orders, items)``: Django model instances by COPY (PostgreSQL), ``LOAD DATA LOCAL
INFILE`` or multi-row INSERTs (MariaDB/MySQL), executemany (SQLite).

The fast path that only application-made keys allow: every object without a key gets one
before its rows are made, so related objects (items of new orders) are loaded in the same
call with no read-back. Objects are left as ``bulk_create`` leaves them: ``pk`` set,
``_state.adding`` False, ``_state.db`` the alias. Each field's ``pre_save`` runs
(``auto_now_add``), then its ``get_db_prep_save``, as in an INSERT.

What the client still has to do once a group's rows are sent runs while the server stores
them (``load_rows(beside_server=...)``): the later groups' keys during the first group's
COPY, each group's states during its own. Measured with bench_bulk (10,000 orders and 30,000
items a round), that was 8.5 ms of keys before the first byte and 12-17 ms of states after
the commit, out of 222 ms, during which the server had nothing to do.

Django APIs used: ``Model._meta`` (``concrete_fields``, ``pk``, ``db_table``), each field's
``attname``, ``column``, ``pre_save``, ``get_db_prep_save`` and ``get_cached_value`` (what
``item.order`` reads), and ``Model._state.adding``/``.db``. Beyond them, on purpose:

* field values are read from and keys written to the instance ``__dict__`` (where Django's
  ``DeferredAttribute`` keeps them; a field with another descriptor is read by ``getattr``):
  a whole column through ``map`` at C speed, where a Python call per object and field was
  most of a load's client time. Writing there also keeps ``item.order`` cached when a failed
  load takes the keys back (``ForeignKeyDeferredAttribute.__set__`` would drop it);
* ``Model._prepare_related_fields_for_save`` only for models with a ``GenericForeignKey``
  (``_meta.private_fields``), as ``bulk_create`` does: no public API prepares them without
  writing the object.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Iterable
from functools import partial
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

from django.conf import settings
from django.db import connections, models, router, transaction
from django.db.models.query_utils import DeferredAttribute

from ..bulk.load import load_rows
from ..bulk.table import BulkTable, ChunkedRows, ColumnRows
from ..errors import BulkLoadError
from . import fields as fields_module
from .fields import SnowflakeAutoField, _next_keys
from .instances import DICT, store, unset
from .narrow_columns import require_wide_columns

__all__ = ["bulk_load"]


def _model_of(objs: list[Any]) -> Any:
    model = type(objs[0])
    concrete = model._meta.concrete_model
    for obj in objs if set(map(type, objs)) != {model} else ():
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


def _give_keys(batches: list[tuple[Any, list[Any]]], made: list[tuple[str, list[Any]]]) -> None:
    """Keys for every object without one in these groups, from one ``next_ids`` call; the
    objects given a key are noted in ``made`` as ``(key attname, objects)``."""
    waiting: list[tuple[str, list[Any]]] = []
    for model, objs in batches:
        pk = model._meta.pk
        attname = pk.attname
        mine = unset(objs, attname)
        if mine and not isinstance(pk, SnowflakeAutoField):
            raise BulkLoadError(
                f"{model._meta.label}.{pk.name} is not a SnowflakeAutoField, so objects "
                f"without a key cannot get one up front ({len(mine)} have none)"
            )
        waiting.append((attname, mine))
    keys = _next_keys(sum(len(mine) for _, mine in waiting))
    start = 0
    for attname, mine in waiting:
        store(mine, attname, keys[start : start + len(mine)])
        start += len(mine)
        made.append((attname, mine))


_STATE = attrgetter("_state")
_ADDING = attrgetter("adding")
_DB = attrgetter("db")


#: Field classes whose ``get_db_prep_save`` returns a value of this exact type unchanged
#: (Django's backend adapters only wrap it for parameter binding, which COPY does not use).
_PLAIN_TYPES: dict[type, type] = {
    models.IntegerField: int, models.BigIntegerField: int, models.SmallIntegerField: int,
    models.PositiveIntegerField: int, models.PositiveBigIntegerField: int,
    models.PositiveSmallIntegerField: int, models.CharField: str, models.TextField: str,
}
_TIME_FIELDS = (models.DateField, models.TimeField)  # DateTimeField is a DateField


def _is_key(field: Any) -> bool:
    target = field.target_field if field.many_to_one or field.one_to_one else field
    return type(target) in (SnowflakeAutoField, models.BigAutoField, models.AutoField)


def _plain_type(field: Any, vendor: str) -> type | None:
    """The value type that needs no ``get_db_prep_save`` for ``field`` on ``vendor``, if any.
    Aware datetimes pass on PostgreSQL (naive ones are refused by the loader). Keys and
    foreign keys to them: ints (on MySQL/MariaDB once the column widths are checked, and not
    0, which Django refuses there as an AutoField value)."""
    if type(field) in _PLAIN_TYPES:
        return _PLAIN_TYPES[type(field)]
    if type(field) is models.DateTimeField and vendor == "postgresql" and settings.USE_TZ:
        return dt.datetime
    return int if _is_key(field) else None


def _needs_pre_save(field: Any) -> bool:
    """Whether ``pre_save`` can differ from reading the attribute: only ``auto_now``/
    ``auto_now_add`` time fields and fields that define their own (not the key, whose
    ``pre_save`` returns the key this call made, unless bulk_create conflict marks exist)."""
    if type(field).pre_save is models.Field.pre_save:
        return False
    if isinstance(field, _TIME_FIELDS):
        return bool(field.auto_now or field.auto_now_add)
    if isinstance(field, SnowflakeAutoField):
        return fields_module._conflict_keys_handed_out
    return True


def _read(model: Any, attname: str, objs: list[Any]) -> list[Any]:
    """Every object's ``attname`` as ``getattr`` reads it (deferred fields load, custom
    descriptors run), at C speed for Django's own descriptors: the instance's value for a
    plain field, the instance dict for a foreign key (whose ``__get__`` reads it there)."""
    descriptor = getattr(model, attname, None)
    if type(descriptor) is not DeferredAttribute and isinstance(descriptor, DeferredAttribute):
        try:
            return list(map(itemgetter(attname), map(DICT, objs)))
        except KeyError:
            pass
    return list(map(attrgetter(attname), objs))


def _link(objs: list[Any], field: Any, linked: list[tuple[str, list[Any]]]) -> None:
    """Copy the keys of related objects set by assignment (``item.order = order``) into the
    foreign key column, as ``save()`` does; an unsaved related object is an error, as there.
    (Whole columns at a time through ``map``: per-object Python code is most of the cost.)"""
    attname, target = field.attname, field.target_field.attname
    empty = unset(objs, attname)
    related = list(map(field.get_cached_value, empty, repeat(None)))  # what obj.<name> = set
    if any(map(is_, related, repeat(None))):  # no key, no related object: left to the column
        empty = [obj for obj, other in zip(empty, related, strict=True) if other is not None]
        related = [other for other in related if other is not None]
    keys = list(map(attrgetter(target), related))
    if None in keys:
        raise ValueError(
            f"bulk_load() prohibited to prevent data loss due to unsaved related object "
            f"'{field.name}' (load its objects in this call or before)"
        )
    store(empty, attname, keys)
    linked.append((attname, empty))


def _rows(
    model: Any, objs: list[Any], connection: Any, linked: list[tuple[str, list[Any]]]
) -> tuple[BulkTable, ColumnRows | ChunkedRows]:
    """The objects' rows as an INSERT would send them (``pre_save`` where it matters, then
    ``get_db_prep_save``), built column by column; foreign keys taken from related objects
    are noted in ``linked``. On PostgreSQL a block at a time (:class:`ChunkedRows`), as the
    COPY sends them, so reading the objects overlaps the server's work."""
    meta = model._meta
    fields = _fields(meta)
    table = BulkTable(meta.db_table, tuple(field.column for field in fields))
    relations = [field for field in fields if field.many_to_one or field.one_to_one]
    link_per_block = relations
    if _generic_relations(meta):  # Django's own preparation, all up front
        link_per_block = []
        for field in relations:
            linked.append((field.attname, unset(objs, field.attname)))
        for obj in objs:
            obj._prepare_related_fields_for_save(operation_name="bulk_load")

    def make(start: int, end: int) -> list[list[Any]]:
        part = objs if start == 0 and end >= len(objs) else objs[start:end]
        for field in link_per_block:
            _link(part, field, linked)
        return [_column(model, field, part, connection) for field in fields]

    if connection.vendor == "postgresql":
        return table, ChunkedRows(len(objs), make)
    return table, ColumnRows(make(0, len(objs)))


def _column(model: Any, field: Any, objs: list[Any], connection: Any) -> list[Any]:
    """One field's values of ``objs`` as an INSERT sends them."""
    if _needs_pre_save(field):
        values = [field.pre_save(obj, True) for obj in objs]
    else:
        values = _read(model, field.attname, objs)
    plain = _plain_type(field, connection.vendor)
    if connection.vendor == "mysql" and plain is int and _is_key(field) and 0 in values:
        plain = None  # validate_autopk_value() refuses it with Django's message
    if plain is None or not set(map(type, values)) <= {plain, type(None)}:
        prepare = field.get_db_prep_save
        values = [value if type(value) is plain else prepare(value, connection) for value in values]
    return values


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
    if connection.vendor == "mysql":
        require_wide_columns(connection)  # what each key's get_db_prep_save checks there
    made: list[tuple[str, list[Any]]] = []
    marked: list[tuple[list[Any], list[Any], list[Any]]] = []
    first, rest = (batches, []) if _refers_forward(batches) else (batches[:1], batches[1:])

    def beside_server(index: int) -> None:
        if index == 0:
            _give_keys(rest, made)
        marked.append(_mark_loaded(batches[index][1], alias))

    try:
        with transaction.atomic(using=alias):
            _give_keys(first, made)
            for index, (model, objs) in enumerate(batches):
                table, rows = _rows(model, objs, connection, made)
                connection.ensure_connection()
                with connection.wrap_database_errors:
                    load_rows(
                        connection.connection, _vendor(connection), table, rows,
                        mariadb_method=mariadb_method,
                        beside_server=partial(beside_server, index),
                    )
    except BaseException:
        for states, adding, dbs in marked:  # as they were before this call
            deque(map(setattr, states, repeat("adding"), adding), maxlen=0)
            deque(map(setattr, states, repeat("db"), dbs), maxlen=0)
        for attname, objs in made:  # the keys made and the foreign keys copied from them
            store(objs, attname, [None] * len(objs))
        raise
    return lists


def _refers_forward(batches: list[tuple[Any, list[Any]]]) -> bool:
    """Whether the first group's objects may relate to a later group's (their keys are then
    made before the first group's rows, with the first group's)."""
    meta = batches[0][0]._meta
    later = {model for model, _ in batches[1:]}
    return _generic_relations(meta) or any(
        (field.many_to_one or field.one_to_one)
        and field.related_model._meta.concrete_model in later
        for field in meta.concrete_fields
    )


def _generic_relations(meta: Any) -> bool:
    """Whether the model has a ``GenericForeignKey`` (a private field that is a relation; a
    ``PublicId`` is private too, but no relation)."""
    return any(field.is_relation for field in meta.private_fields)


def _mark_loaded(objs: list[Any], alias: str) -> tuple[list[Any], list[Any], list[Any]]:
    """Leave the objects as bulk_create does (ModelState's documented ``adding`` and ``db``,
    set before the commit, as there); returns their states with what they held, for a failure
    that comes after (a later group, the COPY's end, the commit's deferred foreign-key
    checks)."""
    states = list(map(_STATE, objs))
    held = (states, list(map(_ADDING, states)), list(map(_DB, states)))
    deque(map(setattr, states, repeat("adding"), repeat(False)), maxlen=0)
    deque(map(setattr, states, repeat("db"), repeat(alias)), maxlen=0)
    return held


def _vendor(connection: Any) -> str:
    return "mariadb" if connection.vendor == "mysql" else str(connection.vendor)
