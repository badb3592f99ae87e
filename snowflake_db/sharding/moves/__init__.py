"""Online moves of a logical shard between PostgreSQL servers: the database steps.

:class:`ShardMover` moves a shard with a journal in the control database, the shard map's
states and flip, the cleanup barrier, resume and abort (:mod:`.mover`).
:class:`PostgresMoveBackend` holds the steps of one move (``docs/design/shard-moves.md``):
``check``, ``capture``, ``copy``, ``copy_progress``/``lag``, ``fence``, ``drained``,
``verify``, ``unfence``, ``cleanup``, ``delete_source_rows``, ``delete_target_rows`` and
``leftovers``. Each is idempotent and finds its objects by name, so it can run again after the
mover died. The journal, the shard map and the flip belong to the orchestration; the driver
:func:`run_move_steps` runs the steps in order without them (tests, scripts).

Needs psycopg 3 (the ``postgres`` extra).
"""

from ...errors import MoverLeaseLostError, MoveStoppedError, StaticWorkersUnconfirmedError
from ._connections import Endpoint
from ._driver import MOVE_STEPS, run_move_steps, wait_until
from ._postgres import (
    FENCE_BYPASS_SETTING,
    FENCE_FUNCTION,
    FENCE_SQLSTATE,
    PostgresMoveBackend,
)
from ._results import (
    Blocker,
    CleanupReport,
    CopyProgress,
    FenceBlockedError,
    FenceResult,
    Leftovers,
    MovedTable,
    TableChecksum,
    Verification,
    VerificationMismatchError,
)
from .mover import (
    FORWARD_STEPS,
    STATIC_WORKERS_STEP,
    MovePlan,
    MoveProgress,
    MoveRecord,
    MoveStatus,
    ProposedMove,
    ShardMover,
)

__all__ = [
    "FENCE_BYPASS_SETTING",
    "FENCE_FUNCTION",
    "FENCE_SQLSTATE",
    "FORWARD_STEPS",
    "MOVE_STEPS",
    "STATIC_WORKERS_STEP",
    "Blocker",
    "CleanupReport",
    "CopyProgress",
    "Endpoint",
    "FenceBlockedError",
    "FenceResult",
    "Leftovers",
    "MovePlan",
    "MoveProgress",
    "MoveRecord",
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
    "run_move_steps",
    "wait_until",
]
