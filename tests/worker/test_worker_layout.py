"""The worker tables record the layout they serve: another layout is refused, the same one is
accepted, tables from before the record adopt the first layout that uses them, and processes
racing to be first leave exactly one layout recorded. PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
import traceback
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, func, select

from snowflake_db import (
    DEFAULT_EPOCH_MS,
    AllocatorUnavailableError,
    Layout,
    LayoutMismatchError,
    MonotonicClock,
    SnowflakeGenerator,
    WorkerLeaseError,
)
from snowflake_db.layout import LAYOUT_FIELDS
from snowflake_db.worker import TableWorkerAllocator, worker_tables
from snowflake_db.worker._layout_record import ensure_layout, layout_text
from snowflake_db.worker._schema import layout_table_name
from snowflake_db.worker._store import WorkerStore

from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import allocator, read_slots

FORK = multiprocessing.get_context("fork")
#: The issue's example: slot 4 of the first and slot 2 of the second share their top bits.
FIRST = Layout(time_bits=41, worker_bits=10, sequence_bits=12)
SECOND = Layout(time_bits=41, worker_bits=9, sequence_bits=13)


def _table_counts(db: ScratchDatabase, prefix: str = "snowflake_worker") -> dict[str, int]:
    tables = worker_tables(
        MetaData(), slots_table=f"{prefix}_slots", registrations_table=f"{prefix}_registrations"
    )
    engine = create_engine(db.url)
    try:
        with engine.connect() as connection:
            count = select(func.count())
            return {
                table.name: int(connection.execute(count.select_from(table)).scalar_one())
                for table in tables
            }
    finally:
        engine.dispose()


def _recorded(db: ScratchDatabase, prefix: str = "snowflake_worker") -> dict[str, Any] | None:
    table = worker_tables(
        MetaData(), slots_table=f"{prefix}_slots", registrations_table=f"{prefix}_registrations"
    ).layout
    engine = create_engine(db.url)
    try:
        with engine.connect() as connection:
            text = connection.execute(select(table.c.layout)).scalar_one_or_none()
    finally:
        engine.dispose()
    return None if text is None else dict(json.loads(text))


def test_another_layout_is_refused_naming_both_and_the_fix(any_db: ScratchDatabase) -> None:
    with allocator(any_db) as alloc:
        held = alloc.acquire(layout=FIRST, clock=MonotonicClock())
        assert _recorded(any_db) == FIRST.as_kwargs()
        before = _table_counts(any_db)
        with pytest.raises(LayoutMismatchError) as refused:
            alloc.acquire(layout=SECOND, clock=MonotonicClock())
        message = str(refused.value)
        assert "worker_bits=10 sequence_bits=12" in message  # the recorded layout
        assert "worker_bits=9 sequence_bits=13" in message  # this process's
        assert "worker_bits 10 vs 9, sequence_bits 12 vs 13" in message
        assert "slots_table=" in message and "same layout" in message
        assert "snowflake_worker_slots at " in message
        assert refused.value.recorded == FIRST.as_kwargs()
        assert refused.value.given == SECOND.as_kwargs()
        # Nothing was written: no registration, no slot, and the held lease is untouched.
        assert _table_counts(any_db) == before
        assert read_slots(any_db.url)[held.worker_id].lease_token == held.token

    # A generator on another layout fails at its first ID, with the same error.
    with allocator(any_db) as alloc:
        generator = SnowflakeGenerator(allocator=alloc, layout=SECOND)
        with pytest.raises(LayoutMismatchError):
            generator.next_id()


def test_the_same_layout_is_accepted_by_every_later_process(any_db: ScratchDatabase) -> None:
    with allocator(any_db) as first, allocator(any_db) as second:
        a = SnowflakeGenerator(allocator=first, layout=SECOND).ensure_worker()
        equal = Layout(**SECOND.as_kwargs())
        b = SnowflakeGenerator(allocator=second, layout=equal).ensure_worker()
        assert a != b
        assert first.recorded_layout() is not None
        recorded = second.recorded_layout()
        assert recorded is not None and recorded.layout == SECOND
        assert recorded.pid == os.getpid() and recorded.hostname == first.hostname
    assert _table_counts(any_db)["snowflake_worker_layout"] == 1


def test_every_layout_field_is_part_of_the_record(sqlite_db: ScratchDatabase) -> None:
    base = Layout(time_bits=40, worker_bits=10, sequence_bits=12)  # a bit to spare for shard_bits
    changed = {
        "time_bits": 39,
        "worker_bits": 9,
        "sequence_bits": 11,
        "shard_bits": 1,
        "datacenter_bits": 2,
        "epoch_ms": DEFAULT_EPOCH_MS + 1000,
        "tick_ms": 2,
    }
    assert set(changed) == set(LAYOUT_FIELDS)  # a new Layout field must be covered here too
    with allocator(sqlite_db) as alloc:
        alloc.acquire(layout=base, clock=MonotonicClock())
        for name, value in changed.items():
            other = Layout(**{**base.as_kwargs(), name: value})
            with pytest.raises(LayoutMismatchError, match=f"differs in {name} "):
                alloc.acquire(layout=other, clock=MonotonicClock())


def test_reservations_respect_the_record(any_db: ScratchDatabase) -> None:
    with allocator(any_db) as alloc:
        # On empty tables a reservation records its layout like a lease does.
        reserved = alloc.reserve_worker_id("server function", layout=SECOND)
        assert _recorded(any_db) == SECOND.as_kwargs()
        with pytest.raises(LayoutMismatchError, match="worker_bits 9 vs 10"):
            alloc.reserve_worker_id("other function", layout=FIRST)
        rows = read_slots(any_db.url)
        assert [row.worker_id for row in rows.values() if row.reserved] == [reserved]
        with pytest.raises(LayoutMismatchError):
            alloc.acquire(layout=FIRST, clock=MonotonicClock())


def _legacy_tables(db: ScratchDatabase) -> None:
    """Worker tables as installs from before the layout record have them, with a used slot."""
    tables = worker_tables(MetaData())
    engine = create_engine(db.url)
    try:
        with engine.begin() as connection:
            tables.slots.create(connection)
            tables.registrations.create(connection)
            connection.execute(
                tables.slots.insert().values(worker_id=3, high_water_ms=1_000, hostname="old")
            )
    finally:
        engine.dispose()


def test_tables_without_the_record_adopt_the_first_layout(any_db: ScratchDatabase) -> None:
    _legacy_tables(any_db)
    # Without create_tables the missing layout table is reported, naming the migration.
    with allocator(any_db, create_tables=False) as alloc, pytest.raises(
        AllocatorUnavailableError, match=r"snowflake_worker_layout .*migration"
    ):
        alloc.acquire(layout=SECOND, clock=MonotonicClock())
    # With it (the default), the table is added and the first layout is recorded.
    with allocator(any_db) as alloc:
        lease = alloc.acquire(layout=SECOND, clock=MonotonicClock())
        assert _recorded(any_db) == SECOND.as_kwargs()
        with pytest.raises(LayoutMismatchError):
            alloc.acquire(layout=FIRST, clock=MonotonicClock())
        lease.release()
    assert read_slots(any_db.url)[3].high_water_ms == 1_000  # the old rows are kept as they were


def test_an_empty_layout_table_after_a_migration_adopts_the_first_layout(
    any_db: ScratchDatabase,
) -> None:
    _legacy_tables(any_db)
    engine = create_engine(any_db.url)
    try:
        with engine.begin() as connection:
            worker_tables(MetaData()).layout.create(connection)  # what the migrations add
    finally:
        engine.dispose()
    with allocator(any_db, create_tables=False) as alloc:
        assert alloc.recorded_layout() is None
        alloc.acquire(layout=FIRST, clock=MonotonicClock())
        recorded = alloc.recorded_layout()
        assert recorded is not None and recorded.layout == FIRST
        with pytest.raises(LayoutMismatchError):
            alloc.acquire(layout=SECOND, clock=MonotonicClock())


def test_own_tables_keep_two_layouts_apart(any_db: ScratchDatabase) -> None:
    """The fix the error names: the second service gets its own tables and layout record."""
    with allocator(any_db) as first, allocator(
        any_db, slots_table="billing_slots", registrations_table="billing_registrations"
    ) as second:
        first.acquire(layout=FIRST, clock=MonotonicClock())
        second.acquire(layout=SECOND, clock=MonotonicClock())
        assert _recorded(any_db) == FIRST.as_kwargs()
        assert _recorded(any_db, "billing") == SECOND.as_kwargs()
    assert layout_table_name("billing_slots") == "billing_layout"
    assert layout_table_name("slots") == "slots_layout"


def test_a_damaged_or_newer_record_is_refused(sqlite_db: ScratchDatabase) -> None:
    with allocator(sqlite_db) as alloc:
        alloc.acquire(layout=FIRST, clock=MonotonicClock())
        table = alloc.store.tables.layout
        for text, expected in (
            ('{"time_bits": 41, "wormhole_bits": 3}', "wormhole_bits.*newer version"),
            ("not json", "not a valid layout"),
            ('{"time_bits": 70}', "not a valid layout"),
        ):
            with alloc._engine.begin() as connection:
                connection.execute(table.update().values(layout=text))
            with pytest.raises(WorkerLeaseError, match=expected):
                alloc.acquire(layout=FIRST, clock=MonotonicClock())


# -- two layouts racing to be first ----------------------------------------------------------


def test_a_loser_blocked_on_the_winners_row_reads_it_and_is_refused(
    any_db: ScratchDatabase,
) -> None:
    """The INSERT conflict path, made deterministic: the first writer's row is uncommitted while
    the second process reads no row and tries its own INSERT."""
    with allocator(any_db) as alloc_a, allocator(any_db) as alloc_b:
        alloc_a.create_tables()
        store = WorkerStore()
        outcome: list[BaseException | None] = []

        def second() -> None:
            try:
                with alloc_b._engine.connect() as connection, connection.begin():
                    ensure_layout(
                        connection, store, SECOND, hostname="b", pid=2, where="the tables"
                    )
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        with alloc_a._engine.connect() as connection:
            with connection.begin():
                text = layout_text(FIRST)
                assert store.record_layout(connection, layout=text, hostname="a", pid=1)
                thread = threading.Thread(target=second)
                thread.start()
                time.sleep(0.5)
                assert thread.is_alive()  # blocked: on the primary key (or SQLite's write lock)
            thread.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], LayoutMismatchError), outcome
        assert _recorded(any_db) == FIRST.as_kwargs()


def _race(url: str, layout_kwargs: dict[str, int], prefix: str, create: bool, sync: Any) -> None:
    barrier, results, finish = sync
    try:
        alloc = TableWorkerAllocator(
            url,
            lease_seconds=30,
            slots_table=f"{prefix}_slots",
            registrations_table=f"{prefix}_registrations",
            create_tables=create,
        )
        layout = Layout(**layout_kwargs)
        barrier.wait(timeout=120)
        try:
            lease = alloc.acquire(layout=layout, clock=MonotonicClock())
        except LayoutMismatchError as error:
            results.put((layout.worker_bits, None, f"mismatch {error.recorded}"))
        else:
            results.put((layout.worker_bits, lease.worker_id, None))
    except BaseException:
        results.put((None, None, traceback.format_exc()))
    finish.wait(timeout=180)


@pytest.mark.parametrize("tables", ["missing", "empty"])
def test_processes_racing_with_two_layouts_record_exactly_one(
    any_db: ScratchDatabase, tables: str
) -> None:
    per_layout, rounds = 4, 3
    winners = set()
    for round_number in range(rounds):
        prefix = f"race{round_number}"
        if tables == "empty":
            with TableWorkerAllocator(
                any_db.url_string,
                slots_table=f"{prefix}_slots",
                registrations_table=f"{prefix}_registrations",
            ) as setup:
                setup.create_tables()
        count = 2 * per_layout
        barrier, results, finish = FORK.Barrier(count), FORK.Queue(), FORK.Event()
        layouts = [FIRST, SECOND] * per_layout
        children = [
            FORK.Process(
                target=_race,
                args=(any_db.url_string, layout.as_kwargs(), prefix, tables == "missing",
                      (barrier, results, finish)),
            )
            for layout in layouts
        ]
        for child in children:
            child.start()
        try:
            got = [results.get(timeout=180) for _ in range(count)]
        finally:
            finish.set()
            for child in children:
                child.join(60)
        crashes = [error for bits, _, error in got if bits is None]
        assert not crashes, crashes[0]
        leased = {bits for bits, worker_id, _ in got if worker_id is not None}
        refused = {bits for bits, worker_id, _ in got if worker_id is None}
        assert len(leased) == 1 and len(refused) == 1 and leased != refused, got
        (winner,) = leased
        winners.add(winner)
        winning = FIRST if winner == FIRST.worker_bits else SECOND
        assert _recorded(any_db, prefix) == winning.as_kwargs()
        worker_ids = [worker_id for _, worker_id, _ in got if worker_id is not None]
        assert len(worker_ids) == per_layout == len(set(worker_ids))
        counts = _table_counts(any_db, prefix)
        # The refused processes wrote nothing: one registration and one slot per winner.
        assert counts == {
            f"{prefix}_slots": per_layout,
            f"{prefix}_registrations": per_layout,
            f"{prefix}_layout": 1,
        }
    assert winners  # (which layout wins each round is up to the scheduler)
