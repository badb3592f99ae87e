"""Counting for :mod:`snowflake_db.metrics`: one recorder per generator or allocator, and the
process's registry of them.

Nothing is recorded per ID: each tick's IDs come from one ``range`` iterator (a *window*), and
the IDs taken from a window are its length minus what is left in it (``operator.length_hint``),
read when the window is replaced and, for the open window, when totals are read. A replaced
window is read again for :data:`STRAGGLER_SECONDS` more. Every other event arrives on a slow
path (at most once per tick) or from the heartbeat.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterator
from operator import length_hint
from typing import TYPE_CHECKING

from .. import forks
from ..clock import monotonic
from ._events import notify
from ._figures import Totals

if TYPE_CHECKING:
    from ..layout import Layout

__all__ = ["STRAGGLER_SECONDS", "MetricsRecorder", "registry"]

#: How long a replaced window is still read for IDs taken from it by threads that had already
#: picked it up (a thread can be switched out between reading the window and taking from it).
STRAGGLER_SECONDS = 1.0


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
        self._totals = Totals.zero()
        self._window: Iterator[int] | None = None
        self._window_size = 0
        # (monotonic seconds when replaced, window, its size), oldest first
        self._replaced: deque[tuple[float, Iterator[int], int]] = deque()
        self._fenced_since: float | None = None
        self._behind = False

    @classmethod
    def register(cls, owner: object, layout: Layout | None = None) -> MetricsRecorder:
        """A recorder counted in the process's ``snapshot()`` for as long as the process
        lives: when ``owner`` is garbage-collected its totals stay in the process's."""
        recorder = cls(layout)
        registry.settle()
        with registry.lock:
            registry.live.add(recorder)
        weakref.finalize(owner, registry.retire, recorder).atexit = False
        return recorder

    # -- generator events (slow path) --------------------------------------------------------

    def window_opened(self, window: Iterator[int]) -> None:
        """A new tick's window, ``length_hint(window)`` IDs, replaces the current one.

        A forked child never counts its parent's window: the reset forgets the recorder's
        window, and the generator retires its own copy without naming it.
        """
        now = monotonic()
        ended: float | None = None
        with self._lock:
            self._replace_window(now)
            self._window, self._window_size = window, length_hint(window)
            self._behind = False
            if self._fenced_since is not None:
                ended = now - self._fenced_since
                self._totals["fenced_seconds"] += ended
                self._fenced_since = None
        if ended is not None:
            notify("fence_ended", ended)

    def window_closed(self) -> None:
        """The current window is retired with no replacement (lease change, fork, close)."""
        with self._lock:
            self._replace_window(monotonic())

    def _replace_window(self, now: float) -> None:
        if self._window is not None:
            self._replaced.append((now, self._window, self._window_size))
            self._window = None
        replaced = self._replaced
        while replaced and replaced[0][0] < now - STRAGGLER_SECONDS:
            _, window, size = replaced.popleft()
            self._totals["ids_issued"] += size - length_hint(window)

    def clock_waited(self, seconds: float) -> None:
        with self._lock:
            self._totals["clock_waits"] += 1
            self._totals["clock_wait_seconds"] += seconds
        notify("clock_wait", seconds)

    def clock_behind(self, behind_ms: int) -> None:
        """The clock reads behind the last tick, within the tolerance (counted once per episode:
        until the clock reaches a new tick)."""
        with self._lock:
            totals = self._totals
            totals["clock_rollback_max_ms"] = max(totals["clock_rollback_max_ms"], behind_ms)
            if self._behind:
                return
            self._behind = True
            totals["clock_rollbacks_tolerated"] += 1
        notify("clock_rollback_tolerated", behind_ms)

    def clock_refused(self, behind_ms: int) -> None:
        with self._lock:
            totals = self._totals
            totals["clock_rollback_refusals"] += 1
            totals["clock_rollback_max_ms"] = max(totals["clock_rollback_max_ms"], behind_ms)
        notify("clock_rollback_refused", behind_ms)

    def lease_refused(self) -> None:
        """A call was refused for want of a usable lease: a fence starts (if none is ongoing)."""
        with self._lock:
            self._totals["lease_refusals"] += 1
            if self._fenced_since is None:
                self._fenced_since = monotonic()
        notify("lease_refused", 0)

    def generator_closed(self) -> None:
        """A closed generator is no longer fenced (its ongoing fence ends now)."""
        with self._lock:
            if self._fenced_since is not None:
                self._totals["fenced_seconds"] += monotonic() - self._fenced_since
                self._fenced_since = None

    # -- allocator events ----------------------------------------------------------------------

    def lease_acquired(self, seconds: float) -> None:
        with self._lock:
            self._totals["lease_acquisitions"] += 1
        notify("lease_acquired", seconds)

    def acquisition_failed(self, seconds: float) -> None:
        with self._lock:
            self._totals["lease_acquisition_failures"] += 1
        notify("lease_acquisition_failed", seconds)

    def renewal_answered(self, seconds: float, *, renewed: bool) -> None:
        """The database answered a renewal in ``seconds``: renewed, or (``renewed=False``) the
        slot is no longer this holder's (counted by :meth:`lease_lost` if it was held)."""
        if not renewed:
            return
        with self._lock:
            totals = self._totals
            totals["lease_renewals"] += 1
            totals["lease_renewal_seconds"] += seconds
            totals["lease_renewal_max_seconds"] = max(totals["lease_renewal_max_seconds"], seconds)
        notify("lease_renewed", seconds)

    def lease_lost(self) -> None:
        with self._lock:
            self._totals["leases_lost"] += 1
        notify("lease_lost", 0)

    def renewal_failed(self, seconds: float) -> None:
        with self._lock:
            self._totals["lease_renewal_failures"] += 1
        notify("lease_renewal_failed", seconds)

    # -- reading -------------------------------------------------------------------------------

    def totals(self) -> Totals:
        """A copy of the counters, with the IDs taken so far from the windows still read."""
        now = monotonic()
        with self._lock:
            totals = self._totals.copy()
            for _, window, size in self._replaced:
                totals["ids_issued"] += size - length_hint(window)
            if self._window is not None:
                totals["ids_issued"] += self._window_size - length_hint(self._window)
            if self._fenced_since is not None:
                totals["fenced_seconds"] += now - self._fenced_since
                totals["fenced_generators"] = 1
        return totals


class _Registry:
    """Every live recorder of the process, and the totals of those whose owners are gone."""

    def __init__(self) -> None:
        self._restart()

    def _restart(self) -> None:
        self.lock = threading.Lock()
        self.live: set[MetricsRecorder] = set()
        self.retired = Totals.zero()
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
            totals["fenced_generators"] = 0  # its owner is gone
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


#: The process's recorders (``snowflake_db.metrics.snapshot`` reads it).
registry = _Registry()
forks.on_fork(registry.after_fork_in_child)
