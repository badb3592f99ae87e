"""PostgreSQL ``snowflake_next_id()``'s lock-free fast path: ``nextval`` values are used only
when their worker and shard bits are the function's, their tick is the clock's (or ahead within
the tolerance) and no slow path ``setval`` can have run around them. A tiny layout (2 worker
bits, 4 sequence bits, 2 shard bits) exhausts ticks constantly, so values refused for their
worker bits, carries across the worker field and ``setval`` jumps all happen under load."""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from snowflake_db import Layout
from snowflake_db.clock import wall_clock
from snowflake_db.key_functions import _postgres
from snowflake_db.key_functions._spec import FunctionSpec

from ..plugins.databases import ScratchDatabase
from .support import install, last_id, set_last_id, worker_tables_in

#: 16 IDs per tick and 4 workers: the worker field is crossed by every used-up tick.
SMALL = Layout(time_bits=41, worker_bits=2, sequence_bits=4, shard_bits=2)
SESSIONS, CALLS, BATCH = 8, 25_600, 3_200  # 204,800 IDs from the function under test
OTHER_SESSIONS, OTHER_CALLS = 2, 6_400  # the neighbour function (worker 3) at the same time


def _small_functions(engine: Any) -> tuple[int, int]:
    """``upper_next_id()`` (worker 3, installed first) and ``mid_next_id()`` (worker 2, whose
    refused values carry into worker 3's bits)."""
    worker_tables_in(engine)
    upper = install(engine, name="upper_next_id", layout=SMALL, label="upper")
    mid = install(engine, name="mid_next_id", layout=SMALL, label="mid")
    assert (upper, mid) == (3, 2)
    return upper, mid


@pytest.mark.timing(seconds=60)
def test_8_sessions_across_used_up_ticks_never_repeat_an_id(postgres_db: ScratchDatabase) -> None:
    engine = create_engine(postgres_db.url, pool_size=SESSIONS + OTHER_SESSIONS)
    try:
        upper, mid = _small_functions(engine)
        barrier = threading.Barrier(SESSIONS + OTHER_SESSIONS)
        results: dict[str, list[array[int]]] = {"mid": [], "upper": []}
        errors: list[BaseException] = []
        lock = threading.Lock()

        def caller(function: str, calls: int) -> None:
            ids = array("q")
            try:
                with engine.connect() as conn:
                    barrier.wait(60)
                    for _ in range(calls // BATCH):
                        ids.extend(
                            conn.scalars(
                                text(f"SELECT {function}() FROM generate_series(1, {BATCH})")
                            )
                        )
                        conn.commit()
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)
            with lock:
                results[function.split("_", maxsplit=1)[0]].append(ids)

        threads = [
            threading.Thread(target=caller, args=("mid_next_id", CALLS)) for _ in range(SESSIONS)
        ] + [
            threading.Thread(target=caller, args=("upper_next_id", OTHER_CALLS))
            for _ in range(OTHER_SESSIONS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        assert not errors, errors
        mid_ids = array("q")
        for part in results["mid"]:
            mid_ids.extend(part)
        upper_ids = array("q")
        for part in results["upper"]:
            upper_ids.extend(part)
        assert len(mid_ids) == SESSIONS * CALLS >= 200_000
        assert len(upper_ids) == OTHER_SESSIONS * OTHER_CALLS
        everything = set(mid_ids)
        assert len(everything) == len(mid_ids)  # not one duplicate
        everything.update(upper_ids)
        assert len(everything) == len(mid_ids) + len(upper_ids)  # nor between the functions
        for ids, worker in ((mid_ids, mid), (upper_ids, upper)):
            parts = {(SMALL.decode(i).worker_id, SMALL.decode(i).shard) for i in ids}
            assert parts == {(worker, 0)}
        # each session's IDs increase, and ticks were used up (16 IDs), never wrapped
        for part in results["mid"]:
            assert all(a < b for a, b in itertools.pairwise(part))
        per_tick: dict[int, int] = {}
        for i in mid_ids:
            tick = i >> SMALL.time_shift
            per_tick[tick] = per_tick.get(tick, 0) + 1
        assert max(per_tick.values()) == SMALL.ids_per_tick
        assert sum(1 for n in per_tick.values() if n == SMALL.ids_per_tick) > 100
    finally:
        engine.dispose()


def test_a_clock_behind_within_the_tolerance_goes_on_beyond_it_is_refused(
    postgres_db: ScratchDatabase,
) -> None:
    engine = create_engine(postgres_db.url)
    try:
        _upper, mid = _small_functions(engine)
        now_ms = wall_clock()
        # the last ID 300 ms ahead, its tick used up: wait for the clock to pass that tick
        ahead = SMALL.encode(timestamp_ms=now_ms + 300, worker_id=mid, sequence=SMALL.max_sequence)
        set_last_id(engine, ahead, function="mid_next_id")
        with engine.connect() as conn:
            after = conn.scalar(text("SELECT mid_next_id()"))
            following = conn.scalar(text("SELECT mid_next_id()"))
        decoded = SMALL.decode(after)
        assert after > ahead and decoded.timestamp_ms > SMALL.decode(ahead).timestamp_ms
        assert (decoded.worker_id, decoded.shard) == (mid, 0)
        assert following > after
        # the last ID 500 ms ahead, below the worker's part of its tick: jump there, no wait
        ahead = SMALL.encode(timestamp_ms=wall_clock() + 500, worker_id=mid - 1, sequence=5)
        set_last_id(engine, ahead, function="mid_next_id")
        with engine.connect() as conn:
            jumped = conn.scalar(text("SELECT mid_next_id()"))
        assert jumped == SMALL.encode(
            timestamp_ms=SMALL.decode(ahead).timestamp_ms, worker_id=mid, sequence=0
        )
        # 10 s ahead: refused by both paths, in two sessions; the state never moves back
        ahead = SMALL.encode(timestamp_ms=wall_clock() + 10_000, worker_id=mid, sequence=3)
        set_last_id(engine, ahead, function="mid_next_id")
        refused = r"clock moved backwards by \d+ ms, more than the tolerated 2000"
        with engine.connect() as first, engine.connect() as second:
            for conn in (first, second, first):
                with pytest.raises(DBAPIError, match=refused):
                    conn.execute(text("SELECT mid_next_id()"))
                conn.rollback()
        state = last_id(engine, mid, function="mid_next_id", layout=SMALL)
        assert state is not None and ahead < state <= ahead + 6 * (1 << SMALL.sequence_shift)
    finally:
        engine.dispose()


def test_a_fresh_function_starts_at_the_current_tick_with_shard_bits_clear(
    postgres_db: ScratchDatabase,
) -> None:
    engine = create_engine(postgres_db.url)
    try:
        _upper, mid = _small_functions(engine)
        before = wall_clock()
        with engine.connect() as conn:
            first = conn.scalar(text("SELECT mid_next_id()"))
        decoded = SMALL.decode(first)
        assert (decoded.worker_id, decoded.sequence, decoded.shard) == (mid, 0, 0)
        assert before - SMALL.tick_ms < decoded.timestamp_ms <= wall_clock()
    finally:
        engine.dispose()


def test_the_time_bits_running_out_is_refused(postgres_db: ScratchDatabase) -> None:
    # a layout whose last tick has passed (2**20 ms from an epoch 2**20 + 5000 ms ago)
    spent = Layout(
        time_bits=20, worker_bits=2, sequence_bits=4, epoch_ms=wall_clock() - 2**20 - 5_000
    )
    engine = create_engine(postgres_db.url)
    try:
        worker_tables_in(engine)
        install(engine, name="spent_next_id", layout=spent)
        with engine.connect() as conn, pytest.raises(DBAPIError, match="time bits ran out"):
            conn.scalar(text("SELECT spent_next_id()"))
    finally:
        engine.dispose()


def test_a_guard_left_odd_is_repaired_by_the_next_slow_path(
    postgres_db: ScratchDatabase,
) -> None:
    """A crash or a killed session in the middle of a slow path leaves the guard odd: the fast
    path then refuses everything, and the next slow path makes it even again."""
    engine = create_engine(postgres_db.url)
    try:
        _upper, mid = _small_functions(engine)
        with engine.begin() as conn:
            conn.execute(text("SELECT nextval('mid_next_id_guard')"))
            assert conn.scalar(text("SELECT last_value FROM mid_next_id_guard")) % 2 == 1
        with engine.connect() as conn:
            ids = [conn.scalar(text("SELECT mid_next_id()")) for _ in range(3)]
            guard = conn.scalar(text("SELECT last_value FROM mid_next_id_guard"))
        assert ids == sorted(set(ids)) and guard % 2 == 0
        assert {SMALL.decode(i).worker_id for i in ids} == {mid}
    finally:
        engine.dispose()


def test_the_drop_removes_both_sequences(postgres_db: ScratchDatabase) -> None:
    from snowflake_db.key_functions import drop_key_function

    engine = create_engine(postgres_db.url)
    try:
        _small_functions(engine)
        with engine.begin() as conn:
            drop_key_function(conn, name="mid_next_id", layout=SMALL, label="mid")
            left = conn.scalars(
                text("SELECT relname FROM pg_class WHERE relname LIKE 'mid_next_id%'")
            ).all()
        assert left == []
    finally:
        engine.dispose()


def test_values_fetched_while_a_slow_path_may_setval_are_never_used(
    postgres_db: ScratchDatabase,
) -> None:
    """This test plays a slow path by hand, exactly as the function does it: lock, guard odd,
    read ``last_value``, ``setval`` to the worker's first ID of the tick, guard even, unlock.
    Between the read and the ``setval`` two callers fetch the next two values; the second is
    the function's own (worker bits, tick), but fetched while the guard was odd, so it is
    refused, and the ``setval`` (one step back over it) hands it out once, after the unlock."""
    engine = create_engine(postgres_db.url, pool_size=4)
    step = 1 << SMALL.sequence_shift
    try:
        worker_tables_in(engine)
        # a tolerance of 60 s keeps a tick 30 s ahead acceptable however slow the machine is
        worker = install(
            engine, name="hand_next_id", layout=SMALL, label="hand", rollback_tolerance_ms=60_000
        )
        first = SMALL.encode(timestamp_ms=wall_clock() + 30_000, worker_id=worker, sequence=0)
        set_last_id(engine, first - 2 * step, function="hand_next_id")
        lock = f"{_postgres.ADVISORY_LOCK_CLASS}, {FunctionSpec('hand_next_id', None).lock_key}"
        got: dict[str, int] = {}
        errors: list[BaseException] = []

        def call(who: str) -> None:
            try:
                with engine.connect() as conn:
                    got[who] = conn.scalar(text("SELECT hand_next_id()"))
                    conn.commit()
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        def state(conn: Any) -> int:
            return int(conn.scalar(text("SELECT pg_sequence_last_value('hand_next_id_state')")))

        def await_state(conn: Any, value: int) -> None:
            deadline = time.monotonic() + 60
            while state(conn) != value:
                assert time.monotonic() < deadline, "a caller never fetched its value"
                time.sleep(0.005)

        with engine.connect() as slow, engine.connect() as watch:
            slow.execute(text(f"SELECT pg_advisory_lock({lock})"))
            slow.execute(text("SELECT nextval('hand_next_id_guard')"))  # odd
            last = state(slow)
            assert last == first - 2 * step
            callers = [threading.Thread(target=call, args=(who,)) for who in ("f", "g")]
            callers[0].start()  # fetches first - step (worker - 1): refused, waits for the lock
            await_state(watch, first - step)
            callers[1].start()  # fetches first (its own worker and tick): refused, guard odd
            await_state(watch, first)
            assert got == {}  # neither returned while the guard was odd
            slow.execute(text(f"SELECT setval('hand_next_id_state', {first - step}, true)"))
            slow.execute(text("SELECT nextval('hand_next_id_guard')"))  # even
            slow.execute(text(f"SELECT pg_advisory_unlock({lock})"))
            slow.commit()
            for caller in callers:
                caller.join(60)
        assert not errors, errors
        assert sorted(got.values()) == [first, first + step]
    finally:
        engine.dispose()
