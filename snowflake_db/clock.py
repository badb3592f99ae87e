"""Clocks: zero-argument callables returning integer Unix milliseconds, and the library's own
readings of real time.

The default, :class:`MonotonicClock`, reads the monotonic clock and adds the offset to wall time
measured once per process, so stepping the wall clock (NTP, an operator, a VM resume) never moves
it backwards. The generator reads its monotonic source directly on the hot path.

Real time, whatever a test tool does
------------------------------------
freezegun replaces ``time.time``, ``time.monotonic``, their ``_ns`` forms and ``perf_counter``,
and, as it starts, every module attribute bound to one of those functions (``from time import
monotonic``); time-machine patches ``time.time``, ``time.time_ns`` and
``clock_gettime(CLOCK_REALTIME)`` in C while it travels. Frozen time would stall or repeat IDs and
break a lease's deadline, so every reading in snowflake_db (IDs, leases, renewals, deadlines,
skew checks, waits) goes through :func:`monotonic_ns`, :func:`monotonic` and :func:`wall_ns`:

* monotonic time is the C function ``time.monotonic_ns`` taken when this module is imported
  (neither tool changes the function itself; freezegun only rebinds names to it), or
  ``clock_gettime_ns(CLOCK_MONOTONIC)`` if a tool had already replaced it by then;
* wall time is ``clock_gettime_ns(CLOCK_REALTIME)``, which freezegun leaves alone (elsewhere: the
  ``time.time_ns`` function taken at import);
* the default clock's anchor (wall minus monotonic) is measured at import, so a later
  time-machine travel, which moves ``CLOCK_REALTIME`` itself, cannot shift IDs.

The sources are kept in a tuple, not as module attributes that freezegun's sweep would replace.
Tests that need to control time pass ``clock=`` to the generator.
"""

from __future__ import annotations

import functools
import time
import types
from collections.abc import Callable
from typing import NamedTuple

Clock = Callable[[], int]

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000


def _untouched(name: str) -> Callable[[], int] | None:
    """``time.<name>`` if it is still the time module's C function (not a test tool's fake)."""
    function = getattr(time, name, None)
    return function if isinstance(function, types.BuiltinFunctionType) else None


def _clock_gettime_ns(clock_name: str) -> Callable[[], int] | None:
    clock_id = getattr(time, clock_name, None)
    if clock_id is None or not hasattr(time, "clock_gettime_ns"):
        return None
    return functools.partial(time.clock_gettime_ns, clock_id)


class _RealTime(NamedTuple):
    monotonic_ns: Callable[[], int]
    wall_ns: Callable[[], int]


_REAL = _RealTime(
    monotonic_ns=(
        _untouched("monotonic_ns") or _clock_gettime_ns("CLOCK_MONOTONIC") or time.monotonic_ns
    ),
    wall_ns=_clock_gettime_ns("CLOCK_REALTIME") or _untouched("time_ns") or time.time_ns,
)


def monotonic_ns() -> int:
    """Real monotonic nanoseconds (the clock of ``time.monotonic_ns``, never faked)."""
    return _REAL.monotonic_ns()


def monotonic() -> float:
    """Real monotonic seconds, for deadlines: what ``time.monotonic()`` reads when not faked."""
    return _REAL.monotonic_ns() / _NS_PER_S


def wall_ns() -> int:
    """Real wall-clock Unix nanoseconds (can step with NTP; freezegun does not fake it)."""
    return _REAL.wall_ns()


def _measure_anchor() -> int:
    # Read wall and monotonic back to back: their difference maps monotonic to Unix time.
    return _REAL.wall_ns() - _REAL.monotonic_ns()


#: Wall minus monotonic nanoseconds, measured once at import: the default clock's anchor.
_PROCESS_ANCHOR_NS = _measure_anchor()


class MonotonicClock:
    """Unix milliseconds that never go backwards: real monotonic time anchored to wall time once
    per process (at import, before a test tool can move the wall clock)."""

    __slots__ = ("offset_ns", "read_ns")

    def __init__(self) -> None:
        #: The raw source, in nanoseconds; the generator's hot path calls it directly.
        self.read_ns: Callable[[], int] = _REAL.monotonic_ns
        self.offset_ns = _PROCESS_ANCHOR_NS

    def __call__(self) -> int:
        return (self.read_ns() + self.offset_ns) // _NS_PER_MS

    def __repr__(self) -> str:
        return f"MonotonicClock(offset_ns={self.offset_ns})"


def wall_clock() -> int:
    """Wall-clock Unix milliseconds (real, see :func:`wall_ns`); can step backwards, unlike the
    default."""
    return _REAL.wall_ns() // _NS_PER_MS


_process_clock: MonotonicClock | None = None


def default_clock() -> MonotonicClock:
    """The process's shared :class:`MonotonicClock`."""
    global _process_clock  # noqa: PLW0603 - one clock per process, created lazily
    if _process_clock is None:
        _process_clock = MonotonicClock()
    return _process_clock
