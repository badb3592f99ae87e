"""MariaDB: a stored function issuing Snowflake IDs with the application's layout, and the
``BEFORE INSERT`` trigger that fills a missing key with it.

MariaDB refuses a stored function in a column's ``DEFAULT`` (error 1901), hence the trigger. The
function's worker ID is a slot of the allocator's slots table reserved permanently, as on
PostgreSQL (:mod:`._slots`).

Concurrency: the state is a ``SEQUENCE`` whose ``NEXTVAL`` is atomic and non-transactional (seen
by every session at once, never rolled back, never blocked by another session's open
transaction). It counts in steps of one sequence value; ``SETVAL(seq, v, 0)`` only ever moves it
forward (a lower value is ignored). So every ``NEXTVAL`` is a value no session ever got before,
and uniqueness never depends on the clock or on a lock. The function

* takes ``NEXTVAL``; if it carries the function's worker bits and its tick is the current one (or
  ahead, within the clock tolerance), that is the ID;
* if its tick is behind the clock, moves the sequence to the start of the current tick with
  ``SETVAL`` (the value taken is dropped) and takes again;
* if the value has other worker bits, the tick's sequence part ran out and carried: such a value
  is never issued; the function waits (bounded by ``max_wait_ms``) for the next tick, then moves
  the sequence there;
* refuses a tick more than ``rollback_tolerance_ms`` ahead of the clock (a clock behind its last
  ID), as the Python generator does; the value taken is dropped, never issued later.

No lock is held at any time, so writers in long transactions never serialise on the function.
The clock is ``SYSDATE(6)`` (``NOW()`` is frozen for the whole statement inside a function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text

from ..errors import InvalidArgumentError
from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ..layout import Layout
from ..worker._schema import validate_identifier
from ._spec import FunctionSpec

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = [
    "create_function_sql",
    "create_trigger_sql",
    "drop_function_sql",
    "drop_trigger_sql",
    "last_issued_id",
    "trigger_name",
]

#: SLEEP between looks at the clock while waiting for the next tick.
_SLEEP_S = 0.0002
#: MariaDB's largest identifier.
_MAX_NAME = 64


def _signal(message_sql: str) -> str:
    return (
        f"SET message = {message_sql};\n"
        "            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = message;"
    )


def create_function_sql(
    spec: FunctionSpec,
    *,
    layout: Layout,
    worker_id: int,
    start_after: int,
    rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
    max_wait_ms: int = 1000,
) -> list[str]:
    """``CREATE SEQUENCE`` + ``SETVAL`` + ``CREATE FUNCTION``; every number is baked in.

    ``start_after`` is the last ID the slot may already have issued (see
    :func:`._slots.floor_id`): the sequence starts one step above it, so a tick already used
    by a previous holder of the slot looks exhausted and is waited out.
    """
    layout.check_worker_id(worker_id)
    if rollback_tolerance_ms < 0 or max_wait_ms < 0:
        raise InvalidArgumentError("rollback_tolerance_ms and max_wait_ms must not be negative")
    fn = spec.qualified(spec.name)
    seq = spec.qualified(spec.sequence)
    step = 1 << layout.sequence_shift
    start = max(start_after + step, 0)
    worker_part = worker_id << layout.worker_shift
    worker_span = 1 << layout.worker_bits
    tolerance = rollback_tolerance_ms
    behind = _signal(
        "CONCAT('snowflake_db: clock moved backwards by ', (last_tick - now_tick) * "
        f"{layout.tick_ms}, ' ms, more than the tolerated {tolerance} ms; no ID was issued')"
    )
    ran_out = _signal(
        "CONCAT('snowflake_db: the layout''s time bits ran out (tick ', now_tick, "
        f"' > {layout.max_tick})')"
    )
    too_late = _signal(
        "'snowflake_db: the clock did not reach the next tick in time; no ID was issued'"
    )
    body = f"""
BEGIN
    DECLARE now_tick BIGINT;
    DECLARE last_tick BIGINT;
    DECLARE new_id BIGINT;
    DECLARE high BIGINT;
    DECLARE started_ms BIGINT DEFAULT FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000);
    DECLARE message VARCHAR(255);
    next_id: LOOP
        SET now_tick = (FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) - {layout.epoch_ms})
            DIV {layout.tick_ms};
        IF now_tick > {layout.max_tick} THEN
            {ran_out}
        END IF;
        SET new_id = NEXTVAL({seq});
        SET high = new_id DIV {1 << layout.worker_shift};
        IF high MOD {worker_span} = {worker_id} THEN
            SET last_tick = new_id DIV {1 << layout.time_shift};
            IF last_tick >= now_tick THEN
                IF (last_tick - now_tick) * {layout.tick_ms} > {tolerance} THEN
                    {behind}
                END IF;
                RETURN new_id;
            END IF;
            -- behind the clock: start the current tick (the value taken is dropped)
            DO SETVAL({seq}, now_tick * {1 << layout.time_shift} + {worker_part}, 0);
        ELSE
            -- the tick is used up (the sequence part carried): never issue a carried value
            SET last_tick = (high - {worker_id} - 1) DIV {worker_span};
            IF now_tick > last_tick THEN
                DO SETVAL({seq}, now_tick * {1 << layout.time_shift} + {worker_part}, 0);
            ELSE
                IF (last_tick - now_tick) * {layout.tick_ms} > {tolerance} THEN
                    {behind}
                END IF;
                IF FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) - started_ms > {max_wait_ms} THEN
                    {too_late}
                END IF;
                DO SLEEP({_SLEEP_S});
            END IF;
        END IF;
    END LOOP next_id;
END"""
    comment = (
        f"snowflake_db ID function: worker_id={worker_id} time_bits={layout.time_bits} "
        f"worker_bits={layout.worker_bits} sequence_bits={layout.sequence_bits} "
        f"shard_bits={layout.shard_bits} epoch_ms={layout.epoch_ms} tick_ms={layout.tick_ms}"
    )
    return [
        f"CREATE SEQUENCE IF NOT EXISTS {seq} START WITH {start} MINVALUE 0 "
        f"INCREMENT BY {step} NOCACHE NOCYCLE",
        f"SELECT SETVAL({seq}, {start}, 0)",  # a leftover sequence only ever moves forward
        f"CREATE FUNCTION {fn}() RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA "
        f"COMMENT '{comment}'{body}",
    ]


def drop_function_sql(spec: FunctionSpec) -> list[str]:
    return [
        f"DROP FUNCTION IF EXISTS {spec.qualified(spec.name)}",
        f"DROP SEQUENCE IF EXISTS {spec.qualified(spec.sequence)}",
    ]


def last_issued_id(conn: Connection, spec: FunctionSpec, layout: Layout) -> int | None:
    """At most the last ID taken from the state sequence (``None`` if none or no sequence)."""
    seq = spec.qualified(spec.sequence)
    exists = conn.scalar(
        text(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_type = 'SEQUENCE' "
            "AND table_schema = COALESCE(:schema, DATABASE()) AND table_name = :name"
        ),
        {"schema": spec.schema, "name": spec.sequence},
    )
    if not exists:
        return None
    upcoming = conn.scalar(text(f"SELECT next_not_cached_value FROM {seq}"))
    value = int(upcoming or 0) - (1 << layout.sequence_shift)
    return value if value > 0 else None


def trigger_name(table: str, column: str) -> str:
    return f"{table}_{column}_snowflake_key"[:_MAX_NAME]


def _table_sql(spec: FunctionSpec, table: str, table_schema: str | None) -> str:
    validate_identifier(table, "table name")
    if table_schema is not None:
        validate_identifier(table_schema, "schema name")
        return f"`{table_schema}`.`{table}`"
    return f"`{table}`"


def create_trigger_sql(
    spec: FunctionSpec,
    *,
    table: str,
    column: str,
    trigger: str,
    table_schema: str | None = None,
    zero_default: bool = True,
) -> list[str]:
    """The ``BEFORE INSERT`` trigger filling a NULL or 0 key; with ``zero_default`` the column
    also gets ``DEFAULT 0``, since MariaDB in strict mode refuses ``INSERT ... SELECT`` without
    a key that has no default before any trigger runs (``INSERT ... VALUES`` passes)."""
    validate_identifier(column, "column name")
    validate_identifier(trigger, "trigger name")
    target = _table_sql(spec, table, table_schema)
    trigger_sql = f"`{table_schema}`.`{trigger}`" if table_schema else f"`{trigger}`"
    statements = [
        f"CREATE TRIGGER {trigger_sql} BEFORE INSERT ON {target} FOR EACH ROW "
        f"IF NEW.`{column}` IS NULL OR NEW.`{column}` = 0 THEN "
        f"SET NEW.`{column}` = {spec.qualified(spec.name)}(); END IF"
    ]
    if zero_default:
        statements.append(f"ALTER TABLE {target} ALTER COLUMN `{column}` SET DEFAULT 0")
    return statements


def drop_trigger_sql(
    spec: FunctionSpec,
    *,
    table: str,
    column: str,
    trigger: str,
    table_schema: str | None = None,
    zero_default: bool = True,
) -> list[str]:
    validate_identifier(column, "column name")
    validate_identifier(trigger, "trigger name")
    target = _table_sql(spec, table, table_schema)
    trigger_sql = f"`{table_schema}`.`{trigger}`" if table_schema else f"`{trigger}`"
    statements = [f"DROP TRIGGER IF EXISTS {trigger_sql}"]
    if zero_default:
        statements.append(f"ALTER TABLE {target} ALTER COLUMN `{column}` DROP DEFAULT")
    return statements
