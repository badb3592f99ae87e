"""The Snowflake ID generator: strictly increasing IDs, whatever the clock, threads or forks do.

How it stays fast and safe
--------------------------
Each tick gets a *window*: a ``range`` iterator over that tick's IDs plus the tick's bounds in the
raw clock's units. ``next_id()`` reads the clock and, while it stays inside the window, takes the
next value from the iterator. Taking from a ``range`` iterator is one C call, atomic under the GIL,
so every ID comes out exactly once without a lock on the hot path. Everything else (a new tick, a
drained tick, a clock behind the last tick, fork detection, lease checks) happens in the slow path
under a lock, at most once per tick. On free-threaded builds with the GIL disabled the whole call
takes the lock. The hot path also reads one byte that the kernel zeroes in a forked child
(:mod:`snowflake_db.forks`), so a child never takes IDs from its parent's window, even when the
fork skipped Python's fork hooks.

A window is installed only after every check has passed, and an exception in the slow path leaves
the generator exactly as it was: no ID is ever issued twice, even after a failed call.

The clock in ticks (raw units, tick arithmetic, the bounded wait for the next tick) is
:mod:`snowflake_db._ticks`; what the generator counts is reported by :mod:`snowflake_db.metrics`.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from itertools import islice
from operator import length_hint

from . import forks
from ._ticks import RawTicks
from ._validate import require_int
from .clock import Clock, default_clock, monotonic
from .errors import (
    ClockMovedBackwardsError,
    ForkedWorkerIdError,
    GeneratorClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LeaseExpiredError,
    TimeExhaustedError,
    WorkerLeaseError,
)
from .layout import DEFAULT_LAYOUT, Layout, require_layout
from .lease import WorkerAllocator, WorkerLease
from .metrics import MetricsRecorder, MetricsSnapshot, snapshot_of

#: How far behind its last tick the clock may fall before ``next_id`` raises: within it the
#: generator keeps issuing from the last tick and waits only if that tick is used up.
DEFAULT_ROLLBACK_TOLERANCE_MS = 2000

#: Slack added to every bounded wait for scheduling delays, before a stalled clock is reported.
DEFAULT_MAX_WAIT_MS = 1000

#: How far back ``next_ids`` may reach for ticks this generator left unused, instead of waiting
#: for future ones (a batch of 10,000 IDs needs three 1 ms ticks of 4,096).
MAX_BACKFILL_MS = 100

#: Most IDs one ``next_ids`` call returns (about 2.4 s of a 12-bit sequence at 1 ms ticks, and
#: some 400 MB of Python ints): ask again for more.
MAX_IDS_PER_CALL = 10_000_000

_GIL_DISABLED = not getattr(sys, "_is_gil_enabled", lambda: True)()


def _empty_iterator() -> Iterator[int]:
    return iter(())


class SnowflakeGenerator:
    """Issues strictly increasing Snowflake IDs for one worker ID (static or leased).

    ``SnowflakeGenerator(5)`` uses worker ID 5; ``SnowflakeGenerator(allocator=...)`` leases one
    from an allocator such as :class:`snowflake_db.worker.TableWorkerAllocator` on first use and
    again in every forked child. ``clock`` returns integer Unix milliseconds; by default a
    monotonic clock anchored to wall time.
    """

    def __init__(
        self,
        worker_id: int | None = None,
        *,
        layout: Layout | None = None,
        clock: Clock | None = None,
        allocator: WorkerAllocator | None = None,
        rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
        randomize_sequence_start: bool = False,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
    ) -> None:
        self.layout = require_layout(layout if layout is not None else DEFAULT_LAYOUT)
        if (worker_id is None) == (allocator is None):
            raise InvalidArgumentError(
                "pass exactly one of worker_id (a static worker ID) or allocator "
                f"(got worker_id={worker_id!r}, allocator={allocator!r})"
            )
        if worker_id is not None:
            self.layout.check_worker_id(worker_id)
        if allocator is not None and not callable(getattr(allocator, "acquire", None)):
            raise InvalidArgumentTypeError(
                f"allocator must have an acquire(layout=, clock=) method, got {allocator!r}"
            )
        if clock is not None and not callable(clock):
            raise InvalidArgumentTypeError(f"clock must be a zero-argument callable, got {clock!r}")
        self.rollback_tolerance_ms = require_int(
            "rollback_tolerance_ms", rollback_tolerance_ms, minimum=0
        )
        self.max_wait_ms = require_int("max_wait_ms", max_wait_ms, minimum=0)
        self.randomize_sequence_start = bool(randomize_sequence_start)

        self.clock: Clock = clock if clock is not None else default_clock()
        self._static_worker_id = worker_id
        self._allocator = allocator
        self._lease: WorkerLease | None = None
        self._pid = os.getpid()
        self._closed = False
        self._lock = threading.Lock()
        self._last_tick = -1
        self._ticks = RawTicks(self.clock, self.layout)
        self._raw_clock = self._ticks.read
        self._max_shard = self.layout.max_shard
        self._metrics = MetricsRecorder.register(self, self.layout)
        self._retire_window()
        # The instance attribute shadows the method: callers get the lock-free closure.
        self.__dict__["next_id"] = self._build_next_id()
        _live_generators.add(self)

    # -- public API --------------------------------------------------------------------------

    def next_id(self) -> int:
        """Return the next ID: larger than every ID this generator returned before."""
        return self._next_id_slow()

    def next_ids(self, n: int) -> list[int]:
        """Return ``n`` strictly increasing IDs, taking whole ticks at a time.

        ``n`` is at most :data:`MAX_IDS_PER_CALL`, checked before anything else is held.
        """
        count = require_int("n", n, minimum=0, maximum=MAX_IDS_PER_CALL, limit_note="per call")
        ids: list[int] = []
        with self._own_lock():
            while len(ids) < count:
                iterator = self._usable_window(wanted=count - len(ids))
                ids.extend(islice(iterator, count - len(ids)))
        return ids

    def next_id_in_shard(self, shard: int) -> int:
        """Return the next ID carrying ``shard`` in the layout's shard bits."""
        if isinstance(shard, bool) or not isinstance(shard, int) or not (
            0 <= shard <= self._max_shard  # per ID: a plain attribute, not the property
        ):
            self.layout.check_shard(shard)
        return self.next_id() | shard

    @property
    def worker_id(self) -> int | None:
        """The worker ID in use; ``None`` while a leased generator has no lease yet."""
        lease = self._lease
        return lease.worker_id if lease is not None else self._static_worker_id

    @property
    def last_tick(self) -> int:
        """The tick (since the layout's epoch) of the newest IDs issued; -1 before the first."""
        return self._last_tick

    def resume_after(self, tick: int) -> None:
        """Issue IDs only from ticks after ``tick`` from now on.

        For handing a worker ID over: a generator that takes over the worker ID of one that
        issued up to ``tick`` (``configure`` replacing the process generator) must start above it.
        """
        require_int("tick", tick, minimum=-1)
        with self._own_lock():
            if tick > self._last_tick:
                self._last_tick = tick
                self._retire_window()

    @property
    def lease(self) -> WorkerLease | None:
        return self._lease

    def metrics(self, *, with_slots: bool = False) -> MetricsSnapshot:
        """This generator's figures (see :mod:`snowflake_db.metrics`) with its allocator's
        lease figures; ``with_slots=True`` also counts the control database's slots."""
        return snapshot_of(self, with_slots=with_slots)

    def ensure_worker(self) -> int:
        """Acquire the lease now instead of on the first ID (to fail fast at start-up)."""
        with self._own_lock():
            self._check_usable()
            worker_id = self.worker_id
            assert worker_id is not None
            return worker_id

    def close(self) -> None:
        """Stop issuing IDs and release the lease (if any) so the slot can be reused."""
        with self._own_lock():
            if self._closed:
                return
            self._closed = True
            self._retire_window()
            self._metrics.generator_closed()
            lease, self._lease = self._lease, None
            if lease is not None and self._pid == os.getpid():
                lease.release()

    def __enter__(self) -> SnowflakeGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        source = "static" if self._allocator is None else "leased"
        return f"<SnowflakeGenerator worker_id={self.worker_id} ({source}) layout={self.layout!r}>"

    # -- windows -------------------------------------------------------------------------------

    def _retire_window(self) -> None:
        """Make the hot path fall through to the slow path (no current window)."""
        self._metrics.window_closed()
        iterator = _empty_iterator()
        self._iter = iterator
        self._window: tuple[int, int, Callable[[], int]] = (0, 0, iterator.__next__)

    def _open_window(self, tick: int) -> Iterator[int]:
        """Install the window of ``tick`` (which is above the last tick) and return its iterator."""
        layout = self.layout
        if tick > layout.max_tick:
            raise TimeExhaustedError(
                f"tick {tick} exceeds the layout's {layout.time_bits} time bits "
                f"(max tick {layout.max_tick}); they ran out at {layout.exhausted_at.isoformat()}"
            )
        worker_id = self.worker_id
        assert worker_id is not None  # _check_usable took a lease
        lease = self._lease
        if lease is not None:
            # Say how far we issue before reading the ceiling: a release ends the lease first
            # and reads this second, so it either covers this tick or we see the ended lease.
            lease.issuing_through(layout.tick_start_ms(tick + 1) - 1)
            ceiling = self._ticks.tick_of_ms(lease.high_water_ms)
            if tick > ceiling:
                self._metrics.lease_refused()
                raise WorkerLeaseError(
                    f"worker {worker_id}: the clock reached tick {tick}, past the reserved "
                    f"high-water mark {lease.high_water_ms} ms (tick {ceiling}); no ID is issued "
                    f"until the lease is renewed ({lease.describe_problem()})"
                )
        first_sequence = 0
        if self.randomize_sequence_start and layout.max_sequence > 0:
            first_sequence = random.getrandbits(layout.sequence_bits - 1)
        base = tick << layout.time_shift | worker_id << layout.worker_shift
        step = 1 << layout.sequence_shift
        end = base + layout.ids_per_tick * step
        iterator = iter(range(base + first_sequence * step, end, step))
        start = self._ticks.start_of(tick)
        self._metrics.window_opened(iterator)
        self._iter = iterator
        self._last_tick = tick
        self._window = (start, start + self._ticks.per_tick, iterator.__next__)
        return iterator

    # -- hot path ------------------------------------------------------------------------------

    def _build_next_id(self) -> Callable[[], int]:
        if _GIL_DISABLED:
            return self._next_id_slow
        generator = self
        raw_clock = self._raw_clock
        slow = self._next_id_slow
        ready = forks.ready  # 0 in a forked child until its reset ran: the window is the parent's

        def next_id() -> int:
            start, end, take = generator._window
            try:
                if start <= raw_clock() < end and ready[0]:
                    return take()
            except (StopIteration, TypeError):
                pass  # a drained window, or a clock reading that is no int: the slow path says
            return slow()

        next_id.__doc__ = SnowflakeGenerator.next_id.__doc__
        return next_id

    # -- slow path -----------------------------------------------------------------------------

    def _own_lock(self) -> threading.Lock:
        """The generator's lock, after this process's after-fork reset (a fork that skipped
        Python's hooks left the parent's lock, perhaps held by a thread that is not here)."""
        forks.reset_if_forked()
        return self._lock

    def _next_id_slow(self) -> int:
        with self._own_lock():
            while True:
                iterator = self._usable_window()
                for snowflake_id in iterator:
                    return snowflake_id
                # A lock-free caller drained the window between our checks: look again.

    def _usable_window(self, wanted: int = 1) -> Iterator[int]:
        """Under the lock: return a window iterator that may issue now, waiting if needed.

        For ``wanted`` IDs that need several ticks, the window opens on the earliest tick that
        lets them end on the current one, so a batch fills the ticks since the last one instead
        of waiting for future ticks (:meth:`_backfill_start`).
        """
        while True:
            self._check_usable()
            ticks = self._ticks
            raw = ticks.read_checked()
            lease = self._lease
            if lease is not None and monotonic() >= lease.valid_until:
                # The deadline passed after the check, before this reading (the thread lost
                # the CPU in between): its tick may begin after it. Check again: renew or fence.
                continue
            tick = ticks.tick_of(raw)
            last = self._last_tick
            if tick > last:
                if wanted > 1:
                    tick = self._backfill_start(tick, last, wanted)
                return self._open_window(tick)
            behind_ms = self.layout.tick_start_ms(last) - ticks.ms_of(raw)
            if behind_ms > self.rollback_tolerance_ms:
                self._metrics.clock_refused(behind_ms)
                raise ClockMovedBackwardsError(behind_ms, self.rollback_tolerance_ms)
            if behind_ms > 0:
                self._metrics.clock_behind(behind_ms)
            if length_hint(self._iter) > 0:
                # Same tick, or the clock is behind within tolerance: keep issuing from that tick.
                return self._iter
            # The last tick is used up: wait for the next one, then check everything again
            # (the wait may have outlived the lease).
            ticks.wait_for_tick_after(
                last,
                rollback_tolerance_ms=self.rollback_tolerance_ms,
                max_wait_ms=self.max_wait_ms,
                metrics=self._metrics,
            )

    def _backfill_start(self, tick: int, last: int, wanted: int) -> int:
        """The first tick for ``wanted`` IDs, the current one being ``tick``: never at or below
        the last tick this generator issued from (or the floor a lease set), never before the
        generator has such a tick (a new static generator does not know who used its worker ID
        before it started), and at most :data:`MAX_BACKFILL_MS` back.

        Those ticks are this worker ID's alone: above its own last IDs and above the previous
        holder's high-water mark, so IDs stay unique and strictly increasing; they only carry a
        time up to ``MAX_BACKFILL_MS`` before the call.
        """
        if last < 0:
            return tick
        layout = self.layout
        back = min((wanted - 1) // layout.ids_per_tick, MAX_BACKFILL_MS // layout.tick_ms)
        return max(last + 1, tick - back)

    def _check_usable(self) -> None:
        """Closed, forked and lease checks; acquires a lease when one is needed."""
        if self._closed:
            raise GeneratorClosedError(f"{self!r} was closed and issues no more IDs")
        if os.getpid() != self._pid:
            self._adopt_after_fork()
        if self._allocator is None:
            return
        lease = self._lease
        if lease is not None:
            renew_if_due = getattr(lease, "renew_if_due", None)
            if renew_if_due is not None:
                renew_if_due()  # a late heartbeat is made up here, before any fencing
            if lease.lost:
                self._drop_lease(release=False)
                lease = None
        if lease is None:
            self._take_lease(self._allocator.acquire(layout=self.layout, clock=self.clock))
            return
        if monotonic() >= lease.valid_until:
            self._metrics.lease_refused()
            raise LeaseExpiredError(
                f"worker {self.worker_id}: the lease passed its local deadline without renewal, "
                f"so no ID is issued until it is renewed or replaced ({lease.describe_problem()})"
            )

    def _adopt_after_fork(self) -> None:
        if self._allocator is None:
            raise ForkedWorkerIdError(
                f"this process (pid {os.getpid()}) was forked from pid {self._pid}, which created "
                f"the generator with static worker ID {self._static_worker_id}; every child would "
                "issue the same IDs. Use configure(allocator=TableWorkerAllocator(...)) so each "
                "process leases its own worker ID, or create the generator (or call configure) "
                "in each child after the fork with a distinct worker ID."
            )
        self._drop_lease(release=False, abandon=True)
        self._pid = os.getpid()

    def _take_lease(self, lease: WorkerLease) -> None:
        self.layout.check_worker_id(lease.worker_id)
        lease.issuing_through(0)  # nothing yet: a release need not keep the whole reserve
        self._lease = lease
        self._retire_window()
        if lease.floor_ms is not None:
            # IDs must come from ticks above the previous holder's high-water mark.
            self._last_tick = max(self._last_tick, self._ticks.tick_of_ms(lease.floor_ms))

    def _drop_lease(self, *, release: bool, abandon: bool = False) -> None:
        lease, self._lease = self._lease, None
        self._retire_window()
        if lease is None:
            return
        if abandon:
            lease.abandon()
        elif release:
            lease.release()


_live_generators: weakref.WeakSet[SnowflakeGenerator] = weakref.WeakSet()


def _after_fork_in_child(parent_pid: int) -> None:
    """Give every inherited generator a fresh lock and send its next call to the slow path,
    where it drops what it inherited (:meth:`SnowflakeGenerator._adopt_after_fork`)."""
    for generator in list(_live_generators):
        generator._lock = threading.Lock()
        generator._retire_window()


forks.on_fork(_after_fork_in_child)
