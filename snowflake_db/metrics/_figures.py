"""What :mod:`snowflake_db.metrics` reports: the snapshot, the slot states and their counts,
and how exporters present each figure.

:class:`MetricsSnapshot` is the one declaration of the figures: the recorders' running totals
(:class:`Totals`) are its fields minus those computed per snapshot, so a new counter is added
in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..layout import Layout

__all__ = [
    "FIGURES",
    "Figure",
    "MetricsSnapshot",
    "SlotCounts",
    "SlotRowLike",
    "SlotState",
    "Totals",
]

#: Field metadata of a total that combines as the larger of two (a maximum), not their sum.
_LARGEST = {"combine": "max"}


class SlotState(StrEnum):
    """The state of one worker slot row, judged by the database clock: the one rule that the
    allocator's rows, the Django model and admin, the CLI, the metrics and the exporters use.

    ``free``: no holder (released or reaped); ``reserved``: held with no expiry (a permanent
    reservation); ``live``: held, expiry not yet passed; ``expired``: held, expiry passed.
    A member is its text (``SlotState.LIVE == "live"``), so JSON and tables show it as is.
    """

    LIVE = "live"
    RESERVED = "reserved"
    EXPIRED = "expired"
    FREE = "free"

    @classmethod
    def of(cls, *, lease_token: str | None, expires_at_ms: int | None, now_ms: int) -> SlotState:
        """The state of a row with this token and expiry at database time ``now_ms``."""
        if lease_token is None:
            return cls.FREE
        if expires_at_ms is None:
            return cls.RESERVED
        return cls.LIVE if expires_at_ms >= now_ms else cls.EXPIRED

    @property
    def held(self) -> bool:
        """Taken by a holder no one else may replace: live or reserved."""
        return self in (SlotState.LIVE, SlotState.RESERVED)

    @property
    def claimable(self) -> bool:
        """A new holder may take it (if its high-water mark allows): free or expired."""
        return self in (SlotState.FREE, SlotState.EXPIRED)


class SlotRowLike(Protocol):
    """What :meth:`SlotCounts.of` reads of a slot row (``snowflake_db.worker.SlotRow``)."""

    @property
    def worker_id(self) -> int: ...

    @property
    def state(self) -> SlotState: ...

    @property
    def high_water_ms(self) -> int: ...

    @property
    def renewed_at_ms(self) -> int | None: ...

    @property
    def db_now_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SlotCounts:
    """The layout's worker IDs by state, judged by the database clock: the one count that
    ``snowflake-db doctor``, ``manage.py snowflake doctor``, the Django admin and the metrics
    exporters show.

    The states ``live``, ``reserved``, ``expired``, ``free`` (released or reaped) and
    ``never_used`` add up to ``size``. ``parked``: free or expired, but with a high-water mark
    further ahead of the database clock than a new holder waits (``max_floor_wait_ms``), so not
    usable yet. ``available``: what a new process could lease now.
    """

    size: int
    live: int
    reserved: int
    expired: int
    free: int
    never_used: int
    parked: int
    #: Seconds since the live lease renewed longest ago (None without live leases): a value
    #: near the lease length means a holder's heartbeat is late.
    stalest_renewal_seconds: float | None = None

    @property
    def available(self) -> int:
        return self.free + self.expired + self.never_used - self.parked

    def by_state(self) -> dict[str, int]:
        """Every state's count, ``never_used`` (worker IDs without a row) last; they add up to
        ``size``. What the exporters label by state and ``doctor --json`` prints."""
        counts = {state.value: getattr(self, state.value) for state in SlotState}
        counts["never_used"] = self.never_used
        return counts

    @classmethod
    def of(cls, rows: Sequence[SlotRowLike], layout: Layout, max_floor_wait_ms: int) -> SlotCounts:
        """Count the slot rows (all read at one database time) of ``layout``'s worker IDs."""
        size = layout.max_worker_id + 1
        mine = [row for row in rows if row.worker_id < size]
        states = dict.fromkeys(SlotState, 0)
        parked = 0
        stalest: float | None = None
        for row in mine:
            state = row.state
            states[state] += 1
            if state.claimable and row.high_water_ms - row.db_now_ms > max_floor_wait_ms:
                parked += 1
            if state is SlotState.LIVE and row.renewed_at_ms is not None:
                age = max(0.0, (row.db_now_ms - row.renewed_at_ms) / 1000)
                stalest = age if stalest is None else max(stalest, age)
        return cls(
            size=size,
            never_used=size - len(mine),
            parked=parked,
            stalest_renewal_seconds=stalest,
            **{state.value: count for state, count in states.items()},
        )

    def describe(self) -> str:
        return (
            f"{self.size} in all: {self.live} live, {self.reserved} reserved, {self.expired} "
            f"expired, {self.free} free, {self.never_used} never used; {self.available} "
            f"available now, {self.parked} parked (mark ahead)"
        )


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every figure at one moment; counters only grow while the process lives."""

    pid: int
    #: IDs handed out (``next_id``, ``next_ids``, ``snowflake_default``).
    ids_issued: int = 0
    #: Calls that waited for the next tick because theirs was used up, and the time waited.
    clock_waits: int = 0
    clock_wait_seconds: float = 0.0
    #: Times the clock fell behind the last tick within the tolerance (IDs went on from it).
    clock_rollbacks_tolerated: int = 0
    #: Calls refused with ClockMovedBackwardsError.
    clock_rollback_refusals: int = 0
    #: The largest rollback seen, tolerated or refused, in ms.
    clock_rollback_max_ms: int = dataclasses.field(default=0, metadata=_LARGEST)
    #: Calls refused for want of a usable lease (LeaseExpiredError, WorkerLeaseError).
    lease_refusals: int = 0
    #: Seconds from each first refused call to the next ID issued (ongoing ones up to now).
    fenced_seconds: float = 0.0
    #: Generators refusing IDs right now (their last call was refused, none issued since).
    fenced_generators: int = 0
    lease_acquisitions: int = 0
    lease_acquisition_failures: int = 0
    lease_renewals: int = 0
    lease_renewal_failures: int = 0
    #: Total and largest time of successful renewals (a latency: total / renewals).
    lease_renewal_seconds: float = 0.0
    lease_renewal_max_seconds: float = dataclasses.field(default=0.0, metadata=_LARGEST)
    #: Leases a renewal found taken by another holder or reaped.
    leases_lost: int = 0
    #: Days until the time bits of the generators' layout run out (the soonest of them);
    #: None without a generator.
    time_left_days: float | None = None
    #: The control database's slots (``with_slots=True``), or None.
    slots: SlotCounts | None = None
    #: Why ``slots`` is None although it was asked for (the control database failed).
    slots_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON; ``slots`` gains its ``available`` count."""
        values = dataclasses.asdict(self)
        if self.slots is not None:
            values["slots"]["available"] = self.slots.available
        return values


@dataclass(frozen=True, slots=True)
class Figure:
    """How exporters and reports present one :class:`MetricsSnapshot` field."""

    field: str
    #: Counters only grow while the process lives; gauges go up and down.
    counter: bool
    #: "" (a count), "seconds", "ms" or "days".
    unit: str
    description: str


#: Every figure of a snapshot except ``slots`` (which has a label per state), in display order:
#: the one list the Prometheus and OpenTelemetry exporters and the text reports share.
FIGURES = (
    Figure("ids_issued", True, "", "IDs issued (next_id, next_ids, snowflake_default)"),
    Figure("clock_waits", True, "", "calls that waited for the next tick (sequences used up)"),
    Figure("clock_wait_seconds", True, "seconds", "time spent waiting for the next tick"),
    Figure(
        "clock_rollbacks_tolerated",
        True,
        "",
        "times the clock fell behind the last tick within the tolerance",
    ),
    Figure("clock_rollback_refusals", True, "", "calls refused with ClockMovedBackwardsError"),
    Figure("clock_rollback_max_ms", False, "ms", "largest clock rollback seen"),
    Figure(
        "lease_refusals",
        True,
        "",
        "calls refused for want of a usable lease (LeaseExpiredError, WorkerLeaseError)",
    ),
    Figure("fenced_seconds", True, "seconds", "time fenced: from a refused call to the next ID"),
    Figure("fenced_generators", False, "", "generators refusing IDs right now (fenced)"),
    Figure("lease_acquisitions", True, "", "worker leases acquired"),
    Figure("lease_acquisition_failures", True, "", "worker lease acquisitions that failed"),
    Figure("lease_renewals", True, "", "lease renewals the control database accepted"),
    Figure("lease_renewal_failures", True, "", "lease renewals that failed (database errors)"),
    Figure("lease_renewal_seconds", True, "seconds", "total time of accepted lease renewals"),
    Figure("lease_renewal_max_seconds", False, "seconds", "longest accepted lease renewal"),
    Figure("leases_lost", True, "", "leases a renewal found taken by another holder or reaped"),
    Figure("time_left_days", False, "days", "days until the layout's time bits run out"),
)


#: Snapshot fields computed when a snapshot is taken; every other field is a running total.
_PER_SNAPSHOT = frozenset({"pid", "time_left_days", "slots", "slots_error"})
_TOTAL_FIELDS = tuple(
    field for field in dataclasses.fields(MetricsSnapshot) if field.name not in _PER_SNAPSHOT
)
#: Each total's name and starting value (0 or 0.0, as the snapshot declares it).
_ZERO = {field.name: field.default for field in _TOTAL_FIELDS}
_MAXIMA = frozenset(field.name for field in _TOTAL_FIELDS if field.metadata.get("combine") == "max")


class Totals(dict[str, Any]):
    """The running totals of one recorder, keyed by :class:`MetricsSnapshot` field name."""

    __slots__ = ()

    @classmethod
    def zero(cls) -> Totals:
        return cls(_ZERO)

    def copy(self) -> Totals:
        return Totals(self)

    def add(self, other: Totals) -> None:
        """Sum the totals; the larger of the two for a maximum."""
        for name, theirs in other.items():
            mine = self[name]
            self[name] = max(mine, theirs) if name in _MAXIMA else mine + theirs
