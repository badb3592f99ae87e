"""A move's row and journal in the control database, written only under the mover's lease.

``snowflake_shard_moves`` holds one row per move: its state, the backend's capture JSON (object
names, subscription OID, fence LSN), the flipped version and the mover's own lease
(``mover_token``, ``mover_expires_at_ms``, database clock). ``snowflake_shard_move_steps`` is the
append-only journal: a ``started`` row before each action, ``done`` or ``failed`` after it.

Every write here first locks the move's row and checks that it still holds this mover's token,
renewing the lease in the same transaction: a mover whose lease was taken over (a forced resume)
cannot write another line, so two movers never both journal one move.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Connection, Engine, String, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from ...errors import MoverLeaseLostError, ShardMoveError
from ...worker._store import db_now_ms
from ..shard_map import DETAIL_LENGTH, ShardMapTables

#: Move states after which no abort is possible: the target is authoritative.
FLIPPED_STATES = frozenset({"flipped", "barrier", "cleaning", "done"})
#: States of a move that has ended (``active_shard`` is NULL).
ENDED_STATES = frozenset({"done", "aborted"})



@dataclass(frozen=True)
class MoveRecord:
    """One row of ``snowflake_shard_moves``."""

    id: int
    shard: int
    source: str
    target: str
    backend: str
    state: str
    capture: dict[str, Any] = field(default_factory=dict)
    flipped_version: int | None = None
    mover_token: str | None = None
    mover_expires_at_ms: int | None = None
    created_at_ms: int = 0
    updated_at_ms: int = 0

    @property
    def flipped(self) -> bool:
        """The flip committed (it records ``flipped_version`` in its own transaction)."""
        return self.flipped_version is not None


@dataclass(frozen=True)
class JournalRow:
    """One line of the journal."""

    seq: int
    step: str
    status: str
    detail: str | None
    at_ms: int


def new_token() -> str:
    return secrets.token_hex(16)


def _record(row: Any) -> MoveRecord:
    capture = json.loads(row.capture) if row.capture else {}
    return MoveRecord(
        id=int(row.id), shard=int(row.logical_shard), source=str(row.source),
        target=str(row.target), backend=str(row.backend), state=str(row.state),
        capture=capture,
        flipped_version=None if row.flipped_version is None else int(row.flipped_version),
        mover_token=row.mover_token,
        mover_expires_at_ms=(None if row.mover_expires_at_ms is None
                             else int(row.mover_expires_at_ms)),
        created_at_ms=int(row.created_at_ms), updated_at_ms=int(row.updated_at_ms),
    )


def read_move(bind: Engine | Connection, tables: ShardMapTables, move_id: int) -> MoveRecord:
    """The move's row, or :class:`ShardMoveError` naming the unknown id."""
    query = select(tables.moves).where(tables.moves.c.id == move_id)
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            row = connection.execute(query).first()
    else:
        row = bind.execute(query).first()
    if row is None:
        raise ShardMoveError(f"no shard move with id {move_id} in the control database")
    return _record(row)


def active_move(engine: Engine, tables: ShardMapTables, shard: int) -> MoveRecord | None:
    """The move holding ``shard`` (``active_shard``), if any."""
    with engine.connect() as connection:
        row = connection.execute(
            select(tables.moves).where(tables.moves.c.active_shard == shard)
        ).first()
    return None if row is None else _record(row)


def list_moves(engine: Engine, tables: ShardMapTables, *, limit: int = 20) -> list[MoveRecord]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(tables.moves).order_by(tables.moves.c.id.desc()).limit(limit)
        ).fetchall()
    return [_record(row) for row in rows]


def read_journal(engine: Engine, tables: ShardMapTables, move_id: int) -> list[JournalRow]:
    steps = tables.move_steps
    with engine.connect() as connection:
        rows = connection.execute(
            select(steps.c.seq, steps.c.step, steps.c.status, steps.c.detail, steps.c.at_ms)
            .where(steps.c.move_id == move_id).order_by(steps.c.seq)
        ).fetchall()
    return [JournalRow(int(r.seq), str(r.step), str(r.status), r.detail, int(r.at_ms))
            for r in rows]


def _detail(detail: object) -> str | None:
    if detail is None:
        return None
    text = detail if isinstance(detail, str) else json.dumps(detail, sort_keys=True, default=str)
    return text if len(text) <= DETAIL_LENGTH else text[: DETAIL_LENGTH - 3] + "..."


def _append(connection: Connection, tables: ShardMapTables, move_id: int, step: str, *,
            status: str, detail: object = None) -> None:
    """One journal line, numbered after the last one, in one statement (``INSERT ... SELECT``:
    the cutover's journal lines are round trips inside the moving shard's pause).

    On MariaDB and MySQL in two: a plain read of the last number, then ``INSERT ... VALUES``.
    There ``INSERT ... SELECT`` takes shared next-key locks on the rows and gaps it reads (in
    REPEATABLE READ), so two movers appending to adjacent moves at once (the newest move's
    first line reads the gap after the last one) each waited for the other's insert: InnoDB
    rolled one back (error 1213 on a move's ``plan`` line in a grow demo of two concurrent
    movers). One mover appends to a move at a time (its lease, whose row each journal
    transaction updates first), so the plain read sees the last line."""
    steps = tables.move_steps
    values = (literal(step, String), literal(status, String), literal(_detail(detail), String),
              db_now_ms())
    if connection.dialect.name in ("mysql", "mariadb"):
        last = connection.execute(select(func.coalesce(func.max(steps.c.seq), 0))
                                  .where(steps.c.move_id == move_id)).scalar_one()
        connection.execute(insert(steps).from_select(
            ["move_id", "seq", "step", "status", "detail", "at_ms"],
            select(literal(move_id, BigInteger), literal(int(last) + 1, BigInteger), *values)))
        return
    connection.execute(insert(steps).from_select(
        ["move_id", "seq", "step", "status", "detail", "at_ms"],
        select(
            literal(move_id, BigInteger), func.coalesce(func.max(steps.c.seq), 0) + 1, *values,
        ).where(steps.c.move_id == move_id),
    ))


def create_move(
    engine: Engine, tables: ShardMapTables, *, shard: int, source: str, target: str,
    backend: str, token: str, lease_ms: int, plan: object,
) -> int:
    """Insert the move (state ``planned``, ``active_shard`` set, this mover's lease) and its
    journal's first line, the plan. A shard already moving is refused by the UNIQUE
    ``active_shard``: the error names the move holding it."""
    moves = tables.moves
    try:
        with engine.begin() as connection:
            move_id = connection.execute(
                insert(moves).values(
                    logical_shard=shard, active_shard=shard, source=source, target=target,
                    backend=backend, state="planned", capture="{}", mover_token=token,
                    mover_expires_at_ms=db_now_ms() + lease_ms, created_at_ms=db_now_ms(),
                    updated_at_ms=db_now_ms(),
                ).returning(moves.c.id)
            ).scalar_one()
            _append(connection, tables, int(move_id), "plan", status="done", detail=plan)
    except IntegrityError:
        holder = active_move(engine, tables, shard)
        raise ShardMoveError(already_moving(shard, holder)) from None
    return int(move_id)


def already_moving(shard: int, holder: MoveRecord | None) -> str:
    if holder is None:
        return f"shard {shard} is already moving (another mover started at the same time)"
    return (
        f"shard {shard} is already moving: move {holder.id} ({holder.source} -> "
        f"{holder.target}, state {holder.state}); resume or abort that move "
        f"(shards move --resume {holder.id} / --abort {holder.id})"
    )


def take_over(engine: Engine, tables: ShardMapTables, move_id: int, token: str, lease_ms: int,
              *, force: bool) -> MoveRecord:
    """Make this mover the move's holder: only when no mover holds it, its lease lapsed (by the
    database clock), or with ``force``. Returns the move as it is now."""
    moves = tables.moves
    with engine.begin() as connection:
        record = read_move(connection, tables, move_id)
        if record.state in ENDED_STATES:
            return record
        condition = moves.c.id == move_id
        if not force:
            condition = condition & (
                moves.c.mover_token.is_(None) | (moves.c.mover_expires_at_ms < db_now_ms())
            )
        taken = connection.execute(
            update(moves).where(condition).values(
                mover_token=token, mover_expires_at_ms=db_now_ms() + lease_ms,
                updated_at_ms=db_now_ms(),
            )
        ).rowcount
        if taken != 1:
            now_ms = connection.execute(select(db_now_ms())).scalar_one()
            left = ((record.mover_expires_at_ms or 0) - int(now_ms)) / 1000
            raise ShardMoveError(
                f"move {move_id} of shard {record.shard} is held by a running mover (its lease "
                f"ends in {max(left, 0):.1f} s): wait for it to finish or its lease to lapse, "
                "or take it over with force=True (--force) if that mover is gone for sure"
            )
        _append(connection, tables, move_id, "takeover", status="done",
                detail={"force": force})
        return read_move(connection, tables, move_id)


class Journal:
    """The journal of one move, written under this mover's lease (``token``)."""

    def __init__(self, engine: Engine, tables: ShardMapTables, move_id: int, token: str,
                 lease_ms: int) -> None:
        self.engine = engine
        self.tables = tables
        self.move_id = move_id
        self.token = token
        self.lease_ms = lease_ms
        self.lost = threading.Event()
        #: The step whose ``started`` line the next ``done`` writes in its own transaction.
        self.then: tuple[str, str | None] | None = None
        self._started_ahead: str | None = None

    @contextmanager
    def owned(self) -> Iterator[Connection]:
        """A transaction holding the move's row lock, after checking and renewing the lease
        (one statement: the UPDATE locks the row and matches only this mover's token)."""
        moves = self.tables.moves
        with self.engine.begin() as connection:
            renewed = connection.execute(
                update(moves).where((moves.c.id == self.move_id)
                                    & (moves.c.mover_token == self.token))
                .values(mover_expires_at_ms=db_now_ms() + self.lease_ms,
                        updated_at_ms=db_now_ms())
            ).rowcount
            if renewed != 1:
                self.lost.set()
                raise MoverLeaseLostError(
                    f"move {self.move_id}: this mover no longer holds the move (another mover "
                    "took it over); stopping"
                )
            yield connection

    def record(self) -> MoveRecord:
        return read_move(self.engine, self.tables, self.move_id)

    def started(self, step: str, state: str | None) -> None:
        """Journal ``step`` as started (and the move's ``state``) before its action; nothing
        to do when the previous step's ``done`` already wrote it (:attr:`then`)."""
        if self._started_ahead == step:
            self._started_ahead = None
            return
        self._started_ahead = None
        with self.owned() as connection:
            self._started(connection, step, state)

    def _started(self, connection: Connection, step: str, state: str | None) -> None:
        if state is not None:
            connection.execute(update(self.tables.moves)
                               .where(self.tables.moves.c.id == self.move_id)
                               .values(state=state))
        _append(connection, self.tables, self.move_id, step, status="started")

    def done(self, step: str, detail: object = None, *,
             capture: dict[str, Any] | None = None, connection: Connection | None = None) -> None:
        if connection is not None:
            self._done(connection, step, detail, capture)
            return
        with self.owned() as owned:
            self._done(owned, step, detail, capture)

    def _done(self, connection: Connection, step: str, detail: object,
              capture: dict[str, Any] | None) -> None:
        if capture is not None:
            connection.execute(update(self.tables.moves)
                               .where(self.tables.moves.c.id == self.move_id)
                               .values(capture=_detail(capture)))
        _append(connection, self.tables, self.move_id, step, status="done", detail=detail)
        # The next step's "started" line in the same transaction: its meaning is unchanged
        # (written after this step's action, before the next one's), one round trip less.
        if self.then is not None:
            following, state = self.then
            self.then = None
            self._started(connection, following, state)
            self._started_ahead = following

    def failed(self, step: str, error: BaseException) -> None:
        """Journal the failure (best effort: the control database may be what failed)."""
        try:
            with self.owned() as connection:
                _append(connection, self.tables, self.move_id, step, status="failed",
                        detail=f"{type(error).__name__}: {error}")
        except Exception:  # the original error is what the caller raises
            pass

    def set_state(self, state: str, *, end: bool = False,
                  connection: Connection | None = None) -> None:
        values: dict[str, Any] = {"state": state, "updated_at_ms": db_now_ms()}
        if end:
            values.update(active_shard=None, mover_token=None, mover_expires_at_ms=None)
        statement = update(self.tables.moves).where(self.tables.moves.c.id == self.move_id)
        if connection is not None:
            connection.execute(statement.values(**values))
            return
        with self.owned() as owned:
            owned.execute(statement.values(**values))

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost`` set) when another mover holds the move."""
        moves = self.tables.moves
        with self.engine.begin() as connection:
            renewed = connection.execute(
                update(moves).where((moves.c.id == self.move_id)
                                    & (moves.c.mover_token == self.token))
                .values(mover_expires_at_ms=db_now_ms() + self.lease_ms)
            ).rowcount
        if renewed != 1:
            self.lost.set()
        return renewed == 1

    def release(self) -> None:
        """Give up the lease (the mover stops; a resume may start at once)."""
        moves = self.tables.moves
        with self.engine.begin() as connection:
            connection.execute(
                update(moves).where((moves.c.id == self.move_id)
                                    & (moves.c.mover_token == self.token))
                .values(mover_token=None, mover_expires_at_ms=None)
            )


class LeaseKeeper:
    """Renews the mover's lease every third of it from a daemon thread while a move runs."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sfdb-mover-{journal.move_id}",
                                        daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        period = max(self.journal.lease_ms / 3000, 0.05)
        while not self._stop.wait(period):
            try:
                if not self.journal.renew():
                    return
            except Exception:  # a control database blip: try again next period
                continue
