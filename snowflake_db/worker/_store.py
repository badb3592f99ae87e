"""Every SQL statement the allocator runs, in SQLAlchemy Core, one version for all dialects.

The only dialect-specific piece is :class:`db_now_ms`, the database clock in Unix milliseconds,
compiled per dialect: lease times are always judged by it, never by a process's clock (clocks of
processes may be skewed, the database's is one for all of them). The rows read and written are
plain frozen records (:class:`SlotRow`, :class:`LayoutRow`, :class:`Claim`); :class:`SlotRow` is
also what ``snowflake-db workers``, the Django admin and the metrics' slot counts read.
Each public method of :class:`WorkerStore` takes an open :class:`~sqlalchemy.Connection` and
runs inside the caller's transaction on it: the allocator decides where transactions begin and
end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    MetaData,
    and_,
    case,
    delete,
    insert,
    inspect,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from ..errors import WorkerLeaseError
from ..metrics import SlotState
from ._schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    LAYOUT_RECORD_ID,
    NAME_LENGTH,
    WorkerTables,
    worker_tables,
)

# -- the database clock ----------------------------------------------------------------------


class db_now_ms(FunctionElement[int]):  # noqa: N801 - reads like the SQL function it renders
    """The database server's current time in Unix milliseconds (BIGINT)."""

    type = BigInteger()
    name = "db_now_ms"
    inherit_cache = True


@compiles(db_now_ms, "postgresql")
def _now_postgresql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
    # https://www.postgresql.org/docs/current/functions-datetime.html#FUNCTIONS-DATETIME-CURRENT
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


@compiles(db_now_ms, "mysql")
@compiles(db_now_ms, "mariadb")
def _now_mysql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    # UTC_TIMESTAMP does not depend on the session time zone (UNIX_TIMESTAMP(NOW()) does, and is
    # ambiguous in a DST fall-back hour); TIMESTAMPDIFF of two DATETIMEs is plain arithmetic.
    return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"


@compiles(db_now_ms, "sqlite")
def _now_sqlite(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    # julianday('now') has millisecond precision and is stable within one statement.
    # https://www.sqlite.org/lang_datefunc.html
    return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


@compiles(db_now_ms)
def _now_other(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000 AS BIGINT)"


# -- the rows --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotRow:
    """One row of the slots table, with the database time it was read at."""

    worker_id: int
    lease_token: str | None
    registration_id: int | None
    hostname: str | None
    pid: int | None
    label: str | None
    acquired_at_ms: int | None
    renewed_at_ms: int | None
    expires_at_ms: int | None
    high_water_ms: int
    db_now_ms: int

    @property
    def reserved(self) -> bool:
        """A permanent reservation: held, with no expiry."""
        return self.state is SlotState.RESERVED

    @property
    def live(self) -> bool:
        """Held by a lease the database clock has not seen expire (or reserved)."""
        return self.state.held

    @property
    def state(self) -> SlotState:
        """Its :class:`~snowflake_db.metrics.SlotState` at the time it was read."""
        return SlotState.of(
            lease_token=self.lease_token, expires_at_ms=self.expires_at_ms, now_ms=self.db_now_ms
        )


@dataclass(frozen=True, slots=True)
class LayoutRow:
    """The layout table's row: the layout's JSON text and who recorded it when."""

    layout: str
    recorded_at_ms: int
    hostname: str | None
    pid: int | None


@dataclass(frozen=True, slots=True)
class Claim:
    """Who claims a slot, and for how long (``lease_ms=None``: a permanent reservation)."""

    worker_id: int
    token: str
    registration_id: int | None
    hostname: str
    pid: int
    lease_ms: int | None
    label: str | None = None


# -- the statements -------------------------------------------------------------------------


class WorkerStore:
    """The worker tables and the statements on them."""

    def __init__(
        self,
        *,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
        schema: str | None = None,
    ) -> None:
        self.metadata = MetaData()
        self.tables: WorkerTables = worker_tables(
            self.metadata,
            slots_table=slots_table,
            registrations_table=registrations_table,
            schema=schema,
        )
        self.schema = schema

    # -- tables ---------------------------------------------------------------------------------

    def missing_tables(self, connection: Connection) -> list[str]:
        inspector = inspect(connection)
        return [
            table.name
            for table in self.tables
            if not inspector.has_table(table.name, schema=self.schema)
        ]

    def create_tables(self, connection: Connection) -> None:
        """``CREATE TABLE`` for the missing tables (another process may race us: see caller)."""
        self.metadata.create_all(connection, checkfirst=True)

    # -- acquisition ----------------------------------------------------------------------------

    def register(self, connection: Connection, *, hostname: str, pid: int) -> int:
        """Insert a registration row and return its generated key (never 0 or None)."""
        registrations = self.tables.registrations
        result = connection.execute(
            insert(registrations).values(
                hostname=hostname[:NAME_LENGTH], pid=pid, started_at_ms=db_now_ms()
            )
        )
        # RETURNING where the dialect has it (PostgreSQL, MariaDB 10.5+, SQLite 3.35+), else
        # cursor.lastrowid. https://docs.sqlalchemy.org/en/20/core/connections.html#sqlalchemy.engine.CursorResult.inserted_primary_key
        key = result.inserted_primary_key[0] if result.inserted_primary_key else None
        if isinstance(key, bool) or not isinstance(key, int) or key <= 0:
            raise WorkerLeaseError(
                f"the database returned {key!r} as the generated key of the registration row in "
                f"{registrations.name}; a positive integer is required"
            )
        return key

    def claim_existing(self, connection: Connection, claim: Claim) -> bool:
        """Take a free or expired slot row: one conditional UPDATE, true if it matched.

        ``lease_ms=None`` makes a permanent reservation (no expiry). The WHERE clause is the whole
        claim: concurrent claimants serialise on the row lock and only one matches. On MySQL and
        MariaDB, SQLAlchemy sets CLIENT.FOUND_ROWS so rowcount counts *matched* rows
        (https://docs.sqlalchemy.org/en/20/dialects/mysql.html#rowcount-support).
        """
        slots = self.tables.slots
        now = db_now_ms()
        result = connection.execute(
            update(slots)
            .where(
                slots.c.worker_id == claim.worker_id,
                or_(slots.c.lease_token.is_(None), slots.c.expires_at_ms < now),
            )
            .values(**self._holder_values(claim, now))
        )
        return result.rowcount == 1

    @staticmethod
    def _holder_values(claim: Claim, now: ColumnElement[int]) -> dict[str, object]:
        return {
            "lease_token": claim.token,
            "registration_id": claim.registration_id,
            "hostname": claim.hostname[:NAME_LENGTH],
            "pid": claim.pid,
            "label": claim.label,
            "acquired_at_ms": now,
            "renewed_at_ms": now,
            "expires_at_ms": None if claim.lease_ms is None else now + claim.lease_ms,
        }

    def claim_new(self, connection: Connection, claim: Claim, *, high_water_ms: int) -> bool:
        """Insert the row of a never-used slot; the primary key makes it atomic.

        Returns false if the row exists (someone else created it first). On PostgreSQL the failed
        INSERT aborts the transaction, so call this in a transaction of its own.
        """
        slots = self.tables.slots
        now = db_now_ms()
        try:
            connection.execute(
                insert(slots).values(
                    worker_id=claim.worker_id,
                    high_water_ms=high_water_ms,
                    **self._holder_values(claim, now),
                )
            )
        except IntegrityError:
            return False
        return True

    def held_high_water(self, connection: Connection, *, worker_id: int, token: str) -> int:
        """The high-water mark of a slot we hold (the previous holder's, right after a claim)."""
        slots = self.tables.slots
        value = connection.execute(
            select(slots.c.high_water_ms).where(
                slots.c.worker_id == worker_id, slots.c.lease_token == token
            )
        ).scalar_one()
        return int(value)

    def set_high_water(
        self, connection: Connection, *, worker_id: int, token: str, high_water_ms: int
    ) -> bool:
        slots = self.tables.slots
        result = connection.execute(
            update(slots)
            .where(slots.c.worker_id == worker_id, slots.c.lease_token == token)
            .values(high_water_ms=high_water_ms)
        )
        return result.rowcount == 1

    def note_worker(self, connection: Connection, *, registration_id: int, worker_id: int) -> None:
        registrations = self.tables.registrations
        connection.execute(
            update(registrations)
            .where(registrations.c.id == registration_id)
            .values(worker_id=worker_id)
        )

    def forget_registration(self, connection: Connection, *, registration_id: int) -> None:
        registrations = self.tables.registrations
        connection.execute(delete(registrations).where(registrations.c.id == registration_id))

    # -- holding --------------------------------------------------------------------------------

    def renew(
        self,
        connection: Connection,
        *,
        worker_id: int,
        token: str,
        lease_ms: int,
        high_water_ms: int,
    ) -> bool:
        """Extend our lease and high-water mark; false if the slot is no longer ours.

        Matching on the token alone (not on expiry) is safe: a lease that expired in the database
        but was never claimed by anyone else still has our token, and any claim replaces it.
        """
        slots = self.tables.slots
        now = db_now_ms()
        result = connection.execute(
            update(slots)
            .where(slots.c.worker_id == worker_id, slots.c.lease_token == token)
            .values(renewed_at_ms=now, expires_at_ms=now + lease_ms, high_water_ms=high_water_ms)
        )
        return result.rowcount == 1

    def release(
        self, connection: Connection, *, worker_id: int, token: str, high_water_ms: int
    ) -> bool:
        """Free our slot, keeping (possibly lowering to what was used) its high-water mark."""
        slots = self.tables.slots
        result = connection.execute(
            update(slots)
            .where(
                slots.c.worker_id == worker_id,
                slots.c.lease_token == token,
                slots.c.expires_at_ms.is_not(None),
            )
            .values(lease_token=None, expires_at_ms=None, high_water_ms=high_water_ms)
        )
        return result.rowcount == 1

    # -- permanent reservations -----------------------------------------------------------------

    def release_reserved(
        self,
        connection: Connection,
        *,
        worker_id: int,
        margin_ms: int,
        label: str | None,
        not_before_ms: int | None = None,
    ) -> bool:
        """End a permanent reservation; its high-water mark becomes at least db-now + margin
        (and at least ``not_before_ms``).

        A server-side ID function issues with the database clock, so the next holder must start
        above the database's current time.
        """
        slots = self.tables.slots
        floor: ColumnElement[int] = db_now_ms() + literal(margin_ms, BigInteger())
        if not_before_ms is not None:
            given = literal(not_before_ms, BigInteger())
            floor = case((floor > given, floor), else_=given)
        conditions = [
            slots.c.worker_id == worker_id,
            slots.c.lease_token.is_not(None),
            slots.c.expires_at_ms.is_(None),
        ]
        if label is not None:
            conditions.append(slots.c.label == label)
        result = connection.execute(
            update(slots)
            .where(and_(*conditions))
            .values(
                lease_token=None,
                label=None,
                high_water_ms=case(
                    (slots.c.high_water_ms > floor, slots.c.high_water_ms), else_=floor
                ),
            )
        )
        return result.rowcount == 1

    # -- the layout record ----------------------------------------------------------------------

    def read_layout(self, connection: Connection) -> LayoutRow | None:
        """The recorded layout row, if any (a plain read: the row never changes once written)."""
        table = self.tables.layout
        row = connection.execute(
            select(table.c.layout, table.c.recorded_at_ms, table.c.hostname, table.c.pid).where(
                table.c.id == LAYOUT_RECORD_ID
            )
        ).first()
        if row is None:
            return None
        return LayoutRow(
            layout=str(row.layout),
            recorded_at_ms=int(row.recorded_at_ms),
            hostname=row.hostname,
            pid=_opt_int(row.pid),
        )

    def record_layout(
        self, connection: Connection, *, layout: str, hostname: str, pid: int
    ) -> bool:
        """Insert the layout row; false if one exists. The primary key makes the first writer
        win; on PostgreSQL the failed INSERT aborts the transaction, so run it in a savepoint."""
        table = self.tables.layout
        try:
            connection.execute(
                insert(table).values(
                    id=LAYOUT_RECORD_ID,
                    layout=layout,
                    recorded_at_ms=db_now_ms(),
                    hostname=hostname[:NAME_LENGTH],
                    pid=pid,
                )
            )
        except IntegrityError:
            return False
        return True

    # -- inspection and maintenance -------------------------------------------------------------

    def now_ms(self, connection: Connection) -> int:
        return int(connection.execute(select(db_now_ms())).scalar_one())

    def slots(self, connection: Connection) -> list[SlotRow]:
        """Every slot row, ordered by worker ID, stamped with one database time."""
        now = self.now_ms(connection)
        slots = self.tables.slots
        rows = connection.execute(select(slots).order_by(slots.c.worker_id)).mappings().all()
        return [
            SlotRow(
                worker_id=int(row["worker_id"]),
                lease_token=row["lease_token"],
                registration_id=_opt_int(row["registration_id"]),
                hostname=row["hostname"],
                pid=_opt_int(row["pid"]),
                label=row["label"],
                acquired_at_ms=_opt_int(row["acquired_at_ms"]),
                renewed_at_ms=_opt_int(row["renewed_at_ms"]),
                expires_at_ms=_opt_int(row["expires_at_ms"]),
                high_water_ms=int(row["high_water_ms"]),
                db_now_ms=now,
            )
            for row in rows
        ]

    def reap(self, connection: Connection, *, worker_ids: list[int] | None = None) -> list[int]:
        """Clear leases the database clock says have expired; never live ones or reservations.

        The rows stay (with their high-water marks): deleting one would let the next holder of
        the worker ID issue IDs the expired holder may already have issued. ``worker_ids``
        limits it to those slots.
        """
        slots = self.tables.slots
        now = self.now_ms(connection)
        expired = and_(
            slots.c.lease_token.is_not(None),
            slots.c.expires_at_ms.is_not(None),
            slots.c.expires_at_ms < now,
        )
        if worker_ids is not None:
            expired = and_(expired, slots.c.worker_id.in_(worker_ids))
        candidates = [
            int(worker_id)
            for worker_id in connection.execute(select(slots.c.worker_id).where(expired)).scalars()
        ]
        reaped: list[int] = []
        for worker_id in candidates:
            # Re-check expiry in the UPDATE itself: a holder may have renewed in between.
            result = connection.execute(
                update(slots)
                .where(
                    slots.c.worker_id == worker_id,
                    slots.c.lease_token.is_not(None),
                    slots.c.expires_at_ms < db_now_ms(),
                )
                .values(lease_token=None, expires_at_ms=None)
            )
            if result.rowcount == 1:
                reaped.append(worker_id)
        return reaped

    def prune_registrations(self, connection: Connection, *, older_than_ms: int) -> int:
        """Delete registration rows older than ``older_than_ms`` that no slot refers to.

        Registrations are a log (one row per acquisition); slots never depend on them for
        safety: renewals match on the lease token, not on the registration key.
        """
        registrations, slots = self.tables.registrations, self.tables.slots
        referenced = select(slots.c.registration_id).where(slots.c.registration_id.is_not(None))
        result = connection.execute(
            delete(registrations).where(
                registrations.c.started_at_ms < db_now_ms() - literal(older_than_ms, BigInteger()),
                registrations.c.id.not_in(referenced),
            )
        )
        return int(result.rowcount)


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
