"""The scheduler-delay probe that widens the suite's liveness bounds measures a real stall and
nothing outside the window it is asked about."""

from __future__ import annotations

import time

from .plugins.scheduler_delay import SchedulerDelay


def _hold_the_gil(seconds: float) -> None:
    """Keep the GIL for about ``seconds`` in one C call (``sum`` over a range never lets
    another thread run), as a thread starved of the CPU keeps every other one waiting."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(2_000_000))


def test_a_stall_counts_as_delay_and_only_within_its_window() -> None:
    probe = SchedulerDelay()
    probe.start()
    try:
        time.sleep(0.05)  # the probe is running
        started = time.monotonic()
        _hold_the_gil(0.3)
        ended = time.monotonic()
        time.sleep(0.05)
        stalled = ended - started
        delay = probe.during(started, ended)
        # Each C call holds the GIL for milliseconds to tens of them; between two, the probe may
        # run, but only after its switch interval: most of the window was delay.
        assert 0.3 * stalled < delay <= stalled
        assert probe.widen(1.0, started, ended) == 1.0 + delay
        assert probe.during(started - 10, started - 9) == 0.0  # before the probe existed
        assert probe.worst() > 0.0
    finally:
        probe.stop()
