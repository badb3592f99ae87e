"""The ``scheduler_delay`` fixture: how long this test's own process waited to run.

A liveness bound ("the call returned within 1.5 s") fails on a loaded machine for a reason that
is not the product's: the thread that made the call, or the one it waited for, was ready but
had no CPU. So such a bound is judged as ``scheduler_delay.widen(bound, start, end)``: the bound
plus the time within ``[start, end]`` that a probe thread, sleeping 10 ms over and over, spent
due but not running. On an idle machine that is about nothing, and a slow product still fails
the bound; on a busy one the bound grows by what the scheduler took.

A wake later than the GIL's switch interval counts only beyond it: a probe that merely waited
for a busy thread of this test to hand over the GIL measures the test's own Python work, not
the scheduler. Correctness (no ID after a deadline, a row locked until the server's limit) is
judged from recorded events, never widened.
"""

from __future__ import annotations

import bisect
import sys
import threading
import time
from array import array
from collections.abc import Iterator

import pytest

#: How long the probe sleeps between two looks at the clock.
PROBE_INTERVAL_S = 0.01


class SchedulerDelay:
    """A probe thread recording, for each of its short sleeps, when it was due and when it ran."""

    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._grace_s = sys.getswitchinterval()
        self._due = array("d")  # when each sleep should have ended (ascending)
        self._woke = array("d")  # when the probe ran again after it
        self._pending_due = float("inf")  # the sleep under way, if any
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="scheduler-delay-probe", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            due = time.monotonic() + self._interval_s
            with self._lock:
                self._pending_due = due
            time.sleep(self._interval_s)
            woke = time.monotonic()
            with self._lock:
                self._due.append(due)
                self._woke.append(woke)
                self._pending_due = float("inf")

    def during(self, start: float, end: float) -> float:
        """Seconds within ``[start, end]`` (``time.monotonic()``) in which the probe was due to
        run but did not, each wake's first switch interval excepted."""
        with self._lock:
            first = bisect.bisect_left(self._woke, start)
            spans = list(zip(self._due[first:], self._woke[first:], strict=True))
            if self._pending_due < end:  # still waiting to run now
                spans.append((self._pending_due, time.monotonic()))
        return sum(
            max(0.0, min(woke, end) - max(due + self._grace_s, start)) for due, woke in spans
        )

    def widen(self, bound: float, start: float, end: float) -> float:
        """``bound`` plus the delay measured while a call ran from ``start`` to ``end``."""
        return bound + self.during(start, end)

    def worst(self) -> float:
        """The latest the probe ever ran, in seconds past its due time."""
        with self._lock:
            return max((w - d for d, w in zip(self._due, self._woke, strict=True)), default=0.0)


@pytest.fixture
def scheduler_delay() -> Iterator[SchedulerDelay]:
    """A probe running for the whole test (see the module's docstring)."""
    probe = SchedulerDelay()
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()
