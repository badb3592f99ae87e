"""A generator's clock in ticks: the clock read in its own raw units, the tick arithmetic, and
the bounded wait for the next tick.

Ticks are expressed in the raw clock's units (real monotonic nanoseconds for the default clock,
see :mod:`snowflake_db.clock`; milliseconds for a user's clock) so that the generator's hot path
compares plain ints; everything here runs on its slow path, at most once per tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .clock import Clock, MonotonicClock, monotonic
from .errors import (
    ClockError,
    ClockMovedBackwardsError,
    ClockStalledError,
    InvalidArgumentTypeError,
)

if TYPE_CHECKING:
    from .layout import Layout
    from .metrics import MetricsRecorder

__all__ = ["RawTicks"]

_NS_PER_MS = 1_000_000
#: Closer than this to the next tick, a wait spins instead of sleeping.
_SPIN_BELOW_MS = 2


class RawTicks:
    """``clock`` read raw: ``unix_ms = (raw + offset) // per_ms``, ``tick = (raw - epoch) //
    per_tick``, where ``epoch`` is the layout's epoch in raw units."""

    __slots__ = ("epoch", "layout", "offset", "per_ms", "per_tick", "read")

    def __init__(self, clock: Clock, layout: Layout) -> None:
        self.layout = layout
        if isinstance(clock, MonotonicClock):
            self.read: Callable[[], int] = clock.read_ns
            self.per_ms = _NS_PER_MS
            self.offset = clock.offset_ns
        else:
            self.read = clock
            self.per_ms = 1
            self.offset = 0
        self.epoch = layout.epoch_ms * self.per_ms - self.offset
        self.per_tick = layout.tick_ms * self.per_ms

    def read_checked(self) -> int:
        """One reading, refused unless it is an int (a user's clock may return anything)."""
        raw = self.read()
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise InvalidArgumentTypeError(
                f"the clock must return integer Unix milliseconds, got {type(raw).__name__} {raw!r}"
            )
        return raw

    def ms_of(self, raw: int) -> int:
        return (raw + self.offset) // self.per_ms

    def tick_of(self, raw: int) -> int:
        tick = (raw - self.epoch) // self.per_tick
        if tick < 0:
            raise ClockError(
                f"the clock reads {self.ms_of(raw)} ms (Unix), before the layout's epoch "
                f"{self.layout.epoch_ms} ms ({self.layout.epoch.isoformat()})"
            )
        return tick

    def tick_of_ms(self, timestamp_ms: int) -> int:
        return (timestamp_ms - self.layout.epoch_ms) // self.layout.tick_ms

    def start_of(self, tick: int) -> int:
        """The raw reading at which ``tick`` begins."""
        return self.epoch + tick * self.per_tick

    def wait_for_tick_after(
        self,
        last: int,
        *,
        rollback_tolerance_ms: int,
        max_wait_ms: int,
        metrics: MetricsRecorder,
    ) -> int:
        """Wait (bounded) until the clock is past tick ``last``; raise if it goes back or stalls."""
        layout = self.layout
        next_start_ms = layout.tick_start_ms(last + 1)
        started = monotonic()
        expected_ms = max(0, next_start_ms - self.ms_of(self.read_checked()))
        give_up = started + (expected_ms + max_wait_ms) / 1000
        while True:
            raw = self.read_checked()
            tick = self.tick_of(raw)
            if tick > last:
                metrics.clock_waited(monotonic() - started)
                return tick
            now_ms = self.ms_of(raw)
            behind_ms = layout.tick_start_ms(last) - now_ms
            if behind_ms > rollback_tolerance_ms:
                metrics.clock_refused(behind_ms)
                raise ClockMovedBackwardsError(
                    behind_ms, rollback_tolerance_ms, "while waiting for the next tick"
                )
            if monotonic() > give_up:
                raise ClockStalledError(
                    f"the clock did not reach tick {last + 1} (Unix ms {next_start_ms}) within "
                    f"{expected_ms + max_wait_ms} ms; it reads {now_ms} ms; no ID was issued"
                )
            remaining_ms = next_start_ms - now_ms
            if remaining_ms >= _SPIN_BELOW_MS:
                time.sleep(min(remaining_ms - 1, 50) / 1000)
