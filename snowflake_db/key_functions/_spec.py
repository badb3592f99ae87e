"""Where a key function lives, what it is called, and where its reserved worker slot is kept.

Shared by both backends: the function's name and schema (a database on MariaDB), the state
sequence beside it, identifier quoting, and the label its permanent slot reservation carries.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from ..worker._schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    NAME_LENGTH,
    validate_identifier,
)

#: The backends with a key function: SQLAlchemy dialect name -> our backend name.
BACKENDS = {"postgresql": "postgresql", "mysql": "mariadb", "mariadb": "mariadb"}


def backend_of(dialect_name: str, what: str) -> str:
    """``"postgresql"`` or ``"mariadb"`` for a SQLAlchemy dialect name; refuses the others."""
    try:
        return BACKENDS[dialect_name]
    except KeyError:
        raise InvalidArgumentError(
            f"{what}: database keys need PostgreSQL or MariaDB, not {dialect_name!r} "
            "(SQLite has no stored functions; let the application issue the keys there)"
        ) from None


@dataclass(frozen=True)
class FunctionSpec:
    """A key function ``name`` in ``schema`` (PostgreSQL schema, MariaDB database)."""

    name: str
    schema: str | None
    backend: str = "postgresql"

    def __post_init__(self) -> None:
        validate_identifier(self.name, "function name")
        if self.schema is not None:
            validate_identifier(self.schema, "schema name")
        if self.backend not in ("postgresql", "mariadb"):
            raise InvalidArgumentError(f"backend {self.backend!r}: postgresql or mariadb")

    @property
    def sequence(self) -> str:
        """Where the function keeps its last ID: a sequence (PostgreSQL) or a one-row Aria
        table (MariaDB) named ``<name>_state``."""
        return f"{self.name}_state"[:63]

    @property
    def guard_sequence(self) -> str:
        """PostgreSQL: the counter a slow path makes odd while it may ``setval`` the state
        sequence (``<name>_guard``; never the state's name, even when both are truncated)."""
        return f"{self.name[:56]}_guard"

    def quote(self, name: str) -> str:
        return f"`{name}`" if self.backend == "mariadb" else f'"{name}"'

    def qualified(self, name: str) -> str:
        if self.schema:
            return f"{self.quote(self.schema)}.{self.quote(name)}"
        return self.quote(name)

    @property
    def call_sql(self) -> str:
        """The call as a column default or in a trigger: ``snowflake_next_id()``, as the
        database itself shows it (unquoted: the names are plain identifiers)."""
        return f"{self.schema}.{self.name}()" if self.schema else f"{self.name}()"

    @property
    def lock_key(self) -> int:
        """PostgreSQL: the second key of the function's advisory lock (a signed int4)."""
        digest = zlib.crc32(f"{self.schema or ''}.{self.name}".encode())
        return digest - 2**32 if digest >= 2**31 else digest

    def default_label(self, database: str | None, server: str) -> str:
        """The reservation's label: ``<backend>-function:<database>@<server>:<schema>.<name>``.
        ``server`` is the server's own identity (``_api.server_identity``): shard servers often
        hold databases of one name, and each function needs a slot of its own."""
        if self.backend == "mariadb":
            where = f"{self.schema or database or ''}.{self.name}"
        else:
            where = f"{self.schema or 'public'}.{self.name}"
        return f"{self.backend}-function:{database or ''}@{server}:{where}"[:NAME_LENGTH]


@dataclass(frozen=True)
class SlotPlace:
    """Where the function's worker slot is reserved: the worker tables in this database, or
    those of the control database at ``control_url``; ``label`` (default
    :meth:`FunctionSpec.default_label`) finds the reservation again."""

    label: str | None = None
    control_url: str | None = None
    slots_table: str = DEFAULT_SLOTS_TABLE
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE
    slots_schema: str | None = None
