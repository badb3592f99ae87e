"""Which Django function is calling the field: told apart by Django's own (private) code objects.

Why this exists: Django asks a primary key for its value through one method,
``get_pk_value_on_save()``, from two places that need different answers. ``Model._save_table``
(``save()``) may leave the key to the INSERT that follows at once; ``QuerySet.
_prepare_for_bulk_create`` (``bulk_create()``) sorts objects by whether they have a key before
it writes them, so it must get one now. Likewise ``pre_save()`` is called from
``SQLInsertCompiler.pre_save_val`` without saying whether the INSERT handles conflicts, and
``bulk_create`` marks objects saved (``_state.adding``/``db``) even where a conflict may have
skipped their row. No public hook says who is asking, so the field compares the calling frame's
code with these functions' code objects: one pointer comparison, on paths run once per row.

They are private to Django and may change in any release. Everything that depends on them is
listed in :data:`CALLERS` (the function, the locals the field reads from its frame, and the
names its code must use); :func:`problems` checks them against the installed Django, and the
test suite fails with the Django version when one changes (tests/django/test_django_callers.py).
Checked on Django 5.2 and 6.x.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any, NamedTuple

import django
from django.db import models
from django.db.models.sql.compiler import SQLInsertCompiler

__all__ = [
    "BULK_CREATE",
    "CALLERS",
    "PREPARE_FOR_BULK_CREATE",
    "PRE_SAVE_VAL",
    "SAVE_TABLE",
    "Caller",
    "bulk_create_handles_conflicts",
    "conflict_insert_compiler",
    "problems",
]


class Caller(NamedTuple):
    """A Django function the field recognises, and what it relies on in it."""

    owner: type
    name: str
    #: Locals of its frame the field reads (``frame.f_locals``).
    reads: tuple[str, ...]
    #: Names its code uses that make it the caller the field expects (methods it calls on the
    #: field, attributes it sets).
    uses: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}"


#: Every Django private the field depends on.
CALLERS = {
    # save(): may leave the key to the INSERT (unless a raw save, fixtures).
    "SAVE_TABLE": Caller(models.Model, "_save_table", ("raw",), ("get_pk_value_on_save",)),
    # bulk_create(): asks per object; the field answers for all of them (its `objs`) at once.
    "PREPARE_FOR_BULK_CREATE": Caller(
        models.QuerySet, "_prepare_for_bulk_create", ("objs",), ("get_pk_value_on_save",)
    ),
    # Its caller: `on_conflict` says whether conflicts are ignored or updated; it marks objects
    # saved (`_state.adding`, `_state.db`), which conflicts.py holds back.
    "BULK_CREATE": Caller(
        models.QuerySet,
        "bulk_create",
        ("on_conflict",),
        ("_prepare_for_bulk_create", "adding", "db"),
    ),
    # The INSERT compiler's call of pre_save(); its `self` knows the INSERT's on_conflict.
    "PRE_SAVE_VAL": Caller(SQLInsertCompiler, "pre_save_val", ("self",), ("pre_save",)),
}


def _code(caller: Caller) -> CodeType:
    function = getattr(caller.owner, caller.name, None)
    code = getattr(function, "__code__", None)
    if not isinstance(code, CodeType):
        raise ImportError(
            f"snowflake_db.django needs {caller.label} (a Django private), which Django "
            f"{django.get_version()} does not have: this Django version is not supported yet"
        )
    return code


SAVE_TABLE = _code(CALLERS["SAVE_TABLE"])
PREPARE_FOR_BULK_CREATE = _code(CALLERS["PREPARE_FOR_BULK_CREATE"])
BULK_CREATE = _code(CALLERS["BULK_CREATE"])
PRE_SAVE_VAL = _code(CALLERS["PRE_SAVE_VAL"])


def problems() -> list[str]:
    """What in :data:`CALLERS` the installed Django no longer has (empty when all is there)."""
    found = []
    for caller in CALLERS.values():
        code = getattr(getattr(caller.owner, caller.name, None), "__code__", None)
        if not isinstance(code, CodeType):
            found.append(f"{caller.label} is gone")
            continue
        missing_locals = [name for name in caller.reads if name not in code.co_varnames]
        missing_uses = [name for name in caller.uses if name not in code.co_names]
        if missing_locals:
            found.append(f"{caller.label} has no local {', '.join(missing_locals)}")
        if missing_uses:
            found.append(f"{caller.label} no longer uses {', '.join(missing_uses)}")
    return found


def bulk_create_handles_conflicts(bulk_create: FrameType | None) -> bool:
    """True when this ``bulk_create`` frame ignores or updates conflicts (its ``on_conflict``)."""
    return (
        bulk_create is not None
        and bulk_create.f_code is BULK_CREATE
        and bulk_create.f_locals.get("on_conflict") is not None
    )


def conflict_insert_compiler() -> Any:
    """Called from a field's ``pre_save()``: the INSERT compiler when ``pre_save()`` was called
    for an INSERT with ON CONFLICT (ignore or update), else None."""
    frame = sys._getframe(2)  # 0: this function, 1: pre_save(), 2: its caller
    if frame.f_code is not PRE_SAVE_VAL:
        return None
    compiler = frame.f_locals["self"]
    return compiler if compiler.query.on_conflict is not None else None
