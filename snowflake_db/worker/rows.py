"""The rows the allocator reads and writes, as plain frozen records (no SQL here).

:class:`SlotRow` is also what ``snowflake-db workers``, the Django admin and the metrics' slot
counts read; :class:`Claim` is what :mod:`.claims` asks :class:`~.store.WorkerStore` to write.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Claim", "LayoutRow", "SlotRow"]


@dataclass(frozen=True, slots=True)
class SlotRow:
    """One row of the slots table, with the database time it was read at."""

    worker_id: int
    lease_token: str | None
    registration_id: int | None
    hostname: str | None
    pid: int | None
    label: str | None
    acquired_at_ms: int | None
    renewed_at_ms: int | None
    expires_at_ms: int | None
    high_water_ms: int
    db_now_ms: int

    @property
    def reserved(self) -> bool:
        """A permanent reservation: held, with no expiry."""
        return self.lease_token is not None and self.expires_at_ms is None

    @property
    def live(self) -> bool:
        """Held by a lease the database clock has not seen expire (or reserved)."""
        if self.lease_token is None:
            return False
        return self.expires_at_ms is None or self.expires_at_ms >= self.db_now_ms

    @property
    def state(self) -> str:
        """``free``, ``live``, ``expired`` or ``reserved``."""
        if self.lease_token is None:
            return "free"
        if self.reserved:
            return "reserved"
        return "live" if self.live else "expired"


@dataclass(frozen=True, slots=True)
class LayoutRow:
    """The layout table's row: the layout's JSON text and who recorded it when."""

    layout: str
    recorded_at_ms: int
    hostname: str | None
    pid: int | None


@dataclass(frozen=True, slots=True)
class Claim:
    """Who claims a slot, and for how long (``lease_ms=None``: a permanent reservation)."""

    worker_id: int
    token: str
    registration_id: int | None
    hostname: str
    pid: int
    lease_ms: int | None
    label: str | None = None
