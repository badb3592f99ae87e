"""Move a logical shard online from one server to another of the same backend, crash-safe.

:class:`ShardMover` drives the steps of a :class:`~snowflake_db.sharding.moves.MoveBackend`
(:class:`~snowflake_db.sharding.moves.PostgresMoveBackend` between PostgreSQL servers, the
MariaDB backend between MariaDB servers: the shard map's backend of both targets picks it)
through the state machine of ``docs/design/shard-moves.md``::

    planned -> capturing -> copying -> catching_up -> fenced -> drained -> verified -> flipped
            -> barrier -> cleaning -> done          (before flipped: -> aborting -> aborted)

Every step is journaled in the control database (``snowflake_shard_move_steps``: a ``started``
row before the action, ``done`` or ``failed`` after it, database clock) under the mover's own
lease on the move's row, renewed while it runs. The actions are idempotent and find their objects
by name, so :meth:`ShardMover.resume` continues a move whose mover died at any point from its
last journaled step, and :meth:`ShardMover.abort` undoes a move that has not flipped. A resume
before the flip, once the copy step has begun, that finds the copy lost (PostgreSQL: the
subscription gone from the target) undoes it and copies again from the capture step
(:data:`RECOPY_STEP`); so does a run whose copy can never finish (PostgreSQL: a table's copy
slot lost in a crash of the source, :class:`~snowflake_db.errors.CopyLostError`). The shard
map follows the move: ``moving`` while copying, ``cutover`` once the fence is up, then the
flip (:func:`~snowflake_db.sharding.shard_map.flip_shard`) in the same transaction as its
journal line. After the flip only forward steps remain: the barrier (every live lease routes
with the new map, or lapsed), then the cleanup of the capture and copy objects and of the
source's rows; the fence stays on the source. Every wait before the flip calls the backend's
``advance`` on each poll: a backend that copies in the mover's process does its work there.

Targets are given as ``{name: URL or Engine}`` and never stored: the control database holds names.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from sqlalchemy import Engine, MetaData, inspect
from sqlalchemy.engine import URL, make_url

from ...errors import (
    CopyLostError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MoverLeaseLostError,
    MoveStoppedError,
    ShardMoveError,
    StaticWorkersUnconfirmedError,
    UnknownShardError,
)
from ...layout import Layout, require_layout
from ...worker._schema import DEFAULT_SLOTS_TABLE
from ..shard_map import (
    ShardMap,
    ShardMapTables,
    backend_of,
    barrier_waiting,
    control_engine,
    flip_shard,
    read_shard_map,
    set_shard_state,
    shard_map_tables,
)
from ._backend import MOVE_BACKENDS, MoveBackend, backend_class
from ._connections import Endpoint
from ._journal import (
    ENDED_STATES,
    Journal,
    JournalRow,
    LeaseKeeper,
    MoveRecord,
    active_move,
    already_moving,
    create_move,
    list_moves,
    new_token,
    read_journal,
    read_move,
    take_over,
)
from ._results import Leftovers, MovedTable

__all__ = [
    "FORWARD_STEPS",
    "RECOPY_STEP",
    "STATIC_WORKERS_STEP",
    "MovePlan",
    "MoveProgress",
    "MoveRecord",
    "MoveStatus",
    "MoveStoppedError",
    "MoverLeaseLostError",
    "ProposedMove",
    "ShardMover",
    "StaticWorkersUnconfirmedError",
]

#: The journaled forward steps and the move state each one runs in, in order.
FORWARD_STEPS: tuple[tuple[str, str | None], ...] = (
    ("check", "planned"),
    ("capture", "capturing"),
    ("copy", "copying"),
    ("catch_up", "catching_up"),
    ("announce", "catching_up"),  # every leased router has seen the shard "moving"
    ("fence", "fenced"),
    ("drain", "drained"),
    ("verify", "verified"),
    ("drop_old_fence", "verified"),
    ("flip", None),  # the flip's own transaction sets the state "flipped"
    ("barrier", "barrier"),
    ("cleanup", "cleaning"),
    ("delete_source_rows", "cleaning"),
    ("finish", "cleaning"),
)
_FORWARD_NAMES = tuple(name for name, _ in FORWARD_STEPS)
#: Steps whose ``done`` line and the next step's ``started`` line share one transaction of
#: the control database (fewer round trips; inside the moving shard's pause, they count).
#: Not the flip (its transaction is the map's) nor the last step.
_CHAINED = frozenset(_FORWARD_NAMES) - {"flip", "finish"}
#: The steps run with one session held open on each server, from the capture to the flip:
#: the copy's and the drain's polls and the pause's steps pay no connection set-up (a server
#: process started) per call. A server restarted meanwhile is met by the next statement on
#: its session: that step stops ("lost the connection"), a resume goes on.
_HELD = frozenset({"capture", "copy", "catch_up", "announce", "fence", "drain", "verify",
                   "drop_old_fence", "flip"})
#: A copy the servers can never finish (:meth:`MoveBackend.copy_stranded`) is looked for
#: every ``STRANDED_CHECK_S`` while the copy is waited for, and acted on once seen for
#: ``STRANDED_CONFIRM_S``: a healthy table's copy passes through the same picture for the
#: moment between its slot's drop and its state's commit.
STRANDED_CHECK_S = 1.0
STRANDED_CONFIRM_S = 5.0
#: How many times one run undoes a lost copy and makes it again before it stops.
RECOPIES_PER_RUN = 3
#: How often the drain (inside the pause) and the end of the copy are polled, in seconds.
DRAIN_POLL_S = 0.01
COPY_POLL_S = 0.05
#: The step a move stops at without ``assume_no_static_workers``.
STATIC_WORKERS_STEP = "delete_source_rows"
#: The step a resume journals when, before the flip, it finds the copy lost (the target's
#: subscription gone): it lifts the move's fence if up, drops the capture and copy objects
#: (the orphaned slot among them), deletes the shard's rows on the target and the move goes
#: on from ``capture``. The journal's forward steps count from its last ``done`` line.
RECOPY_STEP = "recopy"
_COPY_INDEX = _FORWARD_NAMES.index("copy")
_CAPTURE_INDEX = _FORWARD_NAMES.index("capture")
#: An earlier move's fence on the target: ``sfdb_fence_<move id>_<suffix>`` (every backend).
_OLD_FENCE = re.compile(r"^sfdb_fence_(\d+)_")

Target = str | URL | Engine




@dataclass(frozen=True)
class MoveProgress:
    """One progress event of a move: ``str()`` is a line for a terminal or a log."""

    move_id: int | None
    step: str
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        prefix = f"move {self.move_id}" if self.move_id is not None else "plan"
        return f"{prefix} {self.step}: {self.message}"


@dataclass(frozen=True)
class MovePlan:
    """What a move of ``shard`` from ``source`` to ``target`` would do; every check passed."""

    shard: int
    source: str
    target: str
    rows: dict[str, int]
    bytes: int
    map_version: int
    #: the map's shards per target after the move
    placement: dict[str, list[int]]
    #: the backend of both servers (``postgresql`` or ``mariadb``)
    backend: str = "postgresql"

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def as_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "source": self.source, "target": self.target,
                "rows": self.rows, "bytes": self.bytes, "map_version": self.map_version,
                "placement": self.placement, "backend": self.backend}

    def __str__(self) -> str:
        tables = ", ".join(f"{name} {count}" for name, count in self.rows.items())
        return (f"shard {self.shard}: {self.source} -> {self.target}, {self.total_rows} rows "
                f"({tables}), about {self.bytes} bytes; every check passed")


@dataclass(frozen=True)
class ProposedMove:
    """One move of a balancing plan."""

    shard: int
    source: str
    target: str

    def __str__(self) -> str:
        return f"shard {self.shard}: {self.source} -> {self.target}"


@dataclass(frozen=True)
class MoveStatus:
    """A move's row and its journal."""

    move: MoveRecord
    journal: list[JournalRow]


Progress = Callable[[MoveProgress], object]


def _libpq(url: URL) -> str:
    """A libpq URI for a SQLAlchemy URL (what a subscription's CONNECTION takes)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


#: The driver each backend's steps connect with; an engine of another driver is used by URL.
_DRIVERS = {"postgresql": "psycopg", "mariadb": "pymysql"}


class _Server:
    """One target as given: its backend, what the move's steps connect with and (PostgreSQL)
    the connection string a subscription uses."""

    def __init__(self, name: str, value: object) -> None:
        self.name = name
        if isinstance(value, Engine):
            url = value.url
        elif isinstance(value, URL) or (isinstance(value, str) and "://" in value):
            url = make_url(value)
        elif isinstance(value, str):  # a libpq key=value string
            self.backend = "postgresql"
            self.conninfo = value
            self.endpoint: Endpoint = value
            return
        else:
            raise InvalidArgumentTypeError(
                f"target {name!r} must be given as a URL or a SQLAlchemy Engine, not "
                f"{type(value).__name__}"
            )
        self.backend = backend_of(url)
        self.conninfo = _libpq(url) if self.backend == "postgresql" else ""
        if isinstance(value, Engine) and url.get_driver_name() == _DRIVERS.get(self.backend):
            self.endpoint = value  # the steps take an engine of their driver as it is
        elif self.backend == "mariadb":
            self.endpoint = url.set(drivername="mysql+pymysql")
        else:
            self.endpoint = self.conninfo


class ShardMover:
    """Moves logical shards between the targets of the shard map in ``control``.

    ``control`` is the control database (Engine or URL); ``targets`` maps each target name of
    the map the move touches to a URL or SQLAlchemy Engine (never stored); ``layout`` must be
    the map's; ``tables`` are the sharded tables (names or :class:`MovedTable`), parents first.
    ``subscription_conninfo`` optionally gives, per source name, the connection string the
    target's subscription reaches it with (PostgreSQL; default: the source's URL as given).
    A move runs between two servers of the same backend (the map's backend of each target:
    PostgreSQL or MariaDB); before the fence the copy catches up until its backlog is at most
    ``max_lag_bytes`` of WAL (PostgreSQL) or ``max_backlog_rows`` captured changes (MariaDB).

    ``assume_no_static_workers`` is the operator's word that no process routes with a static
    worker ID (or without any lease): the cleanup barrier sees leases only, so without it a move
    stops after its barrier and cleanup, before deleting the source's rows of the shard
    (:data:`STATIC_WORKERS_STEP`); resume it with the option once every such process routes
    with the new map.
    """

    def __init__(
        self,
        control: Engine | URL | str,
        targets: Mapping[str, Target],
        *,
        layout: Layout,
        tables: Sequence[MovedTable | str],
        schema: str | None = None,
        subscription_conninfo: Mapping[str, str] | None = None,
        slots_table: str = DEFAULT_SLOTS_TABLE,
        lease_s: float = 30.0,
        copy_timeout_s: float = 3600.0,
        catch_up_timeout_s: float = 600.0,
        drain_timeout_s: float = 120.0,
        barrier_timeout_s: float = 300.0,
        max_lag_bytes: int = 1 << 20,
        max_backlog_rows: int = 5000,
        batch_size: int = 5000,
        lock_timeout_ms: int = 100,
        fence_attempts: int = 50,
        progress_every_s: float = 2.0,
        assume_no_static_workers: bool = False,
    ) -> None:
        self.layout = require_layout(layout)
        if self.layout.shard_bits == 0:
            raise ShardMoveError(
                "the layout has no shard bits (shard_bits=0): IDs do not carry a logical shard, "
                "so no shard can move by its rows' IDs; moves need Layout(shard_bits>0)")
        if not tables:
            raise InvalidArgumentError("tables is empty: a move needs at least one sharded table")
        self.tables = tuple(t if isinstance(t, MovedTable) else MovedTable(t) for t in tables)
        if not isinstance(targets, Mapping):
            raise InvalidArgumentTypeError(
                f"targets must map target names to URLs or engines, got {type(targets).__name__}"
            )
        self.servers = {str(name): _Server(str(name), value) for name, value in targets.items()}
        for name, seconds in (("lease_s", lease_s), ("copy_timeout_s", copy_timeout_s),
                              ("catch_up_timeout_s", catch_up_timeout_s),
                              ("drain_timeout_s", drain_timeout_s),
                              ("barrier_timeout_s", barrier_timeout_s),
                              ("progress_every_s", progress_every_s)):
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
                raise InvalidArgumentError(f"{name} {seconds!r} must be a number of seconds > 0")
        self.schema = schema
        self.subscription_conninfo = dict(subscription_conninfo or {})
        self.slots_table = slots_table
        self.lease_ms = int(lease_s * 1000)
        self.copy_timeout_s = float(copy_timeout_s)
        self.catch_up_timeout_s = float(catch_up_timeout_s)
        self.drain_timeout_s = float(drain_timeout_s)
        self.barrier_timeout_s = float(barrier_timeout_s)
        for name, count in (("max_lag_bytes", max_lag_bytes),
                            ("max_backlog_rows", max_backlog_rows)):
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise InvalidArgumentError(f"{name} {count!r} must be an int >= 0")
        self.max_lag_bytes = max_lag_bytes
        self.max_backlog_rows = max_backlog_rows
        self.batch_size = batch_size
        self.lock_timeout_ms = lock_timeout_ms
        self.fence_attempts = fence_attempts
        self.progress_every_s = float(progress_every_s)
        if not isinstance(assume_no_static_workers, bool):
            raise InvalidArgumentTypeError(
                f"assume_no_static_workers must be True or False, not {assume_no_static_workers!r}")
        self.assume_no_static_workers = assume_no_static_workers
        self.map_tables = shard_map_tables_for(schema)
        self.engine, self._owns_engine = control_engine(control)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Dispose of the control engine when the mover created it from a URL."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> ShardMover:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------

    def shard_map(self) -> ShardMap:
        """The map as it is now, checked against this mover's layout."""
        current = read_shard_map(self.engine, schema=self.schema)
        current.check_layout(self.layout, where="the control database's shard map")
        return current

    def status(self, move_id: int) -> MoveStatus:
        """A move's row and journal."""
        return MoveStatus(read_move(self.engine, self.map_tables, move_id),
                          read_journal(self.engine, self.map_tables, move_id))

    def moves(self, *, limit: int = 20) -> list[MoveRecord]:
        """The latest moves, newest first."""
        return list_moves(self.engine, self.map_tables, limit=limit)

    def leftovers(self, move_id: int) -> Leftovers:
        """The move's capture and copy objects and fence triggers still present on its
        servers."""
        record = read_move(self.engine, self.map_tables, move_id)
        return self._backend_of(record).leftovers()

    # -- planning ------------------------------------------------------------------------------

    def plan(self, shard: int, to: str) -> MovePlan:
        """Run every check of a move of ``shard`` to ``to`` and measure it; nothing changes."""
        current, source, kind = self._validate(shard, to)
        backend = self._backend(0, shard, source, to, kind)
        backend.check()
        rows, size = backend.measure()
        placement: dict[str, list[int]] = {name: [] for name in sorted(current.targets)}
        for logical, row in sorted(current.rows.items()):
            placement[to if logical == shard else row.target].append(logical)
        return MovePlan(shard, source, to, rows, size, current.version,
                        {name: shards for name, shards in placement.items()}, kind)

    def plan_balance(self, targets: Sequence[str] | None = None) -> list[ProposedMove]:
        """The fewest moves that spread the map's logical shards evenly over ``targets`` (default:
        every target given to this mover); shards on other targets move onto them. Nothing is
        checked or changed: plan or move each proposal."""
        current = self.shard_map()
        names = list(targets) if targets is not None else sorted(self.servers)
        if not names or len(set(names)) != len(names):
            raise InvalidArgumentError(f"plan_balance needs distinct target names, got {names}")
        for name in names:
            if name not in current.targets:
                raise UnknownShardError(self._unknown_target(name, current))
        held: dict[str, list[int]] = {name: [] for name in names}
        homeless: list[int] = []
        for logical, row in sorted(current.rows.items()):
            held.get(row.target, homeless).append(logical)
        count, spread = len(current.rows), len(names)
        # Targets already holding the most keep the remainder's extra shard: fewest moves.
        order = sorted(names, key=lambda n: (-len(held[n]), n))
        quota = {name: count // spread + (1 if i < count % spread else 0)
                 for i, name in enumerate(order)}
        giving = list(homeless)
        for name in order:
            surplus = len(held[name]) - quota[name]
            if surplus > 0:
                giving.extend(held[name][-surplus:])
        proposals = []
        for name in sorted(names, key=lambda n: (len(held[n]), n)):
            while len(held[name]) < quota[name] and giving:
                logical = giving.pop(0)
                proposals.append(ProposedMove(logical, current.rows[logical].target, name))
                held[name].append(logical)
        return proposals

    # -- moving --------------------------------------------------------------------------------

    @overload
    def move(self, shard: int, to: str, *, progress: Progress | None = ...,
             dry_run: Literal[False] = ..., terminate_blockers: bool = ...) -> int: ...

    @overload
    def move(self, shard: int, to: str, *, progress: Progress | None = ...,
             dry_run: Literal[True], terminate_blockers: bool = ...) -> MovePlan: ...

    def move(self, shard: int, to: str, *, progress: Progress | None = None,
             dry_run: bool = False, terminate_blockers: bool = False) -> int | MovePlan:
        """Move ``shard`` to target ``to`` and return the move's id (with ``dry_run``, only the
        plan: every check ran, nothing changed). A failure after the move started is a
        :class:`MoveStoppedError` naming the move and the step: resume or abort it."""
        plan = self.plan(shard, to)
        if dry_run:
            return plan
        token = new_token()
        move_id = create_move(
            self.engine, self.map_tables, shard=shard, source=plan.source, target=to,
            backend=plan.backend, token=token, lease_ms=self.lease_ms, plan=plan.as_dict(),
        )
        _emit(progress, MoveProgress(move_id, "plan", str(plan), plan.as_dict()))
        journal = Journal(self.engine, self.map_tables, move_id, token, self.lease_ms)
        self._run(journal, 0, progress, terminate_blockers)
        return move_id

    def resume(self, move_id: int, *, progress: Progress | None = None, force: bool = False,
               terminate_blockers: bool = False) -> MoveRecord:
        """Continue a move from its last journaled step (an abort that was under way goes on
        aborting). Before the flip, once the copy step has begun (done or not), a copy found
        lost (PostgreSQL: the subscription gone from the target) is undone and made again
        (:data:`RECOPY_STEP`). Refused while another mover holds the move's lease, unless
        ``force``."""
        record = read_move(self.engine, self.map_tables, move_id)
        if record.state in ENDED_STATES:
            return record
        self._servers_of(record)
        token = new_token()
        record = take_over(self.engine, self.map_tables, move_id, token, self.lease_ms,
                           force=force)
        journal = Journal(self.engine, self.map_tables, move_id, token, self.lease_ms)
        if record.state in ENDED_STATES:  # another mover finished it meanwhile
            return record
        if record.state == "aborting":
            self._abort(journal, record, progress)
        else:
            start = _resume_index(read_journal(self.engine, self.map_tables, move_id))
            _emit(progress, MoveProgress(move_id, "resume",
                                         f"state {record.state}, from step "
                                         f"{_FORWARD_NAMES[min(start, len(_FORWARD_NAMES) - 1)]}"))
            self._run(journal, start, progress, terminate_blockers, resumed=True)
        return read_move(self.engine, self.map_tables, move_id)

    def abort(self, move_id: int, *, progress: Progress | None = None,
              force: bool = False) -> MoveRecord:
        """Undo a move that has not flipped: drop its fence, subscription, slots and
        publication, delete the rows it copied to the target, serve the shard from the source
        again. After the flip the target is authoritative: only :meth:`resume` goes on."""
        record = read_move(self.engine, self.map_tables, move_id)
        if record.state == "aborted":
            return record
        if record.flipped:
            raise ShardMoveError(
                f"move {move_id} of shard {record.shard} has flipped (state {record.state}): "
                f"{record.target} is authoritative, so it cannot be aborted; resume it "
                f"(--resume {move_id}), then move the shard back if needed"
            )
        self._servers_of(record)
        token = new_token()
        record = take_over(self.engine, self.map_tables, move_id, token, self.lease_ms,
                           force=force)
        journal = Journal(self.engine, self.map_tables, move_id, token, self.lease_ms)
        self._abort(journal, record, progress)
        return read_move(self.engine, self.map_tables, move_id)

    # -- validation ------------------------------------------------------------------------------

    def _validate(self, shard: int, to: str) -> tuple[ShardMap, str, str]:
        """The map, the shard's source and the backend of both servers; or the one error."""
        current = self.shard_map()
        count = len(current.rows)
        if isinstance(shard, bool) or not isinstance(shard, int):
            raise InvalidArgumentTypeError(
                f"a logical shard must be an int, got {type(shard).__name__} {shard!r}")
        if shard not in current.rows:
            raise UnknownShardError(
                f"unknown logical shard {shard}; the map has 0..{count - 1}")
        if to not in current.targets:
            raise UnknownShardError(self._unknown_target(to, current))
        row = current.rows[shard]
        source = row.target
        if to == source:
            raise ShardMoveError(f"shard {shard} is already on {to}: nothing to move")
        kind = _same_backend(source, current.targets[source], to, current.targets[to])
        holder = active_move(self.engine, self.map_tables, shard)
        if holder is not None or row.state != "serving":
            raise ShardMoveError(already_moving(shard, holder))
        self._require_slots_table()
        self._server(source, "source", kind)
        self._server(to, "target", kind)
        return current, source, kind

    def _require_slots_table(self) -> None:
        """The announce step and the cleanup barrier read the leases in the worker slots table
        of the control database: without it they could not see a single process, so a move
        would flip and then stop (or, worse, delete a copy a process still reads)."""
        if not inspect(self.engine).has_table(self.slots_table, schema=self.schema):
            where = f"{self.schema}.{self.slots_table}" if self.schema else self.slots_table
            raise ShardMoveError(
                f"the control database has no worker slots table {where}: the move waits for "
                "the processes leasing worker IDs there before the fence and before deleting the "
                "old copy; keep the shard map in the database your processes lease from (create "
                "the worker tables with its migrations), or name the table (slots_table=, "
                "--slots-table)")

    def _unknown_target(self, name: str, current: ShardMap) -> str:
        return (f"unknown shard target {name!r}; the map knows {', '.join(sorted(current.targets))}"
                " (register a new server first: shards init --target NAME=URL, or add_target)")

    def _server(self, name: str, role: str, kind: str) -> _Server:
        """The given target ``name``, whose URL must be of backend ``kind`` (the map's)."""
        server = self.servers.get(name)
        if server is None:
            given = ", ".join(sorted(self.servers)) or "none"
            raise ShardMoveError(
                f"the move's {role} {name!r} is not among the given targets ({given}): give its "
                f"URL or engine (--target {name}=URL)")
        if server.backend != kind:
            raise ShardMoveError(
                f"the {role} {name!r} is a {kind} server in the shard map, but its URL is a "
                f"{server.backend} URL: give the URL of the server the map names")
        return server

    def _servers_of(self, record: MoveRecord) -> None:
        self._server(record.source, "source", record.backend)
        self._server(record.target, "target", record.backend)

    # -- backend ---------------------------------------------------------------------------------

    def backlog_limit(self, unit: str) -> int:
        """The backlog (in ``unit``, a backend's :attr:`~MoveBackend.backlog_unit`) the copy
        catches up to before the fence."""
        limits = {"bytes": self.max_lag_bytes, "rows": self.max_backlog_rows}
        if unit not in limits:
            raise ShardMoveError(f"a move backend counts its backlog in {unit!r}, not in "
                                 f"{' or '.join(limits)}")
        return limits[unit]

    def _backend(self, move_id: int, shard: int, source: str, target: str, kind: str,
                 ) -> MoveBackend:
        """Move ``move_id``'s steps between ``source`` and ``target``, servers of ``kind``."""
        s, t = self._server(source, "source", kind), self._server(target, "target", kind)
        options: dict[str, Any] = {}
        if kind == "postgresql":
            options["source_conninfo_for_target"] = self.subscription_conninfo.get(
                source, s.conninfo)
        return backend_class(kind)(  # type: ignore[call-arg]
            source=s.endpoint, target=t.endpoint, layout=self.layout, shard=shard,
            move_id=move_id, target_name=target, tables=self.tables,
            lock_timeout_ms=self.lock_timeout_ms, fence_attempts=self.fence_attempts,
            **options,
        )

    def _backend_of(self, record: MoveRecord) -> MoveBackend:
        return self._backend(record.id, record.shard, record.source, record.target,
                             record.backend)

    # -- the forward path ------------------------------------------------------------------------

    def _run(self, journal: Journal, start: int, progress: Progress | None,
             terminate_blockers: bool, *, resumed: bool = False) -> None:
        record = journal.record()
        backend = self._backend_of(record)
        run = _Run(self, journal, backend, record, progress=progress,
                   terminate_blockers=terminate_blockers)
        held = False
        step = _FORWARD_NAMES[min(start, len(_FORWARD_NAMES) - 1)]
        try:
            with LeaseKeeper(journal), ExitStack() as sessions:
                # A resume after the copy step began and before the flip: is the copy still
                # there? Also when the step did not finish: a subscription it made and lost
                # may have copied rows a new one would copy again into the same keys. After
                # the flip the target is the shard's home: nothing is copied again.
                if resumed and start >= _COPY_INDEX and not record.flipped:
                    run.lost = backend.copy_lost(finished=start > _COPY_INDEX)
                recopies = 0
                while True:
                    if run.lost is not None:  # undo the copy, then go on from the capture
                        step = RECOPY_STEP
                        run.step(RECOPY_STEP, "capturing")
                        run.lost = None
                        start = _CAPTURE_INDEX
                    steps = FORWARD_STEPS[start:]
                    try:
                        for index, (step, state) in enumerate(steps):
                            if step in _HELD and not held:
                                sessions.enter_context(backend.held())
                                held = True
                            elif step not in _HELD and held:
                                sessions.close()
                                held = False
                            then = steps[index + 1] if index + 1 < len(steps) else None
                            run.step(step, state, then=then if step in _CHAINED else None)
                        break
                    except CopyLostError as lost:  # found while the copy was waited for
                        recopies += 1
                        if recopies > RECOPIES_PER_RUN:
                            raise
                        run.lost = str(lost)
        except MoverLeaseLostError:
            raise
        except Exception as error:
            journal.release()
            after = "resume it" if record.flipped or step in _AFTER_FLIP else "resume or abort it"
            raise MoveStoppedError(
                f"move {record.id} of shard {record.shard} ({record.source} -> {record.target}) "
                f"stopped at step {step}: {error}; {after} (move --resume {record.id}"
                + ("" if after == "resume it" else f" / --abort {record.id}") + ")",
                move_id=record.id, step=step,
            ) from error

    # -- abort -------------------------------------------------------------------------------------

    def _abort(self, journal: Journal, record: MoveRecord, progress: Progress | None) -> None:
        with journal.owned() as connection:
            current = read_move(connection, self.map_tables, record.id)
            if current.flipped:
                raise ShardMoveError(
                    f"move {record.id} flipped meanwhile; it cannot be aborted: resume it")
            journal.set_state("aborting", connection=connection)
        copied = any(r.step == "copy" for r in read_journal(self.engine, self.map_tables,
                                                            record.id))
        backend = self._backend_of(record)
        run = _Run(self, journal, backend, record, progress=progress, terminate_blockers=False)
        with LeaseKeeper(journal):
            run.abort_steps(copied)


class _StrandedWatch:
    """A copy the servers can never finish (:meth:`MoveBackend.copy_stranded`), told once the
    same finding has lasted :data:`STRANDED_CONFIRM_S`; looked for every
    :data:`STRANDED_CHECK_S` at most, the first time after as long (the copy's own poll is
    much more frequent, and a short copy never pays for a look)."""

    def __init__(self, backend: MoveBackend) -> None:
        self.backend = backend
        self._next_check = time.monotonic() + STRANDED_CHECK_S
        self._seen: tuple[str, float] | None = None

    def poll(self) -> str | None:
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + STRANDED_CHECK_S
        finding = self.backend.copy_stranded()
        if finding is None or self._seen is None or self._seen[0] != finding:
            self._seen = None if finding is None else (finding, now)
            return None
        return finding if now - self._seen[1] >= STRANDED_CONFIRM_S else None


_AFTER_FLIP = frozenset({"flip", "barrier", "cleanup", "delete_source_rows", "finish"})


def _resume_index(rows: Sequence[JournalRow]) -> int:
    """The forward step a resume starts at: the one after the last ``done`` since the last
    :data:`RECOPY_STEP` (which undid the copy: ``capture`` comes next)."""
    recopied = max((i for i, row in enumerate(rows)
                    if (row.step, row.status) == (RECOPY_STEP, "done")), default=-1)
    done = [_FORWARD_NAMES.index(r.step) for r in rows[recopied + 1:]
            if r.status == "done" and r.step in _FORWARD_NAMES]
    start = max(done) + 1 if done else 0
    return max(start, _CAPTURE_INDEX) if recopied >= 0 else start


def _same_backend(source: str, source_kind: str, target: str, target_kind: str) -> str:
    """The one backend of a move's two servers (by the shard map), or the error saying why
    not: a backend's capture, fence and copy work between two servers of its own kind."""
    if source_kind != target_kind:
        raise ShardMoveError(
            f"a move runs between two servers of the same backend: source {source} is "
            f"{source_kind}, target {target} is {target_kind}")
    if source_kind not in MOVE_BACKENDS:
        raise ShardMoveError(
            f"{source} and {target} are {source_kind} servers; online moves run between two "
            "PostgreSQL or two MariaDB servers")
    return source_kind


def shard_map_tables_for(schema: str | None) -> ShardMapTables:
    return shard_map_tables(MetaData(), schema=schema)


def _emit(progress: Progress | None, event: MoveProgress) -> None:
    if progress is not None:
        progress(event)


class _Run:
    """The steps of one run of a move (forward or abort), journaling each."""

    def __init__(self, mover: ShardMover, journal: Journal, backend: MoveBackend,
                 record: MoveRecord, *, progress: Progress | None,
                 terminate_blockers: bool) -> None:
        self.mover = mover
        self.journal = journal
        self.backend = backend
        self.record = record
        self.progress = progress
        self.terminate_blockers = terminate_blockers
        self.fence_position: str | None = None
        #: Why the copy is lost (:meth:`MoveBackend.copy_lost`), found by a resume.
        self.lost: str | None = None

    def emit(self, step: str, message: str, **numbers: Any) -> None:
        _emit(self.progress, MoveProgress(self.record.id, step, message, numbers))

    def step(self, name: str, state: str | None,
             then: tuple[str, str | None] | None = None) -> None:
        """Journal ``name`` as started, run it; its ``done`` line also starts ``then`` (the
        next step) when given, in the same transaction."""
        self.journal.started(name, state)
        self.journal.then = then
        try:
            getattr(self, f"do_{name}")()
        except Exception as error:
            if not isinstance(error, MoverLeaseLostError):
                self.journal.failed(name, error)
            raise
        finally:
            self.journal.then = None

    def wait(self, predicate: Callable[[], bool], *, timeout_s: float, what: str,
             describe: Callable[[], str], step: str, pause_s: float = 0.05,
             max_pause_s: float = 0.5, advance: bool = True) -> None:
        """Poll until ``predicate``, every ``pause_s`` growing to ``max_pause_s``; progress
        every ``progress_every_s``; bounded; stops when the lease is lost. With ``advance``
        each poll first lets the backend do one unit of its copy work, and while that unit did
        some the next poll comes at once (a copy made in the mover's process is not paced by
        the polls: 50 ms after each chunk halved the MariaDB copy's rate)."""
        start = time.monotonic()
        next_report = start + self.mover.progress_every_s
        pause = pause_s
        worked = 0

        def reached() -> bool:
            nonlocal worked
            if advance:
                worked = self.backend.advance()
            return predicate()

        while not reached():
            if self.journal.lost.is_set():
                raise MoverLeaseLostError(f"move {self.record.id}: lease lost while waiting "
                                          f"for {what}")
            now = time.monotonic()
            if now - start > timeout_s:
                raise ShardMoveError(f"{what} not reached in {timeout_s:g} s ({describe()})")
            if now >= next_report:
                self.emit(step, describe(), elapsed_s=round(now - start, 1))
                next_report = now + self.mover.progress_every_s
            if worked:
                pause = pause_s
                continue
            time.sleep(pause)
            pause = min(pause * 1.5, max_pause_s)

    # -- forward steps ---------------------------------------------------------------------------

    def do_check(self) -> None:
        self.backend.check()
        self.journal.done("check")

    def do_capture(self) -> None:
        made = self.backend.capture()
        self.journal.done("capture", capture=self._capture(**made))

    def _capture(self, **values: Any) -> dict[str, Any]:
        capture = dict(self.journal.record().capture)
        capture.update(values)
        return capture

    def do_copy(self) -> None:
        with self.journal.owned() as connection:
            if self._map_state(connection) == "serving":
                set_shard_state(connection, self.record.shard, "moving",
                                schema=self.mover.schema)
        copying = self.backend.copy()
        self.journal.done("copy", copying, capture=self._capture(**copying))

    def _map_state(self, connection: Any) -> str:
        current = read_shard_map(connection, schema=self.mover.schema)
        row = current.rows[self.record.shard]
        if row.target != self.record.source:
            raise ShardMoveError(
                f"the map puts shard {self.record.shard} on {row.target}, not on the move's "
                f"source {self.record.source}: the map was changed outside this move")
        return row.state

    def do_catch_up(self) -> None:
        planned = self._planned_rows()

        def copy_state() -> str:
            progress = self.backend.copy_progress()
            copied = self.backend.rows_copied()
            states = ", ".join(f"{t} {s}" for t, s in sorted(progress.states.items()))
            share = f" of {planned}" if planned else ""
            return f"copying: {copied} rows{share} copied so far; tables: {states or 'starting'}"

        stranded = _StrandedWatch(self.backend)

        # Polled at a short fixed interval on one held session (one cheap query each), so
        # the end of a short copy is noticed at once.
        def synced() -> bool:
            if self.backend.copy_synced():
                return True
            lost = stranded.poll()
            if lost is not None:
                raise CopyLostError(lost)
            # PostgreSQL's table copies end by streaming to the source's WAL position: not
            # left to the source's WAL writer when its commits are asynchronous.
            self.backend.flush(target=False)
            return False

        with self.backend.held():
            self.wait(synced, timeout_s=self.mover.copy_timeout_s,
                      what="the initial copy", describe=copy_state, step="catch_up",
                      pause_s=COPY_POLL_S, max_pause_s=COPY_POLL_S)
        self.emit("catch_up", "initial copy done; catching up")
        unit = self.backend.backlog_unit
        limit = self.mover.backlog_limit(unit)
        with self.backend.held(target=False):
            self.wait(lambda: (self.backend.backlog() or 0) <= limit,
                      timeout_s=self.mover.catch_up_timeout_s,
                      what=f"backlog below {limit} {unit}", describe=self._backlog,
                      step="catch_up", pause_s=COPY_POLL_S, max_pause_s=COPY_POLL_S)
        # The verification's first pass, before the fence: the pause after it compares only
        # the rows written since (docs/design/shard-moves.md, Verification).
        with self.backend.held():  # it polls the source's slot
            first = self.backend.verify_before_fence(timeout_s=self.mover.drain_timeout_s)
        self.journal.done("catch_up", {"backlog": self.backend.backlog(), "backlog_unit": unit,
                                       "verified_before_fence": first.changed})

    def _backlog(self) -> str:
        return f"backlog {self.backend.backlog()} {self.backend.backlog_unit}"

    def _planned_rows(self) -> int | None:
        for row in read_journal(self.mover.engine, self.mover.map_tables, self.record.id):
            if row.step == "plan" and row.detail:
                try:
                    return int(sum(json.loads(row.detail).get("rows", {}).values()))
                except (ValueError, AttributeError, TypeError):
                    return None
        return None

    def do_fence(self) -> None:
        fenced = self.backend.fence(terminate_blockers=self.terminate_blockers)
        if fenced.terminated:
            self.emit("fence", f"terminated blocking sessions {list(fenced.terminated)}")
        with self.journal.owned() as connection:
            if self._map_state(connection) != "cutover":
                set_shard_state(connection, self.record.shard, "cutover",
                                schema=self.mover.schema)
            self.journal.done("fence", {"position": fenced.position,
                                        "attempts": fenced.attempts,
                                        "terminated": list(fenced.terminated)},
                              capture=self._capture(fence_position=fenced.position),
                              connection=connection)
        self.fence_position = fenced.position
        self.emit("fence", f"fence up at {fenced.position} after {fenced.attempts} attempt(s)")

    def do_drain(self) -> None:
        # The fence step's position (this run's, or journaled by an earlier run: "fence_lsn"
        # in a journal written before moves had other backends than PostgreSQL); a rerun of
        # the fence gives a later one.
        capture = self.journal.record().capture
        position = (self.fence_position or capture.get("fence_position")
                    or capture.get("fence_lsn"))
        if not position:
            position = self.backend.fence(terminate_blockers=self.terminate_blockers).position

        def drained() -> bool:
            if self.backend.drained(str(position)):
                return True
            # PostgreSQL: not left to the servers' WAL writers (200 ms each).
            self.backend.flush()
            return False

        self.wait(drained, timeout_s=self.mover.drain_timeout_s,
                  what=f"the drain to the fence position {position}",
                  describe=self._backlog, step="drain",
                  pause_s=DRAIN_POLL_S, max_pause_s=DRAIN_POLL_S)
        self.journal.done("drain", {"fence_position": position})

    def do_verify(self) -> None:
        result = self.backend.verify()
        rows = {name: checksum.rows for name, checksum in result.target.items()}
        self.journal.done("verify", {"rows": rows, "scope": result.scope})
        self.emit("verify", f"source and target agree ({result.scope} rows): {rows}")

    def do_drop_old_fence(self) -> None:
        # Fences an earlier move of this shard away from this target left there: the flip is
        # about to make it the shard's write target. Found on the held session of the pause.
        dropped = _drop_fences(self.mover, self.record, self.backend.shard_fences_on_target())
        self.journal.done("drop_old_fence", {"dropped": dropped})
        if dropped:
            self.emit("drop_old_fence", f"dropped an earlier move's fence on "
                                        f"{self.record.target}: {dropped}")

    def do_flip(self) -> None:
        with self.journal.owned() as connection:
            current = read_move(connection, self.mover.map_tables, self.record.id)
            version = current.flipped_version
            if version is None:
                version = flip_shard(connection, self.record.shard, self.record.target,
                                     move_id=self.record.id, schema=self.mover.schema)
            self.journal.done("flip", {"version": version}, connection=connection)
        self.emit("flip", f"shard {self.record.shard} now served by {self.record.target} "
                          f"(map version {version})", version=version)

    def do_announce(self) -> None:
        """Before the fence: every leased process routes with a map in which the shard is
        ``moving`` (or its lease lapsed). Such a router checks the map at each call that routes
        the shard, so after the flip none reads the old copy, which misses the orders written
        on the new target (the copy has taken longer than a router's refresh, usually: this
        rarely waits)."""
        version = read_shard_map(self.mover.engine, schema=self.mover.schema).rows[
            self.record.shard].since_version
        self.emit("announce", f"until every leased process routes with map version {version} "
                              f"(shard {self.record.shard} moving)", version=version)
        self._wait_for_barrier(version, "announce")
        self.journal.done("announce", {"version": version})

    def do_barrier(self) -> None:
        version = self.journal.record().flipped_version
        assert version is not None
        self._wait_for_barrier(version, "barrier")
        self.journal.done("barrier", {"version": version})

    def _wait_for_barrier(self, version: int, step: str) -> None:
        """Until every live lease has reported map ``version`` or later, or lapsed."""
        waiting: list[int] = []

        def passed() -> bool:
            waiting[:] = barrier_waiting(self.mover.engine, version,
                                         slots_table=self.mover.slots_table,
                                         schema=self.mover.schema)
            return not waiting

        # After the flip the target is authoritative: no copy work may run any more.
        self.wait(passed, timeout_s=self.mover.barrier_timeout_s,
                  what=f"every live lease routing with map version {version}",
                  describe=lambda: f"waiting for worker IDs {waiting[:20]} to report map "
                                   f"version {version}", step=step,
                  advance=step != "barrier")

    def do_cleanup(self) -> None:
        report = self.backend.cleanup()
        if report.source_pending:
            raise ShardMoveError(f"cleanup: the source did not answer ({report.source_error}); "
                                 "resume once it does")
        self.journal.done("cleanup", {"done": report.done})

    def do_delete_source_rows(self) -> None:
        if not self.mover.assume_no_static_workers:
            version = self.journal.record().flipped_version
            raise StaticWorkersUnconfirmedError(
                f"the source's rows of shard {self.record.shard} stay on {self.record.source}: "
                f"processes with static worker IDs (or no lease) are invisible to the barrier, "
                f"so nothing says they route with map version {version}; once none runs, or "
                f"each has reloaded the map, resume with --assume-no-static-workers "
                f"(ShardMover(assume_no_static_workers=True))")
        deleted = self.backend.delete_source_rows(batch_size=self.mover.batch_size)
        self.journal.done("delete_source_rows", {"deleted": deleted})
        self.emit("delete_source_rows", f"deleted {deleted} rows of shard {self.record.shard} "
                                        f"on {self.record.source}", deleted=deleted)

    def do_finish(self) -> None:
        left = self.backend.leftovers()
        if not left.replication_empty:
            raise ShardMoveError(f"finish: replication objects left: {left}")
        with self.journal.owned() as connection:
            self.journal.done("finish", {"fence_kept": list(left.fence_triggers)},
                              connection=connection)
            self.journal.set_state("done", end=True, connection=connection)
        self.emit("finish", f"done: shard {self.record.shard} on {self.record.target}")

    def do_recopy(self) -> None:
        """The copy is lost before the flip: undo it as an abort would (the source is still
        the shard's home), but keep the move: lift the fence if up (the shard's writes go to
        the source again: a second copy under the fence would refuse them for its whole
        length), drop the capture, copy and tracking objects (the orphaned slot: it would
        hold the source's WAL forever), delete the shard's rows on the target (only those:
        ``id & mask = shard``; other shards' rows there stay) and go on from ``capture``."""
        lost = self.lost or "the copy is lost"
        with self.journal.owned() as connection:
            if read_move(connection, self.mover.map_tables, self.record.id).flipped:
                raise ShardMoveError(f"{RECOPY_STEP}: move {self.record.id} has flipped: "
                                     f"{self.record.target} is the shard's home, nothing is "
                                     "copied again; resume it")
            self._map_state(connection)  # still on the source, or the error saying not
        unfenced = self.backend.unfence()
        with self.journal.owned() as connection:
            if self._map_state(connection) == "cutover":
                set_shard_state(connection, self.record.shard, "moving",
                                schema=self.mover.schema)
        report = self.backend.cleanup()
        if report.source_pending:
            raise ShardMoveError(f"{RECOPY_STEP}: the source did not answer "
                                 f"({report.source_error}); resume once it does")
        deleted = self.backend.delete_target_rows(batch_size=self.mover.batch_size)
        # What the lost copy and fence recorded no longer holds (a new copy, a new fence).
        capture = {key: value for key, value in self.journal.record().capture.items()
                   if key not in ("subscription", "subscription_oid", "fence_position",
                                  "fence_lsn")}
        tables = [table.name for table in self.mover.tables]
        self.journal.done(RECOPY_STEP, {"lost": lost, "unfenced": unfenced,
                                        "dropped": report.done, "deleted_target_rows": deleted,
                                        "tables": tables},
                          capture=capture)
        fence = (f"lifted the fence on {self.record.source} ({len(unfenced)} trigger(s)): the "
                 f"shard's writes go there until the new fence; " if unfenced else "")
        # The replication objects by name; the verification's tracking (triggers and change
        # logs) counted: the journal's detail names every one.
        named = [line for line in report.done
                 if line.startswith(("dropped slot", "dropped publication", "dropped subscr"))]
        tracking = len(report.done) - len(named)
        dropped = "; ".join(named) or "no slot or publication was left"
        if tracking:
            dropped += f"; dropped {tracking} tracking object(s)"
        self.emit(RECOPY_STEP,
                  f"{lost}: {fence}{dropped}; deleted {deleted} rows of shard "
                  f"{self.record.shard} on {self.record.target} ({', '.join(tables)}); "
                  "copying again",
                  deleted=deleted, unfenced=len(unfenced))

    # -- abort steps -----------------------------------------------------------------------------

    def abort_steps(self, copied: bool) -> None:
        for name in ("unfence", "abort_cleanup", *(("delete_target_rows",) if copied else ()),
                     "serve_from_source", "aborted"):
            self.step(name, None)

    def do_unfence(self) -> None:
        dropped = self.backend.unfence()
        self.journal.done("unfence", {"dropped": dropped})

    def do_abort_cleanup(self) -> None:
        self.do_cleanup_named("abort_cleanup")

    def do_cleanup_named(self, name: str) -> None:
        report = self.backend.cleanup()
        if report.source_pending:
            raise ShardMoveError(f"{name}: the source did not answer ({report.source_error}); "
                                 "run the abort again once it does")
        self.journal.done(name, {"done": report.done})

    def do_delete_target_rows(self) -> None:
        deleted = self.backend.delete_target_rows(batch_size=self.mover.batch_size)
        self.journal.done("delete_target_rows", {"deleted": deleted})
        self.emit("abort", f"deleted {deleted} copied rows on {self.record.target}")

    def do_serve_from_source(self) -> None:
        with self.journal.owned() as connection:
            if self._map_state(connection) != "serving":
                set_shard_state(connection, self.record.shard, "serving",
                                schema=self.mover.schema)
            self.journal.done("serve_from_source", connection=connection)

    def do_aborted(self) -> None:
        left = self.backend.leftovers()
        if not left.empty:
            raise ShardMoveError(f"abort: objects of the move left: {left}")
        with self.journal.owned() as connection:
            self.journal.done("aborted", connection=connection)
            self.journal.set_state("aborted", end=True, connection=connection)
        self.emit("abort", f"aborted: shard {self.record.shard} served by {self.record.source}")


def _drop_fences(mover: ShardMover, record: MoveRecord, names: Sequence[str]) -> list[str]:
    """Drop the earlier moves' fences named ``names`` (by the fence function and its shard
    argument), as an abort drops a fence (bounded lock wait)."""
    old_moves = sorted({int(m.group(1)) for name in names
                        if (m := _OLD_FENCE.match(name)) and int(m.group(1)) != record.id})
    dropped: list[str] = []
    for old in old_moves:
        # The earlier move's source was this target: the same names, the roles swapped.
        backend = mover._backend(old, record.shard, record.target, record.source,
                                 record.backend)
        dropped.extend(backend.unfence())
    return dropped
