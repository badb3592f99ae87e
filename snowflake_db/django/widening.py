"""Widen the keys of auto-created many-to-many tables to 64 bits after ``migrate``.

Django's migrations never alter the key of an auto-created many-to-many table when
``DEFAULT_AUTO_FIELD`` changes (https://docs.djangoproject.com/en/stable/ref/settings/#default-auto-field
asks for a hand-written ``RunSQL``). Under ``SnowflakeAutoField`` the application writes 64-bit
keys there, so a table made under ``AutoField`` would refuse them (PostgreSQL) or clamp them and
drop rows (MariaDB's ``INSERT IGNORE`` in ``add()``). After every ``migrate`` this module alters
each such key that is still narrower than 64 bits, with the schema editor's own DDL for
``AutoField`` -> ``SnowflakeAutoField`` (the same statements ``makemigrations`` writes for the
app's own tables: identity or sequence dropped, column made ``BIGINT``).
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models

from .columns import narrow_columns

__all__ = ["widen_through_keys"]

_OLD_KEY_FIELDS = {"smallint": models.SmallAutoField, "int2": models.SmallAutoField}


def _old_key_field(column: Any) -> models.Field:
    """The field the narrow key was made from: ``AutoField`` (or ``SmallAutoField``)."""
    field_class = _OLD_KEY_FIELDS.get(column.db_type.lower().split("(")[0], models.AutoField)
    old = field_class(primary_key=True)
    old.set_attributes_from_name(column.field.name)
    old.model = column.model
    return old


def widen_through_keys(using: str, *, verbosity: int = 1, stdout: Any = None) -> list[str]:
    """Alter every auto-created many-to-many key on ``using`` that holds Snowflake keys but is
    narrower than 64 bits; return the tables altered. Nothing happens on SQLite, whose integer
    keys are 64-bit already."""
    connection = connections[using]
    through_keys = [column for column in narrow_columns(connection) if column.is_through_key]
    altered: list[str] = []
    for column in through_keys:
        with connection.schema_editor(atomic=connection.features.can_rollback_ddl) as editor:
            editor.alter_field(column.model, _old_key_field(column), column.field, strict=True)
        altered.append(column.table)
        if verbosity >= 1 and stdout is not None:
            stdout.write(
                f"  snowflake_db: widened {column.table}.{column.column} ({column.db_type}) to "
                "a 64-bit Snowflake key\n"
            )
    return altered


def widen_after_migrate(
    sender: Any, *, using: str, verbosity: int = 1, stdout: Any = None, plan: Any = None,
    **kwargs: Any,
) -> None:
    """The ``post_migrate`` receiver (connected by the app config). ``flush`` (run after every
    ``TransactionTestCase``) sends the signal without a plan and changes no table: skipped."""
    if plan is not None:
        widen_through_keys(using, verbosity=verbosity, stdout=stdout)
