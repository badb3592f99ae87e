"""``bulk_create`` with conflict handling leaves objects as it leaves ``BigAutoField``'s.

``BigAutoField`` objects go through ``bulk_create`` without a key; ``SnowflakeAutoField`` gives
them one first, so Django treats them as objects that came with a key. With conflicts that
differs in two ways this module puts right, for the objects the field gave a key:

* ``update_conflicts=True`` where the backend returns rows from a bulk insert (PostgreSQL,
  SQLite, MariaDB): ``BigAutoField`` reads each row's key back with ``RETURNING``, the key of
  the row inserted or of the row updated. The INSERT gets ``RETURNING`` of the key too, and each
  object gets its row's key as the rows are converted.
* ``ignore_conflicts=True`` (and ``update_conflicts`` where nothing is returned): Django cannot
  tell which rows were written, so ``BigAutoField`` objects keep ``pk`` None and the state they
  had (``_state.adding`` True, ``_state.db`` None for new objects). ``bulk_create`` writes
  ``adding``/``db`` of objects that came with a key; those two writes are let pass no more.

Both hook into the INSERT being built (``SQLInsertCompiler``, whose ``pre_save_val`` calls the
field's ``pre_save``): ``returning_fields`` is read after the rows are built, and
``get_converters`` after the rows are fetched, in Django 5.2 and 6.x alike.
"""

from __future__ import annotations

import sys
from typing import Any

from django.db.models.base import ModelState
from django.db.models.constants import OnConflict

from ._django_callers import BULK_CREATE

__all__ = ["after_conflict_key_taken_off", "restore_state"]

#: On the compiler: {id(obj): obj} of the objects waiting for their row's key.
_WAITING = "_snowflake_waiting_for_keys"


class _StateKeptFromBulkCreate(ModelState):
    """A ``ModelState`` that ignores ``bulk_create``'s ``adding = False`` and ``db = alias``
    after an INSERT that may have skipped the row, then is an ordinary state again."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("adding", "db") and sys._getframe(1).f_code is BULK_CREATE:
            if name == "db":  # bulk_create writes adding, then db
                super().__setattr__("__class__", ModelState)
            return
        super().__setattr__(name, value)


def restore_state(instance: Any) -> None:
    """Make the state ordinary again (a conflict ``bulk_create`` that failed before its end)."""
    if type(instance._state) is _StateKeptFromBulkCreate:
        instance._state.__class__ = ModelState


def _read_keys_back(compiler: Any, instance: Any, field: Any) -> None:
    waiting: dict[int, Any] | None = compiler.__dict__.get(_WAITING)
    if waiting is None:
        waiting = compiler.__dict__[_WAITING] = {}
        returning = list(compiler.returning_fields or ())
        if field not in returning:
            # The rows are built before as_sql() reads returning_fields: RETURNING gets the key.
            compiler.returning_fields = [*returning, field]
        position = compiler.returning_fields.index(field)
        rows_for = iter(compiler.query.objs)
        attname = field.attname
        get_converters = compiler.get_converters

        def give_key(value: Any, expression: Any, connection: Any) -> Any:
            obj = next(rows_for)  # RETURNING gives one row per object, in order
            if id(obj) in waiting:
                obj.__dict__[attname] = value
            return value

        def with_give_key(expressions: Any) -> dict[int, tuple[list[Any], Any]]:
            converters: dict[int, tuple[list[Any], Any]] = get_converters(expressions)
            existing, expression = converters.get(position, ([], expressions[position]))
            converters[position] = ([*existing, give_key], expression)
            return converters

        compiler.get_converters = with_give_key
    waiting[id(instance)] = instance


def after_conflict_key_taken_off(compiler: Any, instance: Any, field: Any) -> None:
    """``instance``'s new key went into an INSERT that handles conflicts and was taken off the
    object: read its row's key back where ``BigAutoField`` would, else keep its state."""
    returns_rows = compiler.connection.features.can_return_rows_from_bulk_insert
    if compiler.query.on_conflict == OnConflict.UPDATE and returns_rows:
        _read_keys_back(compiler, instance, field)
    else:
        instance._state.__class__ = _StateKeptFromBulkCreate
