"""The scheduler-delay probe that widens the suite's liveness bounds measures a real stall and
nothing outside the window it is asked about."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from .core_support import has_ended
from .scheduler_delay import SchedulerDelay, kill_and_collect


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


def test_wait_for_gives_up_at_the_bound_and_waits_longer_by_the_delay_measured() -> None:
    probe = SchedulerDelay()  # not started: the delay is set below
    calls: list[float] = []

    def never(timeout: float) -> bool:
        calls.append(timeout)
        time.sleep(timeout)
        return False

    started = time.monotonic()
    assert probe.wait_for(never, 0.2) is False  # a hang is still a failure
    assert time.monotonic() - started >= 0.2 and all(t <= 0.2 for t in calls)

    probe.during = lambda start, end: 0.3  # type: ignore[method-assign]  # a stall of 0.3 s
    calls.clear()
    started = time.monotonic()
    assert probe.wait_for(never, 0.2) is False
    assert time.monotonic() - started >= 0.5  # the bound plus the stall
    ends_at_the_second_look = iter([False, True])
    assert probe.wait_for(lambda timeout: next(ends_at_the_second_look), 0.2) is True


def test_run_returns_the_output_and_kills_a_child_past_its_patience() -> None:
    probe = SchedulerDelay()
    probe.start()
    try:
        both = "import sys; print('out'); print('err', file=sys.stderr)"
        done = probe.run([sys.executable, "-c", both], 60)
        assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            probe.run([sys.executable, "-c", "import time; time.sleep(60)"], 0.3)
        assert time.monotonic() - started < 30  # killed, not waited for
    finally:
        probe.stop()


def test_a_killed_process_takes_the_children_holding_its_output_with_it() -> None:
    parent = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None
    child = int(process.stdout.readline())
    kill_and_collect(process)  # the child kept the pipe open: communicate() waited 300 s
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while not has_ended(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert has_ended(child)
