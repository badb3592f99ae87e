"""The layout record: which layout the worker tables serve, adopted once and enforced on claims.

Two layouts leasing slots from one table can issue the same 64-bit value from different slots
(slot 4 under 41/10/12 and slot 2 under 41/9/13 share their top bits), so the tables record the
layout they serve, as the canonical JSON of :meth:`~snowflake_db.Layout.as_kwargs`, in the one
row of the layout table (:mod:`snowflake_db.worker._schema`). Every claim of a slot, by a process
or by a permanent reservation, first calls :func:`ensure_layout`:

* no row yet (new tables, or tables from before the record existed): INSERT this layout. The
  row's fixed primary key makes the first writer win; a loser's INSERT fails, and it reads the
  winner's row back (every allocator connection runs READ COMMITTED, SQLite serialises writers,
  so the read sees it) and is judged against it like everyone else;
* a row: the layout must be equal, field by field, or :class:`LayoutMismatchError` says both and
  how to fix it. The row is never updated, so the check needs no lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection

from ..errors import LayoutMismatchError, WorkerLeaseError
from ..layout import LAYOUT_FIELDS, Layout
from ._store import LayoutRow, WorkerStore

__all__ = [
    "RecordedLayout",
    "describe_layout",
    "ensure_layout",
    "layout_text",
    "recorded_layout",
]

#: What a refusal tells the user to do.
_FIX = (
    "Use the same layout in every process that leases from these tables, or give this service "
    "its own worker tables (TableWorkerAllocator(slots_table=..., registrations_table=...), "
    "ALLOCATOR_OPTIONS in Django, --slots-table/--registrations-table on the command line, or "
    "another schema or database)"
)


def layout_text(layout: Layout) -> str:
    """The recorded form of a layout: its ``as_kwargs()`` as JSON with sorted keys."""
    return json.dumps(layout.as_kwargs(), sort_keys=True, separators=(",", ":"))


def describe_layout(layout: Layout) -> str:
    """Every field of the layout on one line, the epoch also as a date."""
    parts = []
    for name, value in layout.as_kwargs().items():
        if name == "epoch_ms":
            parts.append(f"epoch_ms={value} ({layout.epoch.isoformat()})")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class RecordedLayout:
    """The layout the tables serve, and who recorded it when."""

    layout: Layout
    recorded_at_ms: int
    hostname: str | None
    pid: int | None

    def origin(self) -> str:
        """``recorded 2026-… by host web-1 pid 42``, for messages."""
        when = datetime.fromtimestamp(self.recorded_at_ms / 1000, tz=UTC)
        text = f"recorded {when.isoformat(timespec='milliseconds')}"
        if self.hostname:
            text += f" by host {self.hostname}"
        if self.pid is not None:
            text += f" pid {self.pid}"
        return text


def recorded_layout(
    connection: Connection, store: WorkerStore, *, where: str
) -> RecordedLayout | None:
    """The recorded layout, or ``None`` if no process has recorded one yet."""
    row = store.read_layout(connection)
    return None if row is None else _parse(row, where)


def ensure_layout(
    connection: Connection,
    store: WorkerStore,
    layout: Layout,
    *,
    hostname: str,
    pid: int,
    where: str,
) -> RecordedLayout:
    """Record ``layout`` if the tables have none, then require it to be the recorded one.

    Runs inside the caller's transaction (the INSERT in a savepoint of its own); ``where``
    names the tables and database in messages.
    """
    recorded = recorded_layout(connection, store, where=where)
    if recorded is None:
        savepoint = connection.begin_nested()
        try:
            if store.record_layout(
                connection, layout=layout_text(layout), hostname=hostname, pid=pid
            ):
                savepoint.commit()
            else:
                savepoint.rollback()  # another process recorded first: judged by its layout
        except BaseException:
            if savepoint.is_active:
                savepoint.rollback()
            raise
        recorded = recorded_layout(connection, store, where=where)
        if recorded is None:
            raise WorkerLeaseError(
                f"the layout row of {where} could neither be written nor read back; "
                f"check that {store.tables.layout.name} is a table this user can write"
            )
    if recorded.layout != layout:
        raise _mismatch(recorded, layout, where)
    return recorded


def _parse(row: LayoutRow, where: str) -> RecordedLayout:
    try:
        fields = json.loads(row.layout)
        if not isinstance(fields, dict):
            raise TypeError("not a JSON object")
        unknown = sorted(set(fields) - set(LAYOUT_FIELDS))
        if unknown:
            raise WorkerLeaseError(
                f"the layout recorded in {where} ({row.layout}) has field(s) "
                f"{', '.join(unknown)} this version of snowflake_db does not know: it was "
                "recorded by a newer version; upgrade this one"
            )
        layout = Layout(**fields)
    except WorkerLeaseError:
        raise
    except (TypeError, ValueError) as error:
        raise WorkerLeaseError(
            f"the layout recorded in {where} is not a valid layout ({row.layout!r}: {error}); "
            "it is written once by the first process and never changed: restore it, or delete "
            "the row only if no process with another layout uses these tables"
        ) from None
    return RecordedLayout(
        layout=layout, recorded_at_ms=row.recorded_at_ms, hostname=row.hostname, pid=row.pid
    )


def _mismatch(recorded: RecordedLayout, given: Layout, where: str) -> LayoutMismatchError:
    theirs, ours = recorded.layout.as_kwargs(), given.as_kwargs()
    differences = ", ".join(
        f"{name} {theirs[name]} vs {ours[name]}"
        for name in LAYOUT_FIELDS
        if theirs[name] != ours[name]
    )
    return LayoutMismatchError(
        f"the worker tables {where} serve the layout {describe_layout(recorded.layout)} "
        f"({recorded.origin()}), but this process uses {describe_layout(given)} (differs in "
        f"{differences}): processes with different layouts sharing worker tables can issue "
        f"the same ID, so no worker ID was leased. {_FIX}",
        recorded=theirs,
        given=ours,
    )
