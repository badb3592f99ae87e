"""The key function's worker slot: reserved permanently, released with its high-water mark.

A slot is reserved and released with :mod:`snowflake_db.worker._claims`, like every other slot:
in the caller's transaction when the worker tables are in this database (the same migration may
have created them, invisible to any other connection), else through an allocator on the control
database. Either way the function's layout must be the one the worker tables record (or becomes
it, if none is recorded yet). A re-run finds its reservation by label instead of taking another.

The worker tables must exist already, on either path: a key function never creates them. Made
on the spot (a mistyped ``control_url``, another ``slots_schema``), they would hold a
reservation that the application's allocators, reading the real tables, never see, and one of
them could take the same worker ID.
"""

from __future__ import annotations

import os
import socket

from sqlalchemy import Connection, create_engine

from ..errors import SnowflakeMigrationError
from ..layout import Layout
from ..worker import TableWorkerAllocator, _claims
from ..worker._layout_record import ensure_layout
from ..worker._store import WorkerStore
from ._spec import SlotPlace


def _store(place: SlotPlace) -> WorkerStore:
    return WorkerStore(
        slots_table=place.slots_table,
        registrations_table=place.registrations_table,
        schema=place.slots_schema,
    )


def _allocator(place: SlotPlace) -> TableWorkerAllocator:
    """An allocator on the control database that never creates the worker tables; they were
    checked by :func:`_require_tables` just before."""
    return TableWorkerAllocator(
        place.control_url or "",
        slots_table=place.slots_table,
        registrations_table=place.registrations_table,
        schema=place.slots_schema,
        create_tables=False,
    )


def _require_tables(bind: Connection, place: SlotPlace, url_text: str) -> None:
    missing = _store(place).missing_tables(bind)
    if missing:
        where = f" (schema {place.slots_schema})" if place.slots_schema else ""
        raise SnowflakeMigrationError(
            f"the worker tables {', '.join(missing)} do not exist in {url_text}{where}: a key "
            "function reserves its worker slot in the tables the application's allocators use "
            "and never creates them; create them first (op.create_snowflake_worker_tables(), "
            "or migrate the snowflake_db Django app there), or point control_url / "
            "slots_schema at them"
        )


def _require_control_tables(place: SlotPlace) -> None:
    engine = create_engine(place.control_url or "")
    try:
        with engine.connect() as conn:
            _require_tables(conn, place, engine.url.render_as_string(hide_password=True))
    finally:
        engine.dispose()


def reserve_slot(
    bind: Connection, place: SlotPlace, label: str, layout: Layout
) -> tuple[int, int]:
    """The function's slot, ``(worker_id, high_water_ms)``; a re-run finds it by its label."""
    if place.control_url is None:
        _require_tables(bind, place, bind.engine.url.render_as_string(hide_password=True))
        store = _store(place)
        found = _claims.reserved_under(bind, store, label)
        if found is not None:
            ensure_layout(
                bind,
                store,
                layout,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                where=store.tables.slots.name,
            )
            return found.worker_id, found.high_water_ms
        holder = _claims.Claimant(socket.gethostname(), os.getpid())
        where = (
            f"{store.tables.slots.name} at "
            f"{bind.engine.url.render_as_string(hide_password=True)}"
        )
        return _claims.reserve(
            bind, store, label=label, holder=holder, layout=layout, where=where
        )
    _require_control_tables(place)
    allocator = _allocator(place)
    try:
        for row in allocator.workers():
            if row.reserved and row.label == label:  # re-run of a failed migration
                return row.worker_id, row.high_water_ms
        worker_id = allocator.reserve_worker_id(label, layout=layout)
        rows = {row.worker_id: row for row in allocator.workers()}
        return worker_id, rows[worker_id].high_water_ms
    finally:
        allocator.close()


def release_slot(
    bind: Connection, place: SlotPlace, label: str, issued_until_ms: int | None
) -> int | None:
    """Free the function's slot, its mark past the last ID issued (by either database clock);
    the worker ID freed, or ``None`` if none was reserved under ``label``."""
    if place.control_url is None:
        _require_tables(bind, place, bind.engine.url.render_as_string(hide_password=True))
        store = _store(place)
        found = _claims.reserved_under(bind, store, label)
        if found is None:
            return None
        _claims.release_reservation(
            bind,
            store,
            worker_id=found.worker_id,
            label=label,
            issued_until_ms=issued_until_ms,
        )
        return found.worker_id
    _require_control_tables(place)
    allocator = _allocator(place)
    try:
        for row in allocator.workers():
            if row.reserved and row.label == label:
                allocator.release_reserved(
                    row.worker_id, label=label, issued_until_ms=issued_until_ms
                )
                return row.worker_id
        return None
    finally:
        allocator.close()


def floor_id(layout: Layout, worker_id: int, high_water_ms: int) -> int:
    """The pseudo "last issued ID" a new holder starts from: the high-water tick, used up."""
    if high_water_ms < layout.epoch_ms:
        return -1
    moment = min(high_water_ms, layout.max_timestamp_ms)
    return layout.encode(timestamp_ms=moment, worker_id=worker_id, sequence=layout.max_sequence)


def tick_end_ms(layout: Layout, last_id: int) -> int:
    """The last millisecond of the tick ``last_id`` was issued in (the slot's mark on release)."""
    tick = last_id >> layout.time_shift
    return layout.tick_start_ms(tick) + layout.tick_ms - 1
