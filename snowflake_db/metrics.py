"""Counters and gauges for monitoring: IDs issued, clock trouble, fencing, leases, slots.

Readable at any time with :func:`snapshot` (the whole process) or
``SnowflakeGenerator.metrics()`` (one generator and its allocator), both returning a frozen
:class:`MetricsSnapshot`; :func:`add_listener` also reports each event as it happens.

Nothing is recorded per ID, so ``next_id()`` costs the same with metrics as without: each tick's
IDs come from one ``range`` iterator (a *window*), and the IDs taken from a window are its length
minus what is left in it (``operator.length_hint``), read when the window is replaced and, for
the open window, when a snapshot is taken. A replaced window is read again for
:data:`STRAGGLER_SECONDS` more, so an ID that a thread took from it just after the replacement
still counts. Every other figure is recorded on the generator's slow path (at most once per
tick), by the allocator's heartbeat, or read from the control database on demand
(``with_slots=True``), never on the hot path.

Figures are per process. A forked child starts from zero: it inherits no counts from its
parent (whose own counts are unaffected), so every process reports only what it did itself.
Counters are never lowered while their process lives: a generator or allocator that is
garbage-collected leaves its totals to the process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import length_hint
from typing import TYPE_CHECKING, Any, Protocol

from . import forks
from .errors import InvalidArgumentError, InvalidArgumentTypeError, SnowflakeError

if TYPE_CHECKING:
    from .layout import Layout

__all__ = [
    "EVENTS",
    "FIGURES",
    "STRAGGLER_SECONDS",
    "Figure",
    "Listener",
    "MetricsRecorder",
    "MetricsSnapshot",
    "SlotCounts",
    "SlotRowLike",
    "add_listener",
    "days_left",
    "remove_listener",
    "snapshot",
]

logger = logging.getLogger("snowflake_db.metrics")

#: How long a replaced window is still read for IDs taken from it by threads that had already
#: picked it up (a thread can be switched out between reading the window and taking from it).
STRAGGLER_SECONDS = 1.0

_MS_PER_DAY = 86_400_000

#: Events reported to listeners, with the meaning of their value.
EVENTS = {
    "clock_wait": "seconds a call waited for the next tick (its sequences were used up)",
    "clock_rollback_tolerated": "ms the clock fell behind the last tick, within the tolerance",
    "clock_rollback_refused": "ms behind: a call raised ClockMovedBackwardsError",
    "lease_refused": "0: a call raised LeaseExpiredError or WorkerLeaseError (fenced)",
    "fence_ended": "seconds from the first refused call to the next ID issued",
    "lease_acquired": "seconds the acquisition took",
    "lease_acquisition_failed": "seconds the failed acquisition took",
    "lease_renewed": "seconds the renewal took",
    "lease_renewal_failed": "seconds the failed renewal took",
    "lease_lost": "0: a renewal found the slot taken or reaped",
}

#: ``listener(event, value)``: called on the thread that saw the event (a generator's slow path,
#: holding its lock, or the heartbeat thread). Keep it short and never issue IDs from it.
Listener = Callable[[str, float], None]

_listeners: tuple[Listener, ...] = ()
_listeners_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    """Call ``listener(event, value)`` for every event of :data:`EVENTS` from now on.

    A listener that raises is logged and skipped; it never affects the ID it was called for.
    """
    global _listeners  # noqa: PLW0603 - copy-on-write tuple: notifying reads it without a lock
    if not callable(listener):
        raise InvalidArgumentTypeError(f"listener must be callable, got {listener!r}")
    with _listeners_lock:
        if listener in _listeners:
            raise InvalidArgumentError(f"listener {listener!r} was already added")
        _listeners = (*_listeners, listener)


def remove_listener(listener: Listener) -> None:
    """Stop calling a listener given to :func:`add_listener`."""
    global _listeners  # noqa: PLW0603 - see add_listener
    with _listeners_lock:
        if listener not in _listeners:
            raise InvalidArgumentError(f"listener {listener!r} was not added")
        _listeners = tuple(known for known in _listeners if known != listener)


def _notify(event: str, value: float) -> None:
    for listener in _listeners:
        try:
            listener(event, value)
        except Exception:
            logger.exception("snowflake_db: metrics listener %r failed on %s", listener, event)


class SlotRowLike(Protocol):
    """What :meth:`SlotCounts.of` reads of a slot row (``snowflake_db.worker.SlotRow``)."""

    @property
    def worker_id(self) -> int: ...

    @property
    def state(self) -> str: ...

    @property
    def high_water_ms(self) -> int: ...

    @property
    def renewed_at_ms(self) -> int | None: ...

    @property
    def db_now_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SlotCounts:
    """The layout's worker IDs by state, judged by the database clock: the one count that
    ``snowflake-db doctor``, ``manage.py snowflake doctor``, the Django admin and the metrics
    exporters show.

    The states ``live``, ``reserved``, ``expired``, ``free`` (released or reaped) and
    ``never_used`` add up to ``size``. ``parked``: free or expired, but with a high-water mark
    further ahead of the database clock than a new holder waits (``max_floor_wait_ms``), so not
    usable yet. ``available``: what a new process could lease now.
    """

    size: int
    live: int
    reserved: int
    expired: int
    free: int
    never_used: int
    parked: int
    #: Seconds since the live lease renewed longest ago (None without live leases): a value
    #: near the lease length means a holder's heartbeat is late.
    stalest_renewal_seconds: float | None = None

    @property
    def available(self) -> int:
        return self.free + self.expired + self.never_used - self.parked

    @classmethod
    def of(
        cls, rows: Sequence[SlotRowLike], layout: Layout, max_floor_wait_ms: int
    ) -> SlotCounts:
        """Count the slot rows (all read at one database time) of ``layout``'s worker IDs."""
        size = layout.max_worker_id + 1
        mine = [row for row in rows if row.worker_id < size]
        states = {state: 0 for state in ("live", "reserved", "expired", "free")}
        parked = 0
        stalest: float | None = None
        for row in mine:
            state = row.state
            states[state] += 1
            claimable = state in ("free", "expired")
            if claimable and row.high_water_ms - row.db_now_ms > max_floor_wait_ms:
                parked += 1
            if state == "live" and row.renewed_at_ms is not None:
                age = max(0.0, (row.db_now_ms - row.renewed_at_ms) / 1000)
                stalest = age if stalest is None else max(stalest, age)
        return cls(
            size=size,
            never_used=size - len(mine),
            parked=parked,
            stalest_renewal_seconds=stalest,
            **states,
        )

    def describe(self) -> str:
        return (
            f"{self.size} in all: {self.live} live, {self.reserved} reserved, {self.expired} "
            f"expired, {self.free} free, {self.never_used} never used; {self.available} "
            f"available now, {self.parked} parked (mark ahead)"
        )


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Every figure at one moment; counters only grow while the process lives."""

    pid: int
    #: IDs handed out (``next_id``, ``next_ids``, ``snowflake_default``).
    ids_issued: int = 0
    #: Calls that waited for the next tick because theirs was used up, and the time waited.
    clock_waits: int = 0
    clock_wait_seconds: float = 0.0
    #: Times the clock fell behind the last tick within the tolerance (IDs went on from it).
    clock_rollbacks_tolerated: int = 0
    #: Calls refused with ClockMovedBackwardsError.
    clock_rollback_refusals: int = 0
    #: The largest rollback seen, tolerated or refused, in ms.
    clock_rollback_max_ms: int = 0
    #: Calls refused for want of a usable lease (LeaseExpiredError, WorkerLeaseError).
    lease_refusals: int = 0
    #: Seconds from each first refused call to the next ID issued (ongoing ones up to now).
    fenced_seconds: float = 0.0
    #: Generators refusing IDs right now (their last call was refused, none issued since).
    fenced_generators: int = 0
    lease_acquisitions: int = 0
    lease_acquisition_failures: int = 0
    lease_renewals: int = 0
    lease_renewal_failures: int = 0
    #: Total and largest time of successful renewals (a latency: total / renewals).
    lease_renewal_seconds: float = 0.0
    lease_renewal_max_seconds: float = 0.0
    #: Leases a renewal found taken by another holder or reaped.
    leases_lost: int = 0
    #: Days until the time bits of the generators' layout run out (the soonest of them);
    #: None without a generator.
    time_left_days: float | None = None
    #: The control database's slots (``with_slots=True``), or None.
    slots: SlotCounts | None = None
    #: Why ``slots`` is None although it was asked for (the control database failed).
    slots_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON; ``slots`` gains its ``available`` count."""
        values = dataclasses.asdict(self)
        if self.slots is not None:
            values["slots"]["available"] = self.slots.available
        return values


@dataclass(frozen=True, slots=True)
class Figure:
    """How exporters and reports present one :class:`MetricsSnapshot` field."""

    field: str
    #: Counters only grow while the process lives; gauges go up and down.
    counter: bool
    #: "" (a count), "seconds", "ms" or "days".
    unit: str
    description: str


#: Every figure of a snapshot except ``slots`` (which has a label per state), in display order:
#: the one list the Prometheus and OpenTelemetry exporters and the text reports share.
FIGURES = (
    Figure("ids_issued", True, "", "IDs issued (next_id, next_ids, snowflake_default)"),
    Figure("clock_waits", True, "", "calls that waited for the next tick (sequences used up)"),
    Figure("clock_wait_seconds", True, "seconds", "time spent waiting for the next tick"),
    Figure("clock_rollbacks_tolerated", True, "",
           "times the clock fell behind the last tick within the tolerance"),
    Figure("clock_rollback_refusals", True, "", "calls refused with ClockMovedBackwardsError"),
    Figure("clock_rollback_max_ms", False, "ms", "largest clock rollback seen"),
    Figure("lease_refusals", True, "",
           "calls refused for want of a usable lease (LeaseExpiredError, WorkerLeaseError)"),
    Figure("fenced_seconds", True, "seconds", "time fenced: from a refused call to the next ID"),
    Figure("fenced_generators", False, "", "generators refusing IDs right now (fenced)"),
    Figure("lease_acquisitions", True, "", "worker leases acquired"),
    Figure("lease_acquisition_failures", True, "", "worker lease acquisitions that failed"),
    Figure("lease_renewals", True, "", "lease renewals the control database accepted"),
    Figure("lease_renewal_failures", True, "", "lease renewals that failed (database errors)"),
    Figure("lease_renewal_seconds", True, "seconds", "total time of accepted lease renewals"),
    Figure("lease_renewal_max_seconds", False, "seconds", "longest accepted lease renewal"),
    Figure("leases_lost", True, "", "leases a renewal found taken by another holder or reaped"),
    Figure("time_left_days", False, "days", "days until the layout's time bits run out"),
)


@dataclass(slots=True)
class _Totals:
    """The additive counters of one recorder (``add`` sums them)."""

    ids_issued: int = 0
    clock_waits: int = 0
    clock_wait_seconds: float = 0.0
    clock_rollbacks_tolerated: int = 0
    clock_rollback_refusals: int = 0
    clock_rollback_max_ms: int = 0
    lease_refusals: int = 0
    fenced_seconds: float = 0.0
    fenced_generators: int = 0
    lease_acquisitions: int = 0
    lease_acquisition_failures: int = 0
    lease_renewals: int = 0
    lease_renewal_failures: int = 0
    lease_renewal_seconds: float = 0.0
    lease_renewal_max_seconds: float = 0.0
    leases_lost: int = 0

    def add(self, other: _Totals) -> None:
        """Sum the counters; the largest of the two for a maximum."""
        for field in dataclasses.fields(self):
            name = field.name
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, max(mine, theirs) if name in _MAXIMA else mine + theirs)


_MAXIMA = frozenset({"clock_rollback_max_ms", "lease_renewal_max_seconds"})


class MetricsRecorder:
    """The counters of one generator or allocator, which calls one method per event.

    Methods take a small lock of their own; a generator calls them on its slow path only. In a
    forked child the recorder starts again from zero (:mod:`snowflake_db.forks` runs the reset,
    from the fork hook or before the first slow path of a child forked without the hooks).
    """

    def __init__(self, layout: Layout | None = None) -> None:
        self.layout = layout
        self._restart()

    def _restart(self) -> None:
        self._lock = threading.Lock()
        self._totals = _Totals()
        self._window: Iterator[int] | None = None
        self._window_size = 0
        # (monotonic seconds when replaced, window, its size), oldest first
        self._replaced: deque[tuple[float, Iterator[int], int]] = deque()
        self._fenced_since: float | None = None
        self._behind = False

    @classmethod
    def register(cls, owner: object, layout: Layout | None = None) -> MetricsRecorder:
        """A recorder counted in the process's :func:`snapshot` for as long as the process
        lives: when ``owner`` is garbage-collected its totals stay in the process's."""
        recorder = cls(layout)
        _registry.settle()
        with _registry.lock:
            _registry.live.add(recorder)
        weakref.finalize(owner, _registry.retire, recorder).atexit = False
        return recorder

    # -- generator events (slow path) --------------------------------------------------------

    def window_opened(self, window: Iterator[int]) -> None:
        """A new tick's window, ``length_hint(window)`` IDs, replaces the current one.

        A forked child never counts its parent's window: the reset forgets the recorder's
        window, and the generator retires its own copy without naming it.
        """
        now = time.monotonic()
        ended: float | None = None
        with self._lock:
            self._replace_window(now)
            self._window, self._window_size = window, length_hint(window)
            self._behind = False
            if self._fenced_since is not None:
                ended = now - self._fenced_since
                self._totals.fenced_seconds += ended
                self._fenced_since = None
        if ended is not None:
            _notify("fence_ended", ended)

    def window_closed(self) -> None:
        """The current window is retired with no replacement (lease change, fork, close)."""
        with self._lock:
            self._replace_window(time.monotonic())

    def _replace_window(self, now: float) -> None:
        if self._window is not None:
            self._replaced.append((now, self._window, self._window_size))
            self._window = None
        replaced = self._replaced
        while replaced and replaced[0][0] < now - STRAGGLER_SECONDS:
            _, window, size = replaced.popleft()
            self._totals.ids_issued += size - length_hint(window)

    def clock_waited(self, seconds: float) -> None:
        with self._lock:
            self._totals.clock_waits += 1
            self._totals.clock_wait_seconds += seconds
        _notify("clock_wait", seconds)

    def clock_behind(self, behind_ms: int) -> None:
        """The clock reads behind the last tick, within the tolerance (counted once per episode:
        until the clock reaches a new tick)."""
        with self._lock:
            totals = self._totals
            totals.clock_rollback_max_ms = max(totals.clock_rollback_max_ms, behind_ms)
            if self._behind:
                return
            self._behind = True
            totals.clock_rollbacks_tolerated += 1
        _notify("clock_rollback_tolerated", behind_ms)

    def clock_refused(self, behind_ms: int) -> None:
        with self._lock:
            totals = self._totals
            totals.clock_rollback_refusals += 1
            totals.clock_rollback_max_ms = max(totals.clock_rollback_max_ms, behind_ms)
        _notify("clock_rollback_refused", behind_ms)

    def lease_refused(self) -> None:
        """A call was refused for want of a usable lease: a fence starts (if none is ongoing)."""
        with self._lock:
            self._totals.lease_refusals += 1
            if self._fenced_since is None:
                self._fenced_since = time.monotonic()
        _notify("lease_refused", 0)

    def generator_closed(self) -> None:
        """A closed generator is no longer fenced (its ongoing fence ends now)."""
        with self._lock:
            if self._fenced_since is not None:
                self._totals.fenced_seconds += time.monotonic() - self._fenced_since
                self._fenced_since = None

    # -- allocator events ----------------------------------------------------------------------

    def lease_acquired(self, seconds: float) -> None:
        with self._lock:
            self._totals.lease_acquisitions += 1
        _notify("lease_acquired", seconds)

    def acquisition_failed(self, seconds: float) -> None:
        with self._lock:
            self._totals.lease_acquisition_failures += 1
        _notify("lease_acquisition_failed", seconds)

    def renewal_answered(self, seconds: float, *, renewed: bool) -> None:
        """The database answered a renewal in ``seconds``: renewed, or (``renewed=False``) the
        slot is no longer this holder's (counted by :meth:`lease_lost` if it was held)."""
        if not renewed:
            return
        with self._lock:
            totals = self._totals
            totals.lease_renewals += 1
            totals.lease_renewal_seconds += seconds
            totals.lease_renewal_max_seconds = max(totals.lease_renewal_max_seconds, seconds)
        _notify("lease_renewed", seconds)

    def lease_lost(self) -> None:
        with self._lock:
            self._totals.leases_lost += 1
        _notify("lease_lost", 0)

    def renewal_failed(self, seconds: float) -> None:
        with self._lock:
            self._totals.lease_renewal_failures += 1
        _notify("lease_renewal_failed", seconds)

    # -- reading -------------------------------------------------------------------------------

    def totals(self) -> _Totals:
        """A copy of the counters, with the IDs taken so far from the windows still read."""
        now = time.monotonic()
        with self._lock:
            totals = dataclasses.replace(self._totals)
            for _, window, size in self._replaced:
                totals.ids_issued += size - length_hint(window)
            if self._window is not None:
                totals.ids_issued += self._window_size - length_hint(self._window)
            if self._fenced_since is not None:
                totals.fenced_seconds += now - self._fenced_since
                totals.fenced_generators = 1
        return totals


class _Registry:
    """Every live recorder of the process, and the totals of those whose owners are gone."""

    def __init__(self) -> None:
        self._restart()

    def _restart(self) -> None:
        self.lock = threading.Lock()
        self.live: set[MetricsRecorder] = set()
        self.retired = _Totals()
        # Recorders whose owners were collected, moved to `retired` by the next reader.
        self.gone: deque[MetricsRecorder] = deque()

    def retire(self, recorder: MetricsRecorder) -> None:
        """The owner's finalizer: it only queues the recorder. A garbage collection can run a
        finalizer in any thread at any allocation, also while that thread holds ``lock`` (or
        the recorder's own lock), so taking a lock here could wait for ever on itself."""
        self.gone.append(recorder)  # deque.append is atomic

    def settle(self) -> None:
        """Move the recorders of collected owners into ``retired``; never called holding a lock."""
        while self.gone:
            try:
                recorder = self.gone.popleft()
            except IndexError:
                return  # another thread settled it
            totals = recorder.totals()
            totals.fenced_generators = 0  # its owner is gone
            with self.lock:
                if recorder in self.live:
                    self.live.discard(recorder)
                    self.retired.add(totals)

    def after_fork_in_child(self, parent_pid: int) -> None:
        """The child counts from zero; its live recorders (the parent's objects) stay listed."""
        live, gone = self.live, self.gone
        self._restart()
        self.live, self.gone = live, gone
        for recorder in live:
            recorder._restart()


_registry = _Registry()
forks.on_fork(_registry.after_fork_in_child)


def snapshot(*, with_slots: bool = False) -> MetricsSnapshot:
    """The figures of this whole process: every generator and allocator it has used.

    ``with_slots=True`` also counts the worker slots on the control database of the
    process-wide generator (``snowflake_db.configure``), one query, if it leases from one.
    """
    forks.reset_if_forked()
    _registry.settle()
    with _registry.lock:
        recorders = list(_registry.live)
        totals = dataclasses.replace(_registry.retired)
    layouts = []
    for recorder in recorders:
        totals.add(recorder.totals())
        if recorder.layout is not None:
            layouts.append(recorder.layout)
    slots_from = None
    if with_slots:
        from .process import current_generator

        generator = current_generator()
        slots_from = generator if generator is not None else False
    return _build(totals, layouts, slots_from)


def snapshot_of(generator: Any, *, with_slots: bool = False) -> MetricsSnapshot:
    """One generator's figures, with its allocator's lease figures (shared by the generators
    using that allocator). Used by ``SnowflakeGenerator.metrics()``."""
    forks.reset_if_forked()
    totals = generator._metrics.totals()
    allocator_recorder = getattr(generator._allocator, "metrics_recorder", None)
    if isinstance(allocator_recorder, MetricsRecorder):
        totals.add(allocator_recorder.totals())
    return _build(totals, [generator.layout], generator if with_slots else None)


def _build(totals: _Totals, layouts: list[Layout], slots_from: Any) -> MetricsSnapshot:
    """``slots_from``: None (not asked), False (asked, no generator) or a generator."""
    slots: SlotCounts | None = None
    slots_error: str | None = None
    if slots_from is False:
        slots_error = "no process-wide generator is configured"
    elif slots_from is not None:
        slots, slots_error = _slot_counts(slots_from)
    time_left_days = None
    if layouts:
        time_left_days = min(days_left(layout) for layout in layouts)
    return MetricsSnapshot(
        pid=os.getpid(),
        **dataclasses.asdict(totals),
        time_left_days=time_left_days,
        slots=slots,
        slots_error=slots_error,
    )


def days_left(layout: Layout, now_ms: int | None = None) -> float:
    """Days from ``now_ms`` (default: the wall clock) until the layout's time bits run out."""
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    return (layout.max_timestamp_ms + 1 - now_ms) / _MS_PER_DAY


def _slot_counts(generator: Any) -> tuple[SlotCounts | None, str | None]:
    count = getattr(generator._allocator, "slot_counts", None)
    if count is None:
        return None, f"{generator!r} has no allocator that counts slots"
    try:
        counts = count(layout=generator.layout)
    except SnowflakeError as error:
        return None, str(error)
    if not isinstance(counts, SlotCounts):
        raise InvalidArgumentTypeError(f"slot_counts() returned {counts!r}, not SlotCounts")
    return counts, None
