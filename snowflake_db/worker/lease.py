"""A held worker slot (:class:`TableLease`) and the heartbeat thread that renews it.

State a generator reads (``valid_until``, ``high_water_ms``, ``lost``) is plain attributes,
written only by a renewal after the database has accepted the new values: a generator can never
see a high-water mark that is not already stored.

Renewals run one at a time per lease. The heartbeat runs them on schedule; when it is late (a
starved thread under CPU overload), the generator's own caller starts one through
:meth:`TableLease.renew_if_due` and waits for it, bounded (see the allocator).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import forks
from ..clock import MonotonicClock, monotonic

if TYPE_CHECKING:
    from ..clock import Clock

logger = logging.getLogger("snowflake_db.worker")

#: How long the heartbeat waits for a caller's running renewal before looking again.
_IN_FLIGHT_POLL_SECONDS = 1.0

HELD = "held"
LOST = "lost"
RELEASED = "released"
ABANDONED = "abandoned"


class TableLease:
    """A worker ID held by this process until ``valid_until`` (monotonic seconds).

    Implements :class:`snowflake_db.lease.SelfRenewingLease` (a :class:`snowflake_db.WorkerLease`
    that a caller renews when the heartbeat is late). ``floor_ms`` is the previous holder's
    high-water mark, ``high_water_ms`` the largest timestamp this holder may issue.
    """

    def __init__(
        self,
        *,
        worker_id: int,
        token: str,
        registration_id: int,
        floor_ms: int | None,
        high_water_ms: int,
        valid_until: float,
        next_renewal_at: float,
        renewed_at: float,
        clock: Clock,
        where: str,
        release: Callable[[TableLease], None],
        abandon: Callable[[TableLease], None],
        renew_for_caller: Callable[[TableLease], None] | None = None,
        caller_grace: float = 0.0,
    ) -> None:
        self._worker_id = worker_id
        self.token = token
        self.registration_id = registration_id
        self._floor_ms = floor_ms
        self._high_water_ms = high_water_ms
        self._issued_through_ms: int | None = None
        self._valid_until = valid_until
        self.next_renewal_at = next_renewal_at
        self.clock = clock
        self.pid = os.getpid()
        self.state = HELD
        self.lock = threading.Lock()
        self.last_error: str | None = None
        self.failures = 0
        self.renewals = 0
        # Monotonic start of the claim (or the last renewal) statement: what the expiry and the
        # mark were timed from, never later.
        self.renewed_at = renewed_at
        self._where = where
        self._problem = ""
        self._release = release
        self._abandon = abandon
        self._renew_for_caller = renew_for_caller
        #: How late the heartbeat may be before a caller renews the lease itself.
        self.caller_grace = caller_grace
        #: No caller starts or awaits a renewal before this (monotonic; after a wait timed out).
        self.caller_not_before = 0.0
        #: Renewals a caller started (heartbeat late) and that succeeded; and how often a
        #: caller waited for a renewal (its own or the heartbeat's running one).
        self.caller_renewals = 0
        self.caller_waits = 0
        self._in_flight: threading.Event | None = None  # set when the running renewal ends
        #: A renewal went through and the clocks were not compared since (see the keeper).
        self.clocks_unchecked = False

    # -- the WorkerLease protocol ----------------------------------------------------------

    @property
    def worker_id(self) -> int:
        return self._worker_id

    @property
    def floor_ms(self) -> int | None:
        return self._floor_ms

    @property
    def high_water_ms(self) -> int:
        return self._high_water_ms

    @property
    def valid_until(self) -> float:
        return self._valid_until

    @property
    def lost(self) -> bool:
        return self.state != HELD

    def describe_problem(self) -> str:
        where = f"worker {self._worker_id} in {self._where}"
        if self.state != HELD:
            return f"{where}: {self._problem or self.state}"
        age = monotonic() - self.renewed_at
        detail = f"{where}: last renewed {age:.1f} s ago"
        if self.last_error:
            detail += f"; {self.failures} renewal(s) failed, last: {self.last_error}"
        return detail

    def issuing_through(self, timestamp_ms: int) -> None:
        """Record that IDs up to ``timestamp_ms`` may be issued (the generator, before it does)."""
        issued = self._issued_through_ms
        if issued is None or timestamp_ms > issued:
            self._issued_through_ms = timestamp_ms

    def renew_if_due(self) -> None:
        """Renew now if the heartbeat is late (the generator calls this once per tick).

        Cheap when nothing is due: two comparisons. When the heartbeat has missed its time by
        more than ``caller_grace``, the allocator renews on the caller's behalf and waits for
        it, bounded; the caller then checks ``valid_until`` as always. Never raises.
        """
        now = monotonic()
        if now < self.next_renewal_at + self.caller_grace or now < self.caller_not_before:
            return
        renew = self._renew_for_caller
        if renew is None or self.state != HELD:
            return
        try:
            renew(self)
        except Exception:  # the caller fences on valid_until; the heartbeat keeps trying
            logger.exception("snowflake_db: renewing %r for a caller failed unexpectedly", self)

    def release(self) -> None:
        """Give the slot back (a no-op in a forked child or after it was lost)."""
        self._release(self)

    def abandon(self) -> None:
        """Forget the lease without touching the database (forked child)."""
        self._abandon(self)

    # -- used by the allocator -------------------------------------------------------------

    def start_renewal(self) -> threading.Event | None:
        """Claim the lease's one renewal slot; ``None`` when a renewal is already running.

        Whoever gets the event runs the renewal and passes it to :meth:`finish_renewal`;
        others may wait on :meth:`renewal_in_flight` instead of starting another.
        """
        with self.lock:
            if self._in_flight is not None:
                return None
            self._in_flight = threading.Event()
            return self._in_flight

    def renewal_in_flight(self) -> threading.Event | None:
        return self._in_flight

    def finish_renewal(self, turn: threading.Event) -> None:
        with self.lock:
            if self._in_flight is turn:
                self._in_flight = None
        turn.set()

    def wait_for_floor(self, max_wait_ms: int) -> None:
        """Wait (bounded) until the clock is past the previous holder's high-water mark."""
        floor = self._floor_ms
        if floor is None:
            return
        clock = self.clock
        give_up = monotonic() + max_wait_ms / 1000 + 0.05
        while clock() <= floor and monotonic() < give_up:
            time.sleep(min(0.05, max(0.001, (floor - clock() + 1) / 1000)))

    def renewed(self, *, started: float, valid_for: float, high_water_ms: int) -> None:
        """Record a renewal the database accepted (called with ``lock`` held)."""
        self._high_water_ms = max(self._high_water_ms, high_water_ms)
        self._valid_until = started + valid_for
        self.renewed_at = started
        self.renewals += 1
        self.last_error = None
        self.failures = 0

    def end(self, state: str, problem: str, *, high_water_ms: int | None = None) -> None:
        """Stop the generator from using the lease (with ``lock`` held, or in a fork child)."""
        if high_water_ms is not None:
            self._high_water_ms = min(self._high_water_ms, high_water_ms)
        self._valid_until = -math.inf
        self.state = state
        self._problem = problem

    def mark_at_release(self, reserved_ms: int) -> int:
        """The high-water mark to store when the lease ends: what was really issued, never
        below the previous holder's mark nor above ``reserved_ms`` (call after :meth:`end`).

        A generator reports each tick before issuing from it (:meth:`issuing_through`), so once
        the lease has ended that report covers every ID it can still hand out, whatever its
        clock. Without a report (the lease used directly), only a monotonic clock bounds what
        was issued (by "now"); otherwise the whole reserve is kept.
        """
        issued = self._issued_through_ms
        if issued is None:
            if not isinstance(self.clock, MonotonicClock):
                return reserved_ms
            issued = self.clock() + 1
        return min(reserved_ms, max(issued, self._floor_ms or 0))

    def set_high_water(self, high_water_ms: int) -> None:
        """Set the mark after the lease ended (the value stored at release)."""
        self._high_water_ms = high_water_ms

    def forget_after_fork(self, parent_pid: int) -> None:
        """In a forked child: the lease is the parent's; never renew, release or use it."""
        self.lock = threading.Lock()  # the parent's heartbeat may have held it at the fork
        self._in_flight = None  # the thread renewing it did not cross the fork
        self.end(ABANDONED, f"inherited from pid {parent_pid} across a fork")

    def __repr__(self) -> str:
        return (
            f"<TableLease worker_id={self._worker_id} state={self.state} "
            f"high_water_ms={self._high_water_ms} floor_ms={self._floor_ms}>"
        )


def run_after_renewal(after: Callable[[TableLease], None], lease: TableLease) -> None:
    """Run a renewal's follow-up outside its turn; a renewing thread must outlive any surprise."""
    try:
        after(lease)
    except Exception:
        logger.exception("snowflake_db: after renewing %r: unexpected failure", lease)


class Heartbeat:
    """One daemon thread per allocator renewing its leases when they fall due."""

    def __init__(
        self,
        renew: Callable[[TableLease], None],
        *,
        name: str,
        after_renewal: Callable[[TableLease], None] | None = None,
    ) -> None:
        self._renew = renew
        self._after_renewal = after_renewal
        self._name = name
        self._condition = threading.Condition()
        self._leases: list[TableLease] = []
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def leases(self) -> list[TableLease]:
        with self._condition:
            return list(self._leases)

    @property
    def threadless(self) -> bool:
        """No heartbeat thread in this process (forked without hooks): callers renew."""
        return not forks.threads_allowed()

    def add(self, lease: TableLease) -> None:
        threadless = self.threadless
        with self._condition:
            self._leases.append(lease)
            if threadless:
                return  # the lease's callers renew it (renew_if_due), on their own thread
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._condition.notify_all()

    def discard(self, lease: TableLease) -> None:
        with self._condition:
            if lease in self._leases:
                self._leases.remove(lease)
            self._condition.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        with self._condition:
            self._stopping = True
            thread = self._thread
            self._condition.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def inherited_leases(self) -> list[TableLease]:
        """The leases, read without the lock (only in a forked child, where it may be held)."""
        return list(self._leases)

    def _due(self) -> list[TableLease] | None:
        """Wait until some lease is due; ``None`` when stopping."""
        with self._condition:
            while not self._stopping:
                now = monotonic()
                due = [lease for lease in self._leases if lease.next_renewal_at <= now]
                if due:
                    return due
                wake = min((lease.next_renewal_at for lease in self._leases), default=None)
                self._condition.wait(None if wake is None else max(0.0, wake - now))
            return None

    def _run(self) -> None:
        while True:
            due = self._due()
            if due is None:
                return
            for lease in due:
                if lease.next_renewal_at > monotonic():
                    continue  # a caller renewed it meanwhile
                turn = lease.start_renewal()
                if turn is None:
                    # A caller's renewal is running: wait for it rather than run another
                    # (bounded, so stop() is still heard); it reschedules the lease.
                    running = lease.renewal_in_flight()
                    if running is not None:
                        running.wait(_IN_FLIGHT_POLL_SECONDS)
                    continue
                try:
                    self._renew(lease)
                except Exception:  # the heartbeat must outlive any surprise
                    logger.exception("snowflake_db: renewing %r failed unexpectedly", lease)
                    lease.next_renewal_at = monotonic() + 1.0
                finally:
                    lease.finish_renewal(turn)
                if self._after_renewal is not None:
                    run_after_renewal(self._after_renewal, lease)
