"""What a move's fence must have done, judged from recorded events: every write attempt of the
map-routed writers (where it went, when, and whether a fence refused it) and the moment the
mover reported the fence up (its progress event, emitted once the fence is committed).

Whether a writer happens to meet the fence between its commit and the flip (the router then
follows the map within 0.1 s) is chance, so "at least one refusal" is no claim. These are:

* every refusal was a write of the moving shard on the source, refused by this move's fence
  (:func:`~snowflake_db.sharding.moved.shard_moved_error` names the shard, the new target and
  the move) or by the writer's confirmation of its route before the commit (the shard and the
  new target);
* no write of the moving shard that began after the fence was up was answered by the source;
* the fence is still there after the move: a write of the shard on the source is refused
  naming the move (checked directly, with the backend's driver:
  :func:`tests.plugins.shard_moves.assert_fence_did` makes all three checks, for both
  backends).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from snowflake_db.sharding.moved import shard_moved_error

T = TypeVar("T")


@dataclass(frozen=True)
class Attempt:
    """One try of a write: the order, the server it was routed to, when it began and ended
    (monotonic), and the move whose fence refused it (None: not refused by a fence)."""

    oid: int
    target: str
    began: float
    ended: float
    answered: bool
    refused_by: tuple[int, str, int | None] | None = None  # (shard, target, move id)


@dataclass
class Attempts:
    """The attempts of one writer thread (appended by it only)."""

    recorded: list[Attempt] = field(default_factory=list)

    def run(self, oid: int, target: str, work: Callable[[], T]) -> T:
        """``work()`` (one try on ``target``), recorded with its outcome; re-raises."""
        began = time.monotonic()
        try:
            result = work()
        except Exception as error:
            moved = shard_moved_error(error)
            refused_by = None if moved is None else (moved.shard, moved.target, moved.move_id)
            self.recorded.append(Attempt(oid, target, began, time.monotonic(), False, refused_by))
            raise
        self.recorded.append(Attempt(oid, target, began, time.monotonic(), True))
        return result


class FenceClock:
    """A ``progress`` callback for ``ShardMover.move``: keeps every event's line, and the
    monotonic time the mover reported the fence up (after its commit)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.fence_up: float | None = None
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        with self._lock:
            if (self.fence_up is None and event.step == "fence"
                    and str(event.message).startswith("fence up")):
                self.fence_up = time.monotonic()
            self.events.append(str(event))


def assert_fence_judged(attempts: list[Attempt], *, shard: int, mask: int, source: str,
                        target: str, move_id: int, fence_up: float) -> int:
    """Judge the writers' attempts (see the module's docstring); ``fence_up``: when the fence
    was reported up (or, when no event said so, a moment by which it surely was, such as the
    end of the move). Returns how many attempts the fence refused."""
    refused = [a for a in attempts if a.refused_by is not None]
    # Refused by the fence (its move ID), or by the writer's confirmation of its route before
    # the commit (the map names the new target; no move ID).
    expected = {(shard, target, move_id), (shard, target, None)}
    wrong = [a for a in refused
             if (a.oid & mask, a.target) != (shard, source) or a.refused_by not in expected]
    assert wrong == [], f"refusals other than this move's fence on the shard's source: {wrong[:5]}"
    answered_late = [a for a in attempts if a.answered and a.target == source
                     and a.oid & mask == shard and a.began > fence_up]
    assert answered_late == [], (
        f"{len(answered_late)} write(s) of shard {shard} answered by {source} after its fence "
        f"was up: {answered_late[:5]}")
    return len(refused)
