"""The database check for SQLAlchemy projects: no Snowflake key in a column narrower than 64 bits.

A 64-bit key sent to an ``INTEGER`` column fails loudly under strict SQL, but not on every path:
MariaDB's ``INSERT IGNORE`` (``insert().prefix_with("IGNORE")``) stores 2147483647 with a
warning and drops the next such row as a duplicate, whatever the SQL mode. So the columns are
checked in the database itself, before a key can reach them (Django's ``snowflake_db.E010``).

Which columns hold a key comes from the models: columns made by the column helpers or carrying
a Snowflake default, and every column with a foreign key to one of them, declared in the models
or found in the database (so tables outside the models are covered too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import MetaData
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.engine.reflection import Inspector
from sqlalchemy.exc import CompileError
from sqlalchemy.types import NullType, TypeEngine

from .._column_types import holds_snowflake_keys
from ..errors import NarrowColumnError
from .columns import SNOWFLAKE_INFO_KEY
from .generators import snowflake_default_of

__all__ = [
    "NarrowColumn",
    "is_narrow_type",
    "narrow_snowflake_columns",
    "require_wide_snowflake_columns",
]

_Key = tuple[str | None, str, str]  # schema (None: the default one), table, column


@dataclass(frozen=True)
class NarrowColumn:
    """A column that holds Snowflake keys in a type too narrow for them."""

    schema: str | None
    table: str
    column: str
    #: The type as the database reports it, e.g. ``INTEGER``.
    type: str
    #: ``None`` for a key column itself, else the ``table.column`` key it references.
    references: str | None
    #: The migration step that widens it.
    fix: str

    @property
    def name(self) -> str:
        """``table.column`` (``schema.table.column`` outside the default schema)."""
        prefix = f"{self.schema}." if self.schema else ""
        return f"{prefix}{self.table}.{self.column}"

    def __str__(self) -> str:
        held = "a Snowflake key" if self.references is None else f"references {self.references}"
        return f"{self.name} is {self.type} ({held}); fix: {self.fix}"


def is_narrow_type(type_: TypeEngine[Any], dialect: Dialect) -> bool:
    """True if a column of this reflected type cannot hold every 64-bit key exactly (the one
    table of :mod:`snowflake_db._column_types`, which Django's check reads too)."""
    return not holds_snowflake_keys(
        dialect.name,
        _declared(type_, dialect),
        precision=getattr(type_, "precision", None),
        scale=getattr(type_, "scale", None),
        length=getattr(type_, "length", None),
    )


def _declared(type_: TypeEngine[Any], dialect: Dialect) -> str:
    """The type as DDL; a type SQLAlchemy cannot render (no declared type on SQLite, an
    unknown one elsewhere) gives its name instead."""
    try:
        return type_.compile(dialect=dialect)
    except CompileError:
        return "" if isinstance(type_, NullType) else type(type_).__name__


def _model_keys(metadata: MetaData, default_schema: str | None) -> dict[_Key, str | None]:
    """Key columns of the models: ``None`` for a key itself, else the key it references."""

    def key_of(column: Any) -> _Key:
        schema = column.table.schema
        return (None if schema == default_schema else schema, column.table.name, column.name)

    keys: dict[_Key, str | None] = {}
    for table in metadata.tables.values():
        for column in table.columns:
            helper = column.info.get(SNOWFLAKE_INFO_KEY) == "id"
            if helper or snowflake_default_of(column) is not None:
                keys[key_of(column)] = None
    # Foreign keys to a key, then to those: at most one round per column.
    for _ in range(sum(len(t.columns) for t in metadata.tables.values())):
        added = False
        for table in metadata.tables.values():
            for column in table.columns:
                if key_of(column) in keys:
                    continue
                for fk in column.foreign_keys:
                    try:
                        target = fk.column
                    except Exception:  # an unresolvable ForeignKey: not ours to report
                        continue
                    if key_of(target) in keys:
                        keys[key_of(column)] = f"{target.table.name}.{target.name}"
                        added = True
                        break
        if not added:
            break
    return keys


@dataclass
class _Database:
    """What one reflection found: column specs, and the key columns with what they hold."""

    dialect: Dialect
    keys: dict[_Key, str | None]
    columns: dict[_Key, dict[str, Any]]
    #: Columns with a foreign-key constraint to a key in the database.
    constrained: set[_Key]

    def narrow(self, key: _Key) -> bool:
        return key in self.columns and is_narrow_type(self.columns[key]["type"], self.dialect)

    def report(self, key: _Key) -> NarrowColumn:
        schema, table, column = key
        shown = _declared(self.columns[key]["type"], self.dialect) or "untyped"
        references = self.keys[key]
        in_schema = f", schema={schema!r}" if schema else ""
        if references is None:
            fix = f"op.convert_to_snowflake_pk({table!r}, {column!r}{in_schema})"
        else:
            ref_table, ref_column = references.split(".", 1)
            if key in self.constrained and self.narrow((schema, ref_table, ref_column)):
                fix = (
                    "widened by "
                    f"op.convert_to_snowflake_pk({ref_table!r}, {ref_column!r}{in_schema})"
                )
            else:
                fix = (
                    f"op.alter_column({table!r}, {column!r}, type_=sa.BigInteger(){in_schema})"
                    " (no foreign-key constraint in the database, or its key is already wide)"
                )
        return NarrowColumn(schema, table, column, shown, references, fix)


def narrow_snowflake_columns(bind: Engine | Connection, metadata: MetaData) -> list[NarrowColumn]:
    """Every column of the database that holds Snowflake keys of ``metadata``'s models in a
    type narrower than 64 bits, in table and column order; empty when all is well.

    Tables or columns of the models that the database lacks are not reported (autogenerate
    shows those). Run it after ``alembic upgrade head``: at application start, in CI or a test
    (asyncio: ``await conn.run_sync(narrow_snowflake_columns, metadata)``).
    """
    inspector = sa_inspect(bind)
    default_schema = inspector.default_schema_name
    database = _Database(inspector.dialect, _model_keys(metadata, default_schema), {}, set())
    schemas = {schema for schema, _, _ in database.keys} | _other_schemas(inspector)
    for schema in schemas:
        for (_, table), specs in inspector.get_multi_columns(schema=schema).items():
            for spec in specs:
                database.columns[(schema, table, spec["name"])] = dict(spec)
    foreign_keys = [
        (schema, table, dict(fk))
        for schema in schemas
        for (_, table), fks in inspector.get_multi_foreign_keys(schema=schema).items()
        for fk in fks
    ]
    # Foreign keys in the database to a key hold keys too (tables outside the models), and
    # foreign keys to those: at most one round per foreign key.
    for _ in range(len(foreign_keys) + 1):
        if not _add_references(database, foreign_keys, default_schema):
            break
    return [
        database.report(key)
        for key in sorted(database.keys, key=lambda k: (k[0] or "", k[1], k[2]))
        if database.narrow(key)
    ]


def _other_schemas(inspector: Inspector) -> set[str | None]:
    """PostgreSQL's user schemas: a table in another schema may reference a key (MariaDB's
    databases are left alone: a server may hold many unrelated ones)."""
    if inspector.dialect.name != "postgresql":
        return set()
    default = inspector.default_schema_name
    return {
        None if name == default else name
        for name in inspector.get_schema_names()
        if name != "information_schema" and not name.startswith("pg_")
    }


def _add_references(
    database: _Database,
    foreign_keys: list[tuple[str | None, str, dict[str, Any]]],
    default_schema: str | None,
) -> bool:
    added = False
    for schema, table, fk in foreign_keys:
        referred_schema = fk.get("referred_schema")
        if referred_schema == default_schema:
            referred_schema = None
        for local, remote in zip(fk["constrained_columns"], fk["referred_columns"], strict=False):
            if (referred_schema, fk["referred_table"], remote) not in database.keys:
                continue
            database.constrained.add((schema, table, local))
            if (schema, table, local) not in database.keys:
                database.keys[(schema, table, local)] = f"{fk['referred_table']}.{remote}"
                added = True
    return added


def require_wide_snowflake_columns(bind: Engine | Connection, metadata: MetaData) -> None:
    """Raise :class:`~snowflake_db.errors.NarrowColumnError` naming every column that
    :func:`narrow_snowflake_columns` finds, with its type and the fix."""
    found = narrow_snowflake_columns(bind, metadata)
    if not found:
        return
    lines = "\n".join(f"  {column}" for column in found)
    raise NarrowColumnError(
        f"{len(found)} column(s) hold 64-bit Snowflake keys in a narrower type; a key written "
        "there fails, or is clamped and its row lost (MariaDB INSERT IGNORE), strict SQL mode "
        f"or not:\n{lines}",
        [
            (f"{c.schema}.{c.table}" if c.schema else c.table, c.column, c.type)
            for c in found
        ],
    )
