"""``op.create_snowflake_id_function()`` / ``op.drop_snowflake_id_function()`` (PostgreSQL).

The function's SQL is :mod:`snowflake_db.alembic._pg_function`; its worker slot is reserved and
released with :mod:`snowflake_db.worker._claims`, like every other slot: in the migration's own
transaction when the worker tables are in this database (the same migration may have created
them, invisible to any other connection), else through an allocator on the control database.
Either way the function's ``layout`` must be the one the worker tables record (or becomes it,
if none is recorded yet).
"""

from __future__ import annotations

import dataclasses
import os
import socket

from alembic.operations import Operations
from sqlalchemy import Connection, text

from ...generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ...layout import DEFAULT_LAYOUT, Layout
from ...worker import TableWorkerAllocator, _claims
from ...worker._schema import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE
from ...worker._store import WorkerStore
from .. import _pg_function
from ._base import SnowflakeOp, operation, postgresql_bind


@dataclasses.dataclass(eq=False)
class _SnowflakeIdFunctionOp(SnowflakeOp):
    """Where the function lives, and where its reserved worker slot is."""

    name: str = "snowflake_next_id"
    _: dataclasses.KW_ONLY
    schema: str | None = None
    layout: Layout | None = None
    label: str | None = None
    control_url: str | None = None
    slots_table: str = DEFAULT_SLOTS_TABLE
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE
    slots_schema: str | None = None
    spec: _pg_function.FunctionSpec = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.spec = _pg_function.FunctionSpec(self.name, self.schema)

    def slot_label(self, bind: Connection) -> str:
        return self.label or self.spec.default_label(bind.engine.url.database)

    def store(self) -> WorkerStore:
        return WorkerStore(
            slots_table=self.slots_table,
            registrations_table=self.registrations_table,
            schema=self.slots_schema,
        )

    def allocator(self) -> TableWorkerAllocator:
        """An allocator on the control database (``control_url``)."""
        return TableWorkerAllocator(
            self.control_url or "",
            slots_table=self.slots_table,
            registrations_table=self.registrations_table,
            schema=self.slots_schema,
        )


@operation("create_snowflake_id_function")
@dataclasses.dataclass(eq=False)
class CreateSnowflakeIdFunctionOp(_SnowflakeIdFunctionOp):
    """Create a PostgreSQL function ``name()`` returning Snowflake IDs of ``layout``.

    Its worker ID is a slot reserved forever (under ``label``) in the allocator's slots table:
    in this database, or in the control database at ``control_url`` when the worker tables live
    elsewhere. Use it as a server default:
    ``op.convert_to_snowflake_pk("orders", server_default="snowflake_next_id()")``.
    """

    rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS

    def reverse(self) -> DropSnowflakeIdFunctionOp:
        return self.carry(DropSnowflakeIdFunctionOp)


@operation("drop_snowflake_id_function")
@dataclasses.dataclass(eq=False)
class DropSnowflakeIdFunctionOp(_SnowflakeIdFunctionOp):
    """Drop ``name()`` (drop server defaults using it first) and its state sequence.

    With ``release_worker`` the reserved slot becomes free again, its high-water mark raised
    past the function's last ID so a later holder never repeats it.
    """

    release_worker: bool = True

    def reverse(self) -> CreateSnowflakeIdFunctionOp:
        return self.carry(CreateSnowflakeIdFunctionOp)


_NEEDS = ("reserves a worker slot in the database", "installs a PL/pgSQL function")


@Operations.implementation_for(CreateSnowflakeIdFunctionOp)
def _create_function(operations: Operations, op: CreateSnowflakeIdFunctionOp) -> None:
    bind = postgresql_bind(operations, "create_snowflake_id_function", *_NEEDS)
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
    bind = postgresql_bind(operations, "drop_snowflake_id_function", *_NEEDS)
    layout = op.layout or DEFAULT_LAYOUT
    last_id = _pg_function.last_issued_id(bind, op.spec)
    for statement in _pg_function.drop_function_sql(op.spec):
        operations.execute(text(statement))
    if op.release_worker:
        issued_until_ms = None if last_id is None else _pg_function.tick_end_ms(layout, last_id)
        _release(bind, op, issued_until_ms)


def _reserve(bind: Connection, op: CreateSnowflakeIdFunctionOp, layout: Layout) -> tuple[int, int]:
    """The function's slot, ``(worker_id, high_water_ms)``; a re-run finds it by its label."""
    label = op.slot_label(bind)
    if op.control_url is None:
        store = op.store()
        found = _claims.reserved_under(bind, store, label)
        if found is not None:
            return found.worker_id, found.high_water_ms
        holder = _claims.Claimant(socket.gethostname(), os.getpid())
        where = (
            f"{store.tables.slots.name} at "
            f"{bind.engine.url.render_as_string(hide_password=True)}"
        )
        return _claims.reserve(
            bind, store, label=label, holder=holder, layout=layout, where=where
        )
    allocator = op.allocator()
    try:
        for row in allocator.workers():
            if row.reserved and row.label == label:  # re-run of a failed migration
                return row.worker_id, row.high_water_ms
        worker_id = allocator.reserve_worker_id(label, layout=layout)
        rows = {row.worker_id: row for row in allocator.workers()}
        return worker_id, rows[worker_id].high_water_ms
    finally:
        allocator.close()


def _release(bind: Connection, op: DropSnowflakeIdFunctionOp, issued_until_ms: int | None) -> None:
    """Free the function's slot, its mark past the last ID issued (by either database clock)."""
    label = op.slot_label(bind)
    if op.control_url is None:
        store = op.store()
        found = _claims.reserved_under(bind, store, label)
        if found is not None:
            _claims.release_reservation(
                bind,
                store,
                worker_id=found.worker_id,
                label=label,
                issued_until_ms=issued_until_ms,
            )
        return
    allocator = op.allocator()
    try:
        for row in allocator.workers():
            if row.reserved and row.label == label:
                allocator.release_reserved(
                    row.worker_id, label=label, issued_until_ms=issued_until_ms
                )
    finally:
        allocator.close()
