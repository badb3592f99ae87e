"""Resuming a PostgreSQL move whose subscription is gone from the target, on two throwaway
clusters (issue 31: ``--resume`` continues a move whose mover died at any point).

A mover SIGKILLed after a journaled step (:func:`tests.plugins.shard_moves.kill_mover_after`),
then the move's subscription dropped by hand on the target with its slot left on the source
(``DISABLE``, ``SET (slot_name = NONE)``, ``DROP``: what a target restored from a backup taken
before the copy looks like to the mover, the slot orphaned), then ``resume`` under writer threads
that route every write by the map. Before the flip the resume undoes the copy (the fence lifted
if it was up, the orphaned slot dropped, the shard's rows on the target deleted, no other
shard's) and copies again; after the flip it finishes as usual. Each ends with every
acknowledged order exactly once on the target the final map names and no replication slot,
publication or subscription left on either cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from snowflake_db import SnowflakeGenerator
from snowflake_db.sharding.moves import (
    FORWARD_STEPS,
    RECOPY_STEP,
    MoveProgress,
    ShardMover,
    wait_until,
)

from ..plugins.shard_moves import (
    LAYOUT,
    ROOT,
    SHARD,
    TABLES,
    Setup,
    assert_exactly_once,
    assert_fence_left,
    kill_mover_after,
    start_writers,
)

pytestmark = pytest.mark.xdist_group("shard_move_resume_postgresql")
BACKEND = "postgresql"
#: A shard moved to b before the move under test: its rows there must survive the recopy.
OTHER = 3


def _slots(setup: Setup) -> list[str]:
    return [row[0] for row in setup.pair.query(
        "source", "SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")]


def _wait_copied(setup: Setup, move_id: int) -> None:
    """Until every table of the move's subscription is ready (``r``) on the target."""
    name = f"sfdb_move_{move_id}"

    def ready() -> bool:
        states = setup.pair.query(
            "target", "SELECT r.srsubstate::text FROM pg_subscription_rel r JOIN "
                      "pg_subscription s ON s.oid = r.srsubid WHERE s.subname = %s", (name,))
        return len(states) == 2 and all(state == ("r",) for state in states)

    wait_until(ready, timeout_s=60, what=f"{name} copied")


def _drop_subscription_by_hand(setup: Setup, move_id: int) -> None:
    """The move's subscription dropped on the target, its slot left on the source."""
    name = f"sfdb_move_{move_id}"
    with setup.connect("b") as conn:
        for statement in (f'ALTER SUBSCRIPTION "{name}" DISABLE',
                          f'ALTER SUBSCRIPTION "{name}" SET (slot_name = NONE)',
                          f'DROP SUBSCRIPTION "{name}"'):
            conn.execute(statement.encode())
    assert setup.pair.count("target", "SELECT count(*) FROM pg_subscription") == 0
    assert name in _slots(setup)


def _shard_rows_on_b(setup: Setup, shard: int) -> int:
    return sum(len(rows) for rows in setup.rows("b", shard).values())


def _journal(setup: Setup, move_id: int) -> list[tuple[str, str]]:
    return [(row.step, row.status) for row in setup.mover().status(move_id).journal]


def _recopy_detail(setup: Setup, move_id: int) -> dict[str, Any]:
    [detail] = [row.detail for row in setup.mover().status(move_id).journal
                if (row.step, row.status) == (RECOPY_STEP, "done")]
    return dict(json.loads(detail or "{}"))


def _steps_after_recopy(setup: Setup, move_id: int) -> list[tuple[str, str]]:
    journal = _journal(setup, move_id)
    return journal[journal.index((RECOPY_STEP, "done")) + 1:]


def _drop_copied_subscription_then_resume(setup: Setup, move_id: int,
                                          events: list[MoveProgress]) -> int:
    """Once the move's subscription copied every table: dropped by hand (its slot orphaned),
    then the move resumed to its end; how many of the shard's rows were on b before."""
    _wait_copied(setup, move_id)
    _drop_subscription_by_hand(setup, move_id)
    stale = _shard_rows_on_b(setup, SHARD)
    assert stale > 0
    record = setup.mover(progress_every_s=0.2).resume(move_id, force=True,
                                                      progress=events.append)
    assert record.state == "done"
    return stale


#: The forward steps a recopy runs again, each started and done (the capture's own first).
AFTER_RECOPY = [(name, status) for name, _ in FORWARD_STEPS[1:]
                for status in ("started", "done")]


def test_resume_after_the_copy_with_the_subscription_dropped_copies_again(
    setup: Setup,
) -> None:
    """Killed after the copy step, the copy finished on its own, then the subscription
    dropped by hand (its slot orphaned on the source) while writers go on: the resume drops
    the slot, deletes the target's stale rows of the shard (none of shard ``OTHER``, moved
    there before), and copies again."""
    preloaded = setup.all_rows("a")
    earlier = setup.mover().move(OTHER, "b")
    other_on_b = setup.rows("b", OTHER)
    assert other_on_b["orders"]
    writers = start_writers(setup)
    events: list[MoveProgress] = []
    try:
        move_id = kill_mover_after(setup, SHARD, "copy", "done")
        stale = _drop_copied_subscription_then_resume(setup, move_id, events)
    finally:
        writers.stop()
    detail = _recopy_detail(setup, move_id)
    assert detail["deleted_target_rows"] == stale, detail
    assert detail["unfenced"] == [] and detail["lost"].startswith(f"no subscription sfdb_move_"
                                                                    f"{move_id} on the target")
    assert f"dropped slot sfdb_move_{move_id} on the source" in detail["dropped"], detail
    [said] = [str(e) for e in events if e.step == RECOPY_STEP]
    target = setup.pair.clusters.target
    name = f"sfdb_move_{move_id}"
    assert said == (
        f"move {move_id} recopy: no subscription {name} on the target {target.host}:"
        f"{target.port}/{setup.pair.db}: dropped slot {name} on the source; dropped publication "
        f"{name} on the source; deleted {stale} rows of shard {SHARD} on b (orders, "
        "order_items); copying again"), said
    assert _steps_after_recopy(setup, move_id) == AFTER_RECOPY
    assert_exactly_once(setup, writers, preloaded)  # shard OTHER's rows on b among them
    assert_fence_left(setup, move_id)
    assert_fence_left(setup, earlier)


def test_resume_during_the_copy_with_a_subscription_dropped_midway_copies_again(
    setup: Setup,
) -> None:
    """Killed as the copy step began (its subscription not journaled), then the subscription
    made as the mover makes it, its tables copied, and dropped by hand (its slot orphaned):
    the shard's rows are on b, and a new subscription would copy them again into the same
    keys. The resume finds the copy step begun and no subscription: it deletes b's rows of the
    shard, drops the slot and copies again."""
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    events: list[MoveProgress] = []
    try:
        move_id = kill_mover_after(setup, SHARD, "copy", "started")
        assert ("copy", "done") not in _journal(setup, move_id)
        setup.pair.backend(shard=SHARD, move_id=move_id).copy()
        stale = _drop_copied_subscription_then_resume(setup, move_id, events)
    finally:
        writers.stop()
    detail = _recopy_detail(setup, move_id)
    assert detail["deleted_target_rows"] == stale, detail
    assert detail["lost"].endswith(f"and rows of shard {SHARD} in orders, order_items there, "
                                   "copied by a subscription lost before the copy step "
                                   "finished"), detail
    assert f"dropped slot sfdb_move_{move_id} on the source" in detail["dropped"], detail
    assert _steps_after_recopy(setup, move_id) == AFTER_RECOPY
    assert_exactly_once(setup, writers, preloaded)
    assert_fence_left(setup, move_id)


def test_resume_of_a_copy_step_that_made_nothing_makes_its_subscription(setup: Setup) -> None:
    """Killed as the copy step began, before its subscription: nothing was copied, so nothing
    is lost and the resume goes on with the step (no ``recopy``)."""
    preloaded = setup.all_rows("a")
    move_id = kill_mover_after(setup, SHARD, "copy", "started")
    assert setup.pair.count("target", "SELECT count(*) FROM pg_subscription") == 0
    assert setup.mover().resume(move_id, force=True).state == "done"
    assert RECOPY_STEP not in {step for step, _ in _journal(setup, move_id)}
    assert_exactly_once(setup, None, preloaded)
    assert_fence_left(setup, move_id)


_DISABLING_KILLER = """
import sys
from tests.sharding.test_shard_move_resume_postgres import disabled_then_killed_main
disabled_then_killed_main(sys.argv[1:])
"""


def disabled_then_killed_main(argv: list[str]) -> None:
    """In a subprocess: ``move(SHARD, 'b')`` whose subscription is disabled on the target as
    the announce step begins (the stream stops: nothing written on a since reaches b), then
    SIGKILLed once the fence's journal line committed (argv: control URL, NAME=URL...)."""
    from snowflake_db.sharding.moves import _journal

    control, *given = argv
    targets = dict(arg.split("=", 1) for arg in given)
    started = _journal.Journal.started

    def journaled(self: Any, step: str, state: str | None) -> None:
        started(self, step, state)
        if step == "drain":  # written with the fence's "done" line: the fence is up
            os.kill(os.getpid(), signal.SIGKILL)

    def progress(event: MoveProgress) -> None:
        if event.step != "announce":
            return
        name = f"sfdb_move_{event.move_id}"
        with psycopg.connect(targets["b"].replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'ALTER SUBSCRIPTION "{name}" DISABLE'.encode())
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_subscription WHERE subname = %s AND pid IS NOT "
                "NULL", (name,)).fetchone() == (0,), timeout_s=30, what=f"{name}'s workers gone")

    _journal.Journal.started = journaled  # type: ignore[method-assign]
    mover = ShardMover(control, targets, layout=LAYOUT, tables=TABLES, lease_s=30,
                       assume_no_static_workers=True)
    mover.move(SHARD, "b", progress=progress)
    sys.exit(3)  # never reached: the mover was killed


def _unfenced_between(setup: Setup, events: list[MoveProgress], between: dict[str, Any],
                      oid: int) -> Any:
    """A progress callback: after the recopy (before the new capture) the map says
    ``moving``, a write of the shard passes on a, and b holds none of its rows."""

    def progress(event: MoveProgress) -> None:
        events.append(event)
        if event.step == RECOPY_STEP:
            between["map"] = setup.map_of(SHARD)
            setup.kind.write(setup.url("a"), "INSERT INTO orders (id, customer_id, total_cents, "
                                             "status) VALUES (%s, 5, 5, 'unfenced')", (oid,))
            between["on_b"] = _shard_rows_on_b(setup, SHARD)
    return progress


def _confirmed_past(setup: Setup, move_id: int) -> bool:
    """Whether the move's slot on a confirmed the journaled fence position (drained)."""
    position = setup.mover().status(move_id).move.capture["fence_position"]
    [(past,)] = setup.pair.query(
        "source", "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                  "WHERE slot_name = %s", (position, f"sfdb_move_{move_id}"))
    return bool(past)


def test_resume_with_the_fence_up_and_the_subscription_dropped_lifts_it_and_copies_again(
    setup: Setup,
) -> None:
    """The stream stopped before the fence (subscription disabled), the mover killed once the
    fence is up, then the subscription dropped by hand, its slot left short of the fence
    position: the stream cannot be drained. The resume lifts the fence (the shard's writes go
    to a again, still its home), sets the map back to ``moving``, drops the slot, deletes b's
    stale rows of the shard, copies again and fences anew."""
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    events: list[MoveProgress] = []
    between: dict[str, Any] = {}
    passed = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(SHARD)  # no writer's worker
    try:
        done = subprocess.run(
            [sys.executable, "-c", _DISABLING_KILLER, setup.control_url,
             *(f"{name}={url}" for name, url in setup.targets.items())],
            cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
        [record] = setup.mover().moves(limit=1)
        move_id = record.id
        assert setup.map_of(SHARD) == ("a", "cutover")
        _drop_subscription_by_hand(setup, move_id)
        assert not _confirmed_past(setup, move_id)
        stale = _shard_rows_on_b(setup, SHARD)
        assert stale > 0
        resumed = setup.mover(progress_every_s=0.2, drain_timeout_s=30).resume(
            move_id, force=True, progress=_unfenced_between(setup, events, between, passed))
        assert resumed.state == "done"
    finally:
        writers.stop()
    assert between == {"map": ("a", "moving"), "on_b": 0}
    detail = _recopy_detail(setup, move_id)
    assert len(detail["unfenced"]) == setup.kind.fence_objects, detail
    assert detail["deleted_target_rows"] == stale, detail
    [said] = [str(e) for e in events if e.step == RECOPY_STEP]
    assert "lifted the fence on a (6 trigger(s))" in said, said
    assert f"deleted {stale} rows of shard {SHARD} on b" in said, said
    assert _steps_after_recopy(setup, move_id) == AFTER_RECOPY
    assert_exactly_once(setup, writers, preloaded, {passed: "unfenced"})
    assert_fence_left(setup, move_id)


def _cold_copy(cluster: Any, into: Path) -> None:
    """Stop ``cluster`` (fast shutdown), copy its data directory to ``into``, start it."""
    cluster.stop()
    subprocess.run(["cp", "-a", str(cluster.data), str(into)], check=True, timeout=300)
    cluster.start()


def test_resume_with_the_fence_up_and_b_restored_from_a_backup_before_the_copy(
    setup: Setup,
) -> None:
    """b restored from a backup taken before the move (a stopped cluster's data directory
    copied, then copied back): no subscription, none of the shard's rows, no tracking; the
    slot on a confirmed what the lost b had applied. Resumed after the fence, the move copies
    again instead of verifying (and flipping to) a target that lost the copy."""
    preloaded = setup.all_rows("a")
    target = setup.pair.clusters.target
    backup = target.directory / "backup"
    writers = start_writers(setup)  # every shard on a: b is not written
    events: list[MoveProgress] = []
    between: dict[str, Any] = {}
    passed = SnowflakeGenerator(9, layout=LAYOUT).next_id_in_shard(SHARD)
    try:
        _cold_copy(target, backup)
        move_id = kill_mover_after(setup, SHARD, "drain", "started")  # the fence is up
        assert setup.map_of(SHARD) == ("a", "cutover")
        target.stop()
        shutil.rmtree(target.data)
        subprocess.run(["cp", "-a", str(backup), str(target.data)], check=True, timeout=300)
        target.start()
        assert setup.pair.count("target", "SELECT count(*) FROM pg_subscription") == 0
        assert _shard_rows_on_b(setup, SHARD) == 0
        assert f"sfdb_move_{move_id}" in _slots(setup)
        resumed = setup.mover(progress_every_s=0.2, drain_timeout_s=30).resume(
            move_id, force=True, progress=_unfenced_between(setup, events, between, passed))
        assert resumed.state == "done"
    finally:
        writers.stop()
        if target.pid is None:
            target.start()
        shutil.rmtree(backup, ignore_errors=True)
    assert between == {"map": ("a", "moving"), "on_b": 0}
    detail = _recopy_detail(setup, move_id)
    assert len(detail["unfenced"]) == setup.kind.fence_objects, detail
    assert detail["deleted_target_rows"] == 0, detail
    assert _steps_after_recopy(setup, move_id) == AFTER_RECOPY
    assert_exactly_once(setup, writers, preloaded, {passed: "unfenced"})
    assert_fence_left(setup, move_id)


def test_resume_after_the_flip_with_the_subscription_dropped_finishes_without_copying(
    setup: Setup,
) -> None:
    """After the flip b is the shard's home and is written: a missing subscription means
    nothing to copy again. The resume finishes (its cleanup drops the orphaned slot)."""
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    try:
        move_id = kill_mover_after(setup, SHARD, "barrier", "started")  # the flip committed
        assert setup.map_of(SHARD) == ("b", "serving")
        _drop_subscription_by_hand(setup, move_id)
        # Written on b, the home, before the resume.
        on_b = _shard_rows_on_b(setup, SHARD)
        wait_until(lambda: _shard_rows_on_b(setup, SHARD) > on_b, timeout_s=30,
                   what="writes of the shard on b")
        record = setup.mover().resume(move_id, force=True)
        assert record.state == "done"
    finally:
        writers.stop()
    journal = _journal(setup, move_id)
    assert RECOPY_STEP not in {step for step, _ in journal}
    assert journal[-8:] == [(name, status) for name, _ in FORWARD_STEPS[-4:]
                            for status in ("started", "done")]
    assert_exactly_once(setup, writers, preloaded)
    assert_fence_left(setup, move_id)


def test_abort_with_the_subscription_dropped_leaves_nothing(setup: Setup) -> None:
    """An abort instead of a resume: the orphaned slot is dropped, the target's copy
    deleted, the shard served by a."""
    preloaded = setup.all_rows("a")
    writers = start_writers(setup)
    try:
        move_id = kill_mover_after(setup, SHARD, "copy", "done")
        _wait_copied(setup, move_id)
        _drop_subscription_by_hand(setup, move_id)
        assert setup.mover().abort(move_id, force=True).state == "aborted"
    finally:
        writers.stop()
    assert setup.map_of(SHARD) == ("a", "serving")
    assert _shard_rows_on_b(setup, SHARD) == 0
    assert _slots(setup) == []
    assert_exactly_once(setup, writers, preloaded)
