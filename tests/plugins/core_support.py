"""Helpers shared by tests/core, tests/worker and tests/metrics: Hypothesis
strategies, a fake allocator that speaks the lease protocol, and running code in a fork."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from snowflake_db import DEFAULT_EPOCH_MS, Layout
from snowflake_db.testing import DEFAULT_FAKE_START_MS, FakeClock

# -- layouts -----------------------------------------------------------------------------------

NOW_MS = time.time_ns() // 1_000_000
#: 9999-12-31T23:59:59.999Z, the last millisecond a ``datetime`` can hold.
DATETIME_MAX_MS = 253_402_300_799_999


def boundary_ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in ``[low, high]`` that hit both ends often: off-by-one bugs hide there."""
    return st.one_of(st.sampled_from([low, high]), st.integers(low, high))


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Valid layouts whose last tick still fits a ``datetime`` (wider ones: see test_layout.py)."""
    worker_bits = draw(boundary_ints(0, 20))
    sequence_bits = draw(boundary_ints(0, 20))
    shard_bits = draw(boundary_ints(0, 8))
    datacenter_bits = draw(boundary_ints(0, worker_bits))
    tick_ms = draw(st.one_of(st.sampled_from([1, 2, 10, 1000]), st.integers(1, 10_000)))
    epoch_ms = draw(boundary_ints(0, NOW_MS - 1) | st.just(DEFAULT_EPOCH_MS))
    room = 63 - worker_bits - sequence_bits - shard_bits
    while epoch_ms + (tick_ms << room) - 1 > DATETIME_MAX_MS:
        room -= 1
    time_bits = draw(boundary_ints(1, room))
    return Layout(
        time_bits=time_bits,
        worker_bits=worker_bits,
        sequence_bits=sequence_bits,
        shard_bits=shard_bits,
        datacenter_bits=datacenter_bits,
        epoch_ms=epoch_ms,
        tick_ms=tick_ms,
    )


# -- leases: the allocator contract, without a database -----------------------------------------


@dataclass
class FakeLease:
    """A lease as an allocator would hand out; the test moves its fields to simulate renewals."""

    worker_id: int
    floor_ms: int | None
    high_water_ms: int
    valid_until: float
    lost: bool = False
    released: bool = False
    abandoned: bool = False
    issued_through_ms: list[int] = field(default_factory=list)

    def describe_problem(self) -> str:
        return f"fake lease of worker {self.worker_id}"

    def issuing_through(self, timestamp_ms: int) -> None:
        self.issued_through_ms.append(timestamp_ms)

    def release(self) -> None:
        self.released = True

    def abandon(self) -> None:
        self.abandoned = True


class CountedClock(FakeClock):
    """A :class:`FakeClock` that counts its reads, so that a test can act once the generator
    has looked at it."""

    def __init__(self, start_ms: int = DEFAULT_FAKE_START_MS) -> None:
        super().__init__(start_ms)
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return super().__call__()


def after_next_read(
    clock: CountedClock, delay_s: float, action: Callable[[], None]
) -> threading.Thread:
    """Run ``action`` from another thread ``delay_s`` after ``clock``'s next read (the call
    under test has looked and is waiting): a timer started before that call could fire first on
    a loaded machine, and the call would then never wait at all. Join the thread after it."""
    looked = clock.reads

    def act() -> None:
        deadline = time.monotonic() + 60
        while clock.reads == looked and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=act, name="after-next-read")
    thread.start()
    return thread


@dataclass
class FakeAllocator:
    """Hands out ``worker_ids`` in turn, each with the configured floor and high-water mark
    (by default an hour past the clock's reading at acquisition)."""

    worker_ids: list[int]
    floor_ms: int | None = None
    high_water_ms: int | None = None
    valid_for_s: float = 3600.0
    leases: list[FakeLease] = field(default_factory=list)

    def acquire(self, *, layout: Layout, clock: Callable[[], int]) -> FakeLease:
        assert isinstance(layout, Layout)
        assert callable(clock)
        lease = FakeLease(
            worker_id=self.worker_ids[len(self.leases)],
            floor_ms=self.floor_ms,
            high_water_ms=(
                self.high_water_ms if self.high_water_ms is not None else clock() + 3_600_000
            ),
            valid_until=time.monotonic() + self.valid_for_s,
        )
        self.leases.append(lease)
        return lease


# -- forks -------------------------------------------------------------------------------------


def error_report(error: BaseException) -> dict[str, str]:
    """Exceptions do not always pickle; their class name and message always do."""
    return {"error": type(error).__name__, "message": str(error)}


FORK_TIMEOUT_S = 60


def run_in_fork(child: Callable[[], Any], fork: Callable[[], int] = os.fork) -> Any:
    """Run ``child`` in a forked child; return its result or a report of its exception.

    A fork without Python's hooks (``fork`` other than ``os.fork``) first waits until this
    process's other threads (pytest-xdist's) have gone quiet: one waiting for the GIL at the fork
    leaves the child a GIL that can hang it before the library's repair runs (see
    tests/worker/test_fork_busy_heartbeat.py, which forks beside a busy thread on purpose)."""
    if fork is not os.fork:
        # A quiet period, not a wait for the test's own actors: no event says when another
        # thread (pytest-xdist's) is about to want the GIL, so there is nothing to wait on.
        time.sleep(0.2)
    read_fd, write_fd = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - runs in the child, which never returns to pytest
        exit_code = 1
        try:
            # ``child`` first: in a child forked without Python's hooks, any I/O before the
            # library's repair (its first call) could wait for ever on the GIL.
            try:
                result: Any = {"result": child()}
            except BaseException as error:
                result = error_report(error)
            os.close(read_fd)
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(pickle.dumps(result))
            exit_code = 0
        finally:
            os._exit(exit_code)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + FORK_TIMEOUT_S
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:  # never let a stuck child hang the suite
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([pipe], [], [], remaining)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked child gave no answer within {FORK_TIMEOUT_S} s")
            chunk = pipe.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child crashed"
    return pickle.loads(b"".join(chunks))


def wait_forked(pid: int, bound_s: float = FORK_TIMEOUT_S) -> int:
    """Wait for forked child ``pid`` and return its exit code; one still running after
    ``bound_s`` (deadlocked on something it inherited) fails the test instead of hanging the
    run: SIGABRT first, so that faulthandler (pytest enables it; the child inherits it) prints
    the child's stacks, then SIGKILL."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGABRT)
    time.sleep(2)  # the stacks are written
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} still ran after {bound_s:g} s (its stacks are above)")


def process_stat(pid: int) -> tuple[str, int] | None:
    """Process ``pid``'s state letter and parent PID (from /proc, after the parenthesised name,
    which may hold spaces and parentheses), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[1])


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP has taken effect, not only been sent)."""
    stat = process_stat(pid)
    return stat is not None and stat[0] == "T"


def has_ended(pid: int) -> bool:
    """Whether process ``pid`` is gone, or a zombie nobody has reaped yet."""
    stat = process_stat(pid)
    return stat is None or stat[0] == "Z"
