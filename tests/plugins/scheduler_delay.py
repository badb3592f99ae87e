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

A hang guard (a pool's tasks, a subprocess, a server coming up) is such a bound too: ``wait_for``
and ``run`` give up only once the bound plus the delay measured since they started has passed,
so an overloaded machine cannot turn the guard into a failure while a real hang still is one.
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from .core_support import process_stat

#: How long the probe sleeps between two looks at the clock.
PROBE_INTERVAL_S = 0.01


def monotonic() -> float:
    """``time.monotonic()`` as the kernel keeps it: freezegun replaces ``time.monotonic`` (a
    probe reading it inside a freeze would see no delay at all), ``clock_gettime`` it leaves."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


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
            due = monotonic() + self._interval_s
            with self._lock:
                self._pending_due = due
            time.sleep(self._interval_s)
            woke = monotonic()
            with self._lock:
                self._due.append(due)
                self._woke.append(woke)
                self._pending_due = float("inf")

    def during(self, start: float, end: float) -> float:
        """Seconds within ``[start, end]`` (:func:`monotonic`) in which the probe was due to
        run but did not, each wake's first switch interval excepted."""
        with self._lock:
            first = bisect.bisect_left(self._woke, start)
            spans = list(zip(self._due[first:], self._woke[first:], strict=True))
            if self._pending_due < end:  # still waiting to run now
                spans.append((self._pending_due, monotonic()))
        return sum(
            max(0.0, min(woke, end) - max(due + self._grace_s, start)) for due, woke in spans
        )

    def widen(self, bound: float, start: float, end: float) -> float:
        """``bound`` plus the delay measured while a call ran from ``start`` to ``end``."""
        return bound + self.during(start, end)

    def wait_for(self, done: Callable[[float], bool], bound: float) -> bool:
        """Call ``done(timeout)`` (a wait of at most ``timeout`` s that says whether it ended)
        until it returns True, or False once ``bound`` plus the delay since the start passed."""
        start = monotonic()
        while True:
            remaining = start + self.widen(bound, start, monotonic()) - monotonic()
            if remaining <= 0:
                return False
            if done(min(remaining, 1.0)):
                return True

    def communicate(
        self, process: subprocess.Popen[str], bound: float
    ) -> tuple[str, str] | None:
        """``process.communicate()`` with ``wait_for``'s patience: its output once it ended, or
        None past the patience (the process left running)."""
        output: list[tuple[str, str]] = []

        def ended(timeout: float) -> bool:
            try:
                output.append(process.communicate(timeout=timeout))
            except subprocess.TimeoutExpired:
                return False  # communicate() keeps what it read for the next call
            return True

        return output[0] if self.wait_for(ended, bound) else None

    def run(
        self, args: Sequence[str], bound: float, **popen: Any
    ) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(args, capture_output=True, text=True)`` with ``wait_for``'s patience;
        raises ``subprocess.TimeoutExpired`` (the child killed) past it."""
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
        )
        with process:
            output = self.communicate(process, bound)
            if output is None:
                kill_and_collect(process)
                raise subprocess.TimeoutExpired(list(args), bound)
        return subprocess.CompletedProcess(list(args), process.returncode, *output)

    def worst(self) -> float:
        """The latest the probe ever ran, in seconds past its due time."""
        with self._lock:
            return max((w - d for d, w in zip(self._due, self._woke, strict=True)), default=0.0)


#: How long the pipes of a killed process may stay open (its descendants being killed too).
KILLED_OUTPUT_WAIT_S = 30.0


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children before their own children."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := process_stat(int(entry.name))) is not None:
            parents.setdefault(stat[1], []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        children = parents.get(pending.pop(), [])
        found += children
        pending += children
    return found


def kill_and_collect(process: subprocess.Popen[Any]) -> tuple[Any, Any]:
    """Kill ``process`` and every process below it, and return what it wrote. Its children
    inherit its pipes (a killed uvicorn's workers, a killed demo's order processes), so killing
    it alone left ``communicate()`` waiting for ever on pipes they kept open; what still holds
    them :data:`KILLED_OUTPUT_WAIT_S` later fails the test, saying so."""
    for pid in [process.pid, *_descendants(process.pid)]:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        return process.communicate(timeout=KILLED_OUTPUT_WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"process {process.pid} ({process.args}) was killed, but its output is still "
                    f"held open {KILLED_OUTPUT_WAIT_S:g} s later by a process outside its tree")


def lapse_excuse(lease_seconds: float) -> float:
    """How long a test's process (and its database) must have been kept waiting in the lease
    before a lapse to excuse it: half the slack between a renewal's due time (a third into
    the lease) and the lease's end. A renewal that never ran lapses with far less."""
    return (lease_seconds - lease_seconds / 3) / 2


class Renewals:
    """Every lease renewal of this process while recording (:func:`renewals_recorded`): when
    each began and ended (:func:`monotonic`) and whether it succeeded, from the metrics events
    ``lease_renewed`` and ``lease_renewal_failed`` (their value is how long it took)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, bool]] = []
        self._lock = threading.Lock()

    def __call__(self, event: str, seconds: float) -> None:
        if event in ("lease_renewed", "lease_renewal_failed"):
            ended = monotonic()
            with self._lock:
                self.spans.append((ended - seconds, ended, event == "lease_renewed"))

    def started_on_time(self, at: float, renew_every: float, delay: SchedulerDelay) -> bool:
        """Whether the renewal after the last one that ended before ``at`` (a lapse) began by
        its due time (the product's schedule: ``renew_every`` after the start of a renewal
        that succeeded, a quarter of it after the end of one that failed), late by no more
        than this process was kept from running meanwhile plus a switch interval. Such a lapse
        is the database's doing (the renewal was called and waited for its answer); one whose
        renewal began late or never (the product stopped renewing) is not excused."""
        with self._lock:
            spans = sorted(self.spans)
        before = [span for span in spans if span[1] < at]
        if not before:
            return False
        begun, ended, succeeded = max(before, key=lambda span: span[1])
        due = begun + renew_every if succeeded else ended + renew_every / 4
        following = [span[0] for span in spans if span[0] >= ended]
        if not following:
            return False
        late = delay.during(due, following[0]) + sys.getswitchinterval()
        return following[0] <= due + late


@contextmanager
def renewals_recorded() -> Iterator[Renewals]:
    """:class:`Renewals` recorded for the ``with`` block (a :mod:`snowflake_db.metrics`
    listener)."""
    from snowflake_db import metrics

    renewals = Renewals()
    metrics.add_listener(renewals)
    try:
        yield renewals
    finally:
        metrics.remove_listener(renewals)


@contextmanager
def probing() -> Iterator[SchedulerDelay]:
    """A probe running for the ``with`` block: for a helper that guards one wait."""
    probe = SchedulerDelay()
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()


def wait_patiently(done: Callable[[float], bool], bound: float) -> bool:
    """:meth:`SchedulerDelay.wait_for` with a probe of its own."""
    with probing() as probe:
        return probe.wait_for(done, bound)


def communicate_patiently(
    process: subprocess.Popen[str], bound: float
) -> tuple[str, str] | None:
    """:meth:`SchedulerDelay.communicate` with a probe of its own."""
    with probing() as probe:
        return probe.communicate(process, bound)


def run_patiently(
    args: Sequence[str], bound: float, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """:meth:`SchedulerDelay.run` with a probe of its own."""
    with probing() as probe:
        return probe.run(args, bound, **popen)


@pytest.fixture
def scheduler_delay() -> Iterator[SchedulerDelay]:
    """A probe running for the whole test (see the module's docstring)."""
    with probing() as probe:
        yield probe
