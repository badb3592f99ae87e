"""A lease's timing arguments, checked together: each error names the argument the caller
passed and the limit that applies to it (a derived value is never blamed for its source)."""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import require_int, require_seconds
from ..errors import InvalidArgumentError

#: Default lease length: a crashed holder's worker ID is reusable this long after its last renewal.
DEFAULT_LEASE_SECONDS = 30.0
#: Shortest lease accepted: renewed every third of it, a shorter one would ask the control
#: database for a renewal faster than a round trip to it.
MIN_LEASE_SECONDS = 0.1
#: Longest lease (and ``reserve_ahead_ms``) accepted: a crashed holder parks its slot this long.
MAX_LEASE_SECONDS = 86_400.0


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    lease_seconds: float
    renew_every: float
    safety_margin: float
    reserve_ahead_ms: int


def lease_timing(
    *,
    lease_seconds: float,
    renew_every: float | None,
    safety_margin: float | None,
    reserve_ahead_ms: int | None,
) -> LeaseTiming:
    """Check the arguments and fill in the defaults derived from ``lease_seconds``."""
    lease = require_seconds("lease_seconds", lease_seconds, positive=True)
    if lease < MIN_LEASE_SECONDS:
        raise InvalidArgumentError(
            f"lease_seconds={lease_seconds} is below the minimum {MIN_LEASE_SECONDS:g} s "
            "(renewed every third of it, a shorter lease would need renewals faster than a "
            "round trip to the control database)"
        )
    if lease > MAX_LEASE_SECONDS:
        raise InvalidArgumentError(
            f"lease_seconds={lease_seconds} exceeds the maximum {MAX_LEASE_SECONDS:g} s "
            "(one day): a crashed holder would park its worker ID that long"
        )
    renew = require_seconds(
        "renew_every", renew_every if renew_every is not None else lease / 3, positive=True
    )
    margin = require_seconds(
        "safety_margin", safety_margin if safety_margin is not None else lease / 5
    )
    if renew >= lease - margin:
        raise InvalidArgumentError(
            f"renew_every={renew} s must be shorter than lease_seconds - safety_margin = "
            f"{lease - margin} s, or every lease would pass its local deadline before its "
            "first renewal"
        )
    reserve = round(lease * 1000)  # at least 100 ms, given the minimum lease
    if reserve_ahead_ms is not None:
        reserve = require_int(
            "reserve_ahead_ms",
            reserve_ahead_ms,
            minimum=1,
            maximum=round(MAX_LEASE_SECONDS * 1000),
            limit_note="one day: the next holder of the slot would wait that long",
        )
    return LeaseTiming(lease, renew, margin, reserve)
