"""Model fields: ``SnowflakeAutoField`` (primary keys) and ``SnowflakeField`` (any other column).

``SnowflakeAutoField`` keeps ``AutoField``'s contract: an unsaved object has ``pk is None``, and
its key is assigned when its row is inserted (``save()``, ``create()``, ``bulk_create()``,
fixtures), by the application rather than the database. ``EagerSnowflakeAutoField`` is the
opt-in that gives a key at instantiation instead. ``SnowflakeField`` fills a non-key column when
the object is created, like any field with a callable default.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from django.apps import apps as global_apps
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.fields import NOT_PROVIDED
from django.utils.module_loading import import_string

from ..errors import GeneratorClosedError, InvalidIdError
from ..generator import MAX_IDS_PER_CALL
from ..process import get_generator, snowflake_default
from . import conflicts
from ._django_callers import (
    PREPARE_FOR_BULK_CREATE,
    SAVE_TABLE,
    bulk_create_handles_conflicts,
    conflict_insert_compiler,
)
from .instances import store, unset
from .narrow_columns import require_wide_columns

__all__ = [
    "EagerSnowflakeAutoField",
    "SnowflakeAutoField",
    "SnowflakeField",
    "is_snowflake_field",
]

#: A BIGINT column holds -2**63 .. 2**63 - 1; nothing outside is written (never truncated).
_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1

#: On ModelState: the key a conflict-handling bulk_create gave an object, until its INSERT.
_CONFLICT_KEY = "snowflake_conflict_key"
#: On ModelState: the key pre_save() made for save(), until its INSERT succeeds or fails.
_MADE_KEY = "snowflake_made_key"
#: Set once this process has made a conflict mark; until then pre_save() need not look for one.
_conflict_keys_handed_out = False


def _note_conflict_keys_handed_out() -> None:
    global _conflict_keys_handed_out  # noqa: PLW0603 - a one-way switch read once per row
    _conflict_keys_handed_out = True


def _next_keys(count: int) -> list[int]:
    """``count`` keys from the process-wide generator, in as few ``next_ids`` calls as allowed."""
    keys: list[int] = []
    while len(keys) < count:
        size = min(count - len(keys), MAX_IDS_PER_CALL)
        try:
            keys += get_generator().next_ids(size)
        except GeneratorClosedError:
            keys += get_generator().next_ids(size)  # configure() replaced it in flight
    return keys


def _drop_injected_default(kwargs: dict[str, Any]) -> None:
    # Migrations must not freeze a function path: the field injects the default itself.
    if kwargs.get("default") is snowflake_default:
        del kwargs["default"]


def _checked_key(field: models.Field, value: Any) -> Any:
    """The value as an int that fits BIGINT, or an error naming the model, field and value."""
    if type(value) is int and _BIGINT_MIN <= value <= _BIGINT_MAX:
        return value
    if value is None or hasattr(value, "resolve_expression"):
        return value
    if isinstance(value, bool):
        raise InvalidIdError(f"{_label(field)}: {value!r} is not an integer key")
    try:
        key = int(value)
    except (TypeError, ValueError):
        raise InvalidIdError(f"{_label(field)}: {value!r} is not an integer key") from None
    if isinstance(value, float) and key != value:
        raise InvalidIdError(f"{_label(field)}: {value!r} is not an integer key")
    if not _BIGINT_MIN <= key <= _BIGINT_MAX:
        raise InvalidIdError(
            f"{_label(field)}: key {key} does not fit a 64-bit BIGINT column "
            f"({_BIGINT_MIN}..{_BIGINT_MAX}); it would be truncated or refused by the database"
        )
    return key


def _wrap_insert(model: type[models.Model]) -> None:
    """Wrap ``model._do_insert``, Django's hook for "insert this object" (called for the object
    and for each multi-table parent), so the key goes into the INSERT, and an INSERT that fails
    leaves ``pk`` None, as AutoField's does.

    ``Model._save_table`` leaves ``Options.auto_field`` out of the INSERT of an object without
    a key, for the database to fill; this field is that auto field (the admin renders inline
    rows' keys for it), so the wrapper puts it back, and the compiler's ``pre_save()`` call
    makes the key and notes it on the object. Inherited wrappers are not wrapped again.
    """
    do_insert = model._do_insert
    if getattr(do_insert, "_snowflake_takes_key_back", False):
        return

    @functools.wraps(do_insert)
    def _do_insert(
        instance: Any, manager: Any, using: Any, fields: Any, *args: Any, **kwargs: Any
    ) -> Any:
        key_field = manager.model._meta.pk
        if not isinstance(key_field, SnowflakeAutoField) or key_field.database_generated:
            return do_insert(instance, manager, using, fields, *args, **kwargs)
        if key_field not in fields:
            fields = [key_field, *fields]
        try:
            return do_insert(instance, manager, using, fields, *args, **kwargs)
        except BaseException:
            made = instance._state.__dict__.pop(_MADE_KEY, None)
            if made is not None and getattr(instance, key_field.attname) == made:
                instance.__dict__[key_field.attname] = None
            raise
        finally:
            instance._state.__dict__.pop(_MADE_KEY, None)  # written: the key is the row's

    _do_insert._snowflake_takes_key_back = True  # type: ignore[attr-defined]
    model._do_insert = _do_insert  # type: ignore[method-assign]


def _takes_database_keys(meta: Any) -> bool:
    """True where the key must stay database-generated although DEFAULT_AUTO_FIELD names this
    field: Django's migration recorder, and migrations' copy of an auto-created many-to-many
    table of an app whose ``AppConfig.default_auto_field`` is another field (contrib.auth's
    ``AutoField``).

    Migrations build such a table's key from DEFAULT_AUTO_FIELD (their app configs are stubs
    without ``default_auto_field``), while the running app inserts into it as its own
    ``AutoField``, leaving the key to the database. A plain BIGINT there fails every
    ``user.groups.add()`` on PostgreSQL and MariaDB.
    """
    if meta.app_label == "migrations" and meta.db_table == "django_migrations":
        return True
    if not meta.auto_created or meta.apps is global_apps:
        return False
    try:
        app_field = global_apps.get_app_config(meta.app_label).default_auto_field
    except LookupError:
        return False  # an app no longer installed: its tables are whatever they were
    field_class = import_string(app_field) if isinstance(app_field, str) else app_field
    return not (isinstance(field_class, type) and issubclass(field_class, SnowflakeAutoField))


def _label(field: models.Field) -> str:
    model = getattr(field, "model", None)
    return f"{model._meta.label}.{field.name}" if model is not None else str(field.name)


class SnowflakeAutoField(models.BigAutoField):
    """A ``BigAutoField`` whose value comes from the application, not the database.

    Use it as ``DEFAULT_AUTO_FIELD``, as an ``AppConfig.default_auto_field`` or explicitly with
    ``primary_key=True``. As with ``AutoField``, a new object's ``pk`` stays ``None`` until its
    row is inserted, so Django's "unsaved object" rules (data-loss guards, multi-table
    inheritance onto an existing parent, ``Model(pk=existing).save()`` updating) all hold, and
    ``save()`` of a new object is one INSERT.

    The column is a plain ``BIGINT`` (no identity, sequence or ``AUTO_INCREMENT``; ``INTEGER
    PRIMARY KEY`` on SQLite, which is 64-bit): an INSERT without an ID fails instead of silently
    taking a small sequence number.
    """

    description = "Snowflake ID (64-bit integer generated by the application)"

    # Django reads an AutoField back after INSERT (RETURNING, or cursor.lastrowid on MySQL, which
    # is 0 for a column without AUTO_INCREMENT). The value is already known, so nothing is read
    # back: see django.db.models.Options.db_returning_fields and SQLInsertCompiler.execute_sql.
    db_returning = False

    #: True only on Django's own migration-recorder model (see contribute_to_class).
    database_generated = False

    @property
    def holds_snowflake_keys(self) -> bool:
        """The column holds keys this library makes (not the database): checked to be 64-bit
        (:mod:`.narrow_columns`)."""
        return not self.database_generated

    def contribute_to_class(self, cls: Any, name: str, *args: Any, **kwargs: Any) -> None:
        meta = cls._meta
        if _takes_database_keys(meta):
            # Django's MigrationRecorder model takes DEFAULT_AUTO_FIELD too
            # (django/db/migrations/recorder.py). Its rows must not need a worker ID: `migrate`
            # runs before the worker tables exist, and existing django_migrations tables often
            # have a 32-bit id. There the field stays a plain database-generated BigAutoField,
            # as it does for the many-to-many tables of apps with another auto field.
            self.database_generated = True
            self.db_returning = True
            super().contribute_to_class(cls, name, *args, **kwargs)
            return
        # As AutoFieldMixin.contribute_to_class, without its check that the column is
        # database-generated; the admin keys inline rows' hidden keys on Options.auto_field
        # (InlineAdminForm.needs_explicit_pk_field). _wrap_insert keeps the key in the INSERT.
        if meta.auto_field:
            raise ValueError(f"Model {meta.label} can't have more than one auto-generated field.")
        models.Field.contribute_to_class(self, cls, name, *args, **kwargs)
        meta.auto_field = self
        _wrap_insert(cls)

    def get_default(self) -> Any:
        """``None`` for a new object, also with ``db_default=KeyFunction()``: the database
        default is for rows the application does not insert, and the key stays ``None`` until
        the row is written, as an ``AutoField``'s (Django's own ``db_default`` would put a
        ``DatabaseDefault`` expression there, which its unsaved-object checks take for a key)."""
        if self.has_db_default() and not self.has_default():
            return None
        return super().get_default()

    def check(self, **kwargs: Any) -> list[Any]:
        from .database_keys import check_key_default

        return [*super().check(**kwargs), *check_key_default(self, kwargs.get("databases"))]

    def get_pk_value_on_save(self, instance: Any) -> int | None:
        """The key for an object being inserted with ``pk`` None.

        ``save()`` gets None: the INSERT follows at once (no UPDATE probe, which Django makes
        for any object whose pk is set) and ``pre_save()`` puts the key into it and onto the
        object. ``bulk_create()`` sorts objects by whether they have a key before it writes
        them, and raw saves (fixtures) skip ``pre_save()``: they get the key now.
        """
        if self.database_generated:
            return None
        # Who asks: save() or bulk_create() (see _django_callers for why this is by code object).
        caller = sys._getframe(1)
        if caller.f_code is SAVE_TABLE and not caller.f_locals.get("raw"):
            return None
        key = snowflake_default()
        if caller.f_code is not PREPARE_FOR_BULK_CREATE:
            return key
        # bulk_create asks object by object; the first question is answered for every object
        # still without a key, with one next_ids() call, so Django asks no more.
        conflicts = bulk_create_handles_conflicts(caller.f_back)
        if conflicts:
            _note_conflict_keys_handed_out()  # before any object carries a mark
        objs = [obj for obj in caller.f_locals.get("objs", ()) if obj is not instance]
        waiting = unset(objs, self.attname)
        other_keys = _next_keys(len(waiting))
        store(waiting, self.attname, other_keys)  # at C speed: Django asks no more
        if conflicts:
            for obj, other_key in zip(waiting, other_keys, strict=True):
                obj._state.__dict__[_CONFLICT_KEY] = other_key
        if conflicts:
            # bulk_create(ignore_conflicts=True) or update_conflicts=True: Django cannot tell
            # which rows it wrote or which kept their old key. pre_save() puts the key into
            # the INSERT and takes it off the object, whose pk stays None as an AutoField's.
            instance._state.__dict__[_CONFLICT_KEY] = key
        return key

    def pre_save(self, model_instance: Any, add: bool) -> Any:
        """The key for the INSERT being built: made here for ``save()``."""
        value = getattr(model_instance, self.attname)
        if type(value) is int and not _conflict_keys_handed_out:
            return value  # bulk_create calls this once per row: the common case first
        if value is None:
            if add and not self.database_generated:
                value = snowflake_default()
                setattr(model_instance, self.attname, value)
                model_instance._state.__dict__[_MADE_KEY] = value  # until the INSERT ends
            return value
        if type(value) is not int and not hasattr(value, "resolve_expression"):
            # An explicit key given as "123456": the object holds the int that is written, as
            # an AutoField's does after the database returns it (refused if not an integer).
            value = _checked_key(self, value)
            setattr(model_instance, self.attname, value)
        marks = model_instance._state.__dict__
        # The mark of a bulk_create that failed before its INSERT must not unset the key of a
        # later save(): only an INSERT that handles conflicts takes the key off the object.
        if _CONFLICT_KEY in marks and marks.pop(_CONFLICT_KEY) == value:
            compiler = conflict_insert_compiler()
            if compiler is not None:
                setattr(model_instance, self.attname, None)
                conflicts.after_conflict_key_taken_off(compiler, model_instance, self)
                return value
        conflicts.restore_state(model_instance)
        return value

    def get_db_prep_save(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        if connection.vendor == "mysql" and not self.database_generated:
            require_wide_columns(connection)
        if type(value) is int and _BIGINT_MIN <= value <= _BIGINT_MAX:
            # Every key this field makes: what AutoFieldMixin.get_db_prep_value returns for an
            # int, without its int() round (bulk_create calls this once per row). MySQL's
            # validate_autopk_value() refuses 0, as for an AutoField (Django's own suite checks).
            return connection.ops.validate_autopk_value(value)
        return super().get_db_prep_save(_checked_key(self, value), connection)

    def get_internal_type(self) -> str:
        if self.database_generated:
            return "BigAutoField"
        # Schema editors key identity/sequence handling on the internal type: "BigIntegerField"
        # gives a plain BIGINT, and switching from BigAutoField drops the identity or sequence
        # (django/db/backends/postgresql/schema.py, _alter_column_type_sql).
        return "BigIntegerField"

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "sqlite" and not self.database_generated:
            # INTEGER PRIMARY KEY is SQLite's 64-bit rowid alias: https://www.sqlite.org/lang_createtable.html#rowid
            return "integer"
        result: str | None = super().db_type(connection)
        return result

    def deconstruct(self) -> tuple[str, str, list[Any], dict[str, Any]]:
        name, path, args, kwargs = super().deconstruct()
        _drop_injected_default(kwargs)
        return name, path, args, kwargs


class EagerSnowflakeAutoField(SnowflakeAutoField):
    """Opt-in: the key is assigned when the object is instantiated, before ``save()``.

    For code that needs an object's ID before it is written (to log it, send it elsewhere, or
    build related rows first). The price is Django's "unsaved" rules, which test ``pk is None``:
    an unsaved object looks saved to the data-loss guards and to ``filter(fk=obj)``,
    ``Model(pk=existing).save()`` raises IntegrityError instead of updating, ``full_clean()``
    makes a uniqueness query, multi-table inheritance onto an existing parent fails, and
    ``bulk_create(ignore_conflicts=True)`` leaves objects holding keys that were not inserted.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", snowflake_default)
        super().__init__(*args, **kwargs)

    def contribute_to_class(self, cls: Any, name: str, *args: Any, **kwargs: Any) -> None:
        if _takes_database_keys(cls._meta):
            self.default = NOT_PROVIDED
        super().contribute_to_class(cls, name, *args, **kwargs)


class SnowflakeField(models.BigIntegerField):
    """A ``BIGINT`` column filled with a Snowflake ID, for IDs that are not the primary key.

    For example a public order number next to an existing primary key. Unique and not editable
    unless told otherwise. Adding it to a table that already has rows needs the three-step
    migration Django documents for unique fields
    (https://docs.djangoproject.com/en/stable/howto/writing-migrations/#migrations-that-add-unique-fields):
    a callable default is evaluated once for all existing rows.
    """

    description = "Snowflake ID (64-bit integer generated by the application)"

    #: The column holds Snowflake keys: checked to be 64-bit (:mod:`.narrow_columns`).
    holds_snowflake_keys = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", snowflake_default)
        kwargs.setdefault("unique", True)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def check(self, **kwargs: Any) -> list[Any]:
        from .database_keys import check_key_default

        return [*super().check(**kwargs), *check_key_default(self, kwargs.get("databases"))]

    def get_db_prep_save(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        if connection.vendor == "mysql":
            require_wide_columns(connection)
        return super().get_db_prep_save(_checked_key(self, value), connection)

    def deconstruct(self) -> tuple[str, str, list[Any], dict[str, Any]]:
        name, path, args, kwargs = super().deconstruct()
        _drop_injected_default(kwargs)
        # Emit only what differs from this field's own defaults (unique, not editable).
        kwargs.pop("unique", None)
        if not self._unique:
            kwargs["unique"] = False
        kwargs.pop("editable", None)
        if self.editable:
            kwargs["editable"] = True
        return name, path, args, kwargs


def is_snowflake_field(field: object) -> bool:
    """True for the fields of this module (and subclasses)."""
    return isinstance(field, SnowflakeAutoField | SnowflakeField)
