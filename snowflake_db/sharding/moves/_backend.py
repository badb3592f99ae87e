"""What the mover needs of a backend's move steps, and which backend moves which servers.

:class:`MoveBackend` is the interface :class:`~snowflake_db.sharding.moves.ShardMover` drives:
the journal, the shard map's states and flip, the barrier, resume and abort are the mover's;
how a shard's rows are captured, copied, fenced, drained and compared is the backend's. Who
does the copying differs: on PostgreSQL the target's subscription copies and streams on its
own (the server's workers), so :meth:`MoveBackend.advance` does nothing; a backend without
such machinery copies in the mover's process, one bounded unit of work per
:meth:`~MoveBackend.advance`, which the mover calls on every poll of its waits until the flip.

Every backend class takes the same keyword arguments (:func:`backend_class` finds it by the
shard map's backend name): ``source``, ``target`` (what the mover connects with: a URL
string or a SQLAlchemy ``Engine``, :mod:`._connections`), ``layout``, ``shard``, ``move_id``,
``target_name``, ``tables``, ``lock_timeout_ms``, ``fence_attempts``, plus its own
(PostgreSQL: ``source_conninfo_for_target``). Its objects are named after the move
(``sfdb_move_<move id>``, fences ``sfdb_fence_<move id>_<suffix>``): a step run again after
the mover died finds them by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ...errors import ShardMoveError

if TYPE_CHECKING:
    from ._results import CleanupReport, CopyProgress, FenceResult, Leftovers, Verification


@runtime_checkable
class MoveBackend(Protocol):
    """The steps of one move of one logical shard between two servers of one backend.

    Each step is idempotent and finds the move's objects by name, so it can run again after
    the mover died; a wait's predicate (``copy_synced``, ``backlog``, ``drained``) reads only.
    """

    #: the shard map's backend name of both servers: ``"postgresql"`` or ``"mariadb"``
    kind: str
    #: the move's object name (``sfdb_move_<move id>``)
    name: str
    #: what :meth:`backlog` counts: ``"bytes"`` (PostgreSQL's WAL) or ``"rows"`` (captured
    #: changes not applied yet)
    backlog_unit: str

    def held(self, *, source: bool = True, target: bool = True
             ) -> AbstractContextManager[None]:
        """One session kept open on each side for every step inside the block."""
        ...

    def check(self) -> None:
        """Every pre-check; the first failure is a ShardMoveError naming the fix. Reads only."""
        ...

    def capture(self) -> dict[str, Any]:
        """Start capturing the shard's changes on the source; the names of what it made
        (merged into the journal's capture record)."""
        ...

    def copy(self) -> dict[str, Any]:
        """Start the copy to the target; what the journal keeps of it."""
        ...

    def advance(self) -> int:
        """One bounded unit of copy work in the mover's process: how much it did (rows copied
        and changes applied; 0 when there was nothing to do, and always where the servers copy
        on their own). The mover polls again at once while it does work."""
        ...

    def copy_lost(self, *, finished: bool = True) -> str | None:
        """After the copy step began: why the copy can no longer go on (PostgreSQL: the
        subscription is gone from the target, a backup restored or a hand's ``DROP
        SUBSCRIPTION``), or ``None`` while it can. The mover asks on a resume before the flip
        and, when lost, undoes the copy and makes it again (the journal's ``recopy`` step).
        ``finished`` is whether the step journaled its end: if not, a copy never made is not
        lost, only one that left rows behind."""
        ...

    def copy_stranded(self) -> str | None:
        """While the copy runs: why it can never finish, or ``None`` (PostgreSQL: a table
        whose copy ended and whose table-sync slot is gone from the source; its worker fails
        to stream for ever). One observation: the mover acts only when it lasts."""
        ...

    def copy_progress(self) -> CopyProgress:
        """Each table's copy state, for progress lines."""
        ...

    def copy_synced(self) -> bool:
        """The initial copy is done and changes are applied as they come (cheap: polled)."""
        ...

    def backlog(self) -> int | None:
        """Changes captured and not applied on the target yet, in :attr:`backlog_unit`
        (``None`` while unknown)."""
        ...

    def flush(self, *, source: bool = True, target: bool = True) -> None:
        """Make what the servers wrote durable now, best effort (a drain waits for it)."""
        ...

    def verify_before_fence(self, *, timeout_s: float) -> Verification:
        """The first pass of the comparison, while the shard is still written."""
        ...

    def fence(self, *, terminate_blockers: bool = False) -> FenceResult:
        """The source refuses the shard's writes from now on; the drain position."""
        ...

    def drained(self, position: str) -> bool:
        """Whether the target has applied every change up to the fence's ``position``."""
        ...

    def verify(self) -> Verification:
        """Source and target agree on the shard's rows, or VerificationMismatchError."""
        ...

    def unfence(self) -> list[str]:
        """Drop this move's fence on the source (an abort); what was dropped."""
        ...

    def shard_fences_on_target(self) -> list[str]:
        """Fences of this shard on the target, left by an earlier move away from it."""
        ...

    def cleanup(self) -> CleanupReport:
        """Drop the capture and copy objects of the move (the fence stays)."""
        ...

    def delete_source_rows(self, *, batch_size: int = 5000, pause_ratio: float = 1.0) -> int:
        """After the flip and the barrier: delete the shard's rows on the source, batched."""
        ...

    def delete_target_rows(self, *, batch_size: int = 5000, pause_ratio: float = 1.0) -> int:
        """An abort: delete the shard's copied rows on the target, batched."""
        ...

    def leftovers(self) -> Leftovers:
        """Every object of this move still present on either server."""
        ...

    def measure(self) -> tuple[dict[str, int], int]:
        """The shard's rows per table and its size in bytes on the source (the plan)."""
        ...

    def rows_copied(self) -> int:
        """Rows the copy has written on the target so far (progress lines)."""
        ...


#: The members of :class:`MoveBackend`, for a check that a class has each one.
MOVE_BACKEND_MEMBERS = (
    "kind", "name", "backlog_unit", "held", "check", "capture", "copy", "advance",
    "copy_lost", "copy_stranded", "copy_progress", "copy_synced", "backlog", "flush",
    "verify_before_fence", "fence", "drained", "verify", "unfence", "shard_fences_on_target",
    "cleanup", "delete_source_rows", "delete_target_rows", "leftovers", "measure",
    "rows_copied",
)


def _postgres() -> type[MoveBackend]:
    from ._postgres import PostgresMoveBackend

    return PostgresMoveBackend


_MARIADB_MODULE = f"{__package__}._mariadb"


def _mariadb() -> type[MoveBackend]:
    try:
        module = importlib.import_module(_MARIADB_MODULE)
    except ModuleNotFoundError as error:
        if error.name != _MARIADB_MODULE:
            raise  # a driver missing inside it: its own clear error
        raise ShardMoveError(
            f"MariaDB moves need {_MARIADB_MODULE} (MariaDBMoveBackend), which this "
            "installation of snowflake_db does not have; upgrade snowflake_db, or move the "
            "shard by hand") from None
    backend: type[MoveBackend] = module.MariaDBMoveBackend
    return backend


#: The backend classes by the shard map's backend name, each imported when first asked for
#: (a server's driver is needed only for a move between servers of its backend).
MOVE_BACKENDS: dict[str, Callable[[], type[MoveBackend]]] = {
    "postgresql": _postgres,
    "mariadb": _mariadb,
}


def backend_class(kind: str) -> type[MoveBackend]:
    """The class moving shards between two servers of backend ``kind``."""
    loader = MOVE_BACKENDS.get(kind)
    if loader is None:
        raise ShardMoveError(
            f"no online moves between {kind} servers: moves run between two PostgreSQL or two "
            f"MariaDB servers ({', '.join(MOVE_BACKENDS)})")
    return loader()
