"""Renewing a lease on its caller's behalf: when the heartbeat thread is late, or when this
process runs none (a child forked without Python's fork hooks, see :mod:`snowflake_db.forks`).

With a heartbeat, the renewal runs on a short-lived thread on the allocator's engine (never in
the caller's transaction), so no driver can hold the caller longer than its bounded wait; it
keeps running after the wait and updates the lease if it succeeds. Only one renewal runs per
lease: a caller that finds one running (the heartbeat's) waits for that one. The caller blocks
the generator meanwhile, which also hands its CPU share and the GIL to the renewal. After a wait
that timed out, callers leave the lease to the running renewal and the heartbeat for a while
(no renewal storm against a database that hangs), except near the local deadline: there a
caller waits on until the deadline, as issuing beside a renewal the database would still answer
can starve it on an overloaded machine.

Without threads the caller renews inline: the allocator's statement timeouts
(:mod:`snowflake_db.worker.timeouts`) bound how long a database that does not answer holds it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from .. import forks
from ..clock import monotonic
from .lease import HELD, TableLease, run_after_renewal

logger = logging.getLogger("snowflake_db.worker")


class CallerRenewal:
    """``lease.renew_if_due`` found the lease due: renew it now and wait, bounded."""

    def __init__(
        self,
        renew: Callable[[TableLease], None],
        *,
        wait_seconds: float,
        hold_seconds: float = 0.0,
        after_renewal: Callable[[TableLease], None] | None = None,
    ) -> None:
        self._renew = renew
        #: Run once the renewal's turn is over (the clock comparison): never holds a caller.
        self._after_renewal = after_renewal
        self.wait_seconds = wait_seconds
        #: Within this much of the local deadline, a caller waits for the running renewal
        #: until the deadline rather than for ``wait_seconds``.
        self.hold_seconds = hold_seconds

    def _wait(self, running: threading.Event, lease: TableLease) -> bool:
        """Wait ``wait_seconds`` for the running renewal; then, once the local deadline is
        within ``hold_seconds``, on until the deadline: issuing meanwhile would take the CPU
        and the GIL from the renewal that keeps the lease valid. True if it ended."""
        if running.wait(self.wait_seconds):
            return True
        remaining = lease.valid_until - monotonic()
        return 0 < remaining <= self.hold_seconds and running.wait(remaining)

    def __call__(self, lease: TableLease) -> None:
        if lease.state != HELD or lease.pid != os.getpid():
            return
        lease.caller_waits += 1
        turn = lease.start_renewal()
        if turn is None:
            running = lease.renewal_in_flight()
            if running is None:  # it has just finished
                return
            done = self._wait(running, lease)
        elif not forks.threads_allowed():
            self._run(lease, turn)  # no thread may start here: renew on the caller's own
            return
        else:
            thread = threading.Thread(
                target=self._run, args=(lease, turn), name="snowflake_db-renewal", daemon=True
            )
            try:
                thread.start()
            except RuntimeError:  # no new threads (interpreter shutting down): give the turn back
                lease.finish_renewal(turn)
                raise
            done = self._wait(turn, lease)
        if not done:
            # Leave the lease to the running renewal for a while, but come back (and wait
            # for it again) once the deadline is near.
            now = monotonic()
            pause_until = now + self.wait_seconds
            if now < lease.valid_until:
                pause_until = min(pause_until, lease.valid_until - self.hold_seconds)
            lease.caller_not_before = pause_until

    def _run(self, lease: TableLease, turn: threading.Event) -> None:
        renewals = lease.renewals
        try:
            self._renew(lease)
            if lease.renewals > renewals:
                lease.caller_renewals += 1
        except Exception:  # a thread of ours must not die with a traceback on stderr
            logger.exception("snowflake_db: renewing %r for a caller failed unexpectedly", lease)
            lease.next_renewal_at = monotonic() + 1.0
        finally:
            lease.finish_renewal(turn)
        if self._after_renewal is not None:
            run_after_renewal(self._after_renewal, lease)
