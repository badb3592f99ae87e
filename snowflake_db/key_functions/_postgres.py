"""PostgreSQL: a PL/pgSQL function issuing Snowflake IDs with the application's layout.

Rows inserted by other programs or plain SQL get their ID from ``DEFAULT snowflake_next_id()``.
The function's worker ID is a slot of the allocator's slots table reserved *permanently* (token
set, ``expires_at_ms`` NULL), so no application process can ever hold it: application IDs and
server IDs differ in their worker bits and never collide.

State: the state sequence (``CACHE 1``, ``INCREMENT BY`` one step of the sequence field,
``MAXVALUE`` the layout's largest ID) holds the last value handed out; sequence updates are
non-transactional (seen by every session at once, never rolled back). Fast path, no lock:
``v := nextval()``, used only if its worker and shard bits are the function's, its tick is the
clock's or ahead within the rollback tolerance, and the guard sequence was even and unchanged
around the ``nextval``. Otherwise the slow path takes a session advisory lock (released also on
error) and calls ``nextval`` again; only it calls ``setval``: to the worker's first ID of the
current tick minus one step, or, when the worker's part of the tick is used up, after waiting
(bounded) for the next tick, so a tick's sequence part never wraps. It makes the guard odd
before it reads ``last_value`` and even after the ``setval``.

No duplicates: ``nextval`` returns a value twice only if a ``setval`` moves the sequence back,
and every ``setval`` makes the next value exceed the ``last_value`` L it read. A value fetched
before that read is <= L. One fetched between the read and the ``setval`` may be fetched again
after it (a plain "re-read, ``setval`` if still behind" is not enough: other sessions'
``nextval`` calls can carry the sequence through other workers' bits into this worker's part of the
tick before the ``setval``), but it was fetched while the guard was odd or changed, so it was
refused; the slow path's own ``nextval`` calls run under the lock. Refused values are skipped, never
used, and every used value carries the function's worker bits, which no application process
holds. A carry out of the sequence field lands in another worker's bits (refused); a chain of
refused values through every other worker reaches this worker's part of a later tick, used only
within the tolerance ahead of the clock, as the generator goes on ahead of a clock stepped back.
After a crash a sequence resumes at or past its last logged value (WAL-logged ahead), so values
may be skipped, never repeated; a guard left odd is made even by the next slow path. A standby
cannot call ``nextval``.
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
#: Slow path rounds (nextval, maybe setval) per call before giving up: a round ends in a use, a
#: bounded wait, or a setval after which only other sessions' values can come first.
_MAX_TRIES = 1000


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
    guard = spec.qualified(spec.guard_sequence)
    seq_literal = "'" + seq.replace("'", "''") + "'"
    seq_oid = f"{seq_literal}::regclass"
    guard_oid = "'" + guard.replace("'", "''") + "'::regclass"
    step = 1 << layout.sequence_shift
    worker_part = worker_id << layout.worker_shift
    # the bits that must be the function's: worker and shard (the shard part stays 0)
    own_mask = (layout.max_worker_id << layout.worker_shift) | layout.max_shard
    span = layout.max_sequence * step  # first to last ID of the worker in one tick
    ts = layout.time_shift
    tol = rollback_tolerance_ms
    wait_loops = int((rollback_tolerance_ms + layout.tick_ms + max_wait_ms) / (_SLEEP_S * 1000))
    lock = f"{ADVISORY_LOCK_CLASS}, {spec.lock_key}"
    clock = (
        f"(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - {layout.epoch_ms})"
        f" / {layout.tick_ms}"
    )
    body = f"""
DECLARE
    v bigint;
    g bigint;
    now_tick bigint;
    last_id bigint;
    last_tick bigint;
    base bigint;
    target bigint;
    waited integer := 0;
    tries integer := 0;
    guarded boolean := false;
BEGIN
    -- fast path: no lock; v is used only if no setval can have run around its nextval
    g := pg_sequence_last_value({guard_oid});
    v := nextval({seq_oid});
    IF (v & {own_mask}) = {worker_part} AND g %% 2 = 0
            AND pg_sequence_last_value({guard_oid}) = g THEN
        now_tick := {clock};
        IF (v >> {ts}) >= now_tick AND ((v >> {ts}) - now_tick) * {layout.tick_ms} <= {tol} THEN
            RETURN v;
        END IF;
    END IF;
    -- slow path: one session at a time; only here the state sequence is setval()ed
    PERFORM pg_advisory_lock({lock});
    BEGIN
        IF coalesce(pg_sequence_last_value({guard_oid}), 1) %% 2 = 1 THEN
            PERFORM nextval({guard_oid});  -- left odd by a crash or a killed session
        END IF;
        LOOP
            tries := tries + 1;
            IF tries > {_MAX_TRIES} THEN  -- each setval is followed by a use or a wait
                RAISE EXCEPTION 'snowflake_db: the state sequence %% did not reach the '
                    'function''s part of the tick', {seq_literal};
            END IF;
            v := nextval({seq_oid});
            now_tick := {clock};
            IF now_tick > {layout.max_tick} THEN
                RAISE EXCEPTION 'snowflake_db: the layout''s time bits ran out (tick %% > %%)',
                    now_tick, {layout.max_tick};
            END IF;
            IF (v & {own_mask}) = {worker_part} AND (v >> {ts}) >= now_tick
                    AND ((v >> {ts}) - now_tick) * {layout.tick_ms} <= {tol} THEN
                EXIT;
            END IF;
            IF ((v >> {ts}) - now_tick) * {layout.tick_ms} > {tol} THEN
                RAISE EXCEPTION 'snowflake_db: clock moved backwards by %% ms, more than the '
                    'tolerated {tol} ms; no ID was issued',
                    ((v >> {ts}) - now_tick) * {layout.tick_ms};
            END IF;
            -- v is behind the clock, or not the function's: move the sequence forward
            PERFORM nextval({guard_oid});  -- odd: fast paths now refuse what they fetch
            guarded := true;
            last_id := pg_sequence_last_value({seq_oid});  -- read under the buffer lock
            IF last_id IS NULL THEN  -- not called since a setval(.., false) by hand
                SELECT last_value - {step} INTO last_id FROM {seq};
            END IF;
            last_tick := CASE WHEN last_id < 0 THEN -1 ELSE last_id >> {ts} END;
            base := (greatest(now_tick, last_tick) << {ts}) | {worker_part};
            target := CASE
                WHEN last_id < base - {step} THEN base - {step}
                WHEN last_id < base + {span} AND (last_id & {layout.max_shard}) <> 0
                    THEN last_id - (last_id & {layout.max_shard})
                END;  -- NULL: already in the worker's part of the tick, or past it
            IF target IS NOT NULL THEN
                -- the next value, target + step, is above last_id: never backwards
                PERFORM setval({seq_oid}, target, true);
            END IF;
            PERFORM nextval({guard_oid});  -- even again
            guarded := false;
            IF target IS NULL AND last_id >= base + {span} THEN
                -- the worker's part of tick last_tick is used up: wait for the next tick
                LOOP
                    IF waited >= {wait_loops} THEN
                        RAISE EXCEPTION
                            'snowflake_db: the clock did not reach the next tick in time';
                    END IF;
                    PERFORM pg_sleep({_SLEEP_S});
                    waited := waited + 1;
                    EXIT WHEN {clock} > last_tick;
                END LOOP;
            END IF;
        END LOOP;
    EXCEPTION WHEN query_canceled OR others THEN
        IF guarded THEN
            PERFORM nextval({guard_oid});
        END IF;
        PERFORM pg_advisory_unlock({lock});
        RAISE;
    END;
    PERFORM pg_advisory_unlock({lock});
    RETURN v;
END
"""
    body = body.replace("%%", "%")
    comment = (
        f"snowflake_db ID function: worker_id={worker_id} time_bits={layout.time_bits} "
        f"worker_bits={layout.worker_bits} sequence_bits={layout.sequence_bits} "
        f"shard_bits={layout.shard_bits} epoch_ms={layout.epoch_ms} tick_ms={layout.tick_ms}"
    )
    return [
        f"CREATE SEQUENCE {seq} AS bigint INCREMENT BY {step} MINVALUE {-step} "
        f"MAXVALUE {layout.max_id} START WITH {max(start_after, -1)} CACHE 1 NO CYCLE",
        f"SELECT setval({seq_oid}, {max(start_after, -1)}, true)",
        f"CREATE SEQUENCE {guard} AS bigint MINVALUE 0 START WITH 0 CACHE 1 NO CYCLE",
        f"SELECT setval({guard_oid}, 0, true)",
        f"CREATE FUNCTION {fn}() RETURNS bigint LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE "
        f"AS $snowflake_fn${body}$snowflake_fn$",
        f"COMMENT ON FUNCTION {fn}() IS '{comment}'",
    ]


def drop_function_sql(spec: FunctionSpec) -> list[str]:
    return [
        f"DROP FUNCTION IF EXISTS {spec.qualified(spec.name)}()",
        f"DROP SEQUENCE IF EXISTS {spec.qualified(spec.sequence)}",
        f"DROP SEQUENCE IF EXISTS {spec.qualified(spec.guard_sequence)}",
    ]


def last_issued_id(conn: Connection, spec: FunctionSpec) -> int | None:
    value = conn.scalar(text(f"SELECT last_value FROM {spec.qualified(spec.sequence)}"))
    return None if value is None or value < 0 else int(value)
