"""MariaDB: a stored function issuing Snowflake IDs with the application's layout, and the
``BEFORE INSERT`` trigger that fills a missing key with it.

MariaDB refuses a stored function in a column's ``DEFAULT`` (error 1901), hence the trigger. The
function's worker ID is a slot of the allocator's slots table reserved permanently, as on
PostgreSQL (:mod:`._slots`).

Concurrency: the last issued ID lives in a one-row **Aria** table (``<name>_state``). Aria is
not transactional: the update is seen by every session at once and never rolled back with the
caller's transaction. A table used by a stored function is locked when the calling statement
starts and unlocked when it ends (MariaDB's prelocking), so read-compute-update is atomic and
writers serialise per *statement*, not per transaction. Measured before choosing: an InnoDB
state row stays locked until the caller commits (a second session waited out
``innodb_lock_wait_timeout``), and a ``SEQUENCE`` cannot hold the state because ``SETVAL``
accepts only literals (no expression, variable or subquery) and a function cannot run dynamic
SQL. ``GET_LOCK`` is not needed: the table lock already covers the statement.

The sequence part never wraps inside a tick: an exhausted tick waits (bounded by
``max_wait_ms``) for the next; a clock behind the last ID by more than the tolerance is refused,
as the Python generator does. The clock is ``SYSDATE(6)`` (``NOW()`` is frozen for the whole
statement inside a function; do not start the server with ``--sysdate-is-now``).
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

#: The state table's comment (how Alembic's ``include_object`` knows it).
STATE_COMMENT = "snowflake_db key function state"
#: SLEEP between looks at the clock while waiting for the next tick.
_SLEEP_S = 0.0002
#: MariaDB's largest identifier.
_MAX_NAME = 64


def _signal(message_sql: str) -> str:
    return (
        f"SET message = {message_sql};\n"
        "            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = message;"
    )


def state_table(spec: FunctionSpec) -> str:
    return spec.qualified(spec.sequence)


def create_function_sql(
    spec: FunctionSpec,
    *,
    layout: Layout,
    worker_id: int,
    start_after: int,
    rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
    max_wait_ms: int = 1000,
) -> list[str]:
    """The state table, its row, and ``CREATE FUNCTION``; every number is baked in.

    ``start_after`` is the pseudo last ID (see :func:`._slots.floor_id`); a state row left by
    an earlier install is only ever moved forward.
    """
    layout.check_worker_id(worker_id)
    if rollback_tolerance_ms < 0 or max_wait_ms < 0:
        raise InvalidArgumentError("rollback_tolerance_ms and max_wait_ms must not be negative")
    fn = spec.qualified(spec.name)
    state = state_table(spec)
    worker_part = worker_id << layout.worker_shift
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
    missing = _signal(
        f"'snowflake_db: the state row of {spec.name}() is missing; no ID was issued'"
    )
    body = f"""
BEGIN
    DECLARE last_id BIGINT DEFAULT NULL;
    DECLARE last_tick BIGINT;
    DECLARE now_tick BIGINT;
    DECLARE new_id BIGINT;
    DECLARE started_ms BIGINT DEFAULT FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000);
    DECLARE message VARCHAR(255);
    SELECT {state}.last_id INTO last_id FROM {state} WHERE {state}.k = 1;
    IF last_id IS NULL THEN
        {missing}
    END IF;
    SET last_tick = IF(last_id < 0, -1, last_id DIV {1 << layout.time_shift});
    next_id: LOOP
        SET now_tick = (FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) - {layout.epoch_ms})
            DIV {layout.tick_ms};
        IF now_tick > {layout.max_tick} THEN
            {ran_out}
        END IF;
        IF now_tick > last_tick THEN
            SET new_id = now_tick * {1 << layout.time_shift} + {worker_part};
            LEAVE next_id;
        END IF;
        IF (last_tick - now_tick) * {layout.tick_ms} > {tolerance} THEN
            {behind}
        END IF;
        IF (last_id DIV {1 << layout.sequence_shift}) MOD {layout.max_sequence + 1}
                < {layout.max_sequence} THEN
            SET new_id = last_id + {1 << layout.sequence_shift};
            LEAVE next_id;
        END IF;
        -- this tick is used up: wait for the next one, never wrap the sequence
        IF FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) - started_ms > {max_wait_ms} THEN
            {too_late}
        END IF;
        DO SLEEP({_SLEEP_S});
    END LOOP next_id;
    UPDATE {state} SET last_id = new_id WHERE k = 1;
    RETURN new_id;
END"""
    comment = (
        f"snowflake_db ID function: worker_id={worker_id} time_bits={layout.time_bits} "
        f"worker_bits={layout.worker_bits} sequence_bits={layout.sequence_bits} "
        f"shard_bits={layout.shard_bits} epoch_ms={layout.epoch_ms} tick_ms={layout.tick_ms}"
    )
    return [
        f"CREATE TABLE IF NOT EXISTS {state} (k TINYINT NOT NULL PRIMARY KEY, "
        f"last_id BIGINT NOT NULL) ENGINE=Aria TRANSACTIONAL=1 COMMENT '{STATE_COMMENT}'",
        f"INSERT INTO {state} (k, last_id) VALUES (1, {start_after}) "
        f"ON DUPLICATE KEY UPDATE last_id = GREATEST(last_id, {start_after})",
        f"CREATE FUNCTION {fn}() RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA "
        f"COMMENT '{comment}'{body}",
    ]


def is_state_table_comment(comment: str | None) -> bool:
    return bool(comment) and str(comment).startswith(STATE_COMMENT)


def drop_function_sql(spec: FunctionSpec) -> list[str]:
    return [
        f"DROP FUNCTION IF EXISTS {spec.qualified(spec.name)}",
        f"DROP TABLE IF EXISTS {state_table(spec)}",
    ]


def last_issued_id(conn: Connection, spec: FunctionSpec) -> int | None:
    """The function's last ID (``None`` if it issued none or has no state table)."""
    exists = conn.scalar(
        text(
            "SELECT COUNT(*) FROM information_schema.tables "
            "WHERE table_schema = COALESCE(:schema, DATABASE()) AND table_name = :name"
        ),
        {"schema": spec.schema, "name": spec.sequence},
    )
    if not exists:
        return None
    value = conn.scalar(text(f"SELECT last_id FROM {state_table(spec)} WHERE k = 1"))
    return None if value is None or value < 0 else int(value)


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
