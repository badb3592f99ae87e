"""Keys from the database for every ``SnowflakeAutoField``: ``AUTO_FIELD_DATABASE_KEYS``.

A raw ``INSERT`` that leaves out a ``BigAutoField`` key gets the next number from the column's
identity; Django builds ``DEFAULT_AUTO_FIELD`` with no arguments, so a key that should come
from the database for such inserts cannot say so with ``db_default``. With
``SNOWFLAKE_DB["AUTO_FIELD_DATABASE_KEYS"] = True``, after every ``migrate`` each
``SnowflakeAutoField`` primary key on the migrated database (PostgreSQL or MariaDB) that has no
``db_default`` of its own gets the key function (installed first when missing, on a reserved
slot as :class:`~snowflake_db.django.operations.InstallKeyFunction` does):

* PostgreSQL: the column's ``DEFAULT snowflake_next_id()`` (an ``INSERT`` that gives the key,
  as every ORM insert does, never calls it);
* MariaDB, which refuses a stored function in ``DEFAULT``: a ``BEFORE INSERT`` trigger filling
  a missing key, and no ``DEFAULT 0``, so that an insert without a key fails loudly ("Field
  'id' doesn't have a default value") should the trigger ever be missing, instead of storing 0.

Like ``BigAutoField``'s identity this lives in the database, not in Django's migration state:
migrations do not change with the setting, and ``save()`` keeps ``AutoField``'s rules (a
``db_default`` on a key would make every ``save()`` of a new object an ``INSERT``). SQLite
has no stored functions: there the key column is the 64-bit rowid, which numbers such rows
itself. The ORM keeps making every key it inserts; the database makes only the keys an
``INSERT`` leaves out.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps
from django.db import connections, router

from .conf import get_settings
from .database_keys import (
    DEFAULT_FUNCTION_NAME,
    KEY_FUNCTION_VENDORS,
    django_connection,
    function_exists,
    function_options,
    key_function_of,
    slot_place,
)

__all__ = ["give_auto_fields_database_keys", "key_columns_without_database_keys"]

SETTING = "AUTO_FIELD_DATABASE_KEYS"


def _snowflake_keys(using: str) -> list[tuple[str, str]]:
    """(table, column) of every ``SnowflakeAutoField`` key without a ``KeyFunction`` default
    of the models the routers migrate on ``using`` (auto-created many-to-many tables too)."""
    from .fields import SnowflakeAutoField

    keys: set[tuple[str, str]] = set()
    for model in global_apps.get_models(include_auto_created=True):
        meta = model._meta
        pk = meta.pk
        if (not meta.managed or meta.proxy or not isinstance(pk, SnowflakeAutoField)
                or pk.database_generated or key_function_of(pk) is not None
                or not router.allow_migrate_model(using, model)):
            continue
        keys.add((meta.db_table, pk.column))
    return sorted(keys)


def key_columns_without_database_keys(using: str) -> list[tuple[str, str]]:
    """(table, column) of the ``SnowflakeAutoField`` keys on ``using`` whose tables exist and
    that have no database key yet: no default at all on PostgreSQL (a default of the user's
    own is left alone), no key trigger on MariaDB; none on other databases."""
    from ..key_functions._mariadb import trigger_name

    connection = connections[using]
    if connection.vendor not in KEY_FUNCTION_VENDORS:
        return []
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
        keys = [(table, column) for table, column in _snowflake_keys(using) if table in tables]
        if not keys:
            return []
        if connection.vendor == "postgresql":
            missing = []
            for table, column in keys:
                cursor.execute(
                    "SELECT a.atthasdef OR a.attidentity <> '' FROM pg_attribute a "
                    "WHERE a.attrelid = to_regclass(%s) AND a.attname = %s",
                    [connection.ops.quote_name(table), column],
                )
                row = cursor.fetchone()
                if row is not None and not row[0]:
                    missing.append((table, column))
            return missing
        cursor.execute(
            "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS "
            "WHERE TRIGGER_SCHEMA = DATABASE()"
        )
        triggers = {name for (name,) in cursor.fetchall()}
    return [(table, column) for table, column in keys
            if trigger_name(table, column) not in triggers]


def _plain(name: str) -> bool:
    """Whether the key functions make a MariaDB trigger for this table or column name."""
    from ..errors import InvalidArgumentError
    from ..worker._schema import validate_identifier

    try:
        validate_identifier(name)
    except InvalidArgumentError:
        return False
    return True


def give_auto_fields_database_keys(using: str) -> list[str]:
    """Give every ``SnowflakeAutoField`` key on ``using`` that lacks one a key from the
    database (:mod:`this module <.auto_field_keys>`), installing the key function first when
    it is missing; return one line per change. Nothing happens on other databases than
    PostgreSQL and MariaDB, or when every key has its default or trigger already. MariaDB
    tables whose names are not plain identifiers get no trigger (a line says so)."""
    connection = connections[using]
    missing = key_columns_without_database_keys(using)
    if not missing:
        return []
    from sqlalchemy import text

    from ..key_functions import install_key_function, install_key_trigger, key_default_sql

    done: list[str] = []
    with django_connection(connection) as bind:
        if not function_exists(bind, DEFAULT_FUNCTION_NAME, None):
            worker_id = install_key_function(
                bind, layout=get_settings().layout, **slot_place(using, SETTING),
                **function_options(),
            )
            done.append(f"installed {DEFAULT_FUNCTION_NAME}() on worker ID {worker_id}")
        quote = connection.ops.quote_name
        for table, column in missing:
            if connection.vendor == "postgresql":
                bind.execute(text(
                    f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} "
                    f"SET DEFAULT {key_default_sql('postgresql')}"
                ))
                done.append(f"{table}.{column}: DEFAULT {key_default_sql('postgresql')}")
            elif not (_plain(table) and _plain(column)):
                done.append(f"{table}.{column}: no trigger, the name is not a plain identifier "
                            "(letters, digits, underscores): an INSERT without the key fails "
                            "there")
            else:
                trigger = install_key_trigger(bind, table, column, zero_default=False)
                done.append(f"{table}.{column}: trigger {trigger}")
    return done


def database_keys_after_migrate(
    sender: Any, *, using: str, verbosity: int = 1, stdout: Any = None, plan: Any = None,
    **kwargs: Any,
) -> None:
    """The ``post_migrate`` receiver (connected by the app config): with the setting on, after
    a ``migrate`` (not after ``flush``, which sends the signal without a plan and makes no
    table)."""
    if plan is None or not get_settings().auto_field_database_keys:
        return
    for line in give_auto_fields_database_keys(using):
        if verbosity >= 1 and stdout is not None:
            stdout.write(f"  snowflake_db: {line}\n")
