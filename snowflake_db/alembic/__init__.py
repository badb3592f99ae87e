"""Alembic operations for Snowflake keys: ``import snowflake_db.alembic`` in ``env.py``.

Registers ``op.create_snowflake_worker_tables``, ``op.drop_snowflake_worker_tables``,
``op.convert_to_snowflake_pk``, ``op.revert_snowflake_pk``, ``op.create_snowflake_id_function``
and ``op.drop_snowflake_id_function`` (see :mod:`snowflake_db.alembic.operations`).
"""

from ._convert import SnowflakeMigrationError
from .autogenerate import include_object, process_revision_directives
from .operations import (
    ConvertToSnowflakePkOp,
    CreateSnowflakeIdFunctionOp,
    CreateSnowflakeWorkerTablesOp,
    DropSnowflakeIdFunctionOp,
    DropSnowflakeWorkerTablesOp,
    RevertSnowflakePkOp,
)

__all__ = [
    "ConvertToSnowflakePkOp",
    "CreateSnowflakeIdFunctionOp",
    "CreateSnowflakeWorkerTablesOp",
    "DropSnowflakeIdFunctionOp",
    "DropSnowflakeWorkerTablesOp",
    "RevertSnowflakePkOp",
    "SnowflakeMigrationError",
    "include_object",
    "process_revision_directives",
]
