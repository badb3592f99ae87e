"""What converting a key changes, read from the live database: the integer primary-key column
(:class:`Target`) and every foreign key that references it (:class:`Reference`), which the
conversion drops, widens and re-creates (:mod:`._convert`) or rebuilds on SQLite
(:mod:`._sqlite`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.types import TypeEngine

from ..errors import SnowflakeMigrationError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.engine.reflection import Inspector

__all__ = ["Reference", "Target", "inspect_target"]


@dataclass
class Reference:
    """A foreign-key column that references the key, with what Alembic needs to alter it and
    to re-create its constraint (``fk``: the reflected foreign key)."""

    table: str
    schema: str | None
    name: str | None
    column: str
    nullable: bool
    existing_type: TypeEngine[Any]
    existing_default: Any
    existing_comment: str | None
    fk: dict[str, Any] = field(repr=False)


@dataclass
class Target:
    """The key column (``info``: its reflected column) and the foreign keys referencing it."""

    table: str
    column: str
    schema: str | None
    info: dict[str, Any]
    references: list[Reference]


def inspect_target(bind: Connection, table: str, column: str, schema: str | None) -> Target:
    """``table.column`` and its references; refuses anything but a single-column integer key."""
    inspector = sa_inspect(bind)
    if not inspector.has_table(table, schema=schema):
        raise SnowflakeMigrationError(f"table {table!r} does not exist")
    columns = {c["name"]: c for c in inspector.get_columns(table, schema=schema)}
    if column not in columns:
        raise SnowflakeMigrationError(f"table {table!r} has no column {column!r}")
    pk = inspector.get_pk_constraint(table, schema=schema)["constrained_columns"]
    if pk != [column]:
        raise SnowflakeMigrationError(
            f"{table}.{column} must be the table's only primary-key column (the primary key is "
            f"{pk})"
        )
    info = dict(columns[column])
    if not isinstance(info["type"], Integer):
        raise SnowflakeMigrationError(
            f"{table}.{column} is {info['type']!r}, not an integer type: only integer primary "
            "keys can become Snowflake BIGINT keys without rewriting every reference"
        )
    references: list[Reference] = []
    default = inspector.default_schema_name
    home = schema or default
    for scanned in _schemas(bind, inspector, schema):
        for other in inspector.get_table_names(schema=scanned):
            other_columns: dict[str, Any] | None = None
            for fk in inspector.get_foreign_keys(other, schema=scanned):
                if fk["referred_table"] != table or column not in fk["referred_columns"]:
                    continue
                # None: the table visible without a schema name (the default schema)
                if (fk.get("referred_schema") or default) != home:
                    continue
                if other_columns is None:
                    other_columns = {
                        c["name"]: c for c in inspector.get_columns(other, schema=scanned)
                    }
                local = fk["constrained_columns"][fk["referred_columns"].index(column)]
                spec = other_columns[local]
                references.append(
                    Reference(
                        table=other,
                        schema=scanned,
                        name=fk.get("name"),
                        column=local,
                        nullable=bool(spec["nullable"]),
                        existing_type=spec["type"],
                        existing_default=spec.get("default"),
                        existing_comment=spec.get("comment"),
                        fk=dict(fk),
                    )
                )
    return Target(table, column, schema, info, references)


def _schemas(bind: Connection, inspector: Inspector, schema: str | None) -> list[str | None]:
    """Where referencing tables may live: on PostgreSQL every user schema (a foreign key from
    another schema would otherwise stay ``integer``, as PostgreSQL accepts an ``integer``
    reference to a ``bigint`` key); elsewhere the key's own schema (MariaDB refuses to change a
    key that another database references, so nothing is missed silently)."""
    if bind.dialect.name != "postgresql":
        return [schema]
    default = inspector.default_schema_name
    found: list[str | None] = [schema]
    for name in inspector.get_schema_names():
        if name == "information_schema" or name.startswith("pg_"):
            continue
        candidate = None if name == default else name
        if candidate not in found:
            found.append(candidate)
    return found
