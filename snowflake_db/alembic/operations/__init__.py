"""Every Alembic hook of snowflake_db: registered operations, their implementations, renderers.

Importing :mod:`snowflake_db.alembic` (in ``env.py``) registers:

* ``op.create_snowflake_worker_tables()`` / ``op.drop_snowflake_worker_tables()``
* ``op.convert_to_snowflake_pk(table, column="id")`` / ``op.revert_snowflake_pk(...)``
* ``op.create_snowflake_id_function()`` / ``op.drop_snowflake_id_function()`` (PostgreSQL)

Each operation is a ``MigrateOperation`` with a ``reverse()`` so autogenerate hooks can render
the pair; the renderers also add ``import snowflake_db.alembic`` to the revision file.
(See "Operation Plugins" in the Alembic docs.)
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from alembic.autogenerate import renderers
from alembic.operations import MigrateOperation, Operations
from alembic.operations.ops import CreateTableOp, DropTableOp
from sqlalchemy import MetaData, create_engine, text

from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ..layout import DEFAULT_LAYOUT, Layout
from ..sharding import partitioning
from ..sharding.partitioning import Period
from ..worker.schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    worker_tables,
)
from . import _pg_function
from ._convert import RevertType, SnowflakeMigrationError, convert_pk, revert_pk

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext
    from sqlalchemy.engine import Connection

__all__ = [
    "ConvertToSnowflakePkOp",
    "CreateSnowflakeIdFunctionOp",
    "CreateSnowflakeWorkerTablesOp",
    "DropSnowflakeIdFunctionOp",
    "DropSnowflakeWorkerTablesOp",
    "RevertSnowflakePkOp",
]

_IMPORT = "import snowflake_db.alembic"


def _args(*positional: Any, **keywords: Any) -> str:
    """Render call arguments, leaving out keywords at their default (``None`` marks those)."""
    parts = [repr(value) for value in positional]
    parts += [f"{key}={value!r}" for key, value in keywords.items() if value is not None]
    return ", ".join(parts)


def _render_layout(layout: Layout | None) -> str | None:
    if layout is None or layout == DEFAULT_LAYOUT:
        return None
    fields = {
        name: getattr(layout, name)
        for name in ("time_bits", "worker_bits", "sequence_bits", "shard_bits",
                     "datacenter_bits", "epoch_ms", "tick_ms")
        if getattr(layout, name) != getattr(DEFAULT_LAYOUT, name)
    }
    inner = ", ".join(f"{key}={value!r}" for key, value in fields.items())
    return f"snowflake_db.Layout({inner})"


class _LayoutRepr:
    """Makes ``repr()`` of a layout argument the source code that rebuilds it."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __repr__(self) -> str:
        return self.source


# -- worker tables -------------------------------------------------------------------------


@Operations.register_operation("create_snowflake_worker_tables")
class CreateSnowflakeWorkerTablesOp(MigrateOperation):
    """Create the worker-allocator tables exactly as :mod:`snowflake_db.worker.schema` defines."""

    def __init__(
        self,
        *,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        schema: str | None = None,
    ) -> None:
        self.slots_table = slots_table
        self.registrations_table = registrations_table
        self.schema = schema

    @classmethod
    def create_snowflake_worker_tables(
        cls,
        operations: Operations,
        *,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        schema: str | None = None,
    ) -> None:
        """Create the worker slots and registrations tables (works offline too)."""
        op = cls(slots_table=slots_table, registrations_table=registrations_table, schema=schema)
        operations.invoke(op)

    def reverse(self) -> DropSnowflakeWorkerTablesOp:
        return DropSnowflakeWorkerTablesOp(
            slots_table=self.slots_table,
            registrations_table=self.registrations_table,
            schema=self.schema,
        )

    def _keywords(self) -> dict[str, Any]:
        return {
            "slots_table": None if self.slots_table == DEFAULT_SLOTS_TABLE else self.slots_table,
            "registrations_table": None
            if self.registrations_table == DEFAULT_REGISTRATIONS_TABLE
            else self.registrations_table,
            "schema": self.schema,
        }


@Operations.register_operation("drop_snowflake_worker_tables")
class DropSnowflakeWorkerTablesOp(CreateSnowflakeWorkerTablesOp):
    """Drop the worker-allocator tables (every lease and high-water mark goes with them)."""

    @classmethod
    def drop_snowflake_worker_tables(
        cls,
        operations: Operations,
        *,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        schema: str | None = None,
    ) -> None:
        """Drop the worker slots and registrations tables."""
        op = cls(slots_table=slots_table, registrations_table=registrations_table, schema=schema)
        operations.invoke(op)

    def reverse(self) -> CreateSnowflakeWorkerTablesOp:  # type: ignore[override]
        return CreateSnowflakeWorkerTablesOp(
            slots_table=self.slots_table,
            registrations_table=self.registrations_table,
            schema=self.schema,
        )


def _worker_tables(op: CreateSnowflakeWorkerTablesOp) -> tuple[Any, Any]:
    tables = worker_tables(
        MetaData(),
        slots_table=op.slots_table,
        registrations_table=op.registrations_table,
        schema=op.schema,
    )
    return tables.slots, tables.registrations


@Operations.implementation_for(CreateSnowflakeWorkerTablesOp)
def _create_worker_tables(operations: Operations, op: CreateSnowflakeWorkerTablesOp) -> None:
    for table in _worker_tables(op):
        operations.invoke(CreateTableOp.from_table(table))


@Operations.implementation_for(DropSnowflakeWorkerTablesOp)
def _drop_worker_tables(operations: Operations, op: DropSnowflakeWorkerTablesOp) -> None:
    for table in reversed(_worker_tables(op)):
        operations.invoke(DropTableOp.from_table(table))


@renderers.dispatch_for(CreateSnowflakeWorkerTablesOp)
def _render_create_worker_tables(
    autogen_context: AutogenContext, op: CreateSnowflakeWorkerTablesOp
) -> str:
    autogen_context.imports.add(_IMPORT)
    name = "drop" if isinstance(op, DropSnowflakeWorkerTablesOp) else "create"
    return f"op.{name}_snowflake_worker_tables({_args(**op._keywords())})"


renderers.dispatch_for(DropSnowflakeWorkerTablesOp)(_render_create_worker_tables)


# -- primary-key conversion ----------------------------------------------------------------


@Operations.register_operation("convert_to_snowflake_pk")
class ConvertToSnowflakePkOp(MigrateOperation):
    """Make an auto-increment integer primary key a Snowflake ``BIGINT`` key."""

    def __init__(
        self,
        table_name: str,
        column_name: str = "id",
        *,
        schema: str | None = None,
        server_default: str | None = None,
        revert_type: RevertType = "integer",
    ) -> None:
        self.table_name = table_name
        self.column_name = column_name
        self.schema = schema
        self.server_default = server_default
        self.revert_type = revert_type

    @classmethod
    def convert_to_snowflake_pk(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str = "id",
        *,
        schema: str | None = None,
        server_default: str | None = None,
    ) -> None:
        """Widen ``table_name.column_name`` and every foreign key to it to ``BIGINT``, drop
        its sequence / identity / AUTO_INCREMENT, keep every row.

        ``server_default`` (PostgreSQL) is an SQL expression such as ``"snowflake_next_id()"``
        from :meth:`create_snowflake_id_function`, for rows inserted without the application.
        """
        operations.invoke(
            cls(table_name, column_name, schema=schema, server_default=server_default)
        )

    def reverse(self) -> RevertSnowflakePkOp:
        return RevertSnowflakePkOp(
            self.table_name, self.column_name, schema=self.schema, type_=self.revert_type
        )


@Operations.register_operation("revert_snowflake_pk")
class RevertSnowflakePkOp(MigrateOperation):
    """Undo :class:`ConvertToSnowflakePkOp`: auto-increment again, ``INTEGER`` or ``BIGINT``."""

    def __init__(
        self,
        table_name: str,
        column_name: str = "id",
        *,
        schema: str | None = None,
        type_: RevertType = "integer",
    ) -> None:
        self.table_name = table_name
        self.column_name = column_name
        self.schema = schema
        self.type_ = type_

    @classmethod
    def revert_snowflake_pk(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str = "id",
        *,
        schema: str | None = None,
        type_: RevertType = "integer",
    ) -> None:
        """Restore an auto-increment key (identity on PostgreSQL, AUTO_INCREMENT on MariaDB,
        a rowid alias on SQLite) of ``type_`` ``"integer"`` or ``"bigint"``.

        Reverting to ``"integer"`` fails with a clear error once the table (or a reference)
        holds an ID above 2**31 - 1; ``"bigint"`` always works and keeps every ID.
        """
        operations.invoke(cls(table_name, column_name, schema=schema, type_=type_))

    def reverse(self) -> ConvertToSnowflakePkOp:
        return ConvertToSnowflakePkOp(
            self.table_name, self.column_name, schema=self.schema, revert_type=self.type_
        )


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


@renderers.dispatch_for(ConvertToSnowflakePkOp)
def _render_convert(autogen_context: AutogenContext, op: ConvertToSnowflakePkOp) -> str:
    autogen_context.imports.add(_IMPORT)
    column = None if op.column_name == "id" else op.column_name
    positional = (op.table_name,) if column is None else (op.table_name, column)
    return (
        f"op.convert_to_snowflake_pk("
        f"{_args(*positional, schema=op.schema, server_default=op.server_default)})"
    )


@renderers.dispatch_for(RevertSnowflakePkOp)
def _render_revert(autogen_context: AutogenContext, op: RevertSnowflakePkOp) -> str:
    autogen_context.imports.add(_IMPORT)
    column = None if op.column_name == "id" else op.column_name
    positional = (op.table_name,) if column is None else (op.table_name, column)
    type_ = None if op.type_ == "integer" else op.type_
    return f"op.revert_snowflake_pk({_args(*positional, schema=op.schema, type_=type_)})"


# -- PostgreSQL server-side function -------------------------------------------------------


class _SnowflakeIdFunctionOp(MigrateOperation):
    """What the create and drop operations share: where the function and its slot live."""

    def __init__(
        self,
        name: str = "snowflake_next_id",
        *,
        schema: str | None = None,
        layout: Layout | None = None,
        label: str | None = None,
        control_url: str | None = None,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        slots_schema: str | None = None,
    ) -> None:
        self.spec = _pg_function.FunctionSpec(name, schema)
        self.name = name
        self.schema = schema
        self.layout = layout
        self.label = label
        self.control_url = control_url
        self.slots_table = slots_table
        self.registrations_table = registrations_table
        self.slots_schema = slots_schema

    def _location(self) -> dict[str, Any]:
        """The constructor keywords naming the function and its slot (for ``reverse()``)."""
        return {
            "schema": self.schema,
            "layout": self.layout,
            "label": self.label,
            "control_url": self.control_url,
            "slots_table": self.slots_table,
            "registrations_table": self.registrations_table,
            "slots_schema": self.slots_schema,
        }

    def _keywords(self) -> dict[str, Any]:
        """The keywords to render, defaults left out."""
        rendered_layout = _render_layout(self.layout)
        return {
            "schema": self.schema,
            "layout": None if rendered_layout is None else _LayoutRepr(rendered_layout),
            "label": self.label,
            "control_url": self.control_url,
            "slots_table": None if self.slots_table == DEFAULT_SLOTS_TABLE else self.slots_table,
            "registrations_table": None
            if self.registrations_table == DEFAULT_REGISTRATIONS_TABLE
            else self.registrations_table,
            "slots_schema": self.slots_schema,
        }


@Operations.register_operation("create_snowflake_id_function")
class CreateSnowflakeIdFunctionOp(_SnowflakeIdFunctionOp):
    """Install ``snowflake_next_id()`` on PostgreSQL with a permanently reserved worker slot."""

    def __init__(
        self,
        name: str = "snowflake_next_id",
        *,
        rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
        **location: Any,
    ) -> None:
        super().__init__(name, **location)
        self.rollback_tolerance_ms = rollback_tolerance_ms

    @classmethod
    def create_snowflake_id_function(
        cls,
        operations: Operations,
        name: str = "snowflake_next_id",
        *,
        schema: str | None = None,
        layout: Layout | None = None,
        label: str | None = None,
        control_url: str | None = None,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        slots_schema: str | None = None,
        rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
    ) -> None:
        """Create a PostgreSQL function ``name()`` returning Snowflake IDs of ``layout``.

        Its worker ID is a slot reserved forever (under ``label``) in the allocator's slots
        table: in this database, or in the control database at ``control_url`` when the worker
        tables live elsewhere. Use it as a server default:
        ``op.convert_to_snowflake_pk("orders", server_default="snowflake_next_id()")``.
        """
        operations.invoke(
            cls(
                name,
                schema=schema,
                layout=layout,
                label=label,
                control_url=control_url,
                slots_table=slots_table,
                registrations_table=registrations_table,
                slots_schema=slots_schema,
                rollback_tolerance_ms=rollback_tolerance_ms,
            )
        )

    def reverse(self) -> DropSnowflakeIdFunctionOp:
        return DropSnowflakeIdFunctionOp(self.name, **self._location())


@Operations.register_operation("drop_snowflake_id_function")
class DropSnowflakeIdFunctionOp(_SnowflakeIdFunctionOp):
    """Drop the function and its state sequence, and free its reserved worker slot."""

    def __init__(
        self, name: str = "snowflake_next_id", *, release_worker: bool = True, **location: Any
    ) -> None:
        super().__init__(name, **location)
        self.release_worker = release_worker

    @classmethod
    def drop_snowflake_id_function(
        cls,
        operations: Operations,
        name: str = "snowflake_next_id",
        *,
        schema: str | None = None,
        layout: Layout | None = None,
        label: str | None = None,
        control_url: str | None = None,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        slots_schema: str | None = None,
        release_worker: bool = True,
    ) -> None:
        """Drop ``name()`` (drop server defaults using it first) and its state sequence.

        With ``release_worker`` the reserved slot becomes free again, its high-water mark raised
        past the function's last ID so a later holder never repeats it.
        """
        operations.invoke(
            cls(
                name,
                schema=schema,
                layout=layout,
                label=label,
                control_url=control_url,
                slots_table=slots_table,
                registrations_table=registrations_table,
                slots_schema=slots_schema,
                release_worker=release_worker,
            )
        )

    def reverse(self) -> CreateSnowflakeIdFunctionOp:
        return CreateSnowflakeIdFunctionOp(self.name, **self._location())

    def _keywords(self) -> dict[str, Any]:
        return {**super()._keywords(), "release_worker": None if self.release_worker else False}


def _postgresql_bind(
    operations: Operations,
    what: str,
    needs: str = "reserves a worker slot in the database",
    feature: str = "installs a PL/pgSQL function",
) -> Connection:
    if operations.migration_context.as_sql:
        raise SnowflakeMigrationError(f"{what} {needs} and cannot run in offline --sql mode")
    bind = operations.get_bind()
    if bind.dialect.name != "postgresql":
        raise SnowflakeMigrationError(
            f"{what} {feature}: PostgreSQL only, not {bind.dialect.name}"
        )
    return bind


def _label(op: CreateSnowflakeIdFunctionOp | DropSnowflakeIdFunctionOp, bind: Connection) -> str:
    return op.label or op.spec.default_label(bind.engine.url.database)


def _reserve(
    bind: Connection, op: CreateSnowflakeIdFunctionOp, layout: Layout
) -> tuple[int, int]:
    """Reserve the function's worker slot; return ``(worker_id, high_water_ms)``.

    In this database the reservation runs in the migration's transaction (the worker tables
    may have been created by the same migration, invisible to any other connection). In a
    separate control database it goes through the allocator's own reservation API.
    """
    label = _label(op, bind)
    if op.control_url is None:
        return _pg_function.reserve_slot(
            bind, label=label, layout=layout, slots_table=op.slots_table, schema=op.slots_schema
        )
    from ..worker import TableWorkerAllocator

    allocator = TableWorkerAllocator(
        op.control_url,
        slots_table=op.slots_table,
        registrations_table=op.registrations_table,
        schema=op.slots_schema,
    )
    try:
        for row in allocator.workers():
            if row.reserved and row.label == label:  # re-run of a failed migration
                return row.worker_id, row.high_water_ms
        worker_id = allocator.reserve_worker_id(label, layout=layout)
        rows = {row.worker_id: row for row in allocator.workers()}
        return worker_id, rows[worker_id].high_water_ms
    finally:
        allocator.close()


def _release(
    bind: Connection, op: DropSnowflakeIdFunctionOp, layout: Layout, last_id: int | None
) -> None:
    label = _label(op, bind)
    if op.control_url is None:
        _pg_function.release_slot(
            bind,
            label=label,
            layout=layout,
            last_id=last_id,
            slots_table=op.slots_table,
            schema=op.slots_schema,
        )
        return
    from ..worker import TableWorkerAllocator

    engine = create_engine(op.control_url)
    try:
        with engine.begin() as conn:  # the database clocks may differ: record the last ID too
            worker_id = _pg_function.raise_high_water(
                conn,
                label=label,
                layout=layout,
                last_id=last_id,
                slots_table=op.slots_table,
                schema=op.slots_schema,
            )
    finally:
        engine.dispose()
    if worker_id is None:
        return
    allocator = TableWorkerAllocator(
        op.control_url,
        slots_table=op.slots_table,
        registrations_table=op.registrations_table,
        schema=op.slots_schema,
    )
    try:
        allocator.release_reserved(worker_id, label=label)
    finally:
        allocator.close()


@Operations.implementation_for(CreateSnowflakeIdFunctionOp)
def _create_function(operations: Operations, op: CreateSnowflakeIdFunctionOp) -> None:
    bind = _postgresql_bind(operations, "create_snowflake_id_function")
    layout = op.layout or DEFAULT_LAYOUT
    worker_id, high_water_ms = _reserve(bind, op, layout)
    statements = _pg_function.create_function_sql(
        op.spec,
        layout=layout,
        worker_id=worker_id,
        start_after=_pg_function.floor_id(layout, worker_id, high_water_ms),
        rollback_tolerance_ms=op.rollback_tolerance_ms,
    )
    for statement in statements:
        operations.execute(text(statement))


@Operations.implementation_for(DropSnowflakeIdFunctionOp)
def _drop_function(operations: Operations, op: DropSnowflakeIdFunctionOp) -> None:
    bind = _postgresql_bind(operations, "drop_snowflake_id_function")
    layout = op.layout or DEFAULT_LAYOUT
    last_id = _pg_function.last_issued_id(bind, op.spec)
    for statement in _pg_function.drop_function_sql(op.spec):
        operations.execute(text(statement))
    if op.release_worker:
        _release(bind, op, layout, last_id)


@renderers.dispatch_for(CreateSnowflakeIdFunctionOp)
def _render_create_function(
    autogen_context: AutogenContext, op: CreateSnowflakeIdFunctionOp
) -> str:
    autogen_context.imports.add(_IMPORT)
    if op.layout is not None:
        autogen_context.imports.add("import snowflake_db")
    positional = () if op.name == "snowflake_next_id" else (op.name,)
    return f"op.create_snowflake_id_function({_args(*positional, **op._keywords())})"


@renderers.dispatch_for(DropSnowflakeIdFunctionOp)
def _render_drop_function(autogen_context: AutogenContext, op: DropSnowflakeIdFunctionOp) -> str:
    autogen_context.imports.add(_IMPORT)
    if op.layout is not None:
        autogen_context.imports.add("import snowflake_db")
    positional = () if op.name == "snowflake_next_id" else (op.name,)
    return f"op.drop_snowflake_id_function({_args(*positional, **op._keywords())})"



# -- PostgreSQL partitioned order tables (DDL from snowflake_db.sharding.partitioning) ---------


_PARTITIONS = ("reads the partition catalog", "uses native declarative partitioning")


@Operations.register_operation("create_shard_partitioned_table")
class CreateShardPartitionedTableOp(MigrateOperation):
    """A table partitioned by LIST on the ID's shard bits, one partition per logical shard."""

    def __init__(self, table: str, columns_sql: str, layout: Layout, *, column: str = "id") -> None:
        self.table, self.columns_sql, self.layout, self.column = table, columns_sql, layout, column

    @classmethod
    def create_shard_partitioned_table(
        cls,
        operations: Operations,
        table: str,
        columns_sql: str,
        layout: Layout,
        *,
        column: str = "id",
    ) -> None:
        operations.invoke(cls(table, columns_sql, layout, column=column))


@Operations.register_operation("create_time_partitioned_table")
class CreateTimePartitionedTableOp(MigrateOperation):
    """A table partitioned by RANGE on the ID, with ``periods`` partitions from ``start``."""

    def __init__(
        self,
        table: str,
        columns_sql: str,
        layout: Layout,
        *,
        start: datetime,
        periods: int = 1,
        period: Period = "month",
        column: str = "id",
    ) -> None:
        self.table, self.columns_sql, self.layout = table, columns_sql, layout
        self.start, self.periods, self.period, self.column = start, periods, period, column

    @classmethod
    def create_time_partitioned_table(
        cls,
        operations: Operations,
        table: str,
        columns_sql: str,
        layout: Layout,
        *,
        start: datetime,
        periods: int = 1,
        period: Period = "month",
        column: str = "id",
    ) -> None:
        operations.invoke(
            cls(table, columns_sql, layout, start=start, periods=periods, period=period,
                column=column)
        )


@Operations.register_operation("add_next_time_partition")
class AddNextTimePartitionOp(MigrateOperation):
    """The partition of the period after the highest existing one (reads the catalog: online)."""

    def __init__(self, table: str, layout: Layout, *, period: Period = "month") -> None:
        self.table, self.layout, self.period = table, layout, period

    @classmethod
    def add_next_time_partition(
        cls, operations: Operations, table: str, layout: Layout, *, period: Period = "month"
    ) -> None:
        operations.invoke(cls(table, layout, period=period))


@Operations.implementation_for(CreateShardPartitionedTableOp)
def _create_shard_partitioned(operations: Operations, op: CreateShardPartitionedTableOp) -> None:
    _postgresql_bind(operations, "create_shard_partitioned_table", *_PARTITIONS)
    for statement in partitioning.create_shard_partitioned_table_sql(
        op.table, op.columns_sql, op.layout, column=op.column
    ):
        operations.execute(text(statement))


@Operations.implementation_for(CreateTimePartitionedTableOp)
def _create_time_partitioned(operations: Operations, op: CreateTimePartitionedTableOp) -> None:
    _postgresql_bind(operations, "create_time_partitioned_table", *_PARTITIONS)
    for statement in partitioning.create_time_partitioned_table_sql(
        op.table,
        op.columns_sql,
        op.layout,
        start=op.start,
        periods=op.periods,
        period=op.period,
        column=op.column,
    ):
        operations.execute(text(statement))


@Operations.implementation_for(AddNextTimePartitionOp)
def _add_next_time_partition(operations: Operations, op: AddNextTimePartitionOp) -> None:
    bind = _postgresql_bind(operations, "add_next_time_partition", *_PARTITIONS)
    partitioning.add_next_time_partition(bind, op.table, op.layout, period=op.period)
