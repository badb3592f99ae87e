"""The database key function as a column's ``server_default``, rendered per dialect.

``snowflake_column(key_function="snowflake_next_id")`` gives the column a
:class:`KeyFunctionDefault`: on PostgreSQL ``DEFAULT snowflake_next_id()``, so a raw ``INSERT``
without the key gets one from :func:`snowflake_db.key_functions.install_key_function`'s function.
MariaDB refuses a stored function in ``DEFAULT``: there it renders ``DEFAULT 0``, the placeholder
that the trigger of :func:`snowflake_db.key_functions.install_key_trigger` replaces (and which lets
``INSERT ... SELECT`` without the key pass strict mode). Other databases have no key function:
``DEFAULT NULL``, which changes nothing for a ``NOT NULL`` key. The application's own keys stay
the default path: the column's Python default still fills every ORM and Core insert.

On MariaDB the placeholder comes with a ``CHECK (id <> 0)`` named
``<table>_<column>_key_trigger_missing`` (:func:`~snowflake_db.key_functions.key_check_name`),
made on MariaDB only (``ddl_if``): MariaDB evaluates it after the ``BEFORE INSERT`` trigger, so
a row whose key the trigger filled passes, and a row that would keep the 0 because the trigger
is missing fails with an error naming it, instead of being stored with the key 0.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Column, Table, event, literal_column
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.schema import DefaultClause

from ..key_functions import FunctionSpec, key_check_name

__all__ = ["KeyFunctionDefault", "add_trigger_check", "is_trigger_check", "key_function_default"]

#: ``Column.info`` key marking a column whose key may come from the database key function.
KEY_FUNCTION_INFO_KEY = "snowflake_db.key_function"
#: ``CheckConstraint.info`` key marking :func:`add_trigger_check`'s constraint.
TRIGGER_CHECK_INFO_KEY = "snowflake_db.key_trigger_check"
#: The dialects whose key function needs a trigger (and so the CHECK).
TRIGGER_DIALECTS = ("mysql", "mariadb")


class KeyFunctionDefault(ColumnElement[int]):
    """``name()`` on PostgreSQL, ``0`` on MariaDB (for the trigger), ``NULL`` elsewhere."""

    inherit_cache = True
    type = BigInteger()

    def __init__(self, name: str, schema: str | None = None) -> None:
        self.spec = FunctionSpec(name, schema)


@compiles(KeyFunctionDefault)
def _other(element: KeyFunctionDefault, compiler: SQLCompiler, **kw: Any) -> str:
    return "NULL"


@compiles(KeyFunctionDefault, "postgresql")
def _postgresql(element: KeyFunctionDefault, compiler: SQLCompiler, **kw: Any) -> str:
    return element.spec.call_sql


@compiles(KeyFunctionDefault, "mysql")
@compiles(KeyFunctionDefault, "mariadb")
def _mariadb(element: KeyFunctionDefault, compiler: SQLCompiler, **kw: Any) -> str:
    return "0"


def key_function_default(
    name: str = "snowflake_next_id", schema: str | None = None
) -> DefaultClause:
    """A ``server_default`` calling the database key function ``name()`` (see the module)."""
    return DefaultClause(KeyFunctionDefault(name, schema))


def add_trigger_check(column: Column[Any]) -> None:
    """Give ``column``'s table, once it has one, the MariaDB ``CHECK (column <> 0)`` named by
    :func:`~snowflake_db.key_functions.key_check_name` (created on MariaDB only). A mark in
    ``column.info``, which copies keep (declarative mixins, ``to_metadata``), read by one
    listener on every ``Column``'s attachment to a table."""
    column.info[KEY_FUNCTION_INFO_KEY] = True


def is_trigger_check(constraint: Any) -> bool:
    """Whether ``constraint`` is :func:`add_trigger_check`'s."""
    return isinstance(constraint, CheckConstraint) and bool(
        constraint.info.get(TRIGGER_CHECK_INFO_KEY)
    )


@event.listens_for(Column, "after_parent_attach")
def _attach_check(column: Column[Any], table: Any) -> None:
    if not column.info.get(KEY_FUNCTION_INFO_KEY) or not isinstance(table, Table):
        return
    if column.name is None:
        return
    name = key_check_name(table.name, column.name)
    if any(constraint.name == name for constraint in table.constraints):
        return
    check = CheckConstraint(
        column != literal_column("0"),
        name=name,
        info={TRIGGER_CHECK_INFO_KEY: True},
    )
    # ddl_if takes a tuple of dialect names (documented, and DDLIf checks for it), though its
    # annotation says str
    check.ddl_if(dialect=TRIGGER_DIALECTS)  # type: ignore[arg-type]
    table.append_constraint(check)


@event.listens_for(CheckConstraint, "after_parent_attach")
def _one_check(check: CheckConstraint, table: Any) -> None:
    """A copy of the table (``to_metadata``) copies the CHECK after its columns made it
    again: keep one."""
    if not is_trigger_check(check) or not isinstance(table, Table):
        return
    if any(
        other is not check and other.name == check.name and is_trigger_check(other)
        for other in table.constraints
    ):
        table.constraints.discard(check)
