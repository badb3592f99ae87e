"""How far a process's clock is from the control database's clock, and what is done about it.

Lease expiry is judged by the database clock, but IDs and high-water marks carry the process's
clock. A clock far from the others' makes IDs sort out of time order across processes, leaves
slots looking parked to a process with a correct clock, and is likely to be stepped back by
NTP later, which the generator refuses beyond its rollback tolerance. So the allocator measures
the offset at every acquisition and renewal: beyond ``warning_ms`` it logs a warning; beyond
``max_ms`` (by default the generator's rollback tolerance) it refuses to lease a worker ID at
all (a held lease is never fenced for skew: that would only stop a healthy process).

The offset is measured around one ``SELECT <database now>``: the local clock is read before and
after, and the midpoint compared with the database's answer. Half the round trip plus the two
clocks' 1 ms resolution is the uncertainty; only what certainly exceeds a bound counts, so a
slow round trip never raises a false alarm.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sqlalchemy import Connection

from .._validate import require_int
from ..clock import Clock
from ..errors import ClockSkewError, InvalidArgumentError
from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ._store import WorkerStore

logger = logging.getLogger("snowflake_db.worker")

#: Default skew above which a warning is logged, in ms. NTP keeps hosts within a few ms.
DEFAULT_CLOCK_SKEW_WARNING_MS = 100
#: Default skew above which a lease is refused: the generator's default rollback tolerance.
DEFAULT_MAX_CLOCK_SKEW_MS = DEFAULT_ROLLBACK_TOLERANCE_MS
#: Largest bound accepted (one day).
MAX_CLOCK_SKEW_BOUND_MS = 86_400_000
#: Resolution of the two clocks compared (integer milliseconds each).
_RESOLUTION_MS = 2.0


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """The local clock minus the database clock, in ms (positive: the process is ahead)."""

    offset_ms: float
    uncertainty_ms: float
    #: The database clock's reading the offset was measured against (Unix ms).
    database_ms: int

    @property
    def at_least_ms(self) -> int:
        """How far off the clock certainly is (0 if within the measurement's uncertainty)."""
        return max(0, int(abs(self.offset_ms) - self.uncertainty_ms))

    def describe(self) -> str:
        """``1503 ms ahead of`` / ``2 ms behind`` the database, with the uncertainty."""
        direction = "ahead of" if self.offset_ms >= 0 else "behind"
        return (
            f"{abs(self.offset_ms):.0f} ms (± {self.uncertainty_ms:.0f} ms) {direction} "
            "the database clock"
        )


def measure(connection: Connection, store: WorkerStore, clock: Clock) -> ClockSkew:
    """One measurement, on ``connection`` (inside the caller's transaction, if any)."""
    before = clock()
    database_ms = store.now_ms(connection)
    after = clock()
    return ClockSkew(
        offset_ms=(before + after) / 2 - database_ms,
        uncertainty_ms=abs(after - before) / 2 + _RESOLUTION_MS,
        database_ms=database_ms,
    )


class SkewPolicy:
    """The two bounds, and the warnings they produce (renewals warn once per change)."""

    def __init__(self, *, warning_ms: int, max_ms: int) -> None:
        self.warning_ms = require_int(
            "clock_skew_warning_ms", warning_ms, minimum=0, maximum=MAX_CLOCK_SKEW_BOUND_MS
        )
        self.max_ms = require_int(
            "max_clock_skew_ms", max_ms, minimum=0, maximum=MAX_CLOCK_SKEW_BOUND_MS
        )
        if self.warning_ms > self.max_ms:
            raise InvalidArgumentError(
                f"clock_skew_warning_ms={warning_ms} exceeds max_clock_skew_ms={max_ms}: the "
                "warning bound must not be above the refusal bound"
            )
        self._lock = threading.Lock()
        self._renewal_level = 0

    def level(self, skew: ClockSkew) -> int:
        """0 within the warning bound, 1 beyond it, 2 beyond the refusal bound."""
        if skew.at_least_ms > self.max_ms:
            return 2
        return 1 if skew.at_least_ms > self.warning_ms else 0

    def at_acquisition(self, skew: ClockSkew, where: str) -> None:
        """Refuse a lease beyond ``max_ms``; warn beyond ``warning_ms``."""
        level = self.level(skew)
        if level == 2:
            signed = skew.at_least_ms if skew.offset_ms >= 0 else -skew.at_least_ms
            raise ClockSkewError(
                signed,
                self.max_ms,
                f"this process's clock is {skew.describe()} of {where}, more than the "
                f"{self.max_ms} ms allowed (max_clock_skew_ms, by default the generator's "
                "rollback tolerance); no worker ID was leased. Fix the host's time "
                "synchronisation (NTP/chrony) or the clock= given to the generator",
            )
        if level == 1:
            logger.warning(
                "snowflake_db: this process's clock is %s of %s, more than the %d ms warning "
                "bound (clock_skew_warning_ms); leases are refused beyond %d ms",
                skew.describe(),
                where,
                self.warning_ms,
                self.max_ms,
            )

    def at_renewal(self, skew: ClockSkew, worker_id: int) -> None:
        """Warn when the skew crosses a bound (up or back down); never fence a held lease."""
        level = self.level(skew)
        with self._lock:
            previous, self._renewal_level = self._renewal_level, level
        if level == previous:
            return
        if level == 0:
            logger.info(
                "snowflake_db: the clock of worker %d is back within %d ms of the database "
                "clock (%s)",
                worker_id,
                self.warning_ms,
                skew.describe(),
            )
            return
        bound = self.max_ms if level == 2 else self.warning_ms
        logger.warning(
            "snowflake_db: the clock of worker %d is %s, more than %d ms (%s); the lease is "
            "kept, but a new lease would be %s",
            worker_id,
            skew.describe(),
            bound,
            "max_clock_skew_ms" if level == 2 else "clock_skew_warning_ms",
            "refused" if level == 2 else f"refused beyond {self.max_ms} ms",
        )
