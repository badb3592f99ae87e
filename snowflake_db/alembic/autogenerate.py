"""Autogenerate helpers: the worker tables stay out of the diff, a model switched to the
Snowflake column helpers becomes ``op.convert_to_snowflake_pk`` instead of a bare type change,
and the MariaDB trigger's ``CHECK`` stays out of revisions for other databases.

A bare ``alter_column(type_=BigInteger)`` widens the key but keeps its sequence / identity /
``AUTO_INCREMENT`` and, on MariaDB, fails on the foreign keys that reference it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alembic.operations import ops
from sqlalchemy import BigInteger, Column, Integer, MetaData
from sqlalchemy import inspect as sa_inspect

from ..key_functions import key_check_name
from ..sharding.shard_map import TABLE_NAMES as SHARD_MAP_TABLES
from ..sqlalchemy.columns import is_snowflake_column
from ..sqlalchemy.key_default import (
    KEY_FUNCTION_INFO_KEY,
    TRIGGER_DIALECTS,
    KeyFunctionDefault,
    is_trigger_check,
)
from ..worker._schema import (
    DEFAULT_LAYOUT_TABLE,
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
)
from .operations import ConvertToSnowflakePkOp

if TYPE_CHECKING:
    from alembic.migration import MigrationContext
    from sqlalchemy.engine import Connection

__all__ = ["include_object", "process_revision_directives"]

_WORKER_TABLES = frozenset(
    {DEFAULT_SLOTS_TABLE, DEFAULT_REGISTRATIONS_TABLE, DEFAULT_LAYOUT_TABLE, *SHARD_MAP_TABLES}
)


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """``context.configure(include_object=...)`` filter that ignores the worker and shard map
    tables when they exist only in the database (created by
    ``op.create_snowflake_worker_tables()`` / ``op.create_snowflake_shard_map_tables()``), so
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


def _constrained(
    bind: Connection | None, model: Column[Any], converted: set[tuple[str | None, str, str]]
) -> bool:
    """Whether the database already has a foreign-key constraint from ``model`` to a converted
    key: only then does ``convert_to_snowflake_pk`` see, and widen, the column. A reference
    declared only in the models (its constraint is created later in the same revision) keeps
    its own type change, else it would stay 32-bit (PostgreSQL) or fail (MariaDB)."""
    if bind is None:
        return True
    table = model.table
    for fk in sa_inspect(bind).get_foreign_keys(table.name, schema=table.schema):
        pairs = zip(fk["constrained_columns"], fk["referred_columns"], strict=False)
        for local, remote in pairs:
            referred = (fk.get("referred_schema"), fk["referred_table"], remote)
            if local == model.name and referred in converted:
                return True
    return False


def _rewrite(
    upgrade_ops: ops.UpgradeOps, metadata: MetaData | None, bind: Connection | None = None
) -> bool:
    converted: set[tuple[str | None, str, str]] = set()
    conversions: list[ops.MigrateOperation] = []
    for table_ops in upgrade_ops.ops:
        if not isinstance(table_ops, ops.ModifyTableOps):
            continue
        for op in table_ops.ops:
            if isinstance(op, ops.AlterColumnOp) and _is_conversion(
                op, _model_column(metadata, op.schema, op.table_name, op.column_name)
            ):
                converted.add((op.schema, op.table_name, op.column_name))
                conversions.append(
                    ConvertToSnowflakePkOp(op.table_name, op.column_name, schema=op.schema)
                )
                _widened(op)
    if not converted:
        return False
    # convert_to_snowflake_pk widens the columns whose constraints reference the key itself
    for table_ops in upgrade_ops.ops:
        if not isinstance(table_ops, ops.ModifyTableOps):
            continue
        for op in table_ops.ops:
            if not isinstance(op, ops.AlterColumnOp):
                continue
            model = _model_column(metadata, op.schema, op.table_name, op.column_name)
            if (
                model is not None
                and _references(model, converted)
                and isinstance(op.modify_type, BigInteger)
                and _constrained(bind, model, converted)
            ):
                _widened(op)
        table_ops.ops = [op for op in table_ops.ops if not _is_noop(op)]
    # Conversions first: a foreign key this revision adds to a converted key then meets BIGINT
    # on both sides (MariaDB refuses a BIGINT column referencing an INT key).
    upgrade_ops.ops = conversions + [
        op for op in upgrade_ops.ops if not (isinstance(op, ops.ModifyTableOps) and not op.ops)
    ]
    return True


def _widened(op: ops.AlterColumnOp) -> None:
    """The conversion made the column ``BIGINT``: any other change to it must say so (a
    MariaDB ``MODIFY`` restating ``INTEGER`` would narrow it again)."""
    op.modify_type = None
    op.existing_type = BigInteger()


def _is_noop(op: ops.MigrateOperation) -> bool:
    return (
        isinstance(op, ops.AlterColumnOp)
        and op.modify_type is None
        and op.modify_nullable is None
        and op.modify_server_default is False
        and op.modify_name is None
        and op.modify_comment is False
    )


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
            if context.dialect.name not in TRIGGER_DIALECTS:
                _without_trigger_checks(upgrade_ops)
                checked = False
            else:
                checked = _with_trigger_checks(upgrade_ops)
            if _rewrite(upgrade_ops, metadata, context.bind) or checked:
                upgrade_ops.reverse_into(downgrade_ops)


def _without_trigger_checks(upgrade_ops: ops.UpgradeOps) -> None:
    """Leave out the MariaDB trigger's ``CHECK`` (``snowflake_column(key_function=...)``) from
    tables a revision for another database creates: Alembic renders a ``CheckConstraint``
    without its ``ddl_if``, and only MariaDB's ``DEFAULT 0`` placeholder needs it. Rendering
    attaches the columns to a new table, where their mark would make the ``CHECK`` again:
    the op gets copies without the mark (the model's columns keep theirs)."""
    for op in upgrade_ops.ops:
        if isinstance(op, ops.CreateTableOp):
            op.columns = [
                _unmarked(item) for item in op.columns if not is_trigger_check(item)
            ]


def _with_trigger_checks(upgrade_ops: ops.UpgradeOps) -> bool:
    """MariaDB: an existing table whose column takes ``key_function=`` (a new column, or a
    server default changed to the placeholder) gets the ``CHECK`` too, which Alembic does not
    compare; whether any was added."""
    added = False
    for table_ops in upgrade_ops.ops:
        if not isinstance(table_ops, ops.ModifyTableOps):
            continue
        checks: list[ops.MigrateOperation] = []
        for op in table_ops.ops:
            column = None
            if isinstance(op, ops.AddColumnOp) and op.column.info.get(KEY_FUNCTION_INFO_KEY):
                column = op.column.name
            elif isinstance(op, ops.AlterColumnOp) and isinstance(
                getattr(op.modify_server_default, "arg", None), KeyFunctionDefault
            ):
                column = op.column_name
            if column is not None:
                checks.append(
                    ops.CreateCheckConstraintOp(
                        key_check_name(table_ops.table_name, column),
                        table_ops.table_name,
                        f"`{column}` <> 0",
                        schema=table_ops.schema,
                    )
                )
        table_ops.ops.extend(checks)
        added = added or bool(checks)
    return added


def _unmarked(item: Any) -> Any:
    if not isinstance(item, Column) or not item.info.get(KEY_FUNCTION_INFO_KEY):
        return item
    copy = item._copy()
    copy.info = {k: v for k, v in item.info.items() if k != KEY_FUNCTION_INFO_KEY}
    return copy
