"""What the steps of a shard move take and return: plain values a journal can store as JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...errors import InvalidArgumentError, ShardMoveError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_identifier(what: str, name: str, *, qualified: bool = False) -> tuple[str, ...]:
    """The parts of a plain (optionally ``schema.table``) identifier, or a clear error."""
    parts = tuple(name.split(".")) if isinstance(name, str) else ()
    if not parts or len(parts) > (2 if qualified else 1) or not all(
        _IDENTIFIER.match(part) for part in parts
    ):
        form = "schema.table or table" if qualified else "a name"
        raise InvalidArgumentError(
            f"{what} {name!r} is not a plain identifier ({form}: letters, digits and _, "
            "at most 63 characters each)"
        )
    return parts


@dataclass(frozen=True)
class MovedTable:
    """A sharded table of the move and the column holding its Snowflake ID (the shard bits)."""

    name: str
    id_column: str = "id"

    def __post_init__(self) -> None:
        check_identifier("table", self.name, qualified=True)
        check_identifier("id column", self.id_column)


@dataclass(frozen=True)
class CopyProgress:
    """The subscription's per-table state on the target (``pg_subscription_rel.srsubstate``:
    ``i`` init, ``d`` copying, ``f`` copied, ``s`` synced, ``r`` ready)."""

    states: dict[str, str]
    expected_tables: int

    @property
    def synced(self) -> bool:
        """Every table ready: the initial copy is done and changes stream."""
        return len(self.states) == self.expected_tables and all(
            state == "r" for state in self.states.values()
        )


@dataclass(frozen=True)
class Blocker:
    """A session holding a lock the fence needs (a write transaction on a moving table)."""

    pid: int
    state: str | None
    xact_age_s: float | None
    application_name: str
    table: str


@dataclass(frozen=True)
class FenceResult:
    """The fence is up; ``position`` (``pg_current_wal_lsn()`` after it committed) is the drain
    point: every commit of the shard's rows on the source precedes it."""

    position: str
    attempts: int
    terminated: tuple[int, ...] = ()


@dataclass(frozen=True)
class TableChecksum:
    """``count(*)``, ``sum`` and ``bit_xor`` of ``hashtextextended(row::text, 0)`` over the
    shard's rows of one table (the sum as a decimal string: it can exceed 64 bits)."""

    rows: int
    hash_sum: str
    hash_xor: int


@dataclass(frozen=True)
class Verification:
    """Per table, the source's and the target's checksums (equal, or verify raised).

    ``scope`` says which rows were compared: ``"full"`` every row of the shard;
    ``"before_fence"`` every row not written since the change tracking started (the first pass,
    while writes go on); ``"changed"`` only the rows written since then (the second pass, after
    the drain: ``changed`` counts the IDs per table), the first pass having compared the rest.
    """

    source: dict[str, TableChecksum]
    target: dict[str, TableChecksum]
    scope: str = "full"
    changed: dict[str, int] = field(default_factory=dict)


@dataclass
class CleanupReport:
    """What one cleanup run dropped, and whether the source still has objects to drop (it was
    unreachable: run cleanup again once it answers)."""

    done: list[str] = field(default_factory=list)
    source_pending: bool = False
    source_error: str | None = None


@dataclass(frozen=True)
class Leftovers:
    """Objects of one move still present, found by name."""

    publications: tuple[str, ...] = ()
    slots: tuple[str, ...] = ()
    fence_triggers: tuple[str, ...] = ()
    subscriptions: tuple[str, ...] = ()
    #: the two-pass verification's change-tracking triggers and change logs, on either side
    verify_objects: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.publications or self.slots or self.fence_triggers or self.subscriptions
                    or self.verify_objects)

    @property
    def replication_empty(self) -> bool:
        """Nothing but (possibly) the fence, which stays on the source after a finished move."""
        return not (self.publications or self.slots or self.subscriptions
                    or self.verify_objects)


class FenceBlockedError(ShardMoveError):
    """The fence's lock was not granted within its budget; ``blockers`` are the sessions that
    held conflicting locks on the moving tables at the last attempt. Nothing was created."""

    def __init__(self, message: str, *, blockers: tuple[Blocker, ...]) -> None:
        super().__init__(message)
        self.blockers = blockers


class VerificationMismatchError(ShardMoveError):
    """The shard's rows differ between source and target; both sides' results are attached."""

    def __init__(self, message: str, *, verification: Verification) -> None:
        super().__init__(message)
        self.verification = verification
