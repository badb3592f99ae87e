"""Every claim on the worker slot table: process leases, permanent reservations, their release.

The one owner of *how* a slot is taken. :class:`~snowflake_db.worker.TableWorkerAllocator`
leases slots for processes, and the Alembic operations reserve slots for a server-side ID function
and free them again, through these functions only. Each runs on a
:class:`~sqlalchemy.Connection` inside the caller's transaction (only :func:`acquire` commits as
it goes), with the statements of :class:`~._store.WorkerStore`.

Every claim is atomic: a conditional UPDATE of a free or expired row, or an INSERT the primary key
guards, in a savepoint so a refusal undoes only that claim. Reading the slot table first is a hint
for which slots to try, never a decision.

Every claim first checks the layout record (:func:`~._layout_record.ensure_layout`):
a process or reservation with another layout than the one the tables serve takes no slot.

Acquisition, in short transactions on the allocator's own connection:

1. check (or, on first use, record) the layout, in a transaction of its own: the first
   process's record is committed before its claim begins, so processes starting beside it wait
   for that one INSERT at most, never for a claim the machine has descheduled;
2. insert a registration row and read its generated key back (RETURNING or lastrowid);
3. the preferred worker ID is ``key & layout.max_worker_id``; claim it, in the registration's
   transaction (the common case: one transaction after the layout check);
4. if it is held (wrap-around, gaps, repeated keys after a MariaDB restart), read the slot table
   and try the claimable slots in turn; after :data:`SCAN_ROUNDS` rounds raise
   :class:`~snowflake_db.WorkerIdExhaustedError`.

Within the claim's transaction the previous holder's high-water mark becomes the lease's
``floor_ms`` and a new mark (``clock() + reserve_ahead_ms``) is stored before the lease is used.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from ..clock import Clock, monotonic
from ..errors import WorkerIdExhaustedError
from ..layout import Layout
from ._engine import retry, retry_conflicts
from ._layout_record import ensure_layout
from ._store import Claim, SlotRow, WorkerStore

#: How many times the slot table is re-read when every claim of a round lost a race.
SCAN_ROUNDS = 3
#: How far past the database clock a released reservation's high-water mark is set, in ms: a
#: server-side function issued with the database clock, so the next holder starts above it.
RELEASE_MARGIN_MS = 1000
#: Registration inserts tried when the generated key collides with an existing row.
_REGISTER_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Claimant:
    """The process claiming a slot: host and PID (stored in the slot row, for people reading
    the table)."""

    hostname: str
    pid: int

    def claim(
        self,
        worker_id: int,
        *,
        registration_id: int | None,
        lease_ms: int | None,
        label: str | None = None,
    ) -> Claim:
        """A claim of ``worker_id`` with a fresh random token (``lease_ms=None``: permanent)."""
        return Claim(
            worker_id=worker_id,
            token=secrets.token_hex(16),
            registration_id=registration_id,
            hostname=self.hostname,
            pid=self.pid,
            lease_ms=lease_ms,
            label=label,
        )


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How long a lease lasts, how far ahead its mark goes, how long a floor may be waited for."""

    lease_ms: int
    reserve_ahead_ms: int
    max_floor_wait_ms: int


@dataclass(frozen=True, slots=True)
class ClaimedSlot:
    """A slot claimed for this process; usable once the claim's transaction has committed.

    ``started`` is the monotonic time taken before the claim statement: the database computed
    the expiry later than this, so a local deadline counted from it is conservative.
    """

    worker_id: int
    token: str
    registration_id: int
    floor_ms: int | None
    high_water_ms: int
    started: float


@dataclass(frozen=True, slots=True)
class UnclaimableSlots:
    """How many slots could not be claimed, by reason, for the exhaustion message."""

    live: int = 0
    reserved: int = 0
    ahead: int = 0


# -- leases ------------------------------------------------------------------------------------


def acquire(
    connection: Connection,
    store: WorkerStore,
    *,
    holder: Claimant,
    terms: LeaseTerms,
    layout: Layout,
    clock: Clock,
    where: str,
) -> ClaimedSlot:
    """Claim a slot for a process in short transactions of its own (``connection`` has none open).

    ``where`` names the table and database in the messages (exhaustion, layout mismatch).
    """

    def claim(worker_id: int, registration_id: int) -> ClaimedSlot | None:
        return claim_lease(
            connection,
            store,
            worker_id=worker_id,
            registration_id=registration_id,
            holder=holder,
            terms=terms,
            clock=clock,
        )

    def check_layout() -> None:
        with connection.begin():
            ensure_layout(
                connection, store, layout, hostname=holder.hostname, pid=holder.pid, where=where
            )

    def register_and_claim() -> tuple[int, ClaimedSlot | None]:
        # The common case is this one transaction: register, claim the preferred slot, commit.
        with connection.begin():
            registration_id = register(connection, store, holder)
            return registration_id, claim(registration_id & layout.max_worker_id, registration_id)

    def claim_committed(worker_id: int) -> ClaimedSlot | None:
        with connection.begin():
            return claim(worker_id, registration_id)

    # The layout in a transaction of its own: on first use the record is committed at once, so
    # processes starting beside this one wait for one INSERT, never for this one's whole claim
    # (which a loaded machine may stall past their statement bound).
    retry_conflicts(check_layout)
    registration_id, taken = retry_conflicts(register_and_claim)
    preferred = registration_id & layout.max_worker_id
    unclaimable = UnclaimableSlots()
    for _ in range(SCAN_ROUNDS):
        if taken is not None:
            return taken
        with connection.begin():
            rows = store.slots(connection)
        candidates, unclaimable = _candidates(
            rows, layout, preferred, clock(), terms.max_floor_wait_ms
        )
        if not candidates:
            break
        for worker_id in candidates:
            taken = retry_conflicts(partial(claim_committed, worker_id))
            if taken is not None:
                return taken
    if taken is not None:
        return taken
    with connection.begin():
        store.forget_registration(connection, registration_id=registration_id)
    raise _exhausted(layout, unclaimable, terms.max_floor_wait_ms, where)


def register(connection: Connection, store: WorkerStore, holder: Claimant) -> int:
    """Insert a registration row (inside the caller's transaction); retry a few times if the
    generated key already exists (a sequence reset by a restore, reused values)."""

    def attempt() -> int:
        with connection.begin_nested():
            return store.register(connection, hostname=holder.hostname, pid=holder.pid)

    return retry(
        attempt,
        attempts=_REGISTER_ATTEMPTS,
        retryable=lambda error: isinstance(error, IntegrityError),
        pause=lambda _: 0.0,
    )


def claim_lease(
    connection: Connection,
    store: WorkerStore,
    *,
    worker_id: int,
    registration_id: int,
    holder: Claimant,
    terms: LeaseTerms,
    clock: Clock,
) -> ClaimedSlot | None:
    """One atomic claim of ``worker_id`` inside the caller's transaction.

    Returns ``None`` if the slot is not ours to take. The claim runs in a savepoint so a refusal
    (a duplicate key aborts the whole transaction on PostgreSQL otherwise, or a high-water mark
    too far ahead) undoes only the claim.
    """
    claim = holder.claim(worker_id, registration_id=registration_id, lease_ms=terms.lease_ms)
    # Before the claim statement: the database computes the expiry later than this.
    started = monotonic()
    savepoint = connection.begin_nested()
    try:
        if store.claim_existing(connection, claim):
            floor = store.held_high_water(connection, worker_id=worker_id, token=claim.token)
            now_ms = clock()
            if floor - now_ms > terms.max_floor_wait_ms:
                savepoint.rollback()  # the slot stays as it was: free or expired
                return None
            high_water_ms = max(floor, now_ms) + terms.reserve_ahead_ms
            store.set_high_water(
                connection, worker_id=worker_id, token=claim.token, high_water_ms=high_water_ms
            )
            floor_ms = floor if floor > 0 else None
        else:
            # No row yet, or a live holder: INSERT, the primary key decides.
            high_water_ms = clock() + terms.reserve_ahead_ms
            if not store.claim_new(connection, claim, high_water_ms=high_water_ms):
                savepoint.rollback()
                return None
            floor_ms = None
        store.note_worker(connection, registration_id=registration_id, worker_id=worker_id)
        savepoint.commit()
    except BaseException:
        if savepoint.is_active:
            savepoint.rollback()
        raise
    return ClaimedSlot(
        worker_id=worker_id,
        token=claim.token,
        registration_id=registration_id,
        floor_ms=floor_ms,
        high_water_ms=high_water_ms,
        started=started,
    )


def _candidates(
    rows: list[SlotRow], layout: Layout, preferred: int, now_ms: int, max_floor_wait_ms: int
) -> tuple[list[int], UnclaimableSlots]:
    """Slots that look claimable, starting after ``preferred`` (a hint; claims re-check)."""
    size = layout.max_worker_id + 1
    by_id = {row.worker_id: row for row in rows if row.worker_id < size}
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
        elif row.high_water_ms - now_ms > max_floor_wait_ms:
            ahead += 1
        else:
            candidates.append(worker_id)
    return candidates, UnclaimableSlots(live=live, reserved=reserved, ahead=ahead)


def _exhausted(
    layout: Layout, unclaimable: UnclaimableSlots, max_floor_wait_ms: int, where: str
) -> WorkerIdExhaustedError:
    size = layout.max_worker_id + 1
    parts = [f"{unclaimable.live} held by live leases"]
    if unclaimable.reserved:
        parts.append(f"{unclaimable.reserved} reserved permanently")
    if unclaimable.ahead:
        parts.append(
            f"{unclaimable.ahead} free but with a high-water mark more than "
            f"{max_floor_wait_ms} ms ahead of this process's clock (clock set back?)"
        )
    busy = unclaimable.live + unclaimable.reserved + unclaimable.ahead
    if busy < size:
        parts.append(f"{size - busy} lost every claim race ({SCAN_ROUNDS} rounds)")
    return WorkerIdExhaustedError(
        f"no worker ID is free: all {size} worker IDs (worker_bits={layout.worker_bits}) in "
        f"{where} are taken: {', '.join(parts)}. No worker ID was handed out; wait for leases "
        "to expire, reap dead ones (snowflake-db workers reap) or use more worker bits"
    )


# -- permanent reservations ----------------------------------------------------------------


def reserve(
    connection: Connection,
    store: WorkerStore,
    *,
    label: str,
    holder: Claimant,
    layout: Layout,
    worker_id: int | None = None,
    registration_id: int | None = None,
    where: str | None = None,
) -> tuple[int, int]:
    """Reserve a slot forever under ``label``; return ``(worker_id, high_water_ms)``.

    For a server-side ID function, which issues with the database clock: only a slot whose
    high-water mark is behind the database clock is taken, and the function must still start
    above the returned mark. ``worker_id`` asks for that slot; otherwise the highest claimable
    one is taken (registrations start at the low end). Runs inside the caller's transaction;
    ``layout`` must be the one the tables serve (recorded here if they have none yet), and
    ``where`` names the tables in messages.
    """
    ensure_layout(
        connection,
        store,
        layout,
        hostname=holder.hostname,
        pid=holder.pid,
        where=where or store.tables.slots.name,
    )
    order = [worker_id] if worker_id is not None else range(layout.max_worker_id, -1, -1)
    rows = {row.worker_id: row for row in store.slots(connection)}
    for candidate in order:
        row = rows.get(candidate)
        if row is not None and (row.live or row.high_water_ms > row.db_now_ms):
            continue  # a hint only: the claim re-checks atomically
        claim = holder.claim(candidate, registration_id=registration_id, lease_ms=None, label=label)
        high_water_ms = _claim_reserved(connection, store, claim)
        if high_water_ms is not None:
            return candidate, high_water_ms
    table = store.tables.slots.name
    if worker_id is not None:
        raise WorkerIdExhaustedError(
            f"worker ID {worker_id} in {table} cannot be reserved for {label!r}: it is held, "
            "reserved, or its high-water mark is ahead of the database clock"
        )
    raise WorkerIdExhaustedError(
        f"no worker ID in {table} can be reserved for {label!r}: all {layout.max_worker_id + 1} "
        "are held, reserved or have a high-water mark ahead of the database clock"
    )


def reserved_under(connection: Connection, store: WorkerStore, label: str) -> SlotRow | None:
    """The slot reserved permanently under ``label``, if any (re-running a migration)."""
    for row in store.slots(connection):
        if row.reserved and row.label == label:
            return row
    return None


def release_reservation(
    connection: Connection,
    store: WorkerStore,
    *,
    worker_id: int,
    label: str | None = None,
    issued_until_ms: int | None = None,
) -> bool:
    """End a permanent reservation (only ``label``'s, if given); false if there is none.

    The slot's high-water mark becomes at least the database clock plus
    :data:`RELEASE_MARGIN_MS`, and at least ``issued_until_ms`` (the last time the released
    function issued, needed when it ran on another database's clock).
    """
    return store.release_reserved(
        connection,
        worker_id=worker_id,
        margin_ms=RELEASE_MARGIN_MS,
        label=label,
        not_before_ms=issued_until_ms,
    )


def _claim_reserved(connection: Connection, store: WorkerStore, claim: Claim) -> int | None:
    """Claim a slot permanently, in a savepoint; its high-water mark, or ``None`` if refused.

    Refused unless the mark is behind the database clock (the function issues with it).
    """
    savepoint = connection.begin_nested()
    try:
        if store.claim_existing(connection, claim):
            mark = store.held_high_water(connection, worker_id=claim.worker_id, token=claim.token)
            if mark > store.now_ms(connection):
                savepoint.rollback()
                return None
        elif store.claim_new(connection, claim, high_water_ms=0):
            mark = 0
        else:
            savepoint.rollback()
            return None
        if claim.registration_id is not None:
            store.note_worker(
                connection, registration_id=claim.registration_id, worker_id=claim.worker_id
            )
        savepoint.commit()
    except BaseException:
        if savepoint.is_active:
            savepoint.rollback()
        raise
    return mark
