"""Health of the worker tables, for probes and people: ``workers check`` and ``doctor``.

One module so that ``snowflake-db workers check`` / ``snowflake-db doctor`` and Django's
``manage.py snowflake workers check`` / ``doctor`` say the same things:

* :func:`check` leases a worker ID and gives it back (:meth:`TableWorkerAllocator.check`): a
  one-line verdict for a start-up or readiness probe;
* :func:`slot_records` and :func:`slot_table` list the slots (``workers list``, ``manage.py
  snowflake workers list``: the same JSON and the same table);
* :func:`doctor` reads, and writes nothing: the layout recorded in the tables against the one
  given, when the layout's time bits run out, this host's clock skew against the control
  database, the slots by state, and how far ahead time-partitioned tables reach
  (:mod:`snowflake_db.sharding.partitioning`, PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..clock import Clock
from ..errors import SnowflakeError
from ..layout import Layout
from ..metrics import SlotCounts, SlotState
from ._allocator import TableWorkerAllocator
from ._clock_skew import ClockSkew
from ._layout_record import RecordedLayout, describe_layout
from ._store import SlotRow

__all__ = [
    "LAYOUT_WARNING_DAYS",
    "PARTITION_WARNING_DAYS",
    "CheckResult",
    "DoctorReport",
    "PartitionRunway",
    "SlotCounts",
    "check",
    "doctor",
    "slot_records",
    "slot_table",
]

#: A layout whose time bits run out sooner than this is reported (a layout change takes time).
LAYOUT_WARNING_DAYS = 365
#: A time-partitioned table whose partitions end sooner than this is reported.
PARTITION_WARNING_DAYS = 7
_DAY_MS = 86_400_000

#: ``(partition, low ID, high ID)`` of each range partition of a table, lowest first.
PartitionReader = Callable[[str], list[tuple[str, int, int]]]


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


# -- list ---------------------------------------------------------------------------------------


def slot_records(rows: Sequence[SlotRow]) -> list[dict[str, Any]]:
    """The slots as JSON records: times as ISO text (UTC), the high-water mark in ms too."""

    def iso(ms: int | None) -> str | None:
        return None if ms is None else _iso(ms)

    records = []
    for row in rows:
        expires_in = None
        if row.expires_at_ms is not None and row.lease_token is not None:
            expires_in = round((row.expires_at_ms - row.db_now_ms) / 1000, 3)
        records.append(
            {
                "worker_id": row.worker_id,
                "state": row.state.value,
                "registration_id": row.registration_id,
                "hostname": row.hostname,
                "pid": row.pid,
                "label": row.label,
                "acquired_at": iso(row.acquired_at_ms),
                "renewed_at": iso(row.renewed_at_ms),
                "expires_at": iso(row.expires_at_ms),
                "expires_in_seconds": expires_in,
                "high_water_ms": row.high_water_ms,
                "high_water": iso(row.high_water_ms) if row.high_water_ms > 0 else None,
            }
        )
    return records


def slot_table(records: Sequence[dict[str, Any]]) -> list[str]:
    """The records of :func:`slot_records` as an aligned table and a summary line."""
    if not records:
        return ["no worker slots in use"]
    free, reserved = SlotState.FREE.value, SlotState.RESERVED.value
    headers = ("worker", "state", "holder", "host", "pid", "expires", "in s", "high-water mark")
    table = [
        (
            str(record["worker_id"]),
            record["state"],
            "-" if record["state"] == free else record["label"] or str(record["registration_id"]),
            record["hostname"] or "-",
            str(record["pid"] or "-"),
            record["expires_at"] or ("never" if record["state"] == reserved else "-"),
            "-" if record["expires_in_seconds"] is None else f"{record['expires_in_seconds']:.1f}",
            record["high_water"] or "-",
        )
        for record in records
    ]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    lines = [line(headers), *(line(row) for row in table)]
    held = sum(1 for record in records if SlotState(record["state"]).held)
    lines.append(f"{len(records)} slot(s), {held} live or reserved")
    return lines


# -- check --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The verdict of :func:`check`: ``ok``, and one line saying why."""

    ok: bool
    message: str
    worker_id: int | None = None
    error: SnowflakeError | None = None


def check(
    allocator: TableWorkerAllocator, layout: Layout, clock: Clock | None = None
) -> CheckResult:
    """Can this process lease a worker ID with ``layout`` right now? Takes and releases one."""
    try:
        worker_id = allocator.check(layout=layout, clock=clock)
    except SnowflakeError as error:
        return CheckResult(ok=False, message=_one_line(error), error=error)
    return CheckResult(
        ok=True,
        message=(
            f"ok: worker ID {worker_id} of {allocator.store.tables.slots.name} could be leased "
            f"with layout {layout.time_bits}/{layout.worker_bits}/{layout.sequence_bits} and "
            "was released"
        ),
        worker_id=worker_id,
    )


# -- doctor -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionRunway:
    """How far a time-partitioned table's last partition reaches past now."""

    table: str
    last_partition: str | None = None
    covers_until_ms: int | None = None
    days_ahead: float | None = None
    error: str | None = None

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.table}: {self.error}"
        assert self.covers_until_ms is not None and self.days_ahead is not None
        return (
            f"{self.table}: {self.last_partition} takes IDs until "
            f"{_iso(self.covers_until_ms)} ({self.days_ahead:.1f} days ahead)"
        )


@dataclass(frozen=True)
class DoctorReport:
    """What :func:`doctor` found; :meth:`problems` make a probe fail, :meth:`warnings` don't."""

    where: str
    layout: Layout
    recorded: RecordedLayout | None
    database_now_ms: int
    skew: ClockSkew
    skew_warning_ms: int
    max_skew_ms: int
    slots: SlotCounts
    partitions: list[PartitionRunway] = field(default_factory=list)

    @property
    def layout_matches(self) -> bool | None:
        return None if self.recorded is None else self.recorded.layout == self.layout

    @property
    def runs_out_ms(self) -> int:
        return self.layout.max_timestamp_ms + 1

    @property
    def days_left(self) -> float:
        return (self.runs_out_ms - self.database_now_ms) / _DAY_MS

    def problems(self) -> list[str]:
        found = []
        if self.layout_matches is False:
            assert self.recorded is not None
            found.append(
                f"the tables serve layout {describe_layout(self.recorded.layout)}, not the "
                f"given {describe_layout(self.layout)}: processes with the given layout are "
                "refused (pass the service's layout options, or use its own tables)"
            )
        if self.days_left <= 0:
            found.append(f"the layout's time bits ran out at {_iso(self.runs_out_ms)}")
        if self.skew.at_least_ms > self.max_skew_ms:
            found.append(
                f"this clock is {self.skew.describe()}, more than the {self.max_skew_ms} ms "
                "a lease is refused beyond"
            )
        if self.slots.available <= 0:
            found.append(f"no worker ID can be leased now ({self.slots.describe()})")
        for runway in self.partitions:
            if runway.error is not None:
                found.append(f"partitions of {runway.describe()}")
            elif runway.days_ahead is not None and runway.days_ahead <= 0:
                found.append(
                    f"partitions of {runway.describe()}: new rows are rejected; add partitions"
                )
        return found

    def warnings(self) -> list[str]:
        found = []
        if 0 < self.days_left < LAYOUT_WARNING_DAYS:
            found.append(
                f"the layout's time bits run out in {self.days_left:.0f} days "
                f"({_iso(self.runs_out_ms)})"
            )
        if self.skew_warning_ms < self.skew.at_least_ms <= self.max_skew_ms:
            found.append(
                f"this clock is {self.skew.describe()}, more than the {self.skew_warning_ms} "
                "ms warning bound"
            )
        if 0 < self.slots.available < max(1, self.slots.size // 10):
            found.append(
                f"fewer than 10% of the worker IDs are available ({self.slots.describe()})"
            )
        for runway in self.partitions:
            if runway.days_ahead is not None and 0 < runway.days_ahead < PARTITION_WARNING_DAYS:
                found.append(
                    f"partitions of {runway.describe()}: fewer than {PARTITION_WARNING_DAYS} days"
                )
        return found

    def _recorded_text(self) -> str:
        if self.recorded is None:
            return "none yet: the first process to lease records its layout"
        if self.layout_matches:
            return f"the same ({self.recorded.origin()})"
        return f"DIFFERENT: {describe_layout(self.recorded.layout)} ({self.recorded.origin()})"

    def lines(self) -> list[str]:
        """The report as text, one finding per line."""
        rows = [
            ("layout", describe_layout(self.layout)),
            ("recorded layout", self._recorded_text()),
            ("layout runs out", f"{_iso(self.runs_out_ms)} ({self.days_left:.0f} days left)"),
            (
                "clock skew",
                f"{self.skew.describe()} (warning above {self.skew_warning_ms} ms, leases "
                f"refused above {self.max_skew_ms} ms)",
            ),
            ("worker IDs", self.slots.describe()),
        ]
        rows += [("partitions", runway.describe()) for runway in self.partitions]
        rows.append(("control database", self.where))
        problems, warnings = self.problems(), self.warnings()
        status = "ok" if not problems else f"{len(problems)} problem(s)"
        if warnings:
            status += f", {len(warnings)} warning(s)"
        rows.append(("status", status))
        width = max(len(label) for label, _ in rows) + 1
        text = [f"{label + ':':<{width}} {value}" for label, value in rows]
        text += [f"problem: {problem}" for problem in problems]
        text += [f"warning: {warning}" for warning in warnings]
        return text

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        recorded = None
        if self.recorded is not None:
            recorded = {
                **self.recorded.layout.as_kwargs(),
                "recorded_at": _iso(self.recorded.recorded_at_ms),
                "hostname": self.recorded.hostname,
                "pid": self.recorded.pid,
            }
        slots = self.slots
        return {
            "control_database": self.where,
            "layout": self.layout.as_kwargs(),
            "recorded_layout": recorded,
            "layout_matches": self.layout_matches,
            "layout_runs_out": _iso(self.runs_out_ms),
            "layout_days_left": round(self.days_left, 1),
            "clock_skew_ms": round(self.skew.offset_ms, 1),
            "clock_skew_uncertainty_ms": round(self.skew.uncertainty_ms, 1),
            "clock_skew_warning_ms": self.skew_warning_ms,
            "max_clock_skew_ms": self.max_skew_ms,
            "worker_ids": {
                "size": slots.size,
                **slots.by_state(),
                "parked": slots.parked,
                "available": slots.available,
            },
            "partitions": [
                {
                    "table": runway.table,
                    "last_partition": runway.last_partition,
                    "covers_until": (
                        None if runway.covers_until_ms is None else _iso(runway.covers_until_ms)
                    ),
                    "days_ahead": runway.days_ahead,  # unrounded: 0.04 days is not 0
                    "error": runway.error,
                }
                for runway in self.partitions
            ],
            "problems": self.problems(),
            "warnings": self.warnings(),
        }


def doctor(
    allocator: TableWorkerAllocator,
    layout: Layout,
    *,
    clock: Clock | None = None,
    partitioned_tables: Sequence[str] = (),
    read_partitions: PartitionReader | None = None,
) -> DoctorReport:
    """Read the worker tables (and the partition catalog) and report; writes nothing.

    Raises :class:`~snowflake_db.AllocatorUnavailableError` if the control database or its
    tables cannot be read. ``read_partitions`` lists a table's range partitions
    (:func:`snowflake_db.sharding.partitioning.partition_bounds` on some connection).
    """
    recorded = allocator.recorded_layout()
    skew = allocator.measure_clock_skew(clock)
    rows = allocator.workers()
    database_now_ms = rows[0].db_now_ms if rows else skew.database_ms
    runways = [
        _runway(table, layout, database_now_ms, read_partitions) for table in partitioned_tables
    ]
    return DoctorReport(
        where=allocator.where,
        layout=layout,
        recorded=recorded,
        database_now_ms=database_now_ms,
        skew=skew,
        skew_warning_ms=allocator.clock_skew.warning_ms,
        max_skew_ms=allocator.clock_skew.max_ms,
        slots=SlotCounts.of(rows, layout, allocator.max_floor_wait_ms),
        partitions=runways,
    )


def _runway(
    table: str, layout: Layout, now_ms: int, read_partitions: PartitionReader | None
) -> PartitionRunway:
    if read_partitions is None:
        return PartitionRunway(table, error="no connection to read partitions from")
    try:
        bounds = read_partitions(table)
    except Exception as error:  # a missing table, not PostgreSQL, no permission: report it
        return PartitionRunway(table, error=f"cannot read its partitions ({_one_line(error)})")
    if not bounds:
        return PartitionRunway(table, error="no range partitions by ID (not time-partitioned?)")
    name, _, high = bounds[-1]
    if high > layout.max_id:
        until_ms = layout.max_timestamp_ms + 1
    else:
        until_ms = layout.tick_start_ms(high >> layout.time_shift)
    return PartitionRunway(
        table,
        last_partition=name,
        covers_until_ms=until_ms,
        days_ahead=(until_ms - now_ms) / _DAY_MS,
    )
