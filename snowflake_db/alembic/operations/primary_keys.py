"""``op.convert_to_snowflake_pk(...)`` / ``op.revert_snowflake_pk(...)`` (the work is in
:mod:`snowflake_db.alembic._convert`)."""

from __future__ import annotations

import dataclasses

from alembic.operations import Operations

from .._convert import RevertType, convert_pk, revert_pk
from ._base import NOT_RENDERED, SnowflakeOp, operation


@operation("convert_to_snowflake_pk")
@dataclasses.dataclass(eq=False)
class ConvertToSnowflakePkOp(SnowflakeOp):
    """Widen ``table_name.column_name`` and every foreign key to it to ``BIGINT``, drop its
    sequence / identity / AUTO_INCREMENT, keep every row.

    ``server_default`` (PostgreSQL) is an SQL expression such as ``"snowflake_next_id()"``
    from ``op.create_snowflake_id_function()``, for rows inserted without the application.
    ``revert_type`` is only the type ``reverse()`` restores.
    """

    table_name: str
    column_name: str = "id"
    _: dataclasses.KW_ONLY
    schema: str | None = None
    server_default: str | None = None
    revert_type: RevertType = dataclasses.field(default="integer", metadata=NOT_RENDERED)

    def reverse(self) -> RevertSnowflakePkOp:
        return self.carry(RevertSnowflakePkOp, revert_type="type_")


@operation("revert_snowflake_pk")
@dataclasses.dataclass(eq=False)
class RevertSnowflakePkOp(SnowflakeOp):
    """Restore an auto-increment key (identity on PostgreSQL, AUTO_INCREMENT on MariaDB, a
    rowid alias on SQLite) of ``type_`` ``"integer"`` or ``"bigint"``.

    Reverting to ``"integer"`` fails with a clear error once the table (or a reference) holds
    an ID above 2**31 - 1; ``"bigint"`` always works and keeps every ID.
    """

    table_name: str
    column_name: str = "id"
    _: dataclasses.KW_ONLY
    schema: str | None = None
    type_: RevertType = "integer"

    def reverse(self) -> ConvertToSnowflakePkOp:
        return self.carry(ConvertToSnowflakePkOp, type_="revert_type")


@Operations.implementation_for(ConvertToSnowflakePkOp)
def _convert(operations: Operations, op: ConvertToSnowflakePkOp) -> None:
    convert_pk(
        operations,
        op.table_name,
        op.column_name,
        schema=op.schema,
        server_default=op.server_default,
    )


@Operations.implementation_for(RevertSnowflakePkOp)
def _revert(operations: Operations, op: RevertSnowflakePkOp) -> None:
    revert_pk(operations, op.table_name, op.column_name, schema=op.schema, type_=op.type_)
