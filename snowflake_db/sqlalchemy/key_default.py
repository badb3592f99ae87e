"""The database key function as a column's ``server_default``, rendered per dialect.

``snowflake_column(key_function="snowflake_next_id")`` gives the column a
:class:`KeyFunctionDefault`: on PostgreSQL ``DEFAULT snowflake_next_id()``, so a raw ``INSERT``
without the key gets one from :func:`snowflake_db.key_functions.install_key_function`'s function.
MariaDB refuses a stored function in ``DEFAULT``: there it renders ``DEFAULT 0``, the placeholder
that the trigger of :func:`snowflake_db.key_functions.install_key_trigger` replaces (and which lets
``INSERT ... SELECT`` without the key pass strict mode). Other databases have no key function:
``DEFAULT NULL``, which changes nothing for a ``NOT NULL`` key. The application's own keys stay
the default path: the column's Python default still fills every ORM and Core insert.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.sql.schema import DefaultClause

from ..key_functions._spec import FunctionSpec

__all__ = ["KeyFunctionDefault", "key_function_default"]


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
