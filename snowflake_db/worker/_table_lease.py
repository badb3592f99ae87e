"""A held worker slot: :class:`TableLease`, what a generator reads and reports.

State a generator reads (``valid_until``, ``high_water_ms``, ``lost``) is plain attributes,
written only by a renewal after the database has accepted the new values: a generator can never
see a high-water mark that is not already stored. Renewing, releasing and abandoning are the
lease's :class:`~._renewer.LeaseRenewer`'s, which alone writes its
:class:`~._renewer.RenewalSchedule`: the lease reads it, to start a renewal when the heartbeat is
late (:meth:`TableLease.renew_if_due`) and to describe itself.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING

from ..clock import MonotonicClock, monotonic

if TYPE_CHECKING:
    from ..clock import Clock
    from ._renewer import LeaseRenewer, RenewalSchedule

logger = logging.getLogger("snowflake_db.worker")

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
        clock: Clock,
        where: str,
        renewer: LeaseRenewer,
        schedule: RenewalSchedule,
    ) -> None:
        self._worker_id = worker_id
        self.token = token
        self.registration_id = registration_id
        self._floor_ms = floor_ms
        self._high_water_ms = high_water_ms
        self._issued_through_ms: int | None = None
        self._valid_until = valid_until
        #: renewals applied after ``valid_until`` had passed here: a lease that lapsed may have
        #: been left out of a move's barrier, though its token still renews (the shard router
        #: confirms routes against the control database after one)
        self.lapses = 0
        self.clock = clock
        self.pid = os.getpid()
        self.state = HELD
        self.lock = threading.Lock()
        self._where = where
        self._problem = ""
        self._renewer = renewer
        self._schedule = schedule

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
        schedule = self._schedule
        age = monotonic() - schedule.renewed_at
        detail = f"{where}: last renewed {age:.1f} s ago"
        if schedule.last_error:
            detail += f"; {schedule.failures} renewal(s) failed, last: {schedule.last_error}"
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
        it, bounded; the caller then checks ``valid_until`` as always. Once the renewal is
        due and running (the heartbeat's, on time), the caller waits for it too, bounded,
        rather than compete with it for the CPU and the GIL. Never raises.
        """
        now = monotonic()
        schedule = self._schedule
        if now < schedule.next_renewal_at or now < schedule.caller_not_before:
            return
        if now < schedule.next_renewal_at + schedule.caller_grace and schedule.in_flight is None:
            return
        if self.state != HELD:
            return
        try:
            self._renewer.renew_for_caller(self)
        except Exception:  # the caller fences on valid_until; the heartbeat keeps trying
            logger.exception("snowflake_db: renewing %r for a caller failed unexpectedly", self)

    def release(self) -> None:
        """Give the slot back (a no-op in a forked child or after it was lost)."""
        self._renewer.release(self)

    def abandon(self) -> None:
        """Forget the lease without touching the database (forked child)."""
        self._renewer.abandon(self)

    # -- its renewals (read-only: the renewer keeps them) ----------------------------------

    @property
    def schedule(self) -> RenewalSchedule:
        """When it is renewed next and how its renewals went (written by its renewer only)."""
        return self._schedule

    @property
    def renewals(self) -> int:
        """Renewals the database accepted."""
        return self._schedule.renewals

    @property
    def caller_renewals(self) -> int:
        """Renewals a caller started (the heartbeat was late) that the database accepted."""
        return self._schedule.caller_renewals

    @property
    def caller_waits(self) -> int:
        """How often a caller waited for a renewal (its own or the heartbeat's running one)."""
        return self._schedule.caller_waits

    @property
    def renewed_at(self) -> float:
        """Monotonic start of the claim or of the last renewal accepted."""
        return self._schedule.renewed_at

    def renewal_in_flight(self) -> threading.Event | None:
        """The running renewal's event (set when it ends), or ``None``."""
        return self._schedule.in_flight

    # -- used by the renewer ---------------------------------------------------------------

    def wait_for_floor(self, max_wait_ms: int) -> None:
        """Wait (bounded) until the clock is past the previous holder's high-water mark."""
        floor = self._floor_ms
        if floor is None:
            return
        clock = self.clock
        give_up = monotonic() + max_wait_ms / 1000 + 0.05
        while clock() <= floor and monotonic() < give_up:
            time.sleep(min(0.05, max(0.001, (floor - clock() + 1) / 1000)))

    def renewed(self, *, valid_until: float, high_water_ms: int) -> None:
        """Apply a renewal the database accepted (called with ``lock`` held)."""
        if monotonic() >= self._valid_until:
            self.lapses += 1
        self._high_water_ms = max(self._high_water_ms, high_water_ms)
        self._valid_until = valid_until

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
        self.end(ABANDONED, f"inherited from pid {parent_pid} across a fork")

    def __repr__(self) -> str:
        return (
            f"<TableLease worker_id={self._worker_id} state={self.state} "
            f"high_water_ms={self._high_water_ms} floor_ms={self._floor_ms}>"
        )
