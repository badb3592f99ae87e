"""``TableWorkerAllocator``: lease a worker ID from a table in a shared control database.

Acquisition, in the allocator's own connection and short transactions:

1. insert a registration row and read its generated key back (RETURNING or lastrowid);
2. the preferred worker ID is ``key & layout.max_worker_id``; claim it atomically (a conditional
   UPDATE of a free/expired row, or an INSERT guarded by the primary key);
3. if it is held (wrap-around, gaps, repeated keys after a MariaDB restart), read the slot table
   as a hint and try the claimable slots in turn, each claim atomic again; after a bounded number
   of rounds raise :class:`~snowflake_db.WorkerIdExhaustedError`.

Within the claim's transaction the previous holder's high-water mark becomes this lease's
``floor_ms`` and a new mark (``clock() + reserve``) is stored before the lease is handed out.
"""

from __future__ import annotations

import logging
import math
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from .._validate import require_int
from ..clock import Clock, MonotonicClock
from ..errors import (
    AllocatorUnavailableError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    SnowflakeError,
    WorkerIdExhaustedError,
)
from ..layout import DEFAULT_LAYOUT, Layout
from . import forking
from .connection import (
    check_supported,
    make_engine,
    safe_url_text,
    to_url,
)
from .lease import ABANDONED, HELD, LOST, RELEASED, Heartbeat, TableLease
from .schema import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE, NAME_LENGTH
from .store import Claim, SlotRow, WorkerStore

logger = logging.getLogger("snowflake_db.worker")
_T = TypeVar("_T")

#: Default lease length: a crashed holder's worker ID is reusable this long after its last renewal.
DEFAULT_LEASE_SECONDS = 30.0
#: Default bound on waiting for a previous holder's high-water mark to pass (else: another slot).
DEFAULT_MAX_FLOOR_WAIT_MS = 1000
#: How many times the slot table is re-read when every claim of a round lost a race.
_SCAN_ROUNDS = 3
#: CREATE TABLE attempts when other processes race to create the tables.
_CREATE_ATTEMPTS = 5
#: Registration inserts tried when the generated key collides with an existing row.
_REGISTER_ATTEMPTS = 5
#: Margin added to a released reservation's high-water mark (database clock), in ms.
_RESERVATION_RELEASE_MARGIN_MS = 1000


@dataclass(frozen=True, slots=True)
class _Tally:
    """Why slots could not be taken, for the exhaustion message."""

    live: int = 0
    reserved: int = 0
    ahead: int = 0


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
        hostname: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = to_url(url_or_engine)
        check_supported(self.url)
        self.lease_seconds = _positive_seconds("lease_seconds", lease_seconds)
        self.renew_every = _positive_seconds(
            "renew_every", renew_every if renew_every is not None else self.lease_seconds / 3
        )
        self.safety_margin = _seconds(
            "safety_margin",
            safety_margin if safety_margin is not None else self.lease_seconds / 5,
        )
        if self.renew_every >= self.lease_seconds - self.safety_margin:
            raise InvalidArgumentError(
                f"renew_every={self.renew_every} s must be shorter than lease_seconds - "
                f"safety_margin = {self.lease_seconds - self.safety_margin} s, or every lease "
                "would pass its local deadline before its first renewal"
            )
        self.reserve_ahead_ms = require_int(
            "reserve_ahead_ms",
            reserve_ahead_ms if reserve_ahead_ms is not None else round(lease_seconds * 1000),
            minimum=1,
        )
        self.max_floor_wait_ms = require_int("max_floor_wait_ms", max_floor_wait_ms, minimum=0)
        self.create_tables_on_demand = bool(create_tables)
        self.hostname = (hostname or socket.gethostname() or "unknown")[:NAME_LENGTH]
        self.store = WorkerStore(
            slots_table=slots_table, registrations_table=registrations_table, schema=schema
        )
        timeout = min(10.0, max(1.0, self.lease_seconds / 3))
        try:
            self._engine = make_engine(
                self.url, timeout_seconds=timeout, engine_options=engine_options
            )
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"the database driver for {safe_url_text(self.url)} is not installed "
                f"({error}); install it, e.g. pip install 'snowflake-db[postgres]' (psycopg) "
                "or 'snowflake-db[mysql]' (PyMySQL)",
                name=error.name,
            ) from error
        self._lock = threading.Lock()
        self._tables_ready = False
        self._closed = False
        self._pid = os.getpid()
        self._heartbeat = Heartbeat(self._renew, name="snowflake_db-heartbeat")
        forking.track(self)

    # -- WorkerAllocator ------------------------------------------------------------------------

    def acquire(self, *, layout: Layout, clock: Clock) -> TableLease:
        """Claim a worker slot for this process; raise rather than return a shared one."""
        if not isinstance(layout, Layout):
            raise InvalidArgumentTypeError(
                f"layout must be a snowflake_db.Layout, got {type(layout).__name__}"
            )
        if not callable(clock):
            raise InvalidArgumentTypeError(f"clock must be a zero-argument callable, got {clock!r}")
        self._check_open()
        try:
            lease = self._run(partial(self._acquire, layout=layout, clock=clock))
        except SnowflakeError:
            raise
        except SQLAlchemyError as error:
            raise self._unavailable(
                "cannot lease a worker ID (there is no fallback worker ID)", error
            ) from error
        # Committed: only now may the heartbeat renew it and the generator use it.
        self._heartbeat.add(lease)
        self._wait_for_floor(lease, clock)
        return lease

    # -- administration ----------------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the worker tables if they are missing (safe when processes race to do it)."""
        try:
            with self._engine.connect() as connection:
                self._create_tables(connection)
        except SQLAlchemyError as error:
            raise self._unavailable("cannot create the worker tables", error) from error

    def workers(self) -> list[SlotRow]:
        """Every slot row (holder, expiry, high-water mark), stamped with the database time."""
        self._check_open()
        try:
            return self._run(self._in_transaction(self.store.slots))
        except SQLAlchemyError as error:
            raise self._unavailable("cannot list worker slots", error) from error

    def reap(self) -> list[int]:
        """Clear the leases the database clock says have expired; returns their worker IDs.

        Live leases and permanent reservations are never touched, and the rows (with their
        high-water marks) stay. Acquisition takes expired slots anyway: reaping only tidies up.
        """
        self._check_open()
        try:
            return self._run(self._in_transaction(self.store.reap))
        except SQLAlchemyError as error:
            raise self._unavailable("cannot reap expired worker leases", error) from error

    def prune_registrations(self, older_than_seconds: float = 86_400.0) -> int:
        """Delete registration rows older than this that no slot refers to; returns how many.

        The registrations table gains one row per acquisition; it is a log, not needed for
        safety (renewals match on the lease token), so old rows can go.
        """
        older_than_ms = round(_seconds("older_than_seconds", older_than_seconds) * 1000)
        self._check_open()
        try:
            return self._run(
                self._in_transaction(
                    partial(self.store.prune_registrations, older_than_ms=older_than_ms)
                )
            )
        except SQLAlchemyError as error:
            raise self._unavailable("cannot prune worker registrations", error) from error

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
        self._check_open()
        try:
            return self._run(
                partial(self._reserve, label=label, layout=layout, worker_id=worker_id)
            )
        except SnowflakeError:
            raise
        except SQLAlchemyError as error:
            raise self._unavailable("cannot reserve a worker ID", error) from error

    def release_reserved(self, worker_id: int, *, label: str | None = None) -> None:
        """End a permanent reservation made by :meth:`reserve_worker_id`.

        Stop the server-side function first: the slot's high-water mark is raised to the database
        clock plus a margin, so the next holder issues only above anything it produced.
        """
        require_int("worker_id", worker_id, minimum=0)
        self._check_open()
        try:
            done = self._run(
                self._in_transaction(
                    partial(
                        self.store.release_reserved,
                        worker_id=worker_id,
                        margin_ms=_RESERVATION_RELEASE_MARGIN_MS,
                        label=label,
                    )
                )
            )
        except SQLAlchemyError as error:
            raise self._unavailable("cannot release a reserved worker ID", error) from error
        if not done:
            which = f" with label {label!r}" if label is not None else ""
            raise InvalidArgumentError(
                f"worker ID {worker_id} is not permanently reserved{which} in "
                f"{self.store.tables.slots.name}"
            )

    def close(self) -> None:
        """Release this process's leases, stop the heartbeat and close the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._heartbeat.stop()
        for lease in self._heartbeat.leases:
            self._release(lease)
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
        pid = os.getpid()
        # The common case is one transaction: register, claim the preferred slot, commit.
        registration_id, lease = _retry_conflicts(
            lambda: self._register_and_claim(connection, pid, layout, clock)
        )
        preferred = registration_id & layout.max_worker_id
        tally = _Tally()
        for _ in range(_SCAN_ROUNDS):
            if lease is not None:
                return lease
            with connection.begin():
                rows = self.store.slots(connection)
            candidates, tally = self._candidates(rows, layout, preferred, clock)
            if not candidates:
                break
            for worker_id in candidates:
                lease = _retry_conflicts(
                    partial(
                        self._claim_in_transaction,
                        connection,
                        worker_id,
                        registration_id,
                        layout,
                        clock,
                    )
                )
                if lease is not None:
                    return lease
        if lease is not None:
            return lease
        with connection.begin():
            self.store.forget_registration(connection, registration_id=registration_id)
        raise self._exhausted(layout, tally)

    def _register_and_claim(
        self, connection: Connection, pid: int, layout: Layout, clock: Clock
    ) -> tuple[int, TableLease | None]:
        with connection.begin():
            registration_id = self._register(connection, pid)
            preferred = registration_id & layout.max_worker_id
            return registration_id, self._try_slot(
                connection, preferred, registration_id, layout, clock
            )

    def _claim_in_transaction(
        self,
        connection: Connection,
        worker_id: int,
        registration_id: int,
        layout: Layout,
        clock: Clock,
    ) -> TableLease | None:
        with connection.begin():
            return self._try_slot(connection, worker_id, registration_id, layout, clock)

    def _register(self, connection: Connection, pid: int) -> int:
        """Insert a registration row (inside the caller's transaction); retry a few times if
        the generated key already exists (a sequence reset by a restore, reused values)."""
        for attempt in range(_REGISTER_ATTEMPTS):
            savepoint = connection.begin_nested()
            try:
                registration_id = self.store.register(connection, hostname=self.hostname, pid=pid)
            except IntegrityError:
                savepoint.rollback()
                if attempt == _REGISTER_ATTEMPTS - 1:
                    raise
                continue
            savepoint.commit()
            return registration_id
        raise AssertionError("unreachable")  # pragma: no cover

    def _try_slot(
        self,
        connection: Connection,
        worker_id: int,
        registration_id: int,
        layout: Layout,
        clock: Clock,
    ) -> TableLease | None:
        """One atomic claim of ``worker_id`` inside the caller's transaction.

        Returns ``None`` if the slot is not ours to take. The claim runs in a savepoint so a
        refusal (a duplicate key aborts the whole transaction on PostgreSQL otherwise, or a
        high-water mark too far ahead) undoes only the claim. The lease is usable only once the
        caller has committed.
        """
        token = secrets.token_hex(16)
        claim = Claim(
            worker_id=worker_id,
            token=token,
            registration_id=registration_id,
            hostname=self.hostname,
            pid=os.getpid(),
            lease_ms=round(self.lease_seconds * 1000),
        )
        # Before the claim statement: the database computes the expiry later than this.
        started = time.monotonic()
        savepoint = connection.begin_nested()
        try:
            if self.store.claim_existing(connection, claim):
                floor = self.store.held_high_water(connection, worker_id=worker_id, token=token)
                now_ms = clock()
                if floor - now_ms > self.max_floor_wait_ms:
                    savepoint.rollback()  # the slot stays as it was: free or expired
                    return None
                high_water_ms = max(floor, now_ms) + self.reserve_ahead_ms
                self.store.set_high_water(
                    connection, worker_id=worker_id, token=token, high_water_ms=high_water_ms
                )
                floor_ms = floor if floor > 0 else None
            else:
                # No row yet, or a live holder: INSERT, the primary key decides.
                high_water_ms = clock() + self.reserve_ahead_ms
                if not self.store.claim_new(connection, claim, high_water_ms=high_water_ms):
                    savepoint.rollback()
                    return None
                floor_ms = None
            self.store.note_worker(connection, registration_id=registration_id, worker_id=worker_id)
            savepoint.commit()
        except BaseException:
            if savepoint.is_active:
                savepoint.rollback()
            raise
        return TableLease(
            worker_id=worker_id,
            token=token,
            registration_id=registration_id,
            floor_ms=floor_ms,
            high_water_ms=high_water_ms,
            valid_until=started + self.lease_seconds - self.safety_margin,
            next_renewal_at=started + self.renew_every,
            layout=layout,
            clock=clock,
            where=f"{self.store.tables.slots.name} at {safe_url_text(self.url)}",
            release=self._release,
            abandon=self._abandon,
        )

    def _candidates(
        self, rows: list[SlotRow], layout: Layout, preferred: int, clock: Clock
    ) -> tuple[list[int], _Tally]:
        """Slots that look claimable, starting after ``preferred`` (a hint; claims re-check)."""
        size = layout.max_worker_id + 1
        by_id = {row.worker_id: row for row in rows if row.worker_id < size}
        now_ms = clock()
        live = reserved = ahead = 0
        candidates: list[int] = []
        for offset in range(1, size + 1):
            worker_id = (preferred + offset) % size
            row = by_id.get(worker_id)
            if row is None:
                candidates.append(worker_id)
            elif row.reserved:
                reserved += 1
            elif row.live:
                live += 1
            elif row.high_water_ms - now_ms > self.max_floor_wait_ms:
                ahead += 1
            else:
                candidates.append(worker_id)
        return candidates, _Tally(live=live, reserved=reserved, ahead=ahead)

    def _exhausted(self, layout: Layout, tally: _Tally) -> WorkerIdExhaustedError:
        size = layout.max_worker_id + 1
        parts = [f"{tally.live} held by live leases"]
        if tally.reserved:
            parts.append(f"{tally.reserved} reserved permanently")
        if tally.ahead:
            parts.append(
                f"{tally.ahead} free but with a high-water mark more than "
                f"{self.max_floor_wait_ms} ms ahead of this process's clock (clock set back?)"
            )
        busy = tally.live + tally.reserved + tally.ahead
        if busy < size:
            parts.append(f"{size - busy} lost every claim race ({_SCAN_ROUNDS} rounds)")
        return WorkerIdExhaustedError(
            f"no worker ID is free: all {size} worker IDs (worker_bits={layout.worker_bits}) in "
            f"{self.store.tables.slots.name} at {safe_url_text(self.url)} are taken: "
            f"{', '.join(parts)}. No worker ID was handed out; wait for leases to expire, "
            "reap dead ones (snowflake-db workers reap) or use more worker bits"
        )

    def _wait_for_floor(self, lease: TableLease, clock: Clock) -> None:
        """Wait (bounded) until the clock is past the previous holder's high-water mark."""
        floor = lease.floor_ms
        if floor is None:
            return
        give_up = time.monotonic() + self.max_floor_wait_ms / 1000 + 0.05
        while clock() <= floor and time.monotonic() < give_up:
            time.sleep(min(0.05, max(0.001, (floor - clock() + 1) / 1000)))

    def _reserve(
        self, connection: Connection, *, label: str, layout: Layout, worker_id: int | None
    ) -> int:
        pid = os.getpid()
        # A given slot, else the highest first (registrations start at the low end).
        order = [worker_id] if worker_id is not None else range(layout.max_worker_id, -1, -1)
        with connection.begin():
            registration_id = self._register(connection, pid)
            rows = {row.worker_id: row for row in self.store.slots(connection)}
        for candidate in order:
            row = rows.get(candidate)
            if row is not None and (row.live or row.high_water_ms > row.db_now_ms):
                continue  # a hint only: the claim below re-checks atomically
            claim = Claim(
                worker_id=candidate,
                token=secrets.token_hex(16),
                registration_id=registration_id,
                hostname=self.hostname,
                pid=pid,
                lease_ms=None,
                label=label,
            )
            with connection.begin():
                if self._claim_reserved(connection, claim):
                    return candidate
        with connection.begin():
            self.store.forget_registration(connection, registration_id=registration_id)
        if worker_id is not None:
            raise WorkerIdExhaustedError(
                f"worker ID {worker_id} cannot be reserved: it is held, reserved, or its "
                "high-water mark is ahead of the database clock"
            )
        raise WorkerIdExhaustedError(
            f"no worker ID can be reserved: all {layout.max_worker_id + 1} are held, reserved "
            "or have a high-water mark ahead of the database clock"
        )

    def _claim_reserved(self, connection: Connection, claim: Claim) -> bool:
        """Claim a slot permanently, only if its high-water mark is behind the database clock
        (a server-side function issues with the database clock)."""
        savepoint = connection.begin_nested()
        try:
            if self.store.claim_existing(connection, claim):
                mark = self.store.held_high_water(
                    connection, worker_id=claim.worker_id, token=claim.token
                )
                if mark > self.store.now_ms(connection):
                    savepoint.rollback()
                    return False
            elif not self.store.claim_new(connection, claim, high_water_ms=0):
                savepoint.rollback()
                return False
            self.store.note_worker(
                connection, registration_id=claim.registration_id, worker_id=claim.worker_id
            )
            savepoint.commit()
        except BaseException:
            if savepoint.is_active:
                savepoint.rollback()
            raise
        return True

    # -- holding ---------------------------------------------------------------------------------

    def _renew(self, lease: TableLease) -> None:
        """Heartbeat: extend one lease and its high-water mark, or learn that it was lost."""
        if lease.state != HELD or lease.pid != os.getpid():
            self._heartbeat.discard(lease)
            return
        started = time.monotonic()
        try:
            high_water_ms = max(lease.high_water_ms, lease.clock() + self.reserve_ahead_ms)
            with self._engine.begin() as connection:
                renewed = self.store.renew(
                    connection,
                    worker_id=lease.worker_id,
                    token=lease.token,
                    lease_ms=round(self.lease_seconds * 1000),
                    high_water_ms=high_water_ms,
                )
        except Exception as error:
            lease.failures += 1
            lease.last_error = _describe(error)
            lease.next_renewal_at = time.monotonic() + self.renew_every / 4
            if lease.failures == 1:
                logger.warning(
                    "snowflake_db: renewing the lease on worker %d failed (%s); retrying",
                    lease.worker_id,
                    lease.last_error,
                )
            return
        with lease.lock:
            if lease.state != HELD:
                return
            if renewed:
                lease.renewed(
                    started=started,
                    valid_for=self.lease_seconds - self.safety_margin,
                    high_water_ms=high_water_ms,
                )
                lease.next_renewal_at = started + self.renew_every
                return
            lease.end(LOST, "the slot was taken by another holder or reaped after it expired")
        self._heartbeat.discard(lease)
        logger.warning(
            "snowflake_db: the lease on worker %d was lost; a new worker ID will be leased",
            lease.worker_id,
        )

    def _release(self, lease: TableLease) -> None:
        with lease.lock:
            if lease.state in (RELEASED, ABANDONED):
                return
            was_held = lease.state == HELD
            reserved_ms = lease.high_water_ms
            # Stop the generator first (deadline and ceiling), so every window it may still
            # issue from was opened with a clock reading taken before the one below.
            lease.end(RELEASED, "released", high_water_ms=-1)
            final_ms = reserved_ms
            if isinstance(lease.clock, MonotonicClock):
                # A monotonic clock is at or past every tick the generator read, so nothing above
                # "now" was issued: lower the mark so the slot is reusable at once.
                final_ms = min(reserved_ms, lease.clock() + 1)
            lease.set_high_water(final_ms)
        self._heartbeat.discard(lease)
        if not was_held or lease.pid != os.getpid():
            return
        try:
            with self._engine.begin() as connection:
                self.store.release(
                    connection,
                    worker_id=lease.worker_id,
                    token=lease.token,
                    high_water_ms=final_ms,
                )
        except SQLAlchemyError as error:
            logger.warning(
                "snowflake_db: could not release worker %d (%s); its lease expires by itself",
                lease.worker_id,
                _describe(error),
            )

    def _abandon(self, lease: TableLease) -> None:
        with lease.lock:
            if lease.state == HELD:
                lease.end(ABANDONED, "abandoned (forked child)")
        if lease.pid == os.getpid():
            self._heartbeat.discard(lease)

    # -- process hooks (see forking.py) -----------------------------------------------------

    def _after_fork_in_child(self, parent_pid: int) -> None:
        self._lock = threading.Lock()
        self._engine.dispose(close=False)
        for lease in self._heartbeat.inherited_leases():
            lease.forget_after_fork(parent_pid)
        self._heartbeat = Heartbeat(self._renew, name="snowflake_db-heartbeat")
        self._pid = os.getpid()

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except Exception as error:  # never turn a clean exit into a traceback
            logger.warning("snowflake_db: closing %r at exit failed: %s", self, error)

    # -- helpers -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise AllocatorUnavailableError(f"{self!r} was closed")

    def _in_transaction(self, work: Callable[[Connection], _T]) -> Callable[[Connection], _T]:
        def run(connection: Connection) -> _T:
            with connection.begin():
                return work(connection)

        return run

    def _run(self, work: Callable[[Connection], _T]) -> _T:
        """Run ``work`` on one of the allocator's connections.

        Until the tables are known to exist, a database error from ``work`` triggers a check:
        missing tables are created (``create_tables=True``, then ``work`` runs again) or
        reported. Checking only after a failure keeps the inspection off the common path.
        """
        with self._engine.connect() as connection:
            if self._tables_ready:
                return work(connection)
            try:
                result = work(connection)
            except DBAPIError as error:
                if error.connection_invalidated:
                    raise
                if connection.in_transaction():
                    connection.rollback()
                with connection.begin():
                    missing = self.store.missing_tables(connection)
                if missing and not self.create_tables_on_demand:
                    raise AllocatorUnavailableError(
                        f"the worker tables {', '.join(missing)} do not exist in "
                        f"{safe_url_text(self.url)}: create them with a migration "
                        "(snowflake_db.alembic / the snowflake_db Django app) or pass "
                        "create_tables=True"
                    ) from None
                if missing:
                    self._create_tables(connection)
                # Once more, with the tables in place (perhaps just created by another
                # process, which is also why none may be missing now); a second failure is real.
                result = work(connection)
            self._tables_ready = True
            return result

    def _create_tables(self, connection: Connection) -> None:
        """CREATE TABLE for missing tables, tolerating processes that race to do the same.

        A racing process may have created one table and not yet the other, so after a failure
        the check (``checkfirst``) and creation run again, a bounded number of times.
        """
        for attempt in range(1, _CREATE_ATTEMPTS + 1):
            try:
                with connection.begin():
                    self.store.create_tables(connection)
                break
            except DBAPIError:
                with connection.begin():
                    if not self.store.missing_tables(connection):
                        break
                if attempt == _CREATE_ATTEMPTS:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * attempt)
        self._tables_ready = True

    def _unavailable(self, action: str, error: BaseException) -> AllocatorUnavailableError:
        return AllocatorUnavailableError(
            f"{action}: the worker database {safe_url_text(self.url)} failed: {_describe(error)}"
        )


#: Driver error codes of a transaction the server aborted to break a lock conflict: retry it.
#: MySQL/MariaDB 1213 deadlock, 1205 lock wait timeout; SQLSTATE 40001 serialization failure,
#: 40P01 deadlock (PostgreSQL).
_CONFLICT_CODES = {1213, 1205}
_CONFLICT_SQLSTATES = {"40001", "40P01"}
_CONFLICT_ATTEMPTS = 5


def _is_conflict(error: DBAPIError) -> bool:
    original = error.orig
    if getattr(original, "sqlstate", None) in _CONFLICT_SQLSTATES:
        return True
    args: tuple[object, ...] = getattr(original, "args", ())
    return bool(args) and args[0] in _CONFLICT_CODES


def _retry_conflicts(attempt: Callable[[], _T]) -> _T:
    """Run a whole transaction again (bounded) if the server aborted it over a lock conflict."""
    for number in range(1, _CONFLICT_ATTEMPTS + 1):
        try:
            return attempt()
        except DBAPIError as error:
            if number == _CONFLICT_ATTEMPTS or not _is_conflict(error):
                raise
            time.sleep(random.uniform(0.005, 0.05) * number)
    raise AssertionError("unreachable")  # pragma: no cover


def _describe(error: BaseException) -> str:
    cause = getattr(error, "orig", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentTypeError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be at least 0 seconds, got {value}")
    return float(value)


def _positive_seconds(name: str, value: float) -> float:
    seconds = _seconds(name, value)
    if seconds <= 0:
        raise InvalidArgumentError(f"{name} must be more than 0 seconds, got {value}")
    return seconds
