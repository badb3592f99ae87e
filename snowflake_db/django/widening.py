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

from contextlib import nullcontext
from typing import Any

from django.db import connections, models

from .narrow_columns import narrow_columns

__all__ = ["widen_columns", "widen_through_keys"]

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


def _referencing_columns(model: Any) -> list[tuple[str, str]]:
    """(table, column) of the foreign keys to ``model``'s key, auto-created many-to-many
    tables' included (their hidden relations): altering the key alters them too."""
    return [
        (relation.field.model._meta.db_table, relation.field.column)
        for relation in model._meta.get_fields(include_hidden=True)
        if relation.auto_created and not relation.concrete and relation.is_relation
        and relation.field.concrete
    ]


def widen_columns(using: str, columns: list[Any], *, dry_run: bool = False,
                  stdout: Any = None) -> list[str]:
    """Widen the keys among ``columns`` (:class:`.narrow_columns.NarrowColumn`) to 64 bits with the
    foreign keys to them, as ``migrate`` would have if the migrations had changed the field;
    return one line per key. On PostgreSQL the views and materialized views that use any of
    those columns are dropped first and created again after, in one transaction per key."""
    from django.db import transaction

    from .dependent_views import drop_views, recreate_views, views_depending_on

    connection = connections[using]
    quote = connection.ops.quote_name
    done: list[str] = []
    keys = {(column.table, column.column) for column in columns if column.field.primary_key}
    for column in columns:
        if not column.field.primary_key:
            target = column.field.target_field
            if (target.model._meta.db_table, target.column) not in keys:
                line = (f"{column.table}.{column.column} ({column.db_type}) not widened: a "
                        "foreign key to a key that is 64-bit already; widen it by hand")
                done.append(line)
                if stdout is not None:
                    stdout.write(f"{line}\n")
            continue  # otherwise widened with the key it points to
        affected = [(column.table, column.column), *_referencing_columns(column.model)]
        # MySQL/MariaDB commit each DDL statement (Django refuses DDL inside their
        # transactions): there a failure leaves the statements before it done, as a failed
        # AlterField would (the docs say to take a backup first).
        atomic = (transaction.atomic(using=using) if connection.features.can_rollback_ddl
                  else nullcontext())
        with atomic, connection.cursor() as cursor:
            views = (
                views_depending_on(cursor, [(quote(t), c) for t, c in affected])
                if connection.vendor == "postgresql" else []
            )
            line = f"{column.table}.{column.column} ({column.db_type}) -> 64-bit" + (
                f"; dropped and recreated {', '.join(view.label for view in views)}"
                if views else ""
            )
            if not dry_run:
                drop_views(cursor, views)
                with connection.schema_editor(atomic=False) as editor:
                    editor.alter_field(column.model, _old_key_field(column), column.field,
                                       strict=True)
                recreate_views(cursor, views)
        done.append(line)
        if stdout is not None:
            stdout.write(f"{'would widen' if dry_run else 'widened'} {line}\n")
    return done
