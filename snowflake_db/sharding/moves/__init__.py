"""Online moves of a logical shard between two servers of one backend: the database steps.

:class:`ShardMover` moves a shard with a journal in the control database, the shard map's
states and flip, the cleanup barrier, resume and abort (:mod:`.mover`). It drives a
:class:`MoveBackend`, the steps of one move (``docs/design/shard-moves.md``), chosen by the
shard map's backend of the two servers (a move between two backends is refused):
:class:`PostgresMoveBackend` between PostgreSQL servers (psycopg 3, the ``postgres`` extra;
imported when first used), :class:`MariaDBMoveBackend` between MariaDB servers (PyMySQL, the
``mysql`` extra; imported when first used). Each step is idempotent and finds its objects by
name, so it can run again after the mover died. The journal, the shard map and the flip belong
to the orchestration; the driver :func:`run_move_steps` runs the steps in order without them
(tests, scripts).
"""

from typing import TYPE_CHECKING, Any

from ...errors import (
    FenceBlockedError,
    MoverLeaseLostError,
    MoveServerUnreachableError,
    MoveStoppedError,
    StaticWorkersUnconfirmedError,
    VerificationMismatchError,
)
from ._backend import MOVE_BACKEND_MEMBERS, MOVE_BACKENDS, MoveBackend, backend_class
from ._connections import Endpoint
from ._driver import MOVE_STEPS, run_move_steps, wait_until
from ._results import (
    Blocker,
    CleanupReport,
    CopyProgress,
    FenceResult,
    Leftovers,
    MovedTable,
    TableChecksum,
    Verification,
)
from .mover import (
    FORWARD_STEPS,
    RECOPY_STEP,
    STATIC_WORKERS_STEP,
    MovePlan,
    MoveProgress,
    MoveRecord,
    MoveStatus,
    ProposedMove,
    ShardMover,
)

if TYPE_CHECKING:
    from ._mariadb import MariaDBMoveBackend
    from ._postgres import (
        FENCE_BYPASS_SETTING,
        FENCE_FUNCTION,
        FENCE_SQLSTATE,
        PostgresMoveBackend,
    )

#: Names of the PostgreSQL backend's module, imported when first asked for: a MariaDB move
#: needs no psycopg.
_POSTGRES_NAMES = frozenset({"FENCE_BYPASS_SETTING", "FENCE_FUNCTION", "FENCE_SQLSTATE",
                             "PostgresMoveBackend"})


def __getattr__(name: str) -> Any:
    if name in _POSTGRES_NAMES:
        from . import _postgres

        return getattr(_postgres, name)
    if name == "MariaDBMoveBackend":
        from ._mariadb import MariaDBMoveBackend

        return MariaDBMoveBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FENCE_BYPASS_SETTING",
    "FENCE_FUNCTION",
    "FENCE_SQLSTATE",
    "FORWARD_STEPS",
    "MOVE_BACKENDS",
    "MOVE_BACKEND_MEMBERS",
    "MOVE_STEPS",
    "RECOPY_STEP",
    "STATIC_WORKERS_STEP",
    "Blocker",
    "CleanupReport",
    "CopyProgress",
    "Endpoint",
    "FenceBlockedError",
    "FenceResult",
    "Leftovers",
    "MariaDBMoveBackend",
    "MoveBackend",
    "MovePlan",
    "MoveProgress",
    "MoveRecord",
    "MoveServerUnreachableError",
    "MoveStatus",
    "MoveStoppedError",
    "MovedTable",
    "MoverLeaseLostError",
    "PostgresMoveBackend",
    "ProposedMove",
    "ShardMover",
    "StaticWorkersUnconfirmedError",
    "TableChecksum",
    "Verification",
    "VerificationMismatchError",
    "backend_class",
    "run_move_steps",
    "wait_until",
]
