"""PostgreSQL: a PL/pgSQL function issuing Snowflake IDs with the application's layout.

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

from typing import TYPE_CHECKING

from sqlalchemy import text

from ..errors import InvalidArgumentError
from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ..layout import Layout
from ._spec import FunctionSpec

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = ["create_function_sql", "drop_function_sql", "last_issued_id"]

#: First key of the two-key advisory lock (``'SN'``); the second is a hash of the function name.
ADVISORY_LOCK_CLASS = 0x534E
#: pg_sleep between looks at the clock while waiting for the next tick.
_SLEEP_S = 0.0002


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
