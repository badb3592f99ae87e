"""Autogenerate helpers: the worker tables stay out of the diff, a model switched to the
Snowflake column helpers becomes ``op.convert_to_snowflake_pk`` instead of a bare type change,
and a missing worker layout table becomes ``op.create_snowflake_worker_layout_table()``.

A bare ``alter_column(type_=BigInteger)`` widens the key but keeps its sequence / identity /
``AUTO_INCREMENT`` and, on MariaDB, fails on the foreign keys that reference it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alembic.operations import ops
from sqlalchemy import BigInteger, Integer, MetaData

from ..sqlalchemy.columns import is_snowflake_column
from ..worker.schema import (
    DEFAULT_LAYOUT_TABLE,
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    LAYOUT_TABLE_INFO_KEY,
)
from .operations import ConvertToSnowflakePkOp, CreateSnowflakeWorkerLayoutTableOp

if TYPE_CHECKING:
    from alembic.migration import MigrationContext
    from sqlalchemy import Column

__all__ = ["include_object", "process_revision_directives"]

_WORKER_TABLES = frozenset({DEFAULT_SLOTS_TABLE, DEFAULT_REGISTRATIONS_TABLE, DEFAULT_LAYOUT_TABLE})


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """``context.configure(include_object=...)`` filter that ignores the worker tables when
    they exist only in the database (created by ``op.create_snowflake_worker_tables()``), so
    autogenerate does not propose dropping them."""
    return not (type_ == "table" and reflected and compare_to is None and name in _WORKER_TABLES)


def _model_column(
    metadata: MetaData | None, schema: str | None, table: str, column: str
) -> Column[Any] | None:
    if metadata is None:
        return None
    found = metadata.tables.get(f"{schema}.{table}" if schema else table)
    if found is None:
        return None
    return found.columns.get(column)


def _is_conversion(op: ops.AlterColumnOp, model: Column[Any] | None) -> bool:
    return (
        model is not None
        and is_snowflake_column(model)
        and isinstance(op.modify_type, BigInteger)
        and isinstance(op.existing_type, Integer)
        and not isinstance(op.existing_type, BigInteger)
    )


def _references(model: Column[Any] | None, converted: set[tuple[str | None, str, str]]) -> bool:
    if model is None:
        return False
    return any(
        (fk.column.table.schema, fk.column.table.name, fk.column.name) in converted
        for fk in model.foreign_keys
    )


def _rewrite(upgrade_ops: ops.UpgradeOps, metadata: MetaData | None) -> bool:
    converted: set[tuple[str | None, str, str]] = set()
    new_ops: list[ops.MigrateOperation] = []
    for table_ops in upgrade_ops.ops:
        if isinstance(table_ops, ops.ModifyTableOps):
            kept: list[ops.MigrateOperation] = []
            for op in table_ops.ops:
                if isinstance(op, ops.AlterColumnOp) and _is_conversion(
                    op, _model_column(metadata, op.schema, op.table_name, op.column_name)
                ):
                    converted.add((op.schema, op.table_name, op.column_name))
                    new_ops.append(
                        ConvertToSnowflakePkOp(op.table_name, op.column_name, schema=op.schema)
                    )
                    op.modify_type = None
                kept.append(op)
            table_ops.ops = kept
        new_ops.append(table_ops)
    if not converted:
        return False
    # convert_to_snowflake_pk widens the referencing columns itself
    for table_ops in new_ops:
        if not isinstance(table_ops, ops.ModifyTableOps):
            continue
        for op in table_ops.ops:
            if isinstance(op, ops.AlterColumnOp) and _references(
                _model_column(metadata, op.schema, op.table_name, op.column_name), converted
            ) and isinstance(op.modify_type, BigInteger):
                op.modify_type = None
        table_ops.ops = [op for op in table_ops.ops if not _is_noop(op)]
    upgrade_ops.ops = [
        op for op in new_ops if not (isinstance(op, ops.ModifyTableOps) and not op.ops)
    ]
    return True


def _is_noop(op: ops.MigrateOperation) -> bool:
    return (
        isinstance(op, ops.AlterColumnOp)
        and op.modify_type is None
        and op.modify_nullable is None
        and op.modify_server_default is False
        and op.modify_name is None
        and op.modify_comment is False
    )


def _rewrite_layout_tables(upgrade_ops: ops.UpgradeOps) -> bool:
    """A worker layout table to create (an install from before it) becomes the registered
    operation, which creates it ``IF NOT EXISTS`` and reverses to its own drop."""
    changed = False
    for index, op in enumerate(upgrade_ops.ops):
        if isinstance(op, ops.CreateTableOp) and LAYOUT_TABLE_INFO_KEY in op.info:
            upgrade_ops.ops[index] = CreateSnowflakeWorkerLayoutTableOp(
                slots_table=op.info[LAYOUT_TABLE_INFO_KEY], schema=op.schema
            )
            changed = True
    return changed


def process_revision_directives(
    context: MigrationContext, revision: Any, directives: list[Any]
) -> None:
    """``context.configure(process_revision_directives=...)`` hook: when a model's key moved to
    :func:`~snowflake_db.sqlalchemy.snowflake_column` from an integer, emit
    ``op.convert_to_snowflake_pk(...)`` (which also drops the sequence and widens foreign keys)
    and ``op.revert_snowflake_pk(...)`` in the downgrade, instead of bare type changes; a
    worker layout table missing from the database becomes
    ``op.create_snowflake_worker_layout_table(...)``."""
    metadata = context.opts.get("target_metadata")
    if isinstance(metadata, (list, tuple)):
        metadata = metadata[0] if len(metadata) == 1 else None
    for script in directives:
        if not isinstance(script, ops.MigrationScript):
            continue
        for upgrade_ops, downgrade_ops in zip(
            script.upgrade_ops_list, script.downgrade_ops_list, strict=False
        ):
            converted = _rewrite(upgrade_ops, metadata)
            if _rewrite_layout_tables(upgrade_ops) or converted:
                upgrade_ops.reverse_into(downgrade_ops)
