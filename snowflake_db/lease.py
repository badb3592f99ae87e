"""The contract between a generator and a worker-ID allocator.

The generator stays free of any database code: it asks an allocator for a :class:`WorkerLease`
and, at every tick change (never per ID), checks that the lease still allows issuing.

A lease promises three things, which together make reusing a masked worker slot safe:

* ``worker_id`` is held by this process alone until ``valid_until`` (``time.monotonic()``
  seconds; the allocator keeps a safety margin before the database-side expiry). The generator
  compares it with :func:`snowflake_db.clock.monotonic`, the same clock read past any test
  tool that fakes ``time.monotonic``, after reading the clock for a new tick, so a tick that
  begins after the deadline is never opened, however long the thread waited for the CPU
  between the check and the reading.
* ``floor_ms`` is the previous holder's high-water mark: only timestamps *above* it may be issued.
* ``high_water_ms`` is the largest timestamp this holder may issue; it is stored in the database
  before it is returned, so the next holder of the slot starts above it.

The generator also says, before it opens each tick, how far it will issue
(:meth:`WorkerLease.issuing_through`): a release then stores that instead of the whole reserve,
so a clean exit frees the slot at once whatever the clock.

Optionally, a lease renews itself when its renewer is late (:class:`SelfRenewingLease`): the
generator calls ``renew_if_due()`` at every tick change, before it compares ``valid_until``
with the clock, so a lease can be renewed by the caller instead of fenced while its background
renewal waits for the CPU. A lease without the method is checked as before: renewing it is
entirely its allocator's business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .clock import Clock
    from .layout import Layout


@runtime_checkable
class WorkerLease(Protocol):
    @property
    def worker_id(self) -> int: ...

    @property
    def floor_ms(self) -> int | None: ...

    @property
    def high_water_ms(self) -> int: ...

    @property
    def valid_until(self) -> float: ...

    @property
    def lost(self) -> bool:
        """True once the allocator knows the slot is no longer this holder's."""
        ...

    def describe_problem(self) -> str:
        """Why the lease cannot be trusted right now (for error messages)."""
        ...

    def issuing_through(self, timestamp_ms: int) -> None:
        """Record, *before* issuing, that IDs up to ``timestamp_ms`` (Unix ms) may be issued.

        The generator calls it with 0 when it takes the lease and with each new tick's last
        millisecond before reading ``high_water_ms`` for that tick: a release that ends the lease
        first and reads this second therefore covers every ID that can still be issued.
        """
        ...

    def release(self) -> None:
        """Give the slot back (clean shutdown). Never called in a forked child."""
        ...

    def abandon(self) -> None:
        """Forget the lease without touching the database: used in a forked child."""
        ...


@runtime_checkable
class WorkerAllocator(Protocol):
    def acquire(self, *, layout: Layout, clock: Clock) -> WorkerLease:
        """Claim a worker slot for this process; raise rather than return a shared one."""
        ...


@runtime_checkable
class SelfRenewingLease(WorkerLease, Protocol):
    """A :class:`WorkerLease` that its user can renew when its background renewal is late."""

    def renew_if_due(self) -> None:
        """Renew now, waiting a bounded time, if the lease is due and its renewer is late.

        Called by the generator under its lock, at most once per tick and before it checks
        ``valid_until``; it must be cheap when nothing is due, return within a bound far below
        the lease length, and never raise for a database failure (the lease then simply stays
        unrenewed and the generator fences at ``valid_until``). It must never run inside a
        transaction of the caller's. Optional: the generator calls it only if it exists.
        """
        ...
