"""The steps of an online shard move that every backend shares, on two throwaway servers of each
(``backend``: PostgreSQL clusters, the source with ``wal_level = logical``; MariaDB servers, the
source with a row-based binary log), in the same processes and on the same servers as each
backend's own steps (test_shard_moves_postgres.py, test_shard_moves_mariadb.py).

Each test makes its own database on each server with two sharded tables of a few thousand
rows (4 shard bits: shard = id & 15). Without the binaries the tests skip with the reason;
under ``CI=true`` they fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from snowflake_db.sharding.moves import (
    MOVE_STEPS,
    Leftovers,
    VerificationMismatchError,
    wait_until,
)

from ..plugins.shard_moves import (
    LEFT_AFTER,
    STEP_TIMEOUT_S,
    Kind,
    assert_undone,
    on_every_backend,
)
from ..plugins.shard_moves_mariadb import STEPS

# In the processes of each backend's own steps, on their servers (PostgreSQL's target with
# wal_level = replica).
pytestmark = on_every_backend("shard_moves")
BOTH_LOGICAL = False


def test_check_passes_and_creates_nothing(pair: Any) -> None:
    backend = pair.backend()
    backend.check()
    assert backend.leftovers() == Leftovers()
    pair.assert_nothing_left()


def test_mover_gone_after_each_step_leaves_nothing_after_cleanup(move_kind: Kind, pair: Any
                                                                  ) -> None:
    """A backend run up to each step, then forgotten (the mover died): a new one that knows
    only the move's ID finds what the steps left (``Kind.assert_left_after``), and unfence,
    cleanup and the target's rows' deletion leave nothing."""
    assert list(LEFT_AFTER) == list(MOVE_STEPS[:-1]) == list(STEPS[:-1])  # before cleanup
    for shard, (step, (captured, copying, fenced)) in enumerate(LEFT_AFTER.items()):
        first = pair.backend(shard=shard, move_id=shard + 1)
        move_kind.run_steps(first, stop_after=step)
        del first  # the mover died; a new one knows only the move's ID
        fresh = pair.backend(shard=shard, move_id=shard + 1)
        move_kind.assert_left_after(pair, fresh.leftovers(), step, shard + 1, captured=captured,
                                copying=copying, fenced=fenced)
        fresh.unfence()
        report = fresh.cleanup()
        assert report.source_pending is False
        fresh.delete_target_rows()
        assert fresh.leftovers() == Leftovers(), step
        pair.assert_nothing_left()
        assert pair.rows("target", "orders", shard) == {}


def test_first_pass_catches_a_mismatch_before_the_fence(move_kind: Kind, pair: Any) -> None:
    """A row that differs before the change tracking starts is caught by the first pass,
    while the shard is still served (no fence): the move stops with nothing paused. Without
    the first pass's mark the second pass compares every row."""
    shard = 6
    backend = pair.backend(shard=shard)
    move_kind.run_steps(backend, stop_after="caught_up")
    newest = max(pair.rows("target", "order_items", shard))
    pair.query("target", "DELETE FROM order_items WHERE id = %s", (newest,))
    with pytest.raises(VerificationMismatchError, match=r"verify_before_fence: .*order_items"
                       ) as mismatch:
        backend.verify_before_fence(timeout_s=STEP_TIMEOUT_S)
    found = mismatch.value.verification
    assert found.scope == "before_fence"
    assert found.source["order_items"].rows == found.target["order_items"].rows + 1
    move_kind.assert_not_fenced(pair, backend)
    fenced = backend.fence()
    wait_until(lambda: backend.drained(fenced.position), timeout_s=STEP_TIMEOUT_S, what="drain")
    with pytest.raises(VerificationMismatchError) as again:
        backend.verify()
    assert again.value.verification.scope == "full"
    assert_undone(backend)
