"""``op.create_snowflake_id_function()`` / ``op.drop_snowflake_id_function()`` (PostgreSQL and
MariaDB) and ``op.create_snowflake_key_trigger()`` / ``op.drop_snowflake_key_trigger()``
(MariaDB, which refuses a stored function in a column's ``DEFAULT``).

Thin calls of :mod:`snowflake_db.key_functions`, which holds the SQL of both backends and the
worker slot reservation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from alembic.operations import Operations
from sqlalchemy import Connection

from ...errors import SnowflakeMigrationError
from ...generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ...key_functions import (
    DEFAULT_FUNCTION_NAME,
    drop_key_function,
    drop_key_trigger,
    install_key_function,
    install_key_trigger,
)
from ...layout import Layout
from ...worker._schema import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE
from ._base import SnowflakeOp, operation


@dataclasses.dataclass(eq=False)
class _SnowflakeIdFunctionOp(SnowflakeOp):
    """Where the function lives, and where its reserved worker slot is."""

    name: str = DEFAULT_FUNCTION_NAME
    _: dataclasses.KW_ONLY
    schema: str | None = None
    layout: Layout | None = None
    label: str | None = None
    control_url: str | None = None
    slots_table: str = DEFAULT_SLOTS_TABLE
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE
    slots_schema: str | None = None



@operation("create_snowflake_id_function")
@dataclasses.dataclass(eq=False)
class CreateSnowflakeIdFunctionOp(_SnowflakeIdFunctionOp):
    """Create a function ``name()`` returning Snowflake IDs of ``layout`` (PostgreSQL: PL/pgSQL,
    MariaDB: a stored function).

    Its worker ID is a slot reserved forever (under ``label``) in the allocator's slots table:
    in this database, or in the control database at ``control_url`` when the worker tables live
    elsewhere. PostgreSQL uses it as a server default:
    ``op.convert_to_snowflake_pk("orders", server_default="snowflake_next_id()")``; MariaDB
    through a trigger: ``op.create_snowflake_key_trigger("orders")``.
    """

    rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS

    def reverse(self) -> DropSnowflakeIdFunctionOp:
        return self.carry(DropSnowflakeIdFunctionOp)


@operation("drop_snowflake_id_function")
@dataclasses.dataclass(eq=False)
class DropSnowflakeIdFunctionOp(_SnowflakeIdFunctionOp):
    """Drop ``name()`` (drop server defaults and triggers using it first) and its state sequence.

    With ``release_worker`` the reserved slot becomes free again, its high-water mark raised
    past the function's last ID so a later holder never repeats it.
    """

    release_worker: bool = True

    def reverse(self) -> CreateSnowflakeIdFunctionOp:
        return self.carry(CreateSnowflakeIdFunctionOp)


@dataclasses.dataclass(eq=False)
class _SnowflakeKeyTriggerOp(SnowflakeOp):
    table_name: str
    column_name: str = "id"
    _: dataclasses.KW_ONLY
    function: str = DEFAULT_FUNCTION_NAME
    function_schema: str | None = None
    schema: str | None = None
    trigger: str | None = None
    zero_default: bool = True


@operation("create_snowflake_key_trigger")
@dataclasses.dataclass(eq=False)
class CreateSnowflakeKeyTriggerOp(_SnowflakeKeyTriggerOp):
    """MariaDB: a ``BEFORE INSERT`` trigger on ``table_name`` filling a NULL or 0
    ``column_name`` from ``function()`` (create it first with
    ``op.create_snowflake_id_function()``); a key the ``INSERT`` gives is kept. With
    ``zero_default`` the column gets ``DEFAULT 0`` so ``INSERT ... SELECT`` without the key
    passes strict mode."""

    def reverse(self) -> DropSnowflakeKeyTriggerOp:
        return self.carry(DropSnowflakeKeyTriggerOp)


@operation("drop_snowflake_key_trigger")
@dataclasses.dataclass(eq=False)
class DropSnowflakeKeyTriggerOp(_SnowflakeKeyTriggerOp):
    """MariaDB: drop ``create_snowflake_key_trigger``'s trigger (and the ``DEFAULT 0``)."""

    def reverse(self) -> CreateSnowflakeKeyTriggerOp:
        return self.carry(CreateSnowflakeKeyTriggerOp)


def _bind(operations: Operations, what: str, mariadb_only: bool = False) -> Connection:
    if operations.migration_context.as_sql:
        raise SnowflakeMigrationError(
            f"{what} reserves a worker slot or reads the database and cannot run in offline "
            "--sql mode"
        )
    bind = operations.get_bind()
    allowed = ("mysql", "mariadb") if mariadb_only else ("postgresql", "mysql", "mariadb")
    if bind.dialect.name not in allowed:
        which = "MariaDB" if mariadb_only else "PostgreSQL and MariaDB"
        raise SnowflakeMigrationError(
            f"{what} installs a database key function: {which} only, not {bind.dialect.name}"
        )
    return bind


def _where(op: _SnowflakeIdFunctionOp) -> dict[str, Any]:
    """What install and drop both take: the function's name and place, its slot's place."""
    return {
        "name": op.name, "schema": op.schema, "layout": op.layout, "label": op.label,
        "control_url": op.control_url, "slots_table": op.slots_table,
        "registrations_table": op.registrations_table, "slots_schema": op.slots_schema,
    }


@Operations.implementation_for(CreateSnowflakeIdFunctionOp)
def _create_function(operations: Operations, op: CreateSnowflakeIdFunctionOp) -> None:
    bind = _bind(operations, "create_snowflake_id_function")
    install_key_function(
        bind, **_where(op), rollback_tolerance_ms=op.rollback_tolerance_ms
    )


@Operations.implementation_for(DropSnowflakeIdFunctionOp)
def _drop_function(operations: Operations, op: DropSnowflakeIdFunctionOp) -> None:
    bind = _bind(operations, "drop_snowflake_id_function")
    drop_key_function(bind, **_where(op), release_worker=op.release_worker)


@Operations.implementation_for(CreateSnowflakeKeyTriggerOp)
def _create_trigger(operations: Operations, op: CreateSnowflakeKeyTriggerOp) -> None:
    bind = _bind(operations, "create_snowflake_key_trigger", mariadb_only=True)
    install_key_trigger(
        bind,
        op.table_name,
        op.column_name,
        name=op.function,
        schema=op.function_schema,
        table_schema=op.schema,
        trigger=op.trigger,
        zero_default=op.zero_default,
    )


@Operations.implementation_for(DropSnowflakeKeyTriggerOp)
def _drop_trigger(operations: Operations, op: DropSnowflakeKeyTriggerOp) -> None:
    bind = _bind(operations, "drop_snowflake_key_trigger", mariadb_only=True)
    drop_key_trigger(
        bind,
        op.table_name,
        op.column_name,
        table_schema=op.schema,
        trigger=op.trigger,
        zero_default=op.zero_default,
    )
