"""A PostgreSQL function issuing Snowflake IDs with the application's layout.

Rows inserted by other programs or plain SQL get their ID from ``DEFAULT snowflake_next_id()``.
The function's worker ID is a slot of the allocator's slots table reserved *permanently* (token
set, ``expires_at_ms`` NULL), so no application process can ever hold it: application IDs and
server IDs differ in their worker bits and never collide.

Concurrency: the last issued ID lives in a sequence, because sequence updates are
non-transactional (visible to every session at once, never rolled back), and a session-level
advisory lock makes read-compute-``setval`` atomic across sessions. A row lock would be held
until the caller's transaction ends and serialise all writers; the advisory lock is released
as soon as the ID is computed (also when it fails). The sequence part never wraps inside a
tick: an exhausted tick waits (bounded) for the next one.
"""

from __future__ import annotations

import os
import secrets
import socket
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import MetaData, Table, and_, or_, select, text, update
from sqlalchemy.sql.expression import Executable

from ..errors import InvalidArgumentError, WorkerIdExhaustedError
from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ..layout import DEFAULT_LAYOUT, Layout
from ..worker.schema import (
    DEFAULT_SLOTS_TABLE,
    NAME_LENGTH,
    validate_identifier,
    worker_tables,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["FunctionSpec", "create_function_sql", "db_now_ms", "drop_function_sql"]

#: First key of the two-key advisory lock (``'SN'``); the second is a hash of the function name.
ADVISORY_LOCK_CLASS = 0x534E
#: pg_sleep between looks at the clock while waiting for the next tick.
_SLEEP_S = 0.0002


@dataclass(frozen=True)
class FunctionSpec:
    """Where the function lives and what it is called."""

    name: str
    schema: str | None

    def __post_init__(self) -> None:
        validate_identifier(self.name, "function name")
        if self.schema is not None:
            validate_identifier(self.schema, "schema name")

    @property
    def sequence(self) -> str:
        return f"{self.name}_state"[:63]

    def qualified(self, name: str) -> str:
        return f'"{self.schema}"."{name}"' if self.schema else f'"{name}"'

    @property
    def lock_key(self) -> int:
        digest = zlib.crc32(f"{self.schema or ''}.{self.name}".encode())
        return digest - 2**32 if digest >= 2**31 else digest  # a signed int4

    def default_label(self, database: str | None) -> str:
        return f"postgresql-function:{database or ''}:{self.schema or 'public'}.{self.name}"[
            :NAME_LENGTH
        ]


def floor_id(layout: Layout, worker_id: int, high_water_ms: int) -> int:
    """The pseudo "last issued ID" a new holder starts from: the high-water tick, used up."""
    if high_water_ms < layout.epoch_ms:
        return -1
    moment = min(high_water_ms, layout.max_timestamp_ms)
    return layout.encode(timestamp_ms=moment, worker_id=worker_id, sequence=layout.max_sequence)


def create_function_sql(
    spec: FunctionSpec,
    *,
    layout: Layout,
    worker_id: int,
    start_after: int,
    rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
    max_wait_ms: int = 1000,
) -> list[str]:
    """``CREATE SEQUENCE`` + ``CREATE FUNCTION`` statements; every number is baked in."""
    layout.check_worker_id(worker_id)
    if rollback_tolerance_ms < 0 or max_wait_ms < 0:
        raise InvalidArgumentError("rollback_tolerance_ms and max_wait_ms must not be negative")
    fn = spec.qualified(spec.name)
    seq = spec.qualified(spec.sequence)
    seq_literal = "'" + seq.replace("'", "''") + "'"
    worker_part = worker_id << layout.worker_shift
    wait_loops = int((rollback_tolerance_ms + layout.tick_ms + max_wait_ms) / (_SLEEP_S * 1000))
    lock = f"{ADVISORY_LOCK_CLASS}, {spec.lock_key}"
    body = f"""
DECLARE
    last_id bigint;
    last_tick bigint;
    now_tick bigint;
    new_id bigint;
    waited integer := 0;
BEGIN
    PERFORM pg_advisory_lock({lock});
    BEGIN
        SELECT last_value INTO last_id FROM {seq};
        last_tick := CASE WHEN last_id < 0 THEN -1 ELSE last_id >> {layout.time_shift} END;
        LOOP
            now_tick := (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
                         - {layout.epoch_ms}) / {layout.tick_ms};
            IF now_tick > {layout.max_tick} THEN
                RAISE EXCEPTION 'snowflake_db: the layout''s time bits ran out (tick %% > %%)',
                    now_tick, {layout.max_tick};
            END IF;
            IF now_tick > last_tick THEN
                new_id := (now_tick << {layout.time_shift}) | {worker_part};
                EXIT;
            END IF;
            IF (last_tick - now_tick) * {layout.tick_ms} > {rollback_tolerance_ms} THEN
                RAISE EXCEPTION 'snowflake_db: clock moved backwards by %% ms, more than the '
                    'tolerated {rollback_tolerance_ms} ms; no ID was issued',
                    (last_tick - now_tick) * {layout.tick_ms};
            END IF;
            IF ((last_id >> {layout.sequence_shift}) & {layout.max_sequence})
                    < {layout.max_sequence} THEN
                new_id := last_id + {1 << layout.sequence_shift};
                EXIT;
            END IF;
            -- this tick is used up: wait for the next one, never wrap the sequence
            IF waited >= {wait_loops} THEN
                RAISE EXCEPTION 'snowflake_db: the clock did not reach the next tick in time';
            END IF;
            PERFORM pg_sleep({_SLEEP_S});
            waited := waited + 1;
        END LOOP;
        PERFORM setval({seq_literal}::regclass, new_id, true);
    EXCEPTION WHEN query_canceled OR others THEN
        PERFORM pg_advisory_unlock({lock});
        RAISE;
    END;
    PERFORM pg_advisory_unlock({lock});
    RETURN new_id;
END
"""
    body = body.replace("%%", "%")
    comment = (
        f"snowflake_db ID function: worker_id={worker_id} time_bits={layout.time_bits} "
        f"worker_bits={layout.worker_bits} sequence_bits={layout.sequence_bits} "
        f"shard_bits={layout.shard_bits} epoch_ms={layout.epoch_ms} tick_ms={layout.tick_ms}"
    )
    return [
        f"CREATE SEQUENCE {seq} AS bigint MINVALUE -1 START WITH {start_after} NO CYCLE",
        f"CREATE FUNCTION {fn}() RETURNS bigint LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE "
        f"AS $snowflake_fn${body}$snowflake_fn$",
        f"COMMENT ON FUNCTION {fn}() IS '{comment}'",
    ]


def drop_function_sql(spec: FunctionSpec) -> list[str]:
    return [
        f"DROP FUNCTION IF EXISTS {spec.qualified(spec.name)}()",
        f"DROP SEQUENCE IF EXISTS {spec.qualified(spec.sequence)}",
    ]


def last_issued_id(conn: Connection, spec: FunctionSpec) -> int | None:
    value = conn.scalar(text(f"SELECT last_value FROM {spec.qualified(spec.sequence)}"))
    return None if value is None or value < 0 else int(value)


_NOW_MS = {
    "postgresql": "CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT)",
    "mysql": "CAST(floor(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)",
    "mariadb": "CAST(floor(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
}


def db_now_ms(conn: Connection) -> int:
    """The database clock in Unix milliseconds (leases are judged by it)."""
    sql = _NOW_MS.get(conn.dialect.name)
    if sql is None:
        raise InvalidArgumentError(f"no database clock expression for {conn.dialect.name}")
    return int(conn.scalar(text(f"SELECT {sql}")) or 0)


def reserve_slot(
    conn: Connection,
    *,
    label: str,
    layout: Layout = DEFAULT_LAYOUT,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    schema: str | None = None,
) -> tuple[int, int]:
    """Reserve a worker slot forever under ``label``; return ``(worker_id, high_water_ms)``.

    Idempotent: a slot already reserved under ``label`` is returned again. The claim is a
    conditional UPDATE of a free or expired slot, or an INSERT that a primary-key conflict
    turns into a no-op, so two reservations never share a slot. Slots are tried from the
    highest worker ID down (as the allocator's ``reserve_worker_id`` does); the function still
    starts above the slot's high-water mark.
    """
    slots = worker_tables(MetaData(), slots_table=slots_table, schema=schema).slots
    c = slots.c
    row = conn.execute(
        select(c.worker_id, c.high_water_ms).where(
            c.label == label, c.lease_token.is_not(None), c.expires_at_ms.is_(None)
        )
    ).first()
    if row is not None:
        return int(row.worker_id), int(row.high_water_ms)
    now = db_now_ms(conn)
    rows = conn.execute(select(c.worker_id, c.lease_token, c.expires_at_ms, c.high_water_ms)).all()
    present = {r.worker_id for r in rows}
    # Skip held slots, and (like the allocator) slots whose high-water mark is still ahead of
    # the database clock: the function would have to wait for it.
    unusable = {
        r.worker_id
        for r in rows
        if (r.lease_token is not None and (r.expires_at_ms is None or r.expires_at_ms >= now))
        or r.high_water_ms > now
    }
    values = {
        "lease_token": secrets.token_hex(16),
        "label": label,
        "hostname": socket.gethostname()[:NAME_LENGTH],
        "pid": os.getpid(),
        "registration_id": None,
        "acquired_at_ms": now,
        "renewed_at_ms": now,
        "expires_at_ms": None,
    }
    for worker_id in range(layout.max_worker_id, -1, -1):
        if worker_id in unusable:
            continue
        if worker_id in present:
            conn.execute(
                update(slots)
                .where(
                    c.worker_id == worker_id,
                    or_(c.lease_token.is_(None), and_(c.expires_at_ms.is_not(None),
                                                      c.expires_at_ms < now)),
                )
                .values(**values)
            )
        else:
            conn.execute(_insert_ignoring_conflict(conn, slots), {"worker_id": worker_id, **values})
        # The claim is ours only if our random token is in the row (rowcount is not reliable
        # across drivers for INSERT ... ON CONFLICT DO NOTHING).
        row = conn.execute(
            select(c.lease_token, c.high_water_ms).where(c.worker_id == worker_id)
        ).first()
        if row is not None and row.lease_token == values["lease_token"]:
            return worker_id, int(row.high_water_ms or 0)
    raise WorkerIdExhaustedError(
        f"every worker slot 0..{layout.max_worker_id} in {slots_table} is held by a live lease; "
        f"none can be reserved for {label!r}"
    )


def _insert_ignoring_conflict(conn: Connection, slots: Table) -> Executable:
    name = conn.dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(slots).on_conflict_do_nothing()
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(slots).on_conflict_do_nothing()
    from sqlalchemy import insert

    return insert(slots).prefix_with("IGNORE")


#: How far past the database clock a released slot's high-water mark is set (as the allocator
#: does): the function issued with the database clock, the next holder starts above it.
RELEASE_MARGIN_MS = 1000


def raise_high_water(
    conn: Connection,
    *,
    label: str,
    layout: Layout,
    last_id: int | None,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    schema: str | None = None,
    margin_ms: int = RELEASE_MARGIN_MS,
) -> int | None:
    """Raise the reserved slot's high-water mark past ``last_id`` and the database clock;
    returns the slot's worker ID (``None`` if nothing is reserved under ``label``)."""
    slots = worker_tables(MetaData(), slots_table=slots_table, schema=schema).slots
    c = slots.c
    row = conn.execute(
        select(c.worker_id, c.high_water_ms).where(
            c.label == label, c.lease_token.is_not(None), c.expires_at_ms.is_(None)
        )
    ).first()
    if row is None:
        return None
    high_water = max(int(row.high_water_ms), db_now_ms(conn) + margin_ms)
    if last_id is not None:
        tick = last_id >> layout.time_shift
        high_water = max(high_water, layout.tick_start_ms(tick) + layout.tick_ms - 1)
    conn.execute(
        update(slots)
        .where(c.worker_id == row.worker_id, c.label == label)
        .values(high_water_ms=high_water)
    )
    return int(row.worker_id)


def release_slot(
    conn: Connection,
    *,
    label: str,
    layout: Layout,
    last_id: int | None,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    schema: str | None = None,
) -> int | None:
    """Free the slot reserved under ``label`` after raising its high-water mark."""
    worker_id = raise_high_water(
        conn, label=label, layout=layout, last_id=last_id, slots_table=slots_table, schema=schema
    )
    if worker_id is None:
        return None
    slots = worker_tables(MetaData(), slots_table=slots_table, schema=schema).slots
    conn.execute(
        update(slots)
        .where(slots.c.worker_id == worker_id, slots.c.label == label)
        .values(lease_token=None, label=None, expires_at_ms=None, hostname=None, pid=None)
    )
    return worker_id
