"""The one renewer of an allocator's leases: its schedule, its heartbeat, its callers' renewals,
release and abandonment.

Every renewal of a :class:`~._table_lease.TableLease` goes through :class:`LeaseRenewer`, which
alone writes the lease's :class:`RenewalSchedule` (when the next renewal is due, how the last
ones went, whether one is running); the lease only reads it. The policy:

* the heartbeat thread renews each lease every ``renew_every`` seconds on the allocator's own
  connection (never inside the caller's transaction);
* once the heartbeat is late (a starved thread under CPU overload), or in a process that runs
  none (a child forked without Python's fork hooks, see :mod:`snowflake_db.forks`), the
  generator's own caller starts the renewal through :meth:`TableLease.renew_if_due` and waits
  for it, at most a quarter of the heartbeat's period (:attr:`LeaseRenewer.wait_seconds`). With a
  heartbeat, that renewal runs on a short-lived thread, so no driver can hold the caller longer
  than its bounded wait; it keeps running after the wait and updates the lease if it succeeds.
  Only one renewal runs per lease: a caller that finds one running (the heartbeat's) waits for
  that one. After a wait that timed out, callers leave the lease to the running renewal and the
  heartbeat for a while (no renewal storm against a database that hangs), except near the local
  deadline (:attr:`LeaseRenewer.hold_seconds`): there a caller waits on until the deadline, as
  issuing beside a renewal the database would still answer can starve it on an overloaded
  machine. Without threads the caller renews inline: the statement bounds
  (:mod:`._engine`) limit how long a database that does not answer holds it;
* a renewal that fails is retried after a quarter period, and the generator fences at the local
  deadline;
* a release lowers the slot's high-water mark to the last tick really issued; an abandoned lease
  (a forked child's copy) is never released.

The lease's timing arguments are checked here too (:func:`lease_timing`): each error names the
argument the caller passed and the limit that applies to it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from .. import forks
from .._validate import require_int, require_seconds
from ..clock import Clock, monotonic
from ..errors import InvalidArgumentError
from ..metrics import MetricsRecorder
from ..shutdown import keep_signals_off_this_thread
from . import _clock_skew
from ._claims import ClaimedSlot
from ._store import WorkerStore
from ._table_lease import ABANDONED, HELD, LOST, RELEASED, TableLease

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "MAX_CALLER_WAIT_SECONDS",
    "MAX_LEASE_SECONDS",
    "MIN_LEASE_SECONDS",
    "LeaseRenewer",
    "LeaseTiming",
    "RenewalSchedule",
    "describe_error",
    "lease_timing",
]

logger = logging.getLogger("snowflake_db.worker")

#: Longest a caller waits for a renewal it asked for (or found running) before going on.
MAX_CALLER_WAIT_SECONDS = 1.0
#: The most of the time before the local deadline in which callers wait for a running renewal
#: rather than issue (:attr:`LeaseRenewer.hold_seconds`).
MAX_HOLD_SECONDS = 2.0
#: How long the heartbeat waits for a caller's running renewal before looking again.
_IN_FLIGHT_POLL_SECONDS = 1.0


# -- timing ------------------------------------------------------------------------------------

#: Default lease length: a crashed holder's worker ID is reusable this long after its last renewal.
DEFAULT_LEASE_SECONDS = 30.0
#: Shortest lease accepted: renewed every third of it, a shorter one would ask the control
#: database for a renewal faster than a round trip to it.
MIN_LEASE_SECONDS = 0.1
#: Longest lease (and ``reserve_ahead_ms``) accepted: a crashed holder parks its slot this long.
MAX_LEASE_SECONDS = 86_400.0


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """A lease's timing arguments, checked together (:func:`lease_timing`)."""

    lease_seconds: float
    renew_every: float
    safety_margin: float
    reserve_ahead_ms: int


def lease_timing(
    *,
    lease_seconds: float,
    renew_every: float | None,
    safety_margin: float | None,
    reserve_ahead_ms: int | None,
) -> LeaseTiming:
    """Check the arguments and fill in the defaults derived from ``lease_seconds`` (an error
    names the argument the caller passed: a derived value is never blamed for its source)."""
    lease = require_seconds("lease_seconds", lease_seconds, positive=True)
    if lease < MIN_LEASE_SECONDS:
        raise InvalidArgumentError(
            f"lease_seconds={lease_seconds} is below the minimum {MIN_LEASE_SECONDS:g} s "
            "(renewed every third of it, a shorter lease would need renewals faster than a "
            "round trip to the control database)"
        )
    if lease > MAX_LEASE_SECONDS:
        raise InvalidArgumentError(
            f"lease_seconds={lease_seconds} exceeds the maximum {MAX_LEASE_SECONDS:g} s "
            "(one day): a crashed holder would park its worker ID that long"
        )
    renew = require_seconds(
        "renew_every", renew_every if renew_every is not None else lease / 3, positive=True
    )
    margin = require_seconds(
        "safety_margin", safety_margin if safety_margin is not None else lease / 5
    )
    if renew >= lease - margin:
        raise InvalidArgumentError(
            f"renew_every={renew} s must be shorter than lease_seconds - safety_margin = "
            f"{lease - margin} s, or every lease would pass its local deadline before its "
            "first renewal"
        )
    reserve = round(lease * 1000)  # at least 100 ms, given the minimum lease
    if reserve_ahead_ms is not None:
        reserve = require_int(
            "reserve_ahead_ms",
            reserve_ahead_ms,
            minimum=1,
            maximum=round(MAX_LEASE_SECONDS * 1000),
            limit_note="one day: the next holder of the slot would wait that long",
        )
    return LeaseTiming(lease, renew, margin, reserve)


# -- one lease's schedule ----------------------------------------------------------------------


class RenewalSchedule:
    """When one lease is renewed next and how its renewals went.

    Written only by its :class:`LeaseRenewer`; the lease reads it (``renew_if_due``, its
    problem description and its counters).
    """

    def __init__(self, *, started: float, renew_every: float, caller_grace: float) -> None:
        self.next_renewal_at = started + renew_every
        #: Monotonic start of the claim (or the last renewal) statement: what the expiry and
        #: the mark were timed from, never later.
        self.renewed_at = started
        #: How late the heartbeat may be before a caller renews the lease itself.
        self.caller_grace = caller_grace
        #: No caller starts or awaits a renewal before this (monotonic; after a wait timed out).
        self.caller_not_before = 0.0
        self.renewals = 0
        #: Renewals a caller started (heartbeat late) and that succeeded; and how often a
        #: caller waited for a renewal (its own or the heartbeat's running one).
        self.caller_renewals = 0
        self.caller_waits = 0
        self.failures = 0
        self.last_error: str | None = None
        #: A renewal went through and the clocks were not compared since.
        self.clocks_unchecked = False
        self._lock = threading.Lock()
        self._in_flight: threading.Event | None = None  # set when the running renewal ends

    def start_turn(self) -> threading.Event | None:
        """Claim the lease's one renewal turn; ``None`` when a renewal is already running.

        Whoever gets the event runs the renewal and passes it to :meth:`finish_turn`; others
        may wait on :attr:`in_flight` instead of starting another.
        """
        with self._lock:
            if self._in_flight is not None:
                return None
            self._in_flight = threading.Event()
            return self._in_flight

    @property
    def in_flight(self) -> threading.Event | None:
        return self._in_flight

    def finish_turn(self, turn: threading.Event) -> None:
        with self._lock:
            if self._in_flight is turn:
                self._in_flight = None
        turn.set()

    def forget_after_fork(self) -> None:
        """In a forked child: the thread renewing it (and its lock's holder) did not cross."""
        self._lock = threading.Lock()
        self._in_flight = None


# -- the heartbeat -----------------------------------------------------------------------------


class Heartbeat:
    """One daemon thread per allocator renewing its leases when they fall due."""

    def __init__(self, renewer: LeaseRenewer, *, name: str) -> None:
        self._renewer = renewer
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
                due = [lease for lease in self._leases if lease.schedule.next_renewal_at <= now]
                if due:
                    return due
                wake = min((lease.schedule.next_renewal_at for lease in self._leases), default=None)
                self._condition.wait(None if wake is None else max(0.0, wake - now))
            return None

    def _run(self) -> None:
        keep_signals_off_this_thread()
        renewer = self._renewer
        while True:
            due = self._due()
            if due is None:
                return
            for lease in due:
                schedule = lease.schedule
                if schedule.next_renewal_at > monotonic():
                    continue  # a caller renewed it meanwhile
                turn = schedule.start_turn()
                if turn is None:
                    # A caller's renewal is running: wait for it rather than run another
                    # (bounded, so stop() is still heard); it reschedules the lease.
                    running = schedule.in_flight
                    if running is not None:
                        running.wait(_IN_FLIGHT_POLL_SECONDS)
                    continue
                try:
                    renewer.renew(lease)
                except Exception:  # the heartbeat must outlive any surprise
                    logger.exception("snowflake_db: renewing %r failed unexpectedly", lease)
                    schedule.next_renewal_at = monotonic() + 1.0
                finally:
                    schedule.finish_turn(turn)
                renewer.after_renewal(lease)


# -- the renewer -------------------------------------------------------------------------------


class LeaseRenewer:
    """Renews, releases and abandons the leases of one allocator, on its engine."""

    def __init__(
        self,
        engine: Engine,
        store: WorkerStore,
        *,
        timing: LeaseTiming,
        skew_policy: _clock_skew.SkewPolicy,
        recorder: MetricsRecorder,
    ) -> None:
        self._engine, self._store = engine, store
        self._timing, self._skew_policy, self._recorder = timing, skew_policy, recorder
        self.heartbeat = Heartbeat(self, name="snowflake_db-heartbeat")
        # A caller renews a lease itself once the heartbeat is a quarter of the slack between
        # its renewal time and the local deadline late, and waits for that renewal at most a
        # quarter of the heartbeat's period (never the whole remaining lease).
        self._caller_grace = (timing.lease_seconds - timing.safety_margin - timing.renew_every) / 4
        #: How long a caller waits for the running renewal.
        self.wait_seconds = min(timing.renew_every / 4, MAX_CALLER_WAIT_SECONDS)
        #: Within this much of the local deadline, a caller waits for the running renewal
        #: until the deadline rather than for ``wait_seconds``: issuing meanwhile only takes
        #: the CPU and the GIL from it. For a short lease that is all of the slack after the
        #: callers' grace (a 3 s lease: from 1.05 s before the deadline; with 0.5 s, four busy
        #: callers held a renewal the database answered 0.9 s of its 1.7 s at load 15 on 2
        #: cores, past the deadline); for a long one at most ``MAX_HOLD_SECONDS``, so a
        #: database that hangs does not stop a lease that is still valid from issuing.
        self.hold_seconds = min(
            timing.lease_seconds - timing.safety_margin - timing.renew_every - self._caller_grace,
            MAX_HOLD_SECONDS,
        )

    @property
    def caller_grace(self) -> float:
        """How late the heartbeat may be before a caller renews; 0 without a heartbeat thread
        (a child forked without hooks: its callers renew on schedule)."""
        return 0.0 if self.heartbeat.threadless else self._caller_grace

    def hold(self, claimed: ClaimedSlot, *, clock: Clock, where: str) -> TableLease:
        """The lease on a slot just claimed, renewed and ended by this renewer. It may issue
        until the safety margin before its expiry, timed from before the claim statement."""
        timing = self._timing
        return TableLease(
            worker_id=claimed.worker_id,
            token=claimed.token,
            registration_id=claimed.registration_id,
            floor_ms=claimed.floor_ms,
            high_water_ms=claimed.high_water_ms,
            valid_until=claimed.started + timing.lease_seconds - timing.safety_margin,
            clock=clock,
            where=where,
            renewer=self,
            schedule=RenewalSchedule(
                started=claimed.started,
                renew_every=timing.renew_every,
                caller_grace=self.caller_grace,
            ),
        )

    def renew(self, lease: TableLease) -> None:
        """Extend one lease and its high-water mark, or learn that it was lost (run in the
        lease's renewal turn)."""
        if lease.state != HELD or lease.pid != os.getpid():
            self.heartbeat.discard(lease)
            return
        timing, schedule = self._timing, lease.schedule
        started = monotonic()
        try:
            high_water_ms = max(lease.high_water_ms, lease.clock() + timing.reserve_ahead_ms)
            # Only the UPDATE and its commit stand between the start and the new deadline: on
            # an overloaded machine each round trip can take hundreds of ms (the database's
            # process waits for a CPU too), so the clocks are compared once it is applied.
            with self._engine.begin() as connection:
                renewed = self._store.renew(
                    connection,
                    worker_id=lease.worker_id,
                    token=lease.token,
                    lease_ms=round(timing.lease_seconds * 1000),
                    high_water_ms=high_water_ms,
                )
        except Exception as error:
            self._recorder.renewal_failed(monotonic() - started)
            schedule.failures += 1
            schedule.last_error = describe_error(error)
            schedule.next_renewal_at = monotonic() + timing.renew_every / 4
            if schedule.failures == 1:
                logger.warning(
                    "snowflake_db: renewing the lease on worker %d failed (%s); retrying",
                    lease.worker_id,
                    schedule.last_error,
                )
            return
        self._recorder.renewal_answered(monotonic() - started, renewed=renewed)
        with lease.lock:
            if lease.state != HELD:
                return
            if renewed:
                lease.renewed(
                    valid_until=started + timing.lease_seconds - timing.safety_margin,
                    high_water_ms=high_water_ms,
                )
                schedule.renewed_at = started
                schedule.renewals += 1
                schedule.last_error = None
                schedule.failures = 0
                schedule.next_renewal_at = started + timing.renew_every
            else:
                lease.end(LOST, "the slot was taken by another holder or reaped after it expired")
        if renewed:
            schedule.clocks_unchecked = True  # compare_clocks, once the renewal's turn is over
            return
        self.heartbeat.discard(lease)
        self._recorder.lease_lost()
        logger.warning(
            "snowflake_db: the lease on worker %d was lost; a new worker ID will be leased",
            lease.worker_id,
        )

    def after_renewal(self, lease: TableLease) -> None:
        """A renewal's follow-up (the clock comparison), outside its turn; a renewing thread
        must outlive any surprise."""
        try:
            self.compare_clocks(lease)
        except Exception:
            logger.exception("snowflake_db: after renewing %r: unexpected failure", lease)

    def compare_clocks(self, lease: TableLease) -> None:
        """Measure the clock skew after a renewal was applied (it warns, never fences).

        Run by whoever renewed, after the renewal's turn ended: a comparison that waits on a
        database gone quiet (a lock, an outage starting) must not hold the next renewal back.
        """
        schedule = lease.schedule
        if not schedule.clocks_unchecked or lease.pid != os.getpid():
            return
        schedule.clocks_unchecked = False
        try:
            with self._engine.begin() as connection:
                skew = _clock_skew.measure(connection, self._store, lease.clock)
        except SQLAlchemyError as error:  # the lease is renewed; the next renewal measures again
            logger.debug("snowflake_db: comparing the clocks failed: %s", describe_error(error))
            return
        self._skew_policy.at_renewal(skew, lease.worker_id)

    # -- a caller's renewal ---------------------------------------------------------------------

    def renew_for_caller(self, lease: TableLease) -> None:
        """``lease.renew_if_due`` found the lease due: renew it now and wait, bounded."""
        if lease.state != HELD or lease.pid != os.getpid():
            return
        schedule = lease.schedule
        schedule.caller_waits += 1
        turn = schedule.start_turn()
        if turn is None:
            running = schedule.in_flight
            if running is None:  # it has just finished
                return
            done = self._wait(running, lease)
        elif monotonic() < schedule.next_renewal_at:  # the renewal it found running just ended
            schedule.finish_turn(turn)
            return
        elif not forks.threads_allowed():
            self._renew_in_turn(lease, turn)  # no thread may start here: renew on the caller's
            return
        else:
            thread = threading.Thread(
                target=self._renew_in_thread,
                args=(lease, turn),
                name="snowflake_db-renewal",
                daemon=True,
            )
            try:
                thread.start()
            except RuntimeError:  # no new threads (interpreter shutting down): give the turn back
                schedule.finish_turn(turn)
                raise
            done = self._wait(turn, lease)
        if not done:
            # Leave the lease to the running renewal for a while, but come back (and wait
            # for it again) once the deadline is near.
            now = monotonic()
            pause_until = now + self.wait_seconds
            if now < lease.valid_until:
                pause_until = min(pause_until, lease.valid_until - self.hold_seconds)
            schedule.caller_not_before = pause_until

    def _wait(self, running: threading.Event, lease: TableLease) -> bool:
        """Wait ``wait_seconds`` for the running renewal; then, once the local deadline is
        within ``hold_seconds``, on until the deadline: issuing meanwhile would take the CPU
        and the GIL from the renewal that keeps the lease valid. True if it ended."""
        if running.wait(self.wait_seconds):
            return True
        remaining = lease.valid_until - monotonic()
        return 0 < remaining <= self.hold_seconds and running.wait(remaining)

    def _renew_in_thread(self, lease: TableLease, turn: threading.Event) -> None:
        keep_signals_off_this_thread()
        self._renew_in_turn(lease, turn)

    def _renew_in_turn(self, lease: TableLease, turn: threading.Event) -> None:
        schedule = lease.schedule
        renewals = schedule.renewals
        try:
            self.renew(lease)
            if schedule.renewals > renewals:
                schedule.caller_renewals += 1
        except Exception:  # a thread of ours must not die with a traceback on stderr
            logger.exception("snowflake_db: renewing %r for a caller failed unexpectedly", lease)
            schedule.next_renewal_at = monotonic() + 1.0
        finally:
            schedule.finish_turn(turn)
        self.after_renewal(lease)

    # -- ending leases --------------------------------------------------------------------------

    def release(self, lease: TableLease) -> None:
        """End the lease and give the slot back with the mark of the last tick issued."""
        with lease.lock:
            if lease.state in (RELEASED, ABANDONED):
                return
            was_held = lease.state == HELD
            reserved_ms = lease.high_water_ms
            # Stop the generator first (deadline and ceiling), so every window it may still
            # issue from was opened with a clock reading taken before the one below.
            lease.end(RELEASED, "released", high_water_ms=-1)
            # Read second: the generator reports a tick before it reads the ceiling ended above.
            final_ms = lease.mark_at_release(reserved_ms)
            lease.set_high_water(final_ms)
        self.heartbeat.discard(lease)
        if not was_held or lease.pid != os.getpid():
            return
        try:
            with self._engine.begin() as connection:
                self._store.release(
                    connection,
                    worker_id=lease.worker_id,
                    token=lease.token,
                    high_water_ms=final_ms,
                )
        except SQLAlchemyError as error:
            logger.warning(
                "snowflake_db: could not release worker %d (%s); its lease expires by itself",
                lease.worker_id,
                describe_error(error),
            )

    def abandon(self, lease: TableLease) -> None:
        """A forked child's copy of a lease: never renewed or released from here."""
        with lease.lock:
            if lease.state == HELD:
                lease.end(ABANDONED, "abandoned (forked child)")
        if lease.pid == os.getpid():
            self.heartbeat.discard(lease)

    def release_all(self) -> None:
        """Stop the heartbeat and release every lease it renews (the allocator's close)."""
        self.heartbeat.stop()
        for lease in self.heartbeat.leases:
            self.release(lease)

    def after_fork_in_child(self, parent_pid: int) -> None:
        """The parent's leases are forgotten (never released from here); a new heartbeat."""
        for lease in self.heartbeat.inherited_leases():
            lease.schedule.forget_after_fork()
            lease.forget_after_fork(parent_pid)
        self.heartbeat = Heartbeat(self, name="snowflake_db-heartbeat")


def describe_error(error: BaseException) -> str:
    """A database error in one line: the driver's exception, not SQLAlchemy's wrapper."""
    cause = getattr(error, "orig", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")
