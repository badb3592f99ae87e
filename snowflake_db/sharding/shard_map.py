"""The shard map in the control database: which target serves each logical shard, and its version.

Six tables, created beside the worker tables (:mod:`snowflake_db.worker._schema`) by the same
routes: :func:`create_shard_map_tables` (SQLAlchemy), ``op.create_snowflake_shard_map_tables()``
(Alembic) and the ``snowflake_db`` app's migration (Django). Portable on purpose: times are
``BIGINT`` Unix milliseconds from the **database clock**, states are ``VARCHAR`` with ``CHECK``
constraints, so one set of statements serves PostgreSQL, MariaDB and SQLite.

=============================  ================================================================
table                          rows
=============================  ================================================================
``snowflake_shard_targets``    one per target: ``name`` and ``backend``; never a URL (URLs carry
                               secrets: Django names ``DATABASES`` aliases, SQLAlchemy engines)
``snowflake_shard_map_version``exactly one (``singleton = 1``) once initialised: ``version``,
                               bumped in the transaction of every map change, the ``layout``
                               (canonical JSON, as the worker layout record) and
                               ``changed_at_ms``
``snowflake_shard_map``        one per logical shard: ``target``, ``state`` (``serving``,
                               ``moving``, ``cutover``) and ``since_version``
``snowflake_shard_moves``      one per move (written by the mover); ``active_shard`` is UNIQUE
                               and NULL once the move ends, so a second move of a shard fails
``snowflake_shard_move_steps`` the movers' append-only journal ``(move_id, seq)``
``snowflake_shard_map_seen``   one per worker slot: the map version its lease holder routes with
=============================  ================================================================

Every change of the map is one transaction that bumps the version first (a row lock on the one
version row, so concurrent changes serialise), then changes the rows with ``since_version`` set
to the new version. A router re-reads the one version row cheaply and reloads the rows only when
it changed (:class:`~snowflake_db.sharding.routing.ControlledShardRouter`). The cleanup barrier
of a move (:func:`barrier_waiting`) waits until every live lease of the worker slots table has
reported a version at or after the flip (:func:`report_seen`), or expired.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    and_,
    create_engine,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError

from ..errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LayoutMismatchError,
    ShardingError,
    UnknownShardError,
)
from ..layout import Layout, require_layout
from ..worker._schema import (
    DEFAULT_SLOTS_TABLE,
    LAYOUT_TEXT_LENGTH,
    TOKEN_LENGTH,
    validate_identifier,
    worker_tables,
)
from ..worker._store import db_now_ms

__all__ = [
    "BACKENDS",
    "MOVE_STATES",
    "STATES",
    "ShardMap",
    "ShardMapRow",
    "ShardMapTables",
    "add_target",
    "backend_of",
    "barrier_passed",
    "barrier_waiting",
    "control_engine",
    "create_shard_map_tables",
    "drop_shard_map_tables",
    "flip_shard",
    "init_shard_map",
    "layout_text",
    "read_map_version",
    "read_shard_map",
    "report_seen",
    "set_shard_state",
    "shard_map_tables",
]

TARGETS_TABLE = "snowflake_shard_targets"
VERSION_TABLE = "snowflake_shard_map_version"
MAP_TABLE = "snowflake_shard_map"
MOVES_TABLE = "snowflake_shard_moves"
MOVE_STEPS_TABLE = "snowflake_shard_move_steps"
SEEN_TABLE = "snowflake_shard_map_seen"
#: The six names, in the order they are created.
TABLE_NAMES = (TARGETS_TABLE, VERSION_TABLE, MAP_TABLE, MOVES_TABLE, MOVE_STEPS_TABLE, SEEN_TABLE)

#: Length of a target name.
TARGET_NAME_LENGTH = 100
#: Backends a target may run. ``sqlite`` serves tests and single-file setups; no mover moves it.
BACKENDS = ("postgresql", "mariadb", "sqlite")
#: SQLAlchemy backend names that the map spells otherwise (MySQL URLs reach MariaDB servers).
_BACKEND_NAMES = {"postgres": "postgresql", "mysql": "mariadb"}


def backend_of(url: URL) -> str:
    """The map's backend name (:data:`BACKENDS`) of the server a SQLAlchemy URL names: the
    name a target is registered with, and what a move's URLs are checked against."""
    name = url.get_backend_name()
    return _BACKEND_NAMES.get(name, name)


#: What routers see of a logical shard: ``serving`` and ``moving`` route to ``target``;
#: ``cutover`` (the fence is up) still routes reads to ``target``, the source, while writes
#: fail with :class:`~snowflake_db.errors.ShardMovedError` until the flip.
STATES = ("serving", "moving", "cutover")
#: States of a move (the mover's state machine, docs/design/shard-moves.md).
MOVE_STATES = (
    "planned", "capturing", "copying", "catching_up", "fenced", "drained", "verified",
    "flipped", "barrier", "cleaning", "done", "aborting", "aborted",
)
#: Statuses of a journal row.
STEP_STATUSES = ("started", "done", "failed")
#: Length of the capture JSON and of a journal row's detail.
DETAIL_LENGTH = 4000
_SINGLETON = 1


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class ShardMapTables(NamedTuple):
    """The six :class:`~sqlalchemy.Table` objects of one metadata."""

    targets: Table
    version: Table
    map: Table
    moves: Table
    move_steps: Table
    seen: Table


def shard_map_tables(metadata: MetaData, *, schema: str | None = None) -> ShardMapTables:
    """Define (or return the existing) shard map tables in ``metadata``."""
    if schema is not None:
        validate_identifier(schema, "schema name")
    prefix = f"{schema}." if schema else ""
    if f"{prefix}{TARGETS_TABLE}" in metadata.tables:
        return ShardMapTables(*(
            metadata.tables[f"{prefix}{name}"]
            for name in TABLE_NAMES
        ))
    target_ref = f"{prefix}{TARGETS_TABLE}.name"
    targets = Table(
        TARGETS_TABLE,
        metadata,
        Column("name", String(TARGET_NAME_LENGTH), primary_key=True),
        Column("backend", String(20), nullable=False),
        CheckConstraint(_in("backend", BACKENDS), name="snowflake_shard_targets_backend"),
        schema=schema,
    )
    version = Table(
        VERSION_TABLE,
        metadata,
        Column("singleton", Integer, primary_key=True, autoincrement=False),
        Column("version", BigInteger, nullable=False),
        Column("layout", String(LAYOUT_TEXT_LENGTH), nullable=False),
        Column("changed_at_ms", BigInteger, nullable=False),
        CheckConstraint(f"singleton = {_SINGLETON}", name="snowflake_shard_map_version_one"),
        schema=schema,
    )
    shard_map = Table(
        MAP_TABLE,
        metadata,
        Column("logical_shard", Integer, primary_key=True, autoincrement=False),
        Column("target", String(TARGET_NAME_LENGTH), ForeignKey(target_ref), nullable=False),
        Column("state", String(10), nullable=False),
        Column("since_version", BigInteger, nullable=False),
        CheckConstraint(_in("state", STATES), name="snowflake_shard_map_state"),
        schema=schema,
    )
    moves = Table(
        MOVES_TABLE,
        metadata,
        Column(
            "id",
            BigInteger().with_variant(Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        Column("logical_shard", Integer, nullable=False),
        Column("active_shard", Integer, nullable=True, unique=True),
        Column("source", String(TARGET_NAME_LENGTH), ForeignKey(target_ref), nullable=False),
        Column("target", String(TARGET_NAME_LENGTH), ForeignKey(target_ref), nullable=False),
        Column("backend", String(20), nullable=False),
        Column("state", String(20), nullable=False),
        Column("capture", String(DETAIL_LENGTH), nullable=True),
        Column("flipped_version", BigInteger, nullable=True),
        Column("mover_token", String(TOKEN_LENGTH), nullable=True),
        Column("mover_expires_at_ms", BigInteger, nullable=True),
        Column("created_at_ms", BigInteger, nullable=False),
        Column("updated_at_ms", BigInteger, nullable=False),
        CheckConstraint(_in("state", MOVE_STATES), name="snowflake_shard_moves_state"),
        schema=schema,
        sqlite_autoincrement=True,
    )
    move_steps = Table(
        MOVE_STEPS_TABLE,
        metadata,
        Column("move_id", BigInteger, ForeignKey(f"{prefix}{MOVES_TABLE}.id"), nullable=False),
        Column("seq", Integer, nullable=False, autoincrement=False),
        Column("step", String(40), nullable=False),
        Column("status", String(10), nullable=False),
        Column("detail", String(DETAIL_LENGTH), nullable=True),
        Column("at_ms", BigInteger, nullable=False),
        PrimaryKeyConstraint("move_id", "seq"),
        CheckConstraint(_in("status", STEP_STATUSES), name="snowflake_shard_move_steps_status"),
        schema=schema,
    )
    seen = Table(
        SEEN_TABLE,
        metadata,
        Column("worker_id", Integer, primary_key=True, autoincrement=False),
        Column("lease_token", String(TOKEN_LENGTH), nullable=False),
        Column("map_version", BigInteger, nullable=False),
        Column("seen_at_ms", BigInteger, nullable=False),
        schema=schema,
    )
    return ShardMapTables(targets, version, shard_map, moves, move_steps, seen)


def create_shard_map_tables(bind: Engine | Connection, *, schema: str | None = None) -> None:
    """Create the six tables where missing (or let a migration create them)."""
    tables = shard_map_tables(MetaData(), schema=schema)
    tables.targets.metadata.create_all(bind, tables=list(tables), checkfirst=True)


def drop_shard_map_tables(bind: Engine | Connection, *, schema: str | None = None) -> None:
    """Drop the six tables (the map, its version and every move's journal go with them)."""
    tables = shard_map_tables(MetaData(), schema=schema)
    tables.targets.metadata.drop_all(bind, tables=list(tables), checkfirst=True)


# -- reading -----------------------------------------------------------------------------------


def layout_text(layout: Layout) -> str:
    """The recorded form of a layout: its ``as_kwargs()`` as JSON with sorted keys (the same
    text as the worker tables' layout record)."""
    return json.dumps(layout.as_kwargs(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ShardMapRow:
    """One logical shard: where it is served from and since which map version."""

    target: str
    state: str
    since_version: int


@dataclass(frozen=True, slots=True)
class ShardMap:
    """The map as read in one transaction: its version, layout, rows and targets."""

    version: int
    layout: Layout
    rows: dict[int, ShardMapRow]
    #: every known target ``{name: backend}``, serving shards or not
    targets: dict[str, str]
    changed_at_ms: int

    @property
    def mapping(self) -> dict[int, str]:
        """``{logical_shard: target}``."""
        return {shard: row.target for shard, row in self.rows.items()}

    def check_layout(self, layout: Layout, *, where: str = "the shard map") -> None:
        """Refuse another layout than the map's: its IDs would route by other shard bits."""
        if layout != self.layout:
            raise LayoutMismatchError(
                f"{where} was initialised for layout {layout_text(self.layout)}, but this "
                f"process uses {layout_text(layout)}: IDs would be routed with the wrong bits. "
                "Use the map's layout, or another control database for another layout",
                recorded=self.layout.as_kwargs(),
                given=layout.as_kwargs(),
            )


def control_engine(control: object) -> tuple[Engine, bool]:
    """``(engine, created)`` for a control database given as an ``Engine`` (used as it is) or a
    URL (a new engine that checks its connections before use; the caller disposes it)."""
    if isinstance(control, Engine):
        return control, False
    if isinstance(control, URL | str):
        return create_engine(control, pool_pre_ping=True), True
    raise InvalidArgumentTypeError(
        f"the control database must be a SQLAlchemy Engine, URL or URL string, got "
        f"{type(control).__name__}"
    )


@contextmanager
def _transaction(bind: Engine | Connection) -> Iterator[Connection]:
    """An engine's own transaction, or the caller's connection as it is (the caller commits)."""
    if isinstance(bind, Engine):
        with bind.begin() as connection:
            yield connection
    else:
        yield bind


def _tables(schema: str | None) -> ShardMapTables:
    return shard_map_tables(MetaData(), schema=schema)


_NOT_INITIALISED = (
    "the shard map is not initialised: run init_shard_map(control, layout=..., assignment=...) "
    "once on the control database"
)


def read_map_version(bind: Engine | Connection, *, schema: str | None = None) -> int:
    """The map's version: one row by its primary key, what routers poll."""
    tables = _tables(schema)
    with _transaction(bind) as connection:
        version = connection.execute(
            select(tables.version.c.version).where(tables.version.c.singleton == _SINGLETON)
        ).scalar()
    if version is None:
        raise ShardingError(_NOT_INITIALISED)
    return int(version)


def read_shard_map(bind: Engine | Connection, *, schema: str | None = None) -> ShardMap:
    """The whole map (version, layout, rows, targets) from one transaction."""
    tables = _tables(schema)
    with _transaction(bind) as connection:
        return _read(connection, tables)


def existing_layout(bind: Engine | Connection, *, schema: str | None = None) -> Layout | None:
    """The layout of the map already written, or ``None`` before :func:`init_shard_map` (so
    that initialising again needs no layout repeated)."""
    tables = _tables(schema)
    with _transaction(bind) as connection:
        head = connection.execute(
            select(tables.version.c.version).where(tables.version.c.singleton == _SINGLETON)
        ).first()
        return None if head is None else _read(connection, tables).layout


def _read(connection: Connection, tables: ShardMapTables) -> ShardMap:
    head = connection.execute(
        select(tables.version.c.version, tables.version.c.layout, tables.version.c.changed_at_ms)
        .where(tables.version.c.singleton == _SINGLETON)
    ).first()
    if head is None:
        raise ShardingError(_NOT_INITIALISED)
    try:
        layout = Layout(**json.loads(head.layout))
    except (ValueError, TypeError) as error:
        raise ShardingError(
            f"the shard map's recorded layout {head.layout!r} cannot be read: {error}"
        ) from None
    rows = {
        int(row.logical_shard): ShardMapRow(str(row.target), str(row.state), int(row.since_version))
        for row in connection.execute(
            select(tables.map.c.logical_shard, tables.map.c.target, tables.map.c.state,
                   tables.map.c.since_version)
        )
    }
    targets = {
        str(row.name): str(row.backend)
        for row in connection.execute(select(tables.targets.c.name, tables.targets.c.backend))
    }
    return ShardMap(int(head.version), layout, rows, targets, int(head.changed_at_ms))


# -- changing ----------------------------------------------------------------------------------


def _logical_shards(layout: Layout) -> int:
    if layout.shard_bits == 0:
        raise ShardingError(
            "a shard map needs a layout with shard_bits > 0 (each ID carries its logical shard, "
            f"so a shard can move without rewriting IDs); got {layout_text(layout)}"
        )
    return 1 << layout.shard_bits


def _check_target_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(
            f"a shard target name must be a str, got {type(name).__name__} {name!r}"
        )
    if not name or len(name) > TARGET_NAME_LENGTH:
        raise InvalidArgumentError(
            f"shard target name {name!r} must have 1 to {TARGET_NAME_LENGTH} characters"
        )
    if "://" in name:
        raise InvalidArgumentError(
            f"shard target name {name!r} looks like a URL: store names only (URLs carry "
            "secrets); name the target and give its engine or DATABASES alias separately"
        )
    return name


def _check_backend(backend: object, name: str) -> str:
    if backend not in BACKENDS:
        raise InvalidArgumentError(
            f"backend {backend!r} of shard target {name!r} is not one of {', '.join(BACKENDS)}"
        )
    return str(backend)


def _check_shard(shard: object, count: int) -> int:
    if isinstance(shard, bool) or not isinstance(shard, int):
        raise InvalidArgumentTypeError(
            f"a logical shard must be an int, got {type(shard).__name__} {shard!r}"
        )
    if not 0 <= shard < count:
        raise UnknownShardError(f"unknown logical shard {shard}; the map has 0..{count - 1}")
    return shard


def init_shard_map(
    bind: Engine | Connection,
    *,
    layout: Layout,
    assignment: Sequence[str] | Mapping[int, str],
    backend: str | Mapping[str, str] = "postgresql",
    schema: str | None = None,
) -> ShardMap:
    """Write the first map (version 1): ``2**shard_bits`` logical shards on their targets.

    ``assignment`` is a sequence of target names (shard ``s`` on ``names[s % len(names)]``) or
    a mapping ``{shard: name}`` covering every shard; ``backend`` is every target's backend or
    ``{name: backend}``. Run again with the same layout it changes nothing and returns the map
    as it is (moves may have changed it since); with another layout it is refused
    (:class:`~snowflake_db.errors.LayoutMismatchError`), because the map's shards are that
    layout's shard bits.
    """
    layout = require_layout(layout)
    count = _logical_shards(layout)
    if isinstance(assignment, str):
        raise InvalidArgumentTypeError(
            f"assignment must be a sequence or mapping of target names, got the string "
            f"{assignment!r}"
        )
    if isinstance(assignment, Mapping):
        mapping = {_check_shard(shard, count): target for shard, target in assignment.items()}
        missing = [shard for shard in range(count) if shard not in mapping]
        if missing:
            raise InvalidArgumentError(
                f"the assignment must give a target to each logical shard 0..{count - 1}; "
                f"missing {missing[:10]}"
            )
    else:
        names = list(assignment)
        if not names:
            raise InvalidArgumentError("a shard map needs at least one target")
        mapping = {shard: names[shard % len(names)] for shard in range(count)}
    targets = {_check_target_name(name): "" for name in mapping.values()}
    for name in targets:
        chosen = backend if isinstance(backend, str) else backend.get(name)
        targets[name] = _check_backend(chosen, name)
    tables = _tables(schema)
    try:
        with _transaction(bind) as connection:
            existing = connection.execute(
                select(tables.version.c.version).where(tables.version.c.singleton == _SINGLETON)
            ).first()
            if existing is None:
                _write_initial(connection, tables, layout, mapping, targets)
            current = _read(connection, tables)
    except IntegrityError:
        # Another process initialised it first (the version row's fixed key): judge against it.
        current = read_shard_map(bind, schema=schema)
    current.check_layout(layout, where="the shard map")
    return current


def _write_initial(
    connection: Connection,
    tables: ShardMapTables,
    layout: Layout,
    mapping: dict[int, str],
    targets: dict[str, str],
) -> None:
    connection.execute(
        insert(tables.version).values(
            singleton=_SINGLETON, version=1, layout=layout_text(layout), changed_at_ms=db_now_ms()
        )
    )
    known = set(connection.execute(select(tables.targets.c.name)).scalars())
    new_targets = [{"name": n, "backend": b} for n, b in targets.items() if n not in known]
    if new_targets:
        connection.execute(insert(tables.targets), new_targets)
    connection.execute(
        insert(tables.map),
        [
            {"logical_shard": shard, "target": target, "state": "serving", "since_version": 1}
            for shard, target in sorted(mapping.items())
        ],
    )


def add_target(
    bind: Engine | Connection, name: str, *, backend: str = "postgresql",
    schema: str | None = None,
) -> None:
    """Register a target shards can move to (no shard is placed on it; the version is unchanged:
    routers do not need a new target until a shard is flipped to it). Registering a known name
    again with the same backend does nothing; with another backend it is refused."""
    _check_target_name(name)
    _check_backend(backend, name)
    tables = _tables(schema)
    with _transaction(bind) as connection:
        known = connection.execute(
            select(tables.targets.c.backend).where(tables.targets.c.name == name)
        ).scalar()
        if known is None:
            connection.execute(insert(tables.targets).values(name=name, backend=backend))
        elif known != backend:
            raise InvalidArgumentError(
                f"shard target {name!r} is already registered with backend {known!r}, not "
                f"{backend!r}"
            )


def _bump(connection: Connection, tables: ShardMapTables) -> tuple[int, int]:
    """Bump the version (the row lock serialises map changes); return it and the shard count."""
    bumped = connection.execute(
        update(tables.version)
        .where(tables.version.c.singleton == _SINGLETON)
        .values(version=tables.version.c.version + 1, changed_at_ms=db_now_ms())
    )
    if bumped.rowcount != 1:
        raise ShardingError(_NOT_INITIALISED)
    head = connection.execute(
        select(tables.version.c.version, tables.version.c.layout)
        .where(tables.version.c.singleton == _SINGLETON)
    ).one()
    layout = Layout(**json.loads(head.layout))
    return int(head.version), 1 << layout.shard_bits


def flip_shard(
    bind: Engine | Connection,
    shard: int,
    target: str,
    *,
    move_id: int | None = None,
    schema: str | None = None,
) -> int:
    """The flip: in one transaction bump the version, put ``shard`` on ``target`` with state
    ``serving``, and (with ``move_id``) record the new version as the move's
    ``flipped_version``. Returns the new version, which the cleanup barrier waits for."""
    _check_target_name(target)
    tables = _tables(schema)
    with _transaction(bind) as connection:
        version, count = _bump(connection, tables)
        _check_shard(shard, count)
        _require_target(connection, tables, target)
        connection.execute(
            update(tables.map)
            .where(tables.map.c.logical_shard == shard)
            .values(target=target, state="serving", since_version=version)
        )
        if move_id is not None:
            moved = connection.execute(
                update(tables.moves)
                .where(tables.moves.c.id == move_id)
                .values(flipped_version=version, state="flipped", updated_at_ms=db_now_ms())
            )
            if moved.rowcount != 1:
                raise ShardingError(f"no shard move with id {move_id} to record the flip in")
    return version


def _require_target(connection: Connection, tables: ShardMapTables, target: str) -> None:
    names = list(connection.execute(select(tables.targets.c.name)).scalars())
    if target not in names:
        raise UnknownShardError(
            f"unknown shard target {target!r}; known targets: {', '.join(sorted(names))} "
            "(register a new one with add_target first)"
        )


def set_shard_state(
    bind: Engine | Connection, shard: int, state: str, *, schema: str | None = None
) -> int:
    """Set a shard's state (``serving``, ``moving``, ``cutover``), bumping the version in the
    same transaction; returns the new version. The target is changed only by :func:`flip_shard`."""
    if state not in STATES:
        raise InvalidArgumentError(f"shard state {state!r} is not one of {', '.join(STATES)}")
    tables = _tables(schema)
    with _transaction(bind) as connection:
        version, count = _bump(connection, tables)
        _check_shard(shard, count)
        connection.execute(
            update(tables.map)
            .where(tables.map.c.logical_shard == shard)
            .values(state=state, since_version=version)
        )
    return version


# -- what processes route with, and the barrier --------------------------------------------------


def report_seen(
    bind: Engine | Connection,
    *,
    worker_id: int,
    lease_token: str,
    version: int,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    schema: str | None = None,
) -> bool:
    """Record that the holder of ``worker_id``'s lease ``lease_token`` routes with map
    ``version``. Written only while the slots table holds that token for the slot (a process
    whose lease was lost, or that leases from other tables, writes nothing); returns whether it
    was written."""
    tables = _tables(schema)
    slots = worker_tables(MetaData(), slots_table=slots_table, schema=schema).slots
    with _transaction(bind) as connection:
        held = connection.execute(
            select(slots.c.worker_id).where(
                and_(slots.c.worker_id == worker_id, slots.c.lease_token == lease_token)
            )
        ).first()
        if held is None:
            return False
        values = {"lease_token": lease_token, "map_version": version, "seen_at_ms": db_now_ms()}
        if connection.dialect.name in ("mysql", "mariadb"):
            # One upsert: InnoDB's UPDATE of a missing row locks the gap where it would be
            # (REPEATABLE READ), so two processes reporting for the first time at once each
            # waited for the other's INSERT into that gap, and one was rolled back (error 1213
            # as the grow demo's order processes started). The upsert locks the row only.
            from sqlalchemy.dialects.mysql import insert as mysql_insert

            upsert = mysql_insert(tables.seen).values(worker_id=worker_id, **values)
            connection.execute(upsert.on_duplicate_key_update(**values))
            return True
        updated = connection.execute(
            update(tables.seen).where(tables.seen.c.worker_id == worker_id).values(**values)
        )
        if updated.rowcount == 0:
            connection.execute(insert(tables.seen).values(worker_id=worker_id, **values))
    return True


def barrier_waiting(
    bind: Engine | Connection,
    version: int,
    *,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    schema: str | None = None,
) -> list[int]:
    """The worker IDs whose live lease has not reported a map ``version`` or later; the barrier
    has passed when the list is empty.

    A lease counts while ``expires_at_ms`` is at or after the database's now (an expired lease's
    holder has fenced itself); a report counts only under the slot's current token (a new holder
    starts over). Permanent reservations (no expiry: server-side ID functions) route nothing
    and are not waited for. Processes with static worker IDs are invisible here.
    """
    tables = _tables(schema)
    slots = worker_tables(MetaData(), slots_table=slots_table, schema=schema).slots
    seen = tables.seen
    joined = slots.outerjoin(
        seen, and_(seen.c.worker_id == slots.c.worker_id, seen.c.lease_token == slots.c.lease_token)
    )
    query = (
        select(slots.c.worker_id)
        .select_from(joined)
        .where(
            slots.c.lease_token.is_not(None),
            slots.c.expires_at_ms.is_not(None),
            slots.c.expires_at_ms >= db_now_ms(),
            or_(seen.c.map_version.is_(None), seen.c.map_version < literal(version)),
        )
        .order_by(slots.c.worker_id)
    )
    with _transaction(bind) as connection:
        return [int(worker_id) for worker_id in connection.execute(query).scalars()]


def barrier_passed(
    bind: Engine | Connection,
    version: int,
    *,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    schema: str | None = None,
) -> bool:
    """Whether every live lease routes with map ``version`` or later (:func:`barrier_waiting`)."""
    return not barrier_waiting(bind, version, slots_table=slots_table, schema=schema)

