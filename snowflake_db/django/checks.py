"""System checks: misconfiguration surfaces at start-up (``manage.py check``, ``runserver``,
``migrate``), not with the first duplicate key.

============================  =================================================================
``snowflake_db.E001``         ``SNOWFLAKE_DB`` is invalid
``snowflake_db.E002``         ``CONTROL_DATABASE`` is not in ``DATABASES`` or is in-memory SQLite
``snowflake_db.E003``         the table allocator's extras (SQLAlchemy, a driver) are missing
``snowflake_db.W001``         a static worker ID where a prefork server or Celery is in use
``snowflake_db.W002``         the worker tables would also be migrated on other aliases
``snowflake_db.W003``         ``WORKER_SOURCE = "env"`` but neither variable is set
``snowflake_db.W004``         a project app's ``default_auto_field`` overrides a Snowflake
                              ``DEFAULT_AUTO_FIELD`` (``manage.py startapp`` writes one)
``snowflake_db.E012``         a ``GenericForeignKey``'s object ID column has fewer than 64 bits
                              while models have Snowflake keys
``snowflake_db.E014``         a plain integer field named after a Snowflake-keyed model
                              (``offer_id``) or listed in ``KEY_COLUMNS`` has fewer than 64 bits
``snowflake_db.E010``         a Snowflake column (or a foreign key to one) is not 64-bit in the DB,
                              and no pending migration changes it
``snowflake_db.I010``         the columns ``migrate`` widens (a pending migration, or an
                              auto-created many-to-many key), named in one message
``snowflake_db.E011``         existing IDs decode to the future: epoch or layout changed
``snowflake_db.E013``         ``SNOWFLAKE_SHARD_ROUTER``'s layout is not ``SNOWFLAKE_DB["LAYOUT"]``
``snowflake_db.E015``         ``db_default=KeyFunction()`` on a model migrated to a database
                              without key functions (SQLite)
``snowflake_db.E016``         ``db_default=KeyFunction()`` on a model migrated to MariaDB
                              without its ``KeyTriggerCheck``
``snowflake_db.W020``         no public-ID keys are configured (a ``PublicId`` field's check)
``snowflake_db.E020``         the public-ID keys are invalid, or the codec cannot be built
``snowflake_db.E021``         a ``PublicId``'s ``field=`` names no integer field of its model
============================  =================================================================

W020, E020 and E021 are ``PublicId.check()``'s (:mod:`snowflake_db.django.public_ids`): Django
runs them with every model field's checks. E015 and E016 are the Snowflake fields' own
(Django runs them with the databases it checks: ``migrate``, ``check --database``).

E010 and E011 query the database, so they run only where Django runs database checks
(``migrate``, ``check --database ALIAS``):
https://docs.djangoproject.com/en/stable/topics/checks/#builtin-tags
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router
from django.utils.module_loading import import_string

from ..clock import wall_clock
from ..errors import SnowflakeError
from ..process import WORKER_ID_ENV, WORKER_URL_ENV
from .conf import SnowflakeSettings, get_settings
from .fields import SnowflakeAutoField, is_snowflake_field
from .key_columns import (
    field_kind,
    field_path,
    is_installed_package,
    narrow_generic_object_ids,
    narrow_key_fields,
    snowflake_keyed_models,
    unknown_declared_fields,
)
from .narrow_columns import NarrowColumn, narrow_columns, snowflake_models
from .worker import README_SECTION

APP_LABEL = "snowflake_db"

#: Allow this much clock skew before calling a stored ID "from the future".
FUTURE_TOLERANCE_MS = 5 * 60 * 1000


def _settings() -> tuple[SnowflakeSettings | None, list[CheckMessage]]:
    try:
        return get_settings(), []
    except ImproperlyConfigured as error:
        return None, [
            Error(str(error), hint=f"See {README_SECTION}.", id="snowflake_db.E001")
        ]


def prefork_hints() -> list[str]:
    """What suggests this project runs in forked worker processes (may be empty)."""
    hints: list[str] = []
    if any(name.startswith("CELERY") for name in dir(settings)):
        hints.append("CELERY_* settings (Celery's prefork pool forks workers)")
    if os.environ.get("GUNICORN_CMD_ARGS") is not None or "gunicorn" in os.path.basename(
        sys.argv[0] if sys.argv else ""
    ):
        hints.append("gunicorn (its workers are forked from the master)")
    if os.environ.get("SERVER_SOFTWARE", "").startswith("gunicorn"):
        hints.append("SERVER_SOFTWARE=gunicorn")
    if "uwsgi" in sys.modules:
        hints.append("uWSGI (its workers are forked from the master)")
    if "celery" in sys.modules:
        hints.append("the celery package is imported")
    return hints


@register()
def check_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Settings-only checks: no query is made."""
    conf, errors = _settings()
    if conf is None:
        return errors
    if conf.worker_source == "static":
        hints = prefork_hints()
        if hints:
            errors.append(
                Warning(
                    f"SNOWFLAKE_DB uses a static WORKER_ID={conf.worker_id}, but this project "
                    f"looks prefork-served ({'; '.join(hints)}): every forked child would share "
                    "the worker ID, so snowflake_db refuses to issue IDs in them.",
                    hint="Use WORKER_SOURCE='table' so each process leases its own worker ID.",
                    id="snowflake_db.W001",
                )
            )
    if conf.worker_source == "env" and not (
        os.environ.get(WORKER_URL_ENV, "").strip() or os.environ.get(WORKER_ID_ENV, "").strip()
    ):
        errors.append(
            Warning(
                f"SNOWFLAKE_DB uses WORKER_SOURCE='env' but neither {WORKER_URL_ENV} nor "
                f"{WORKER_ID_ENV} is set: the first Snowflake ID will raise NotConfiguredError.",
                hint="Set one of them, or WORKER_SOURCE='table' (or 'static' with WORKER_ID).",
                id="snowflake_db.W003",
            )
        )
    if conf.worker_source == "table":
        errors.extend(_check_table_source(conf))
    return errors


def _is_snowflake_auto_field(path: object) -> bool:
    try:
        field_class = import_string(str(path))
    except ImportError:
        return False  # Django reports an unimportable DEFAULT_AUTO_FIELD itself
    return isinstance(field_class, type) and issubclass(field_class, SnowflakeAutoField)


@register(Tags.models)
def check_app_auto_fields(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W004: a project app whose ``default_auto_field`` quietly overrides Snowflake keys."""
    if not _is_snowflake_auto_field(settings.DEFAULT_AUTO_FIELD):
        return []
    warnings: list[CheckMessage] = []
    for app_config in app_configs or apps.get_app_configs():
        if (
            not app_config._is_default_auto_field_overridden
            or _is_snowflake_auto_field(app_config.default_auto_field)
            or app_config.label == APP_LABEL
            or is_installed_package(app_config)
        ):
            continue
        affected = [
            model._meta.object_name
            for model in app_config.get_models()
            if model._meta.pk is not None
            and model._meta.pk.auto_created
            and not is_snowflake_field(model._meta.pk)
        ]
        if not affected:
            continue
        config_class = type(app_config)
        warnings.append(
            Warning(
                f"app {app_config.label!r} sets default_auto_field = "
                f"{app_config.default_auto_field!r} in {config_class.__module__}."
                f"{config_class.__qualname__}, which overrides DEFAULT_AUTO_FIELD "
                f"({settings.DEFAULT_AUTO_FIELD}): {', '.join(affected)} get database "
                "sequence keys, not Snowflake IDs",
                hint=f"Delete the default_auto_field line from {config_class.__module__} "
                "(manage.py startapp writes it), then run makemigrations.",
                obj=app_config,
                id="snowflake_db.W004",
            )
        )
    return warnings


@register(Tags.models)
def check_generic_foreign_keys(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E012: a GenericForeignKey that would store a Snowflake key in a 32-bit column."""
    keyed = [model._meta.label for model in snowflake_keyed_models()]
    errors: list[CheckMessage] = []
    for model, generic, object_id in narrow_generic_object_ids(_checked_models(app_configs)):
        errors.append(
            Error(
                f"{model._meta.label}.{generic.name} stores object IDs in "
                f"{model._meta.label}.{object_id.name}, {field_kind(object_id)} (32 bits or "
                "fewer), but "
                f"models with Snowflake keys ({', '.join(keyed[:3])}"
                f"{', ...' if len(keyed) > 3 else ''}) need 64 bits: pointing it "
                "at one fails with 'integer out of range' (or is truncated on MySQL "
                "without strict mode)",
                hint=_widen_hint(model, object_id, or_else=", or a CharField"),
                obj=model,
                id="snowflake_db.E012",
            )
        )
    return errors


@register(Tags.models)
def check_key_fields(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E014: a plain integer field named after a Snowflake-keyed model (or listed in
    ``KEY_COLUMNS``) that cannot hold its keys."""
    if _settings()[0] is None:
        return []  # check_settings reports E001
    errors: list[CheckMessage] = [
        Error(
            f"SNOWFLAKE_DB names {path}, which is no field of an installed model "
            "(KEY_COLUMNS and NOT_KEY_COLUMNS take 'app_label.Model.field')",
            id="snowflake_db.E001",
        )
        for path in unknown_declared_fields()
    ]
    for found in narrow_key_fields(_checked_models(app_configs)):
        errors.append(
            Error(
                f"{found.path} is {field_kind(found.field)} (32 bits or fewer) but "
                f"{found.evidence}: writing one fails with 'integer out of range' (or is "
                "stored as 2147483647 on MariaDB without strict mode), and a lookup with one "
                "finds nothing",
                hint=_widen_hint(found.model, found.field),
                obj=found.model,
                id="snowflake_db.E014",
            )
        )
    return errors


def _checked_models(app_configs: Sequence[Any] | None) -> list[Any]:
    checked = {config.label for config in app_configs} if app_configs else None
    return [model for model in apps.get_models()
            if checked is None or model._meta.app_label in checked]


def _widen_hint(model: Any, field: Any, *, or_else: str = "") -> str:
    """What the owner of a model can do: edit it, or, for an installed app's model, replace it."""
    declare = f"list '{field_path(model, field)}' in SNOWFLAKE_DB['NOT_KEY_COLUMNS']."
    not_a_key = f"If it never holds a Snowflake key, {declare}"
    if model._meta.label == "taggit.TaggedItem":
        return (
            "taggit.TaggedItem is django-taggit's model: tag Snowflake-keyed models through "
            "your own model, `class TaggedItem(SnowflakeTaggedItemBase)` from "
            "snowflake_db.django.taggit, with TaggableManager(through=TaggedItem), run "
            f"makemigrations; once no TaggableManager uses taggit.TaggedItem, {declare}"
        )
    if not model._meta.managed:
        return (
            f"{model._meta.label} is not managed by Django (a view or a table made elsewhere): "
            f"make {field.name} a BigIntegerField so lookups accept 64-bit keys, and the "
            f"database column bigint. {not_a_key}"
        )
    app_config = apps.get_app_config(model._meta.app_label)
    if is_installed_package(app_config):
        return (
            f"{model._meta.label} belongs to the installed app {app_config.name!r}, which you "
            f"cannot edit: where the app lets you replace the model (a forked or swappable "
            f"app, e.g. django-oscar's oscar_fork_app), declare {field.name} = "
            "models.PositiveBigIntegerField(...) in your model and run makemigrations; "
            f"otherwise ask the app for 64-bit keys. {not_a_key}"
        )
    return (
        f"Make {field.name} a PositiveBigIntegerField (or BigIntegerField{or_else}) and run "
        f"makemigrations. {not_a_key}"
    )


@register()
def check_shard_router_layout(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E013: the shard router and the generator must use one layout, or every new sharded
    row's key is refused (ShardingError) at its first ``create()``."""
    if getattr(settings, "SNOWFLAKE_SHARD_ROUTER", None) is None:
        return []
    conf, errors = _settings()
    if conf is None:
        return errors
    from .sharding import get_shard_router

    try:
        router_layout = get_shard_router().layout
    except (ImproperlyConfigured, ImportError, SnowflakeError) as error:
        return [Error(f"SNOWFLAKE_SHARD_ROUTER: {error}", id="snowflake_db.E013")]
    if router_layout == conf.layout:
        return []
    return [
        Error(
            f"SNOWFLAKE_SHARD_ROUTER's layout {router_layout.as_kwargs()} differs from the "
            f"layout IDs are made with, SNOWFLAKE_DB['LAYOUT'] {conf.layout.as_kwargs()}: "
            "every new sharded row's key would be refused (ShardingError)",
            hint="Set SNOWFLAKE_DB['LAYOUT'] to the router's layout, e.g. "
            f"SNOWFLAKE_DB = {{..., 'LAYOUT': {router_layout.as_kwargs()}}}.",
            id="snowflake_db.E013",
        )
    ]


def _check_table_source(conf: SnowflakeSettings) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    alias = conf.control_database
    if alias not in settings.DATABASES:
        return [
            Error(
                f"SNOWFLAKE_DB['CONTROL_DATABASE']={alias!r} is not an alias in DATABASES "
                f"({', '.join(settings.DATABASES)})",
                id="snowflake_db.E002",
            )
        ]
    vendor = connections[alias].vendor
    if vendor == "sqlite" and conf.engine_url is None:
        name = str(connections[alias].settings_dict.get("NAME", ""))
        if name in ("", ":memory:") or "mode=memory" in name:
            errors.append(
                Error(
                    f"the control database {alias!r} is an in-memory SQLite database: worker "
                    "leases must be visible to every process",
                    hint="Use a file or a server database as CONTROL_DATABASE.",
                    id="snowflake_db.E002",
                )
            )
    missing = [
        module
        for module in ("sqlalchemy", *_driver_modules(vendor))
        if importlib.util.find_spec(module) is None
    ]
    if missing and conf.engine_url is None:
        extra = {"postgresql": "postgres", "mysql": "mysql"}.get(vendor, "sqlalchemy")
        errors.append(
            Error(
                f"WORKER_SOURCE='table' needs {', '.join(missing)}, which is not installed",
                hint=f"pip install 'snowflake-db[django,{extra}]'",
                id="snowflake_db.E003",
            )
        )
    others = [
        other
        for other in settings.DATABASES
        if other != alias and router.allow_migrate(other, APP_LABEL, model_name="workerslot")
    ]
    if others:
        errors.append(
            Warning(
                f"the worker tables would also be migrated on {', '.join(others)}, not only on "
                f"the control database {alias!r}",
                hint="Add 'snowflake_db.django.routers.ControlDatabaseRouter' to the start of "
                "DATABASE_ROUTERS, or make your router's allow_migrate() return False for the "
                "app label 'snowflake_db' on other aliases.",
                id="snowflake_db.W002",
            )
        )
    return errors


def _driver_modules(vendor: str) -> tuple[str, ...]:
    if vendor == "postgresql":
        return () if importlib.util.find_spec("psycopg2") else ("psycopg",)
    if vendor == "mysql":
        return () if importlib.util.find_spec("MySQLdb") else ("pymysql",)
    return ()


@register(Tags.database)
def check_database(
    app_configs: Sequence[Any] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """Introspect the tables of models using Snowflake IDs on the given databases."""
    if not databases:
        return []
    conf, errors = _settings()
    if conf is None:
        return errors
    for alias in databases:
        connection = connections[alias]
        errors.extend(_check_column_types(connection))
        with connection.cursor() as cursor:
            tables = set(connection.introspection.table_names(cursor))
            for model in snowflake_models(alias):
                if model._meta.db_table in tables and not model._meta.auto_created:
                    errors.extend(_check_epoch(connection, cursor, model, conf))
    return errors


@dataclass(frozen=True)
class _PendingChanges:
    """What the migrations not yet applied on a database will change: the fields they alter
    (app label, model name, field name) and the apps among them that run SQL of their own."""

    altered: frozenset[tuple[str, str, str]] = frozenset()
    own_sql: frozenset[str] = frozenset()

    def fix(self, column: NarrowColumn) -> list[str]:
        """The apps whose pending migrations widen ``column``: an ``AlterField`` of its field,
        or of the key a foreign key points to (Django alters the foreign keys with it); an
        app's own SQL may do anything, so it is trusted. A migration that only touches other
        fields of the app widens nothing (``makemigrations`` run before ``snowflake widen``)."""
        fields = [column.field]
        target = getattr(column.field, "target_field", None)
        if column.field.is_relation and target is not None:
            fields.append(target)
        found = {
            field.model._meta.app_label
            for field in fields
            if (field.model._meta.app_label, field.model._meta.model_name, field.name)
            in self.altered
        }
        return sorted(found | (column.owner_apps & self.own_sql))


def _database_operations(operations: Iterable[Any]) -> Iterator[Any]:
    """A migration's operations as the database sees them (``SeparateDatabaseAndState``'s
    database side included, its state side not)."""
    from django.db import migrations

    for operation in operations:
        if isinstance(operation, migrations.SeparateDatabaseAndState):
            yield from _database_operations(operation.database_operations)
        else:
            yield operation


def _pending_changes(connection: Any) -> _PendingChanges:
    """The changes of the migrations not yet applied on this database."""
    from django.db import migrations
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError:
        return _PendingChanges()
    altered: set[tuple[str, str, str]] = set()
    own_sql: set[str] = set()
    for migration, backwards in plan:
        if backwards:
            continue
        for operation in _database_operations(migration.operations):
            if isinstance(operation, migrations.AlterField):
                altered.add((migration.app_label, operation.model_name_lower, operation.name))
            elif isinstance(operation, migrations.RunSQL):
                own_sql.add(migration.app_label)
    return _PendingChanges(frozenset(altered), frozenset(own_sql))


def unfixed_narrow_columns(connection: Any) -> list[Any]:
    """The narrow columns that check E010 reports: no pending migration or through-key widening
    changes them."""
    narrow = narrow_columns(connection)
    pending = _pending_changes(connection) if narrow else _PendingChanges()
    return [column for column in narrow
            if not column.is_through_key and not pending.fix(column)]


def _check_column_types(connection: Any, models: Sequence[Any] | None = None) -> list[CheckMessage]:
    """E010 for each narrow column that ``migrate`` will not fix; one I010 naming all those it
    will (a pending migration of the app that owns it, or an auto-created many-to-many key,
    which :mod:`.widening` alters after ``migrate``). ``migrate`` runs these checks before it
    repairs what they find: it says once what it is about to widen, and neither blocks nor
    warns about its own work."""
    narrow = narrow_columns(connection, models)
    pending = _pending_changes(connection) if narrow else _PendingChanges()
    messages: list[CheckMessage] = []
    widened: dict[str, list[NarrowColumn]] = {}
    for column in narrow:
        fixing = pending.fix(column)
        if column.is_through_key:
            by = "snowflake_db after migrating (auto-created many-to-many keys)"
        elif fixing:
            by = f"the pending migrations of {', '.join(fixing)}"
        else:
            messages.append(
                Error(
                    f"{column.what}: column {column.table}.{column.column} on database "
                    f"{connection.alias!r} is {column.db_type}, which cannot hold a 64-bit "
                    "Snowflake ID",
                    hint="Run `manage.py makemigrations` then `manage.py migrate`; if "
                    "makemigrations finds no change (migrations that build keys from "
                    "DEFAULT_AUTO_FIELD, as django-oscar's do, or a table moved between apps), "
                    f"run `manage.py snowflake widen --database {connection.alias}`; for a table "
                    "Django does not manage, widen the column by hand (see the docs page "
                    "'Converting an existing Django project', docs/converting/django.md).",
                    obj=column.model,
                    id="snowflake_db.E010",
                )
            )
            continue
        widened.setdefault(by, []).append(column)
    if widened:
        columns = [column for group in widened.values() for column in group]
        types = {column.db_type for column in columns}
        one_type = f" {types.pop()}" if len(types) == 1 else ""
        listed = "; ".join(
            f"by {by}: " + ", ".join(
                f"{c.table}.{c.column}" + ("" if one_type else f" ({c.db_type})") for c in group
            )
            for by, group in widened.items()
        )
        messages.append(
            Info(
                f"`migrate` widens {len(columns)}{one_type} column(s) to 64 bits for Snowflake "
                f"IDs, {listed}",
                hint="Nothing to do during `migrate`: it is what widens them. Until it has "
                "run, MySQL/MariaDB writes of Snowflake keys to these columns are refused "
                "(NarrowColumnError).",
                obj=f"database {connection.alias!r}",
                id="snowflake_db.I010",
            )
        )
    return messages


def _check_epoch(
    connection: Any, cursor: Any, model: Any, conf: SnowflakeSettings
) -> list[CheckMessage]:
    pk = model._meta.pk
    if not is_snowflake_field(pk):
        return []
    quote = connection.ops.quote_name
    try:
        # MAX of the primary key is one index lookup.
        cursor.execute(f"SELECT MAX({quote(pk.column)}) FROM {quote(model._meta.db_table)}")
        row = cursor.fetchone()
    except DatabaseError:
        return []  # an unreadable table is not this check's business
    newest = row[0] if row else None
    if newest is None:
        return []
    layout = conf.layout
    now_ms = wall_clock()
    try:
        decoded = layout.decode(int(newest))
    except (SnowflakeError, ValueError, TypeError):
        return [_epoch_error(model, connection.alias, int(newest), "does not fit the layout")]
    if decoded.timestamp_ms > now_ms + FUTURE_TOLERANCE_MS:
        return [
            _epoch_error(
                model,
                connection.alias,
                int(newest),
                f"decodes to {decoded.datetime.isoformat()}, in the future",
            )
        ]
    return []


def _epoch_error(model: Any, alias: str, newest: int, problem: str) -> CheckMessage:
    return Error(
        f"{model._meta.label}: the largest stored ID {newest} on database {alias!r} {problem} "
        "under the current SNOWFLAKE_DB layout: the epoch or bit layout changed after IDs were "
        "issued, so new IDs would sort below old ones and may collide with them",
        hint="Restore the previous LAYOUT/EPOCH; a layout can only change for an empty table.",
        obj=model,
        id="snowflake_db.E011",
    )
