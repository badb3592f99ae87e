"""MariaDB: a stored function issuing Snowflake IDs with the application's layout, and the
``BEFORE INSERT`` trigger that fills a missing key with it.

MariaDB refuses a stored function in a column's ``DEFAULT`` (error 1901), hence the trigger. The
function's worker ID is a slot of the allocator's slots table reserved permanently, as on
PostgreSQL (:mod:`._slots`).

**State.** The function's position is a *packed* number ``tick * 2**sequence_bits + sequence``
(the next ID's time and sequence parts; the worker part is a constant). It is the sum of the
``next_not_cached_value`` of a few ``SEQUENCE`` objects: ``<name>_state`` counts IDs (step 1) and
``<name>_state_<k>`` jump ahead in steps of ``unit * 256**k``. ``NEXTVAL`` is atomic and not
transactional: seen by every session at once, never rolled back, never blocked by another
session's open transaction or running statement. What was measured before choosing it:

* ``SETVAL`` accepts only literals (no expression, variable or subquery) and a function cannot
  run dynamic SQL, so one sequence cannot be moved to the current tick;
* an ``INSERT`` into a sequence, or an InnoDB state row, stays locked until the caller commits;
* an Aria (or MyISAM, MEMORY) state table is locked for the whole calling statement (MariaDB's
  prelocking), including its commit: 8 sessions inserting through it ran at 0.06x
  ``AUTO_INCREMENT``, and a statement waiting for a row lock held every other writer until
  ``innodb_lock_wait_timeout``.

**Atomicity.** ``GET_LOCK`` (a user-level lock, not part of any transaction) makes
read-compute-advance atomic; it is held only while one ID is computed and released at once,
also on error (an exit handler). Moving to a new tick adds at most ``RADIX - 1`` steps per
level, rounded up to ``unit`` (half a tick's sequence numbers; those below are skipped).

The sequence part never wraps inside a tick: an exhausted tick waits (bounded by
``max_wait_ms``) for the next; a clock behind the last ID by more than the tolerance is refused,
as the Python generator does. The clock is ``SYSDATE(6)`` (``NOW()`` is frozen for the whole
statement inside a function; do not start the server with ``--sysdate-is-now``).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, text

from ..errors import InvalidArgumentError
from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ..layout import Layout
from ..worker._schema import validate_identifier
from ._spec import FunctionSpec

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

__all__ = [
    "check_name",
    "check_sql",
    "create_function_sql",
    "create_trigger_sql",
    "drop_function_sql",
    "drop_trigger_sql",
    "last_issued_id",
    "move_forward",
    "trigger_name",
]

#: Each jump level is this many times the one below (steps per level: at most RADIX - 1). 256:
#: six levels and the counter for the default layout (seven reads per call), and a jump after
#: a second of idleness takes about 200 NEXTVALs.
RADIX = 256
#: SLEEP between looks at the clock while waiting for the next tick.
_SLEEP_S = 0.0002
#: MariaDB's largest identifier.
_MAX_NAME = 64
#: The longest name :func:`~snowflake_db.worker._schema.validate_identifier` passes.
_MAX_PLAIN = 63
#: Seconds a call waits for another session's computation before it gives up.
_LOCK_WAIT_S = 10


def _signal(message_sql: str) -> str:
    return (
        f"SET message = {message_sql};\n"
        "            DO RELEASE_LOCK(lock_name);\n"
        "            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = message;"
    )


def unit(layout: Layout) -> int:
    """The smallest jump, in sequence numbers: half a tick's (1 without sequence bits)."""
    return max(1, (layout.max_sequence + 1) // 2)


def levels(layout: Layout) -> int:
    """How many jump levels cover every tick of the layout."""
    span = (layout.max_tick + 1) * (layout.max_sequence + 1) // unit(layout)
    count = 1
    while RADIX**count < span:
        count += 1
    return count


def counter_name(spec: FunctionSpec) -> str:
    return spec.sequence


def level_name(spec: FunctionSpec, level: int) -> str:
    return f"{spec.sequence[:55]}_{level}"


def _names(spec: FunctionSpec, layout: Layout) -> list[str]:
    return [counter_name(spec)] + [level_name(spec, k) for k in range(levels(layout))]


def packed(layout: Layout, snowflake_id: int) -> int:
    """An ID's time and sequence parts as one number (``tick * 2**sequence_bits + seq``)."""
    if snowflake_id < 0:
        return -1
    tick = snowflake_id >> layout.time_shift
    return tick * (layout.max_sequence + 1) + (
        (snowflake_id >> layout.sequence_shift) & layout.max_sequence
    )


def unpacked(layout: Layout, value: int, worker_id: int) -> int:
    tick, sequence = divmod(value, layout.max_sequence + 1)
    return (
        tick << layout.time_shift
        | worker_id << layout.worker_shift
        | sequence << layout.sequence_shift
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
    """The state sequences and ``CREATE FUNCTION``; every number is baked in.

    ``start_after`` is the pseudo last ID (see :func:`._slots.floor_id`). Sequences left by an
    earlier install are kept (``IF NOT EXISTS``): :func:`move_forward` then moves them on.
    """
    layout.check_worker_id(worker_id)
    if rollback_tolerance_ms < 0 or max_wait_ms < 0:
        raise InvalidArgumentError("rollback_tolerance_ms and max_wait_ms must not be negative")
    fn = spec.qualified(spec.name)
    per_tick = layout.max_sequence + 1
    step = unit(layout)
    names = _names(spec, layout)
    sequences = [spec.qualified(name) for name in names]
    # scalar subqueries, not a join: planning a join of ten tables on every call cost ~10x
    total = "\n        + ".join(f"(SELECT next_not_cached_value FROM {seq})" for seq in sequences)
    lock = f"snowflake_db:{spec.name}@"
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
    jumps = "\n".join(
        f"""            SET steps = (units DIV {RADIX**k}) MOD {RADIX};
            WHILE steps > 0 DO
                SET ignored = NEXTVAL({sequences[k + 1]});
                SET steps = steps - 1;
            END WHILE;"""
        for k in reversed(range(len(sequences) - 1))
    )
    body = f"""
BEGIN
    DECLARE lock_name VARCHAR(64) DEFAULT LEFT(CONCAT('{lock}', DATABASE()), 64);
    DECLARE next_value BIGINT;
    DECLARE last_tick BIGINT;
    DECLARE now_tick BIGINT;
    DECLARE units BIGINT;
    DECLARE steps BIGINT;
    DECLARE ignored BIGINT;
    DECLARE started_ms BIGINT DEFAULT FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000);
    DECLARE message VARCHAR(255);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        DO RELEASE_LOCK(lock_name);
        RESIGNAL;
    END;
    IF COALESCE(GET_LOCK(lock_name, {_LOCK_WAIT_S}), 0) = 0 THEN
        SET message = CONCAT('snowflake_db: another session held {spec.name}() for ',
            '{_LOCK_WAIT_S} s; no ID was issued');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = message;
    END IF;
    SET next_value = {total};
    SET last_tick = IF(next_value < 1, -1, (next_value - 1) DIV {per_tick});
    next_id: LOOP
        SET now_tick = (FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) - {layout.epoch_ms})
            DIV {layout.tick_ms};
        IF now_tick > {layout.max_tick} THEN
            {ran_out}
        END IF;
        IF now_tick > last_tick THEN
            -- a new tick: jump to its start, rounded up to whole units
            SET units = (now_tick * {per_tick} - next_value + {step - 1}) DIV {step};
{jumps}
            SET next_value = next_value + units * {step};
            LEAVE next_id;
        END IF;
        IF (last_tick - now_tick) * {layout.tick_ms} > {tolerance} THEN
            {behind}
        END IF;
        IF next_value MOD {per_tick} <> 0 THEN
            LEAVE next_id;
        END IF;
        -- this tick is used up: wait for the next one, never wrap the sequence
        IF FLOOR(UNIX_TIMESTAMP(SYSDATE(6)) * 1000) - started_ms > {max_wait_ms} THEN
            {too_late}
        END IF;
        DO SLEEP({_SLEEP_S});
    END LOOP next_id;
    SET ignored = NEXTVAL({sequences[0]});
    DO RELEASE_LOCK(lock_name);
    RETURN (next_value DIV {per_tick}) * {1 << layout.time_shift}
        + {worker_id << layout.worker_shift}
        + (next_value MOD {per_tick}) * {1 << layout.sequence_shift};
END"""
    comment = (
        f"snowflake_db ID function: worker_id={worker_id} time_bits={layout.time_bits} "
        f"worker_bits={layout.worker_bits} sequence_bits={layout.sequence_bits} "
        f"shard_bits={layout.shard_bits} epoch_ms={layout.epoch_ms} tick_ms={layout.tick_ms}"
    )
    start = packed(layout, start_after) + 1
    statements = [
        f"CREATE SEQUENCE IF NOT EXISTS {sequences[0]} START WITH {start} MINVALUE 0 "
        "INCREMENT BY 1 NOCACHE NOCYCLE"
    ]
    statements += [
        f"CREATE SEQUENCE IF NOT EXISTS {seq} START WITH 0 MINVALUE 0 "
        f"INCREMENT BY {step * RADIX**k} NOCACHE NOCYCLE"
        for k, seq in enumerate(sequences[1:])
    ]
    statements.append(
        f"CREATE FUNCTION {fn}() RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA "
        f"COMMENT '{comment}'{body}"
    )
    return statements


def _next_value(conn: Connection, spec: FunctionSpec, layout: Layout) -> int | None:
    """The packed value of the function's next ID (``None`` without its sequences)."""
    names = _names(spec, layout)
    found = conn.scalar(
        text(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_type = 'SEQUENCE' "
            "AND table_schema = COALESCE(:schema, DATABASE()) AND table_name IN :names"
        ).bindparams(bindparam("names", expanding=True)),
        {"schema": spec.schema, "names": tuple(names)},
    )
    if found != len(names):
        return None
    sequences = [spec.qualified(name) for name in names]
    total = " + ".join(f"{seq}.next_not_cached_value" for seq in sequences)
    value = conn.scalar(text(f"SELECT {total} FROM {', '.join(sequences)}"))
    return None if value is None else int(value)


def move_forward(conn: Connection, spec: FunctionSpec, layout: Layout, after_id: int) -> None:
    """Move the function past ``after_id`` (never back): its next ID comes after it."""
    current = _next_value(conn, spec, layout)
    if current is None:
        raise InvalidArgumentError(f"{spec.name}() has no state sequences in this database")
    target = packed(layout, after_id) + 1
    if target <= current:
        return
    counter = spec.qualified(counter_name(spec))
    own = int(conn.scalar(text(f"SELECT next_not_cached_value FROM {counter}")))
    conn.execute(text(f"SELECT SETVAL({counter}, {own + target - current}, 0)"))


def state_sequences(conn: Connection, spec: FunctionSpec) -> list[str]:
    """The function's state sequences present in the database (whatever layout made them)."""
    names = conn.scalars(
        text(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'SEQUENCE' "
            "AND table_schema = COALESCE(:schema, DATABASE()) AND (table_name = :counter "
            "OR table_name LIKE :levels)"
        ),
        {
            "schema": spec.schema,
            "counter": counter_name(spec),
            "levels": level_name(spec, 0)[:-1].replace("_", "\\_") + "%",
        },
    )
    return sorted(names)


def drop_function_sql(spec: FunctionSpec, sequences: list[str]) -> list[str]:
    """Drop the function, then ``sequences`` (from :func:`state_sequences`)."""
    return [f"DROP FUNCTION IF EXISTS {spec.qualified(spec.name)}"] + [
        f"DROP SEQUENCE IF EXISTS {spec.qualified(name)}" for name in sequences
    ]


def last_issued_id(
    conn: Connection, spec: FunctionSpec, layout: Layout, worker_id: int = 0
) -> int | None:
    """The function's last ID (``None`` if it issued none or has no sequences); its worker
    part is ``worker_id``."""
    value = _next_value(conn, spec, layout)
    if value is None or value < 1:
        return None
    return unpacked(layout, value - 1, worker_id)


def trigger_name(table: str, column: str) -> str:
    """``<table>_<column>_snowflake_key``; a longer name than a plain identifier's 63
    characters is cut and ends with a hash of the whole (names cut alike stay apart)."""
    name = f"{table}_{column}_snowflake_key"
    return name if len(name) <= _MAX_PLAIN else _cut(name, _MAX_PLAIN)


#: The end of the CHECK's name: what its failure means.
CHECK_SUFFIX = "_key_trigger_missing"


def check_name(table: str, column: str) -> str:
    """The name of the ``CHECK (column <> 0)`` that comes with the trigger's ``DEFAULT 0``:
    ``<table>_<column>_key_trigger_missing``, which MariaDB's error names when a row would
    keep the placeholder (a long prefix is cut and ends with a hash of it instead)."""
    prefix = f"{table}_{column}"
    room = _MAX_NAME - len(CHECK_SUFFIX)
    if len(prefix) > room:
        prefix = _cut(prefix, room)
    return prefix + CHECK_SUFFIX


def _cut(name: str, room: int) -> str:
    """``name`` in ``room`` characters, ending with a hash of the whole (names cut alike stay
    apart)."""
    digest = f"{zlib.crc32(name.encode()):08x}"
    return f"{name[: room - len(digest) - 1]}_{digest}"


def _table_sql(spec: FunctionSpec, table: str, table_schema: str | None) -> str:
    validate_identifier(table, "table name")
    if table_schema is not None:
        validate_identifier(table_schema, "schema name")
        return f"`{table_schema}`.`{table}`"
    return f"`{table}`"


def check_sql(column: str) -> str:
    """The condition of :func:`check_name`'s CHECK: the key is not the placeholder 0."""
    validate_identifier(column, "column name")
    return f"`{column}` <> 0"


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
    a key that has no default before any trigger runs (``INSERT ... VALUES`` passes), and the
    ``CHECK`` of :func:`check_name` with it (``IF NOT EXISTS``: a model may have made it),
    which refuses the placeholder should the trigger ever be missing. MariaDB evaluates a
    ``CHECK`` after the ``BEFORE INSERT`` triggers, so it sees the trigger's key."""
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
        statements.append(
            f"ALTER TABLE {target} ADD CONSTRAINT IF NOT EXISTS `{check_name(table, column)}` "
            f"CHECK ({check_sql(column)})"
        )
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
        statements.append(
            f"ALTER TABLE {target} DROP CONSTRAINT IF EXISTS `{check_name(table, column)}`"
        )
    return statements
