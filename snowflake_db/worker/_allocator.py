"""``TableWorkerAllocator``: lease a worker ID from a table in a shared control database.

The allocator owns the configuration, its private engine, the administration of the tables and
the fork and exit hooks; *how* a slot is claimed, reserved or released is :mod:`._claims`, which
it calls in its own connection and transactions, and keeping the leases it handed out (heartbeat
and caller renewals, release, abandonment) is its :class:`~._renewer.LeaseRenewer`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from .. import forks
from .._validate import require_int, require_seconds
from ..clock import Clock, default_clock, monotonic
from ..errors import (
    AllocatorUnavailableError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SnowflakeError,
)
from ..layout import DEFAULT_LAYOUT, Layout, require_layout
from ..metrics import MetricsRecorder, SlotCounts
from . import _claims, _clock_skew, _process_hooks
from ._engine import (
    ControlDatabase,
    check_supported,
    idle_transaction_seconds,
    safe_url_text,
    statement_seconds,
    to_url,
)
from ._layout_record import RecordedLayout, recorded_layout
from ._renewer import (
    DEFAULT_LEASE_SECONDS,
    MAX_CALLER_WAIT_SECONDS,
    Heartbeat,
    LeaseRenewer,
    describe_error,
    lease_timing,
)
from ._schema import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE, NAME_LENGTH
from ._store import SlotRow, WorkerStore
from ._table_lease import TableLease

__all__ = ["DEFAULT_MAX_FLOOR_WAIT_MS", "MAX_CALLER_WAIT_SECONDS", "TableWorkerAllocator"]

logger = logging.getLogger("snowflake_db.worker")
_T = TypeVar("_T")

#: Default bound on waiting for a previous holder's high-water mark to pass (else: another slot).
DEFAULT_MAX_FLOOR_WAIT_MS = 1000


class TableWorkerAllocator:
    """Lease worker IDs from the worker tables of the database at ``url_or_engine``.

    ``url_or_engine`` is a URL (string or :class:`sqlalchemy.engine.URL`) or an
    :class:`~sqlalchemy.Engine`, used for its URL only: the allocator opens its own small engine
    so no lease statement ever runs in the application's connections or transactions
    (``engine_options`` adds :func:`sqlalchemy.create_engine` arguments, e.g. ``connect_args``).

    Timing: a lease lasts ``lease_seconds`` by the database clock and is renewed every
    ``renew_every`` seconds (default a third of it) by a daemon thread. The generator may issue
    until ``safety_margin`` seconds (default a fifth) before the lease would expire, measured from
    the start of the last successful renewal on this process's monotonic clock. Each renewal
    stores a high-water mark ``reserve_ahead_ms`` (default the lease length) ahead of the clock.
    Both are at most :data:`~snowflake_db.worker.MAX_LEASE_SECONDS` (one day). Every statement
    on the control database is bounded by a third of the lease, 1 to 10 s.

    Clocks: at every acquisition and renewal the clock given to ``acquire`` is compared with
    the database clock. Beyond ``clock_skew_warning_ms``
    a warning is logged; beyond ``max_clock_skew_ms`` (default: the generator's default rollback
    tolerance, 2000 ms) acquisition raises :class:`~snowflake_db.ClockSkewError`.

    Layout: the tables record the layout they serve (the first process's); acquiring with
    another raises :class:`~snowflake_db.LayoutMismatchError`.

    The URL must name the control database fully: a host or socket and a database (a file for
    SQLite), never left to the driver's defaults.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine,
        *,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        schema: str | None = None,
        create_tables: bool = True,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        renew_every: float | None = None,
        safety_margin: float | None = None,
        reserve_ahead_ms: int | None = None,
        max_floor_wait_ms: int = DEFAULT_MAX_FLOOR_WAIT_MS,
        clock_skew_warning_ms: int = _clock_skew.DEFAULT_CLOCK_SKEW_WARNING_MS,
        max_clock_skew_ms: int = _clock_skew.DEFAULT_MAX_CLOCK_SKEW_MS,
        hostname: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = to_url(url_or_engine)
        check_supported(self.url)
        timing = lease_timing(
            lease_seconds=lease_seconds,
            renew_every=renew_every,
            safety_margin=safety_margin,
            reserve_ahead_ms=reserve_ahead_ms,
        )
        self.lease_seconds, self.renew_every = timing.lease_seconds, timing.renew_every
        self.safety_margin, self.reserve_ahead_ms = timing.safety_margin, timing.reserve_ahead_ms
        self.max_floor_wait_ms = require_int("max_floor_wait_ms", max_floor_wait_ms, minimum=0)
        self.clock_skew = _clock_skew.SkewPolicy(
            warning_ms=clock_skew_warning_ms, max_ms=max_clock_skew_ms
        )
        self.hostname = (hostname or socket.gethostname() or "unknown")[:NAME_LENGTH]
        self.store = WorkerStore(
            slots_table=slots_table, registrations_table=registrations_table, schema=schema
        )
        self._control = ControlDatabase(
            self.url,
            self.store,
            create_tables=bool(create_tables),
            timeout_seconds=statement_seconds(self.lease_seconds),
            # A transaction idle for a whole lease is a frozen holder's (_engine.py).
            idle_transaction_seconds=idle_transaction_seconds(self.lease_seconds),
            engine_options=engine_options,
        )
        self._engine = self._control.engine
        self._lock = threading.Lock()
        self._closed = False
        self._terms = _claims.LeaseTerms(
            lease_ms=round(self.lease_seconds * 1000),
            reserve_ahead_ms=self.reserve_ahead_ms,
            max_floor_wait_ms=self.max_floor_wait_ms,
        )
        self._where = f"{self.store.tables.slots.name} at {safe_url_text(self.url)}"
        #: Lease figures for snowflake_db.metrics (acquisitions, renewals and their latency).
        self.metrics_recorder = MetricsRecorder.register(self)
        self._renewer = LeaseRenewer(
            self._engine,
            self.store,
            timing=timing,
            skew_policy=self.clock_skew,
            recorder=self.metrics_recorder,
        )
        _process_hooks.track(self._after_fork_in_child, self._close_at_exit)

    @property
    def where(self) -> str:
        """The slots table and the control database (password hidden), for messages."""
        return self._where

    @property
    def _heartbeat(self) -> Heartbeat:
        """The heartbeat renewing this allocator's leases (tests stop it to starve a lease)."""
        return self._renewer.heartbeat

    @property
    def _renew_for_caller(self) -> LeaseRenewer:
        """The renewer (its ``wait_seconds`` and ``hold_seconds`` bound a caller's wait)."""
        return self._renewer

    @property
    def create_tables_on_demand(self) -> bool:
        """Whether missing worker tables are created (``create_tables``) or reported."""
        return self._control.create_tables_on_demand

    # -- WorkerAllocator ------------------------------------------------------------------------

    def acquire(self, *, layout: Layout, clock: Clock) -> TableLease:
        """Claim a worker slot for this process; raise rather than return a shared one."""
        require_layout(layout)
        if not callable(clock):
            raise InvalidArgumentTypeError(f"clock must be a zero-argument callable, got {clock!r}")
        started = monotonic()
        try:
            lease = self._use(
                "cannot lease a worker ID (there is no fallback worker ID)",
                partial(self._acquire, layout=layout, clock=clock),
            )
        except SnowflakeError:
            self.metrics_recorder.acquisition_failed(monotonic() - started)
            raise
        self.metrics_recorder.lease_acquired(monotonic() - started)
        # Committed: only now may the heartbeat renew it and the generator use it.
        self._renewer.heartbeat.add(lease)
        _process_hooks.release_at_child_exit()
        lease.wait_for_floor(self.max_floor_wait_ms)
        return lease

    def check(self, *, layout: Layout, clock: Clock | None = None) -> int:
        """Lease a worker ID and give it back at once; return the worker ID that was free.

        For readiness and start-up probes (``snowflake-db workers check``): raises what
        :meth:`acquire` would (layout mismatch, clock skew, exhaustion, database down). Nothing
        stays behind: the slot is released with its high-water mark as it was (no ID was
        issued) and the registration row is deleted.
        """
        lease = self.acquire(layout=layout, clock=clock if clock is not None else default_clock())
        lease.issuing_through(0)  # nothing issued: release restores the previous holder's mark
        try:
            return lease.worker_id
        finally:
            lease.release()
            self._use(
                "cannot delete the check's registration row",
                partial(self.store.forget_registration, registration_id=lease.registration_id),
                transaction=True,
            )

    # -- administration ----------------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the worker tables if they are missing (safe when processes race to do it)."""
        forks.reset_if_forked()
        try:
            with self._engine.connect() as connection:
                self._control.create_tables(connection)
        except SQLAlchemyError as error:
            raise self._unavailable("cannot create the worker tables", error) from error

    def recorded_layout(self) -> RecordedLayout | None:
        """The layout the tables serve, or ``None`` before the first lease records one."""
        return self._use(
            "cannot read the recorded layout",
            partial(recorded_layout, store=self.store, where=self._where),
            transaction=True,
        )

    def measure_clock_skew(self, clock: Clock | None = None) -> _clock_skew.ClockSkew:
        """How far ``clock`` (default: the process clock) is from the database clock now."""
        return self._use(
            "cannot read the database clock",
            partial(
                _clock_skew.measure,
                store=self.store,
                clock=clock if clock is not None else default_clock(),
            ),
            transaction=True,
        )

    def workers(self) -> list[SlotRow]:
        """Every slot row (holder, expiry, high-water mark), stamped with the database time."""
        return self._use("cannot list worker slots", self.store.slots, transaction=True)

    def reap(self, worker_ids: Iterable[int] | None = None) -> list[int]:
        """Clear the leases the database clock says have expired; returns their worker IDs.

        Live leases and permanent reservations are never touched, and the rows (with their
        high-water marks) stay. Acquisition takes expired slots anyway: reaping only tidies up.
        ``worker_ids`` limits reaping to those slots (the Django admin's action on a selection).
        """
        only = None
        if worker_ids is not None:
            only = [require_int("worker_id", worker_id, minimum=0) for worker_id in worker_ids]
        return self._use(
            "cannot reap expired worker leases",
            partial(self.store.reap, worker_ids=only),
            transaction=True,
        )

    def slot_counts(self, layout: Layout | None = None) -> SlotCounts:
        """The layout's worker IDs by state, judged by the database clock (reads the slots
        table; for monitoring and reports, never on the hot path)."""
        layout = require_layout(layout if layout is not None else DEFAULT_LAYOUT)
        return SlotCounts.of(self.workers(), layout, self.max_floor_wait_ms)

    def prune_registrations(self, older_than_seconds: float = 86_400.0) -> int:
        """Delete registration rows older than this that no slot refers to; returns how many.

        The registrations table gains one row per acquisition; it is a log, not needed for
        safety (renewals match on the lease token), so old rows can go.
        """
        older_than_ms = round(require_seconds("older_than_seconds", older_than_seconds) * 1000)
        return self._use(
            "cannot prune worker registrations",
            partial(self.store.prune_registrations, older_than_ms=older_than_ms),
            transaction=True,
        )

    def reserve_worker_id(
        self, label: str, *, layout: Layout | None = None, worker_id: int | None = None
    ) -> int:
        """Claim a worker ID permanently, for IDs generated outside this library.

        Meant for a server-side ID function (such as the PostgreSQL function installed by
        ``snowflake_db.alembic``) that computes IDs with the database clock: the slot never
        expires, is never reaped and is never handed to a process. Only a slot whose high-water
        mark is already behind the database clock is taken. Pass ``worker_id`` to claim that
        exact slot; otherwise the highest free one is chosen. Undo with :meth:`release_reserved`.
        """
        if not isinstance(label, str) or not label.strip() or len(label) > NAME_LENGTH:
            raise InvalidArgumentError(
                f"label must be a non-empty string of at most {NAME_LENGTH} characters, "
                f"got {label!r}"
            )
        layout = layout if layout is not None else DEFAULT_LAYOUT
        if worker_id is not None:
            layout.check_worker_id(worker_id)
        return self._use(
            "cannot reserve a worker ID",
            partial(self._reserve, label=label, layout=layout, worker_id=worker_id),
            transaction=True,
        )

    def release_reserved(
        self, worker_id: int, *, label: str | None = None, issued_until_ms: int | None = None
    ) -> None:
        """End a permanent reservation made by :meth:`reserve_worker_id`.

        Stop the server-side function first: the slot's high-water mark is raised to the database
        clock plus a margin, so the next holder issues only above anything it produced. When the
        function ran on another database (whose clock may be ahead of this one), pass the last
        time it issued as ``issued_until_ms`` (Unix ms): the mark is raised to it too.
        """
        require_int("worker_id", worker_id, minimum=0)
        if issued_until_ms is not None:
            require_int("issued_until_ms", issued_until_ms, minimum=0)
        done = self._use(
            "cannot release a reserved worker ID",
            partial(
                _claims.release_reservation,
                store=self.store,
                worker_id=worker_id,
                label=label,
                issued_until_ms=issued_until_ms,
            ),
            transaction=True,
        )
        if not done:
            which = f" with label {label!r}" if label is not None else ""
            raise InvalidArgumentError(
                f"worker ID {worker_id} is not permanently reserved{which} in "
                f"{self.store.tables.slots.name}"
            )

    def close(self) -> None:
        """Release this process's leases, stop the heartbeat and close the connections."""
        forks.reset_if_forked()  # never the parent's heartbeat or pooled connections
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._renewer.release_all()
        self._engine.dispose()

    def __enter__(self) -> TableWorkerAllocator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<TableWorkerAllocator {safe_url_text(self.url)} "
            f"table={self.store.tables.slots.name} lease_seconds={self.lease_seconds}>"
        )

    # -- acquisition ---------------------------------------------------------------------------

    def _acquire(self, connection: Connection, *, layout: Layout, clock: Clock) -> TableLease:
        # Before anything is written (the layout record included): a clock this far off is
        # refused outright.
        with connection.begin():
            skew = _clock_skew.measure(connection, self.store, clock)
        self.clock_skew.at_acquisition(skew, self._where)
        claimed = _claims.acquire(
            connection,
            self.store,
            holder=_claims.Claimant(self.hostname, os.getpid()),
            terms=self._terms,
            layout=layout,
            clock=clock,
            where=self._where,
        )
        return self._renewer.hold(claimed, clock=clock, where=self._where)

    def _reserve(
        self, connection: Connection, *, label: str, layout: Layout, worker_id: int | None
    ) -> int:
        holder = _claims.Claimant(self.hostname, os.getpid())
        registration_id = _claims.register(connection, self.store, holder)
        reserved, _ = _claims.reserve(
            connection,
            self.store,
            label=label,
            holder=holder,
            layout=layout,
            worker_id=worker_id,
            registration_id=registration_id,
            where=self._where,
        )
        return reserved

    # -- process hooks (see _process_hooks.py) -----------------------------------------------

    def _after_fork_in_child(self, parent_pid: int) -> None:
        """This allocator's part of the child's one after-fork reset (:mod:`snowflake_db.forks`):
        fresh lock, the parent's pooled connections left open for it, its leases forgotten."""
        self._lock = threading.Lock()
        _process_hooks.keep_parent_sqlite_connections(self._engine)
        self._engine.dispose(close=False)
        self._renewer.after_fork_in_child(parent_pid)

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except Exception as error:  # never turn a clean exit into a traceback
            logger.warning("snowflake_db: closing %r at exit failed: %s", self, error)

    # -- helpers -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        forks.reset_if_forked()  # a fork without Python's hooks: reset before any connection
        if self._closed:
            raise AllocatorUnavailableError(f"{self!r} was closed")

    def _use(
        self, action: str, work: Callable[[Connection], _T], *, transaction: bool = False
    ) -> _T:
        """Run ``work`` on the control database (in one transaction if asked); a database
        failure becomes :class:`AllocatorUnavailableError` saying what ``action`` was."""
        self._check_open()
        try:
            return self._control.run(work, transaction=transaction)
        except SnowflakeError:
            raise
        except SQLAlchemyError as error:
            raise self._unavailable(action, error) from error

    def _unavailable(self, action: str, error: BaseException) -> AllocatorUnavailableError:
        return AllocatorUnavailableError(
            f"{action}: the worker database {safe_url_text(self.url)} failed: "
            f"{describe_error(error)}"
        )
