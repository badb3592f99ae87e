"""Keeping the leases one allocator handed out: renewing them, ending them, forgetting them
after a fork.

The renewal policy lives here: the heartbeat renews each lease every ``renew_every`` seconds
on its own connection; a caller renews it itself once the heartbeat is late (:mod:`.caller_renewal`)
and waits at most a quarter of the heartbeat's period (near the local deadline, until it); a
renewal that fails is retried after a quarter period, and the generator fences at the local
deadline. A release lowers the slot's high-water mark to the last tick really issued; an
abandoned lease (a forked child's copy) is never released.
"""

from __future__ import annotations

import logging
import os

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..clock import Clock, monotonic
from ..metrics import MetricsRecorder
from . import claims, clock_skew
from .caller_renewal import CallerRenewal
from .lease import ABANDONED, HELD, LOST, RELEASED, Heartbeat, TableLease
from .store import WorkerStore
from .timing import LeaseTiming

__all__ = ["MAX_CALLER_WAIT_SECONDS", "LeaseKeeper", "describe_error"]

logger = logging.getLogger("snowflake_db.worker")

#: Longest a caller waits for a renewal it asked for (or found running) before going on.
MAX_CALLER_WAIT_SECONDS = 1.0


class LeaseKeeper:
    """Renews, releases and abandons the leases of one allocator, on its engine."""

    def __init__(
        self,
        engine: Engine,
        store: WorkerStore,
        *,
        timing: LeaseTiming,
        skew_policy: clock_skew.SkewPolicy,
        recorder: MetricsRecorder,
    ) -> None:
        self._engine, self._store = engine, store
        self._timing, self._skew_policy, self._recorder = timing, skew_policy, recorder
        self.heartbeat = self._new_heartbeat()
        # A caller renews a lease itself once the heartbeat is a quarter of the slack between
        # its renewal time and the local deadline late, and waits for that renewal at most a
        # quarter of the heartbeat's period (never the whole remaining lease).
        self._caller_grace = (timing.lease_seconds - timing.safety_margin - timing.renew_every) / 4
        # Within two such waits of the local deadline, a caller waits for the running renewal
        # until the deadline: issuing meanwhile only takes the CPU and the GIL from it.
        wait = min(timing.renew_every / 4, MAX_CALLER_WAIT_SECONDS)
        self.renew_for_caller = CallerRenewal(
            self.renew,
            wait_seconds=wait,
            hold_seconds=2 * wait,
            after_renewal=self.compare_clocks,
        )

    def _new_heartbeat(self) -> Heartbeat:
        return Heartbeat(
            self.renew, name="snowflake_db-heartbeat", after_renewal=self.compare_clocks
        )

    @property
    def caller_grace(self) -> float:
        """How late the heartbeat may be before a caller renews; 0 without a heartbeat thread
        (a child forked without hooks: its callers renew on schedule)."""
        return 0.0 if self.heartbeat.threadless else self._caller_grace

    def hold(self, taken: claims.Taken, *, clock: Clock, where: str) -> TableLease:
        """The lease on a slot just claimed, renewed and ended by this keeper. It may issue
        until the safety margin before its expiry, timed from before the claim statement."""
        timing = self._timing
        return TableLease(
            worker_id=taken.worker_id,
            token=taken.token,
            registration_id=taken.registration_id,
            floor_ms=taken.floor_ms,
            high_water_ms=taken.high_water_ms,
            valid_until=taken.started + timing.lease_seconds - timing.safety_margin,
            next_renewal_at=taken.started + timing.renew_every,
            renewed_at=taken.started,
            clock=clock,
            where=where,
            release=self.release,
            abandon=self.abandon,
            renew_for_caller=self.renew_for_caller,
            caller_grace=self.caller_grace,
        )

    def renew(self, lease: TableLease) -> None:
        """Extend one lease and its high-water mark, or learn that it was lost."""
        if lease.state != HELD or lease.pid != os.getpid():
            self.heartbeat.discard(lease)
            return
        timing = self._timing
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
            lease.failures += 1
            lease.last_error = describe_error(error)
            lease.next_renewal_at = monotonic() + timing.renew_every / 4
            if lease.failures == 1:
                logger.warning(
                    "snowflake_db: renewing the lease on worker %d failed (%s); retrying",
                    lease.worker_id,
                    lease.last_error,
                )
            return
        self._recorder.renewal_answered(monotonic() - started, renewed=renewed)
        with lease.lock:
            if lease.state != HELD:
                return
            if renewed:
                lease.renewed(
                    started=started,
                    valid_for=timing.lease_seconds - timing.safety_margin,
                    high_water_ms=high_water_ms,
                )
                lease.next_renewal_at = started + timing.renew_every
            else:
                lease.end(LOST, "the slot was taken by another holder or reaped after it expired")
        if renewed:
            lease.clocks_unchecked = True  # compare_clocks, once the renewal's turn is over
            return
        self.heartbeat.discard(lease)
        self._recorder.lease_lost()
        logger.warning(
            "snowflake_db: the lease on worker %d was lost; a new worker ID will be leased",
            lease.worker_id,
        )

    def compare_clocks(self, lease: TableLease) -> None:
        """Measure the clock skew after a renewal was applied (it warns, never fences).

        Run by whoever renewed, after the renewal's turn ended: a comparison that waits on a
        database gone quiet (a lock, an outage starting) must not hold the next renewal back.
        """
        if not lease.clocks_unchecked or lease.pid != os.getpid():
            return
        lease.clocks_unchecked = False
        try:
            with self._engine.begin() as connection:
                skew = clock_skew.measure(connection, self._store, lease.clock)
        except SQLAlchemyError as error:  # the lease is renewed; the next renewal measures again
            logger.debug("snowflake_db: comparing the clocks failed: %s", describe_error(error))
            return
        self._skew_policy.at_renewal(skew, lease.worker_id)

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
            lease.forget_after_fork(parent_pid)
        self.heartbeat = self._new_heartbeat()


def describe_error(error: BaseException) -> str:
    """A database error in one line: the driver's exception, not SQLAlchemy's wrapper."""
    cause = getattr(error, "orig", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")
