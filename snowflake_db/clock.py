"""Clocks: zero-argument callables returning integer Unix milliseconds.

The default, :class:`MonotonicClock`, reads the monotonic clock and adds the offset to wall time
measured once when the process first needs it, so stepping the wall clock (NTP, an operator, a VM
resume) never moves it backwards. The generator reads its monotonic source directly on the hot path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


class MonotonicClock:
    """Unix milliseconds that never go backwards: monotonic time anchored to wall time once."""

    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        # Read wall and monotonic back to back; the anchor is fixed for the clock's lifetime.
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def __call__(self) -> int:
        return (time.monotonic_ns() + self.offset_ns) // 1_000_000

    def __repr__(self) -> str:
        return f"MonotonicClock(offset_ns={self.offset_ns})"


def wall_clock() -> int:
    """Wall-clock Unix milliseconds (``time.time_ns``); can step backwards, unlike the default."""
    return time.time_ns() // 1_000_000


_process_clock: MonotonicClock | None = None


def default_clock() -> MonotonicClock:
    """The process's shared :class:`MonotonicClock`, anchored on first use."""
    global _process_clock  # noqa: PLW0603 - one anchor per process, created lazily
    if _process_clock is None:
        _process_clock = MonotonicClock()
    return _process_clock
