"""Keys from the database for rows the application does not insert: Django's side of
:mod:`snowflake_db.key_functions`.

* :class:`InstallKeyFunction`: a migration operation creating ``snowflake_next_id()`` on the
  migration's database (PostgreSQL, MariaDB), its worker ID a slot reserved forever in the worker
  tables of ``SNOWFLAKE_DB["CONTROL_DATABASE"]``: through the migration's own connection and
  transaction when that is the control database, else on the control database. Reversed, it
  drops the function and frees the slot.
* :class:`KeyFunction`: the function as a column's ``db_default``
  (``SnowflakeAutoField(primary_key=True, db_default=KeyFunction())``), which ``makemigrations``
  writes into the migration. PostgreSQL: ``DEFAULT (snowflake_next_id())``. MariaDB refuses a
  stored function in ``DEFAULT``: there the column defaults to ``0``, which the trigger of
  :class:`InstallKeyTrigger` replaces with the function's key.
* :class:`InstallKeyTrigger`: MariaDB's ``BEFORE INSERT`` trigger for one model's key column;
  nothing to do on PostgreSQL, where the column's default calls the function.

SQLite has no stored functions: the operations refuse it, and check ``snowflake_db.E015``
reports a ``KeyFunction`` default on a model migrated there. The application keeps making the
keys of ``save()``, ``create()`` and ``bulk_create()``; the database makes only the keys an
``INSERT`` leaves out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError, models, router, transaction
from django.db.migrations.operations.base import Operation
from django.utils.deconstruct import deconstructible

from ..errors import InvalidArgumentError, SnowflakeMigrationError
from .conf import get_settings

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from ..key_functions import FunctionSpec

__all__ = [
    "InstallKeyFunction",
    "InstallKeyTrigger",
    "KeyFunction",
    "KeyTriggerCheck",
    "check_key_default",
    "key_function_of",
]

#: Django vendors with a key function.
KEY_FUNCTION_VENDORS = ("postgresql", "mysql")
#: :data:`snowflake_db.key_functions.DEFAULT_FUNCTION_NAME`, repeated so that importing this
#: module (and ``snowflake_db.django``) needs no SQLAlchemy; a test compares them.
DEFAULT_FUNCTION_NAME = "snowflake_next_id"


def _spec(name: str, schema: str | None, vendor: str = "postgresql") -> FunctionSpec:
    """The function's name and schema, validated (this imports SQLAlchemy: a database with a
    key function needs the ``postgres`` or ``mysql`` extra, which bring it)."""
    from ..key_functions import FunctionSpec

    backend = "mariadb" if vendor == "mysql" else "postgresql"
    return FunctionSpec(name, schema, backend)  # validates both identifiers


@deconstructible(path="snowflake_db.django.KeyFunction")
class KeyFunction(models.Func):
    """The key function as a column's database default: ``db_default=KeyFunction()``.

    PostgreSQL renders ``snowflake_next_id()`` (``schema.name()`` when given). MariaDB refuses
    a stored function in ``DEFAULT``: the column defaults to ``0`` there, and
    :class:`InstallKeyTrigger` turns a missing or ``0`` key into the function's (no key this
    library makes is 0). Other databases raise ``NotSupportedError``.
    """

    allowed_default = True
    arity = 0

    def __init__(self, name: str = DEFAULT_FUNCTION_NAME, schema: str | None = None) -> None:
        self.name, self.schema = name, schema
        _spec(name, schema)
        super().__init__(output_field=models.BigIntegerField())

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        if connection.vendor == "postgresql":
            return _spec(self.name, self.schema).call_sql, []
        if connection.vendor == "mysql":
            return "0", []  # the trigger's "no key" mark (MariaDB error 1901 for a function)
        raise NotSupportedError(
            f"KeyFunction ({self.name}()) needs PostgreSQL or MariaDB, not {connection.vendor}: "
            "SQLite has no stored functions; let the application make the keys there "
            "(remove db_default=KeyFunction())"
        )

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema else ""
        return f"KeyFunction({self.name!r}{schema})"


def key_function_of(field: models.Field) -> KeyFunction | None:
    """The field's ``db_default`` if it is a :class:`KeyFunction`."""
    db_default = getattr(field, "db_default", None)
    return db_default if isinstance(db_default, KeyFunction) else None


#: The end of :class:`KeyTriggerCheck`'s default name (``snowflake_db.key_functions``'s too).
_CHECK_SUFFIX = "_key_trigger_missing"


class KeyTriggerCheck(models.BaseConstraint):
    """MariaDB: ``CHECK (key <> 0)`` for a field with ``db_default=KeyFunction()``, whose
    column defaults to the placeholder ``0`` there. MariaDB evaluates it after the
    ``BEFORE INSERT`` trigger of :class:`InstallKeyTrigger`, so a row the trigger gave a key
    passes; without the trigger (never migrated, dropped, the table made again) an ``INSERT``
    that leaves out the key fails with an error naming the constraint,
    ``<app>_<model>_<field>_key_trigger_missing``, instead of storing the key 0.

    ``class Meta: constraints = [KeyTriggerCheck()]`` (``KeyTriggerCheck("number")`` for
    another field); ``makemigrations`` writes it. Other databases get nothing from it: on
    PostgreSQL the column's default is the function itself. Check ``snowflake_db.E016``
    reports a ``KeyFunction`` field without it on a model migrated to MariaDB.
    """

    def __init__(
        self,
        field_name: str = "id",
        *,
        name: str | None = None,
        violation_error_code: str | None = None,
        violation_error_message: str | None = None,
    ) -> None:
        if not isinstance(field_name, str) or not field_name:
            raise InvalidArgumentError(
                f"KeyTriggerCheck: field_name={field_name!r} must name a field of the model"
            )
        self.field_name = field_name
        super().__init__(
            name=name or f"%(app_label)s_%(class)s_{field_name}{_CHECK_SUFFIX}",
            violation_error_code=violation_error_code,
            violation_error_message=violation_error_message,
        )

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """Its name as formatted for the model (``clone()`` and migrations keep it)."""
        _, args, kwargs = super().deconstruct()
        if self.field_name != "id":
            kwargs["field_name"] = self.field_name
        return "snowflake_db.django.KeyTriggerCheck", args, kwargs

    def _sql_parts(self, model: Any, schema_editor: Any) -> tuple[str, str, str] | None:
        if schema_editor.connection.vendor != "mysql":
            return None
        quote = schema_editor.quote_name
        column = model._meta.get_field(self.field_name).column
        # a name over MariaDB's 64 characters is refused by MariaDB itself: pass name=
        return quote(model._meta.db_table), quote(self.name), f"{quote(column)} <> 0"

    def constraint_sql(self, model: Any, schema_editor: Any) -> str | None:
        parts = self._sql_parts(model, schema_editor)
        if parts is None:
            return None
        _, name, condition = parts
        return f"CONSTRAINT {name} CHECK ({condition})"

    def create_sql(self, model: Any, schema_editor: Any) -> str | None:
        parts = self._sql_parts(model, schema_editor)
        if parts is None:
            return None
        table, name, condition = parts
        # IF NOT EXISTS: InstallKeyTrigger on a field without the default made the same one
        return f"ALTER TABLE {table} ADD CONSTRAINT IF NOT EXISTS {name} CHECK ({condition})"

    def remove_sql(self, model: Any, schema_editor: Any) -> str | None:
        parts = self._sql_parts(model, schema_editor)
        if parts is None:
            return None
        table, name, _ = parts
        return f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}"

    def validate(self, model: Any, instance: Any, exclude: Any = None, using: Any = None) -> None:
        """Nothing to validate in Python: the application never makes the key 0, and an
        unsaved object's key is ``None`` until its ``INSERT``."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyTriggerCheck):
            return self.deconstruct() == other.deconstruct()
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.field_name, self.name))

    def __repr__(self) -> str:
        return f"<KeyTriggerCheck: field_name={self.field_name!r} name={self.name!r}>"


def _has_trigger_check(field: models.Field) -> bool:
    return any(
        isinstance(constraint, KeyTriggerCheck) and constraint.field_name == field.name
        for constraint in field.model._meta.constraints
    )


def check_key_default(field: models.Field, databases: Any) -> list[Any]:
    """E015: a ``KeyFunction`` default on a model migrated to a database without key functions;
    E016: on a model migrated to MariaDB, such a field without its :class:`KeyTriggerCheck`
    (run where Django runs database checks: ``migrate``, ``check --database``)."""
    from django.core.checks import Error
    from django.db import connections

    if key_function_of(field) is None or not databases:
        return []
    model = field.model
    errors = []
    for alias in databases:
        vendor = connections[alias].vendor
        if not router.allow_migrate_model(alias, model):
            continue
        if vendor == "mysql" and not _has_trigger_check(field):
            argument = "" if field.name == "id" else repr(field.name)
            errors.append(
                Error(
                    f"{model._meta.label}.{field.name} has db_default=KeyFunction(), whose "
                    f"MariaDB column (database {alias!r}) defaults to the trigger's placeholder "
                    "0: without KeyTriggerCheck an INSERT that finds no trigger stores the key 0",
                    hint=f"Add KeyTriggerCheck({argument}) (from snowflake_db.django) to "
                    f"{model.__name__}.Meta.constraints and run makemigrations.",
                    obj=field,
                    id="snowflake_db.E016",
                )
            )
        if vendor in KEY_FUNCTION_VENDORS:
            continue
        errors.append(
            Error(
                f"{model._meta.label}.{field.name} has db_default=KeyFunction(), but database "
                f"{alias!r} ({vendor}) has no stored functions to make keys with",
                hint="Keep the model off that database with a router, or remove the "
                "db_default (the application makes every key there anyway).",
                obj=field,
                id="snowflake_db.E015",
            )
        )
    return errors


class _BorrowedConnection:
    """A DB-API connection lent to SQLAlchemy for one operation: its transaction stays
    Django's (commit, rollback and close are Django's to do, never SQLAlchemy's)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self._raw.cursor(*args, **kwargs)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def add_notice_handler(self, handler: Any) -> None:
        pass  # SQLAlchemy's psycopg dialect would add one to Django's connection each time

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def migration_connection(schema_editor: Any) -> AbstractContextManager[Connection]:
    """A SQLAlchemy ``Connection`` on the migration's own database connection, inside its
    transaction (:func:`django_connection`)."""
    return django_connection(schema_editor.connection)


@contextmanager
def django_connection(connection: Any) -> Iterator[Connection]:
    """A SQLAlchemy ``Connection`` on Django's ``connection``, inside its transaction
    (``transaction.atomic``: a savepoint in an atomic migration; on MariaDB, whose DDL commits
    implicitly, a transaction that makes the savepoints of the slot claim work)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from .worker import sqlalchemy_url

    with transaction.atomic(using=connection.alias):
        connection.ensure_connection()
        raw = connection.connection
        # use_native_hstore=False: psycopg's type lookup needs its own Connection class.
        dialect_options = {"use_native_hstore": False} if connection.vendor == "postgresql" else {}
        engine = create_engine(
            sqlalchemy_url(connection.alias),
            creator=lambda: _BorrowedConnection(raw),
            poolclass=NullPool,
            pool_reset_on_return=None,
            **dialect_options,
        )
        try:
            with engine.connect() as bind:
                yield bind
        finally:
            engine.dispose()


def _refuse_elsewhere(what: str, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor not in KEY_FUNCTION_VENDORS:
        raise SnowflakeMigrationError(
            f"{what} on database alias {connection.alias!r}: database keys need PostgreSQL or "
            f"MariaDB, not {connection.vendor} (SQLite has no stored functions; the application "
            "makes every key there). Keep this migration off that alias with a router "
            "(hints=...) or remove the operation"
        )
    if schema_editor.collect_sql:
        raise SnowflakeMigrationError(
            f"{what} reserves a worker slot and reads the database: it cannot be written as SQL"
        )


class _KeyOperation(Operation):
    """Runs on the aliases the routers allow for ``hints`` (like ``RunSQL``); no model state."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, *, hints: dict[str, Any] | None = None) -> None:
        self.hints = hints or {}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def _allowed(self, app_label: str, schema_editor: Any) -> bool:
        return bool(
            router.allow_migrate(schema_editor.connection.alias, app_label, **self.hints)
        )


class InstallKeyFunction(_KeyOperation):
    """Create the key function ``name()`` on the migration's database; reversed, drop it.

    Its worker ID is a slot reserved forever in the worker tables of
    ``SNOWFLAKE_DB["CONTROL_DATABASE"]`` (its table names from ``ALLOCATOR_OPTIONS``), found
    again by ``label`` (default ``<backend>-function:<database>@<server>:<schema>.<name>``,
    the server's own identity); the layout is ``SNOWFLAKE_DB``'s. On the control database
    itself the reservation runs in the migration's transaction: the migration must depend on
    ``snowflake_db``'s (the worker tables). Put it before the models whose ``db_default`` is
    :class:`KeyFunction` (PostgreSQL checks the function exists when a default names it).
    """

    def __init__(
        self,
        name: str = DEFAULT_FUNCTION_NAME,
        *,
        schema: str | None = None,
        label: str | None = None,
        rollback_tolerance_ms: int | None = None,
        max_wait_ms: int | None = None,
        hints: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(hints=hints)
        _spec(name, schema)
        for option, value in (
            ("rollback_tolerance_ms", rollback_tolerance_ms),
            ("max_wait_ms", max_wait_ms),
        ):
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidArgumentError(
                    f"InstallKeyFunction: {option}={value!r} must be an int >= 0 (milliseconds)"
                )
        if label is not None and (not isinstance(label, str) or not label):
            raise InvalidArgumentError(f"InstallKeyFunction: label={label!r} must be a string")
        self.name, self.schema, self.label = name, schema, label
        self.rollback_tolerance_ms, self.max_wait_ms = rollback_tolerance_ms, max_wait_ms

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        args = [self.name] if self.name != DEFAULT_FUNCTION_NAME else []
        given = {
            "schema": self.schema,
            "label": self.label,
            "rollback_tolerance_ms": self.rollback_tolerance_ms,
            "max_wait_ms": self.max_wait_ms,
            "hints": self.hints or None,
        }
        return (
            self.__class__.__qualname__,
            args,
            {key: value for key, value in given.items() if value is not None},
        )

    def describe(self) -> str:
        return f"Install the key function {self.name}()"

    @property
    def migration_name_fragment(self) -> str:
        return f"install_{self.name}"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not self._allowed(app_label, schema_editor):
            return
        from ..key_functions import install_key_function

        _refuse_elsewhere("InstallKeyFunction", schema_editor)
        place = slot_place(schema_editor.connection.alias)
        options = function_options(self.rollback_tolerance_ms)
        if self.max_wait_ms is not None:
            options["max_wait_ms"] = self.max_wait_ms
        with migration_connection(schema_editor) as bind:
            if function_exists(bind, self.name, self.schema):
                raise SnowflakeMigrationError(
                    f"InstallKeyFunction: a function {self._where(schema_editor)} already "
                    "exists (installed by another migration, or left by one that failed on "
                    "MariaDB, whose DDL is not transactional): drop it, or mark this migration "
                    "applied with migrate --fake"
                )
            install_key_function(
                bind,
                name=self.name,
                schema=self.schema,
                layout=get_settings().layout,
                label=self.label,
                **place,
                **options,
            )

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not self._allowed(app_label, schema_editor):
            return
        from ..key_functions import drop_key_function

        _refuse_elsewhere("InstallKeyFunction (reversed)", schema_editor)
        place = slot_place(schema_editor.connection.alias)
        with migration_connection(schema_editor) as bind:
            if not function_exists(bind, self.name, self.schema):
                raise SnowflakeMigrationError(
                    f"InstallKeyFunction (reversed): there is no function "
                    f"{self._where(schema_editor)} to drop, so its last key is unknown and its "
                    "worker slot stays reserved (see manage.py snowflake workers); mark this "
                    "migration unapplied with migrate --fake"
                )
            drop_key_function(
                bind,
                name=self.name,
                schema=self.schema,
                layout=get_settings().layout,
                label=self.label,
                **place,
            )

    def _where(self, schema_editor: Any) -> str:
        return (
            f"{_spec(self.name, self.schema).call_sql} on database alias "
            f"{schema_editor.connection.alias!r}"
        )


def function_options(rollback_tolerance_ms: int | None = None) -> dict[str, Any]:
    """The key function's clock option: ``rollback_tolerance_ms`` when given, else
    ``GENERATOR_OPTIONS``' (the application's generator tolerates the same), else the
    function's own default."""
    if rollback_tolerance_ms is not None:
        return {"rollback_tolerance_ms": rollback_tolerance_ms}
    generator_options = get_settings().generator_options
    if "rollback_tolerance_ms" in generator_options:
        return {"rollback_tolerance_ms": generator_options["rollback_tolerance_ms"]}
    return {}


def slot_place(alias: str, what: str = "InstallKeyFunction") -> dict[str, Any]:
    """Where the function's slot is reserved: the worker tables of the control database (this
    connection's when ``alias`` is the control database, else ``control_url``); ``what``
    installs it (for the error when the control database has no worker tables)."""
    from .models import REGISTRATIONS_TABLE, SLOTS_TABLE

    conf = get_settings()
    options = conf.allocator_options
    place: dict[str, Any] = {
        "slots_table": options.get("slots_table", SLOTS_TABLE),
        "registrations_table": options.get("registrations_table", REGISTRATIONS_TABLE),
        "slots_schema": options.get("schema"),
    }
    control = conf.control_database
    _require_worker_tables(control, place, what)
    if alias != control:
        from .worker import sqlalchemy_url

        place["control_url"] = conf.engine_url or sqlalchemy_url(control).render_as_string(
            hide_password=False
        )
    return place


def _require_worker_tables(control: str, place: dict[str, Any], what: str) -> None:
    """The control database must have the worker tables (its ``snowflake_db`` migrations run),
    or the function would take a slot nobody else sees."""
    from django.db import connections

    if place["slots_schema"] is not None or control not in connections.databases:
        return  # another schema, or ENGINE_URL only: the allocator reports a missing table
    connection = connections[control]
    with connection.cursor() as cursor:
        names = set(connection.introspection.table_names(cursor))
    if place["slots_table"] not in names:
        in_a_migration = (
            "; in the same database, add a dependency on ('snowflake_db', '0002_workerlayout') "
            "to this migration" if what == "InstallKeyFunction" else ""
        )
        raise SnowflakeMigrationError(
            f"{what}: the worker table {place['slots_table']} is not in the control database "
            f"(alias {control!r}): migrate snowflake_db there first{in_a_migration}"
        )


def function_exists(bind: Connection, name: str, schema: str | None) -> bool:
    from sqlalchemy import text

    if bind.dialect.name == "postgresql":
        spec = _spec(name, schema)
        found = bind.scalar(
            text("SELECT to_regprocedure(:signature)"),
            {"signature": f"{spec.qualified(name)}()"},
        )
        return found is not None
    count = bind.scalar(
        text(
            "SELECT COUNT(*) FROM information_schema.routines WHERE routine_type = 'FUNCTION' "
            "AND routine_schema = COALESCE(:schema, DATABASE()) AND routine_name = :name"
        ),
        {"schema": schema, "name": name},
    )
    return bool(count)


class InstallKeyTrigger(_KeyOperation):
    """MariaDB: a ``BEFORE INSERT`` trigger giving ``model_name``'s key column (``field_name``,
    default its primary key) the key function's value when an ``INSERT`` leaves it out, is
    NULL or 0; reversed, drop it. A key the ``INSERT`` gives is kept.

    PostgreSQL needs none (the column's ``db_default=KeyFunction()`` calls the function): there
    this checks that the field has that default and does nothing. The trigger calls the
    field's :class:`KeyFunction` (its name and schema), or the default function when the field
    has none; such a column also gets ``DEFAULT 0`` (dropped when reversed), which
    ``INSERT ... SELECT`` without the key needs in strict mode.
    """

    def __init__(
        self,
        model_name: str,
        field_name: str | None = None,
        *,
        hints: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(hints=hints)
        if not isinstance(model_name, str) or not model_name:
            raise InvalidArgumentError(
                f"InstallKeyTrigger: model_name={model_name!r} must name a model of this app"
            )
        self.model_name, self.field_name = model_name, field_name

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        args: list[Any] = [self.model_name]
        if self.field_name is not None:
            args.append(self.field_name)
        return (self.__class__.__qualname__, args, {"hints": self.hints} if self.hints else {})

    def describe(self) -> str:
        return f"Install the key trigger of {self.model_name}"

    @property
    def migration_name_fragment(self) -> str:
        return f"key_trigger_{self.model_name.lower()}"

    def _field(self, app_label: str, state: Any) -> tuple[Any, Any]:
        model = state.apps.get_model(app_label, self.model_name)
        try:
            field = (
                model._meta.pk
                if self.field_name is None
                else model._meta.get_field(self.field_name)
            )
        except Exception:
            raise SnowflakeMigrationError(
                f"InstallKeyTrigger: {model._meta.label} has no field {self.field_name!r}"
            ) from None
        return model, field

    def _run(self, app_label: str, schema_editor: Any, state: Any, *, install: bool) -> None:
        if not self._allowed(app_label, schema_editor):
            return
        model, field = self._field(app_label, state)
        if not router.allow_migrate_model(schema_editor.connection.alias, model):
            return
        what = "InstallKeyTrigger" + ("" if install else " (reversed)")
        _refuse_elsewhere(what, schema_editor)
        function = key_function_of(field)
        if schema_editor.connection.vendor == "postgresql":
            if function is None:
                raise SnowflakeMigrationError(
                    f"{what}: on PostgreSQL the key comes from the column's default: give "
                    f"{model._meta.label}.{field.name} db_default=KeyFunction() (no trigger "
                    "is needed)"
                )
            return
        from ..key_functions import drop_key_trigger, install_key_trigger

        table, column = model._meta.db_table, field.column
        # A KeyFunction default already is DEFAULT 0 in the migration state: leave it alone.
        zero_default = function is None
        with migration_connection(schema_editor) as bind:
            if install:
                name = function.name if function else DEFAULT_FUNCTION_NAME
                schema = function.schema if function else None
                if not function_exists(bind, name, schema):
                    raise SnowflakeMigrationError(
                        f"{what}: the key function {_spec(name, schema).call_sql} does not "
                        f"exist on database alias {schema_editor.connection.alias!r}: run "
                        "InstallKeyFunction in an earlier migration (a dependency of this one)"
                    )
                install_key_trigger(
                    bind, table, column, name=name, schema=schema, zero_default=zero_default
                )
            else:
                drop_key_trigger(bind, table, column, zero_default=zero_default)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._run(app_label, schema_editor, to_state, install=True)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._run(app_label, schema_editor, from_state, install=False)
