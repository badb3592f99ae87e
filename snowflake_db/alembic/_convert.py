"""Convert an auto-increment integer primary key to a Snowflake ``BIGINT`` and back.

The steps, per backend (all through Alembic operations, so DDL is rendered by each dialect):

* PostgreSQL: drop the foreign keys that reference the column, drop its identity or its
  ``serial`` default and owned sequence, widen it and every referencing column to ``BIGINT``,
  re-create the foreign keys unchanged.
* MariaDB/MySQL: the same; ``MODIFY ... BIGINT NOT NULL`` without ``AUTO_INCREMENT``.
* SQLite: "move and copy" batch mode (``ALTER TABLE`` cannot change a column there); the table
  is rebuilt with ``BIGINT NOT NULL`` (no longer a rowid alias) and rows are copied.

Rows keep their existing IDs; new rows get Snowflake IDs, which are far above any serial value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import BigInteger, Integer, func, select, text
from sqlalchemy.types import TypeEngine

from ..errors import InvalidArgumentError, SnowflakeMigrationError
from ._sqlite import sqlite_rebuild
from ._target import Target, inspect_target

if TYPE_CHECKING:
    from alembic.operations import Operations
    from sqlalchemy.engine import Connection

__all__ = ["SnowflakeMigrationError", "convert_pk", "revert_pk"]

RevertType = Literal["integer", "bigint"]

_INT32_MAX = 2**31 - 1


def _bind(operations: Operations, what: str) -> Connection:
    if operations.migration_context.as_sql:
        raise SnowflakeMigrationError(
            f"{what} inspects the live database (types, sequences, foreign keys) and cannot run "
            "in offline --sql mode; run it online"
        )
    return operations.get_bind()


def _quoted(bind: Connection, table: str, schema: str | None) -> str:
    preparer = bind.dialect.identifier_preparer
    name = preparer.quote(table)
    return f"{preparer.quote_schema(schema)}.{name}" if schema else name


def _drop_references(operations: Operations, target: Target) -> None:
    for ref in target.references:
        if not ref.name:
            raise SnowflakeMigrationError(
                f"the foreign key {ref.table}.{ref.column} -> {target.table}.{target.column} has "
                "no name, so it cannot be dropped and re-created; name it first"
            )
        operations.drop_constraint(ref.name, ref.table, type_="foreignkey", schema=ref.schema)


def _create_references(operations: Operations, target: Target) -> None:
    for ref in target.references:
        options = ref.fk.get("options") or {}
        assert ref.name is not None
        operations.create_foreign_key(
            ref.name,
            ref.table,
            target.table,
            ref.fk["constrained_columns"],
            ref.fk["referred_columns"],
            source_schema=ref.schema,
            referent_schema=target.schema,
            ondelete=options.get("ondelete"),
            onupdate=options.get("onupdate"),
            deferrable=options.get("deferrable"),
            initially=options.get("initially"),
        )


def _alter_references(
    operations: Operations, target: Target, type_: TypeEngine[Any]
) -> None:
    for ref in target.references:
        operations.alter_column(
            ref.table,
            ref.column,
            type_=type_,
            existing_type=ref.existing_type,
            existing_nullable=ref.nullable,
            existing_server_default=_server_default(ref.existing_default),
            existing_comment=ref.existing_comment,
            schema=ref.schema,
        )


def _server_default(reflected: Any) -> Any:
    return None if reflected is None else text(str(reflected))


def _drop_postgresql_autoincrement(
    bind: Connection, operations: Operations, target: Target
) -> None:
    table = _quoted(bind, target.table, target.schema)
    column = bind.dialect.identifier_preparer.quote(target.column)
    if target.info.get("identity"):
        operations.execute(f"ALTER TABLE {table} ALTER COLUMN {column} DROP IDENTITY IF EXISTS")
        return
    default = target.info.get("default")
    if default is None:
        return
    sequence = bind.scalar(
        select(func.pg_get_serial_sequence(table, target.column))
    )
    operations.execute(f"ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT")
    if sequence is not None and "nextval(" in str(default):
        operations.execute(f"DROP SEQUENCE IF EXISTS {sequence}")


def convert_pk(
    operations: Operations,
    table: str,
    column: str,
    *,
    schema: str | None,
    server_default: str | None,
) -> None:
    """Turn ``table.column`` into a Snowflake ``BIGINT`` primary key, widening references."""
    bind = _bind(operations, "convert_to_snowflake_pk")
    dialect = bind.dialect.name
    if dialect not in ("postgresql", "mysql", "mariadb", "sqlite"):
        raise SnowflakeMigrationError(
            f"convert_to_snowflake_pk supports PostgreSQL, MariaDB/MySQL and SQLite, not {dialect}"
        )
    if server_default is not None and dialect != "postgresql":
        raise InvalidArgumentError(
            f"server_default={server_default!r} needs PostgreSQL's server-side function "
            f"(this database is {dialect})"
        )
    target = inspect_target(bind, table, column, schema)
    bigint = BigInteger()
    if dialect == "sqlite":
        sqlite_rebuild(operations, target, bigint, autoincrement=False)
        return
    _drop_references(operations, target)
    if dialect == "postgresql":
        _drop_postgresql_autoincrement(bind, operations, target)
    operations.alter_column(
        table,
        column,
        type_=bigint,
        existing_type=target.info["type"],
        existing_nullable=False,
        # MODIFY without AUTO_INCREMENT; other dialects warn about the argument
        autoincrement=False if dialect != "postgresql" else None,
        existing_comment=target.info.get("comment"),
        server_default=text(server_default) if server_default else False,
        schema=schema,
    )
    _alter_references(operations, target, bigint)
    _create_references(operations, target)


def _check_fits(bind: Connection, target: Target, to: RevertType) -> None:
    if to != "integer" or bind.dialect.name == "sqlite":
        return  # SQLite's INTEGER holds 64 bits
    preparer = bind.dialect.identifier_preparer
    columns = [(target.table, target.column, target.schema)] + [
        (r.table, r.column, r.schema) for r in target.references
    ]
    for table_name, column_name, schema in columns:
        largest = bind.scalar(
            text(
                f"SELECT max({preparer.quote(column_name)}) "
                f"FROM {_quoted(bind, table_name, schema)}"
            )
        )
        if largest is not None and largest > _INT32_MAX:
            raise SnowflakeMigrationError(
                f"cannot revert {target.table}.{target.column} to INTEGER: "
                f"{table_name}.{column_name} holds {largest}, above the INTEGER maximum "
                f"{_INT32_MAX}. Revert with type_='bigint' (keeps every ID, restores "
                "auto-increment), or delete or renumber the rows with Snowflake IDs first"
            )


def revert_pk(
    operations: Operations,
    table: str,
    column: str,
    *,
    schema: str | None,
    type_: RevertType,
) -> None:
    """Make ``table.column`` auto-incrementing again (``integer`` or ``bigint``)."""
    if type_ not in ("integer", "bigint"):
        raise InvalidArgumentError(f"type_ must be 'integer' or 'bigint', got {type_!r}")
    bind = _bind(operations, "revert_snowflake_pk")
    target = inspect_target(bind, table, column, schema)
    _check_fits(bind, target, type_)
    new_type: TypeEngine[Any] = Integer() if type_ == "integer" else BigInteger()
    dialect = bind.dialect.name
    if dialect == "sqlite":
        sqlite_rebuild(operations, target, Integer(), autoincrement=True)
        return
    _drop_references(operations, target)
    if dialect == "postgresql":
        quoted = _quoted(bind, table, schema)
        name = bind.dialect.identifier_preparer.quote(column)
        operations.alter_column(
            table,
            column,
            type_=new_type,
            existing_type=target.info["type"],
            existing_nullable=False,
            server_default=None,
            existing_server_default=_server_default(target.info.get("default")),
            schema=schema,
        )
        start = (bind.scalar(text(f"SELECT max({name}) FROM {quoted}")) or 0) + 1
        operations.execute(
            f"ALTER TABLE {quoted} ALTER COLUMN {name} "
            f"ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {int(start)})"
        )
    else:
        # MODIFY ... AUTO_INCREMENT; the counter starts above the largest existing value
        operations.alter_column(
            table,
            column,
            type_=new_type,
            existing_type=target.info["type"],
            existing_nullable=False,
            autoincrement=True,
            existing_comment=target.info.get("comment"),
            schema=schema,
        )
    _alter_references(operations, target, new_type)
    _create_references(operations, target)
