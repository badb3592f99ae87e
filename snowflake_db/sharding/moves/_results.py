"""What the steps of a shard move take and return: plain values a journal can store as JSON."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import FenceBlockedError, InvalidArgumentError, VerificationMismatchError

__all__ = [  # the two errors live in snowflake_db.errors; importable from here as before
    "Blocker",
    "CleanupReport",
    "CopyProgress",
    "FenceBlockedError",
    "FenceResult",
    "Leftovers",
    "MovedTable",
    "TableChecksum",
    "Verification",
    "VerificationMismatchError",
    "check_identifier",
]

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


#: A target's name in the shard map (and in the fence's refusal message).
TARGET_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,63}$")


def check_move_arguments(*, move_id: int, target_name: str,
                         tables: Sequence[MovedTable | str],
                         at_least_one: dict[str, int]) -> tuple[MovedTable, ...]:
    """What every backend's constructor checks: the move's ID, the target's name, the tables
    (as :class:`MovedTable`, none twice) and its positive int options (``{name: value}``);
    one clear error each."""
    if not isinstance(move_id, int) or isinstance(move_id, bool) or not 0 <= move_id < 2**63:
        raise InvalidArgumentError(f"move_id {move_id!r} must be an int in [0, 2**63)")
    if not isinstance(target_name, str) or not TARGET_NAME.match(target_name):
        raise InvalidArgumentError(
            f"target_name {target_name!r} must be 1-63 letters, digits or _ . : -")
    if not tables:
        raise InvalidArgumentError("tables is empty: a move needs at least one sharded table")
    for name, value in at_least_one.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(f"{name} {value!r} must be an int >= 1")
    moved = tuple(t if isinstance(t, MovedTable) else MovedTable(t) for t in tables)
    if len({t.name for t in moved}) != len(moved):
        raise InvalidArgumentError(f"tables {[t.name for t in moved]} name one twice")
    return moved


@dataclass(frozen=True)
class CopyProgress:
    """Each table's copy state on the target, ``r`` once ready (the letters are PostgreSQL's
    ``pg_subscription_rel.srsubstate``: ``i`` init, ``d`` copying, ``f`` copied, ``s``
    synced, ``r`` ready)."""

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
    """The fence is up; ``position`` is the drain point in the backend's terms (PostgreSQL:
    ``pg_current_wal_insert_lsn()`` after the fence committed): every commit of the shard's
    rows on the source precedes it."""

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
