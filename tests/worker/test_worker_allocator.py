"""TableWorkerAllocator in one process: claims, wrap-around, exhaustion, high-water marks,
transactions, start-up failures, reservations. Every test runs on PostgreSQL, MariaDB and a
SQLite file unless it says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, text

from snowflake_db import (
    AllocatorUnavailableError,
    InvalidArgumentError,
    Layout,
    MonotonicClock,
    SnowflakeGenerator,
    WorkerIdExhaustedError,
)
from snowflake_db.worker import TableLease, TableWorkerAllocator

from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import (
    LEASE_SECONDS,
    STILL_LIVE_LEASE_S,
    OffsetClock,
    allocator,
    database_now_ms,
    delete_registrations,
    expire_lease,
    read_slots,
    set_next_registration_id,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lease(gen: SnowflakeGenerator) -> TableLease:
    lease = gen.lease
    assert isinstance(lease, TableLease)
    return lease


def test_acquire_stores_a_committed_lease_and_ids_decode_to_it(any_db: ScratchDatabase) -> None:
    # A 30 s lease: no renewal may move the lease's mark between the row's read and the
    # comparison (with 2 s ones, a heartbeat did, under load from a fresh clone's make test).
    lease_seconds = 30
    with allocator(any_db, lease_seconds=lease_seconds) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        assert gen.worker_id is None  # lazy: nothing happens before the first ID
        ids = gen.next_ids(5000)
        lease = _lease(gen)
        assert len(set(ids)) == 5000 and ids == sorted(ids)
        assert {gen.layout.decode(i).worker_id for i in ids} == {lease.worker_id}
        # The key read back is real (never 0/None) and decides the preferred slot.
        assert lease.registration_id >= 1
        assert lease.worker_id == lease.registration_id & gen.layout.max_worker_id
        row = read_slots(any_db.url)[lease.worker_id]
        assert row.lease_token == lease.token and row.state == "live"
        assert row.high_water_ms == lease.high_water_ms
        assert max(gen.layout.decode(i).timestamp_ms for i in ids) <= row.high_water_ms
        # The lease expiry is judged by the database clock, one lease length ahead.
        assert row.expires_at_ms is not None
        assert 0 < row.expires_at_ms - row.db_now_ms <= lease_seconds * 1000
        gen.close()
        released = read_slots(any_db.url)[lease.worker_id]
        assert released.state == "free" and released.high_water_ms >= max(
            gen.layout.decode(i).timestamp_ms for i in ids
        )


def test_heartbeat_renews_and_extends_high_water(any_db: ScratchDatabase) -> None:
    with allocator(any_db, lease_seconds=1.2) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        gen.next_id()
        lease = _lease(gen)
        first = read_slots(any_db.url)[lease.worker_id]
        deadline = time.monotonic() + 15
        ids = []
        while time.monotonic() < deadline and len(ids) < 4:
            time.sleep(0.5)
            ids.append(gen.next_id())  # past the first lease length: only renewal allows this
        later = read_slots(any_db.url)[lease.worker_id]
        assert later.lease_token == first.lease_token
        assert later.renewed_at_ms is not None and first.renewed_at_ms is not None
        assert later.renewed_at_ms > first.renewed_at_ms
        assert later.high_water_ms > first.high_water_ms
        assert lease.valid_until > time.monotonic()
        assert not lease.lost


def test_wrap_around_and_repeated_keys_never_hand_out_a_live_slot(
    any_db: ScratchDatabase,
) -> None:
    layout = Layout()
    # Leases that stay live without renewals: with 2 s leases a renewal late on a loaded machine
    # (PostgreSQL 18 stage beside a lease benchmark) let the holder's slot expire, and the test
    # then no longer asked about a live slot.
    with allocator(any_db, lease_seconds=STILL_LIVE_LEASE_S) as alloc:
        holder = alloc.acquire(layout=layout, clock=MonotonicClock())
        assert holder.registration_id == 1 and holder.worker_id == 1
        # Auto-increment advanced past 1024: key 1025 masks to the live slot 1.
        set_next_registration_id(any_db, 1025)
        wrapped = alloc.acquire(layout=layout, clock=MonotonicClock())
        assert wrapped.registration_id == 1025
        assert wrapped.worker_id != holder.worker_id
        # A repeated key (MariaDB restart after deleted rows): key 1 again, slot 1 still live.
        delete_registrations(any_db)
        set_next_registration_id(any_db, 1)
        repeated = alloc.acquire(layout=layout, clock=MonotonicClock())
        assert repeated.registration_id == 1
        assert repeated.worker_id not in (holder.worker_id, wrapped.worker_id)
        rows = read_slots(any_db.url)
        for lease in (holder, wrapped, repeated):
            assert rows[lease.worker_id].lease_token == lease.token
            assert rows[lease.worker_id].state == "live"


def test_exhaustion_with_every_slot_live(any_db: ScratchDatabase) -> None:
    layout = Layout(worker_bits=2)
    with allocator(any_db, lease_seconds=STILL_LIVE_LEASE_S) as alloc:
        leases = [alloc.acquire(layout=layout, clock=MonotonicClock()) for _ in range(4)]
        assert sorted(lease.worker_id for lease in leases) == [0, 1, 2, 3]
        with pytest.raises(WorkerIdExhaustedError) as caught:
            alloc.acquire(layout=layout, clock=MonotonicClock())
        message = str(caught.value)
        assert "all 4 worker IDs" in message and "4 held by live leases" in message
        gen = SnowflakeGenerator(allocator=alloc, layout=layout)
        with pytest.raises(WorkerIdExhaustedError):
            gen.next_id()
        assert gen.worker_id is None
        # Releasing one makes exactly that one available again (monotonic clock: at once).
        leases[2].release()
        assert gen.ensure_worker() == leases[2].worker_id
        ids = gen.next_ids(100)
        assert all(layout.decode(i).timestamp_ms > leases[2].high_water_ms - 1 for i in ids)


@pytest.mark.slow
def test_full_1024_slot_exhaustion_on_postgresql(postgres_db: ScratchDatabase) -> None:
    layout = Layout()
    alloc = allocator(postgres_db, lease_seconds=120)
    try:
        clock = MonotonicClock()
        leases = [alloc.acquire(layout=layout, clock=clock) for _ in range(1024)]
        assert sorted(lease.worker_id for lease in leases) == list(range(1024))
        with pytest.raises(WorkerIdExhaustedError, match="all 1024 worker IDs"):
            alloc.acquire(layout=layout, clock=clock)
        rows = read_slots(postgres_db.url)
        assert len(rows) == 1024 and all(row.state == "live" for row in rows.values())
    finally:
        for lease in alloc._heartbeat.leases:
            lease.abandon()  # the database is dropped afterwards; skip 1024 releases
        alloc.close()


def test_restart_with_the_clock_set_back_never_reissues(any_db: ScratchDatabase) -> None:
    layout = Layout(worker_bits=1)  # two slots, one of them held while the other is reused
    # A clock a minute off is refused at acquisition by default (ClockSkewError, tested in
    # test_worker_clock_skew.py); allowed here, the high-water mark is what keeps IDs apart.
    with allocator(any_db, lease_seconds=1.0, max_clock_skew_ms=600_000) as alloc:
        holder = SnowflakeGenerator(allocator=alloc, layout=layout, clock=OffsetClock(-120_000))
        held = holder.ensure_worker()  # issues nothing: its mark drops back to 0 on release
        first = SnowflakeGenerator(allocator=alloc, layout=layout, clock=OffsetClock(0))
        old_ids = first.next_ids(20_000)
        used = _lease(first).worker_id
        assert used != held
        reserved = _lease(first).high_water_ms
        first.close()  # the mark is lowered to the last tick issued (any clock)
        stored = read_slots(any_db.url)[used]
        old_mark = max(layout.decode(i).timestamp_ms for i in old_ids)
        assert stored.state == "free" and stored.high_water_ms == old_mark <= reserved

        # Restarted with the clock a minute back: the slot is refused, never duplicated.
        behind = SnowflakeGenerator(allocator=alloc, layout=layout, clock=OffsetClock(-60_000))
        with pytest.raises(WorkerIdExhaustedError, match="high-water mark"):
            behind.next_id()
        # Once another slot is free (with a mark behind its clock), it takes that one instead.
        holder.close()
        other = SnowflakeGenerator(allocator=alloc, layout=layout, clock=OffsetClock(-60_000))
        assert other.ensure_worker() == held
        other.close()

    # Set back by less than the allowed wait: it waits and issues only above the old mark.
    with allocator(any_db, lease_seconds=1.0, max_floor_wait_ms=5000) as alloc:
        blocker = alloc.reserve_worker_id("busy", layout=layout, worker_id=held)
        again = SnowflakeGenerator(allocator=alloc, layout=layout, clock=OffsetClock(-700))
        new_ids = again.next_ids(20_000)
        assert _lease(again).worker_id == used != blocker
        assert _lease(again).floor_ms == old_mark
        assert min(layout.decode(i).timestamp_ms for i in new_ids) > old_mark
        assert not set(new_ids) & set(old_ids)


def test_acquire_in_a_callers_transaction_that_rolls_back(any_db: ScratchDatabase) -> None:
    app_engine = create_engine(any_db.url)
    try:
        with app_engine.connect() as connection:
            if any_db.backend != "sqlite":
                connection.execute(text("CREATE TABLE orders (id BIGINT PRIMARY KEY)"))
                connection.commit()
            transaction = connection.begin()
            if any_db.backend == "sqlite":
                connection.execute(text("SELECT 1"))  # a write here would lock the file
            else:
                connection.execute(text("INSERT INTO orders (id) VALUES (1)"))
            # The application hands its Engine over, inside its open transaction.
            alloc = TableWorkerAllocator(app_engine, lease_seconds=LEASE_SECONDS)
            gen = SnowflakeGenerator(allocator=alloc)
            worker_id = gen.ensure_worker()
            transaction.rollback()
        row = read_slots(any_db.url)[worker_id]
        assert row.state == "live" and row.lease_token == _lease(gen).token
        assert not _lease(gen).lost and gen.next_id() > 0
        alloc.close()
    finally:
        app_engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_database_down_at_start_is_a_clear_error(backend: str, tmp_path: object) -> None:
    url = {
        "postgresql": "postgresql+psycopg://snow:s3cret@127.0.0.1:1/control",
        "mariadb": "mysql+pymysql://snow:s3cret@127.0.0.1:1/control",
        "sqlite": f"sqlite:///{tmp_path}/missing-dir/control.db",
    }[backend]
    gen = SnowflakeGenerator(allocator=TableWorkerAllocator(url, lease_seconds=LEASE_SECONDS))
    with pytest.raises(AllocatorUnavailableError) as caught:
        gen.next_id()
    message = str(caught.value)
    assert "s3cret" not in message
    assert ("***" in message) == (backend != "sqlite")
    assert "no fallback worker ID" in message and "Error" in message
    assert gen.worker_id is None  # no fallback worker ID
    with pytest.raises(AllocatorUnavailableError):
        gen.next_id()  # still nothing, still an error


def test_invalid_configuration_is_rejected(sqlite_db: ScratchDatabase) -> None:
    with pytest.raises(InvalidArgumentError, match="not a plain identifier"):
        TableWorkerAllocator(sqlite_db.url_string, slots_table="slots; DROP TABLE x")
    with pytest.raises(InvalidArgumentError, match="in-memory"):
        TableWorkerAllocator("sqlite://")
    with pytest.raises(InvalidArgumentError, match="renew_every"):
        TableWorkerAllocator(sqlite_db.url_string, lease_seconds=1, renew_every=1)
    with pytest.raises(TypeError):
        TableWorkerAllocator(42)  # type: ignore[arg-type]


def test_custom_table_names_and_missing_tables(any_db: ScratchDatabase) -> None:
    names = {"slots_table": "sf_slots", "registrations_table": "sf_regs"}
    missing = allocator(any_db, create_tables=False, **names)
    with pytest.raises(AllocatorUnavailableError, match="do not exist") as refused:
        missing.acquire(layout=Layout(), clock=MonotonicClock())
    missing.close()
    # What a Django data migration that runs before the app's own migrations is told.
    assert "depend on ('snowflake_db', '0002_workerlayout')" in str(refused.value)
    with allocator(any_db, **names) as alloc:
        lease = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        assert [row.worker_id for row in alloc.workers()] == [lease.worker_id]
    with create_engine(any_db.url).connect() as connection:
        assert connection.execute(text("SELECT COUNT(*) FROM sf_slots")).scalar_one() == 1


def test_permanent_reservation(any_db: ScratchDatabase) -> None:
    layout = Layout(worker_bits=1)
    # A 30 s lease: the held slot must still be held at the next acquire (its expiry is set by
    # expire_lease where the test wants one). A 2 s lease lapsed between the two calls once,
    # beside a second suite at load 26, and the next acquire rightly took the slot.
    with allocator(any_db, lease_seconds=30) as alloc:
        reserved = alloc.reserve_worker_id("postgres id function", layout=layout)
        assert reserved == 1  # the highest free slot
        lease = alloc.acquire(layout=layout, clock=MonotonicClock())
        assert lease.worker_id == 0
        lease.abandon()  # stops renewing: expires, unlike the reservation
        expire_lease(any_db.url, lease.worker_id)
        assert alloc.reap() == [0]
        row = read_slots(any_db.url)[1]
        assert row.state == "reserved" and row.label == "postgres id function"
        held = alloc.acquire(layout=layout, clock=MonotonicClock())
        assert held.worker_id == 0
        with pytest.raises(WorkerIdExhaustedError, match="1 reserved permanently"):
            alloc.acquire(layout=layout, clock=MonotonicClock())
        with pytest.raises(InvalidArgumentError, match="not permanently reserved"):
            alloc.release_reserved(0)
        before = database_now_ms(any_db.url)
        alloc.release_reserved(1, label="postgres id function")
        row = read_slots(any_db.url)[1]
        assert row.state == "free" and row.high_water_ms >= before + 1000


def test_released_reservation_keeps_a_mark_from_another_clock(any_db: ScratchDatabase) -> None:
    """A function that ran on another database's clock (ahead of this one) hands its last time
    over: the next holder of the slot starts above it, not just above this database's clock."""
    layout = Layout(worker_bits=2)
    with allocator(any_db) as alloc:
        reserved = alloc.reserve_worker_id("function elsewhere", layout=layout, worker_id=2)
        assert reserved == 2
        ahead = database_now_ms(any_db.url) + 600_000
        alloc.release_reserved(2, label="function elsewhere", issued_until_ms=ahead)
        assert read_slots(any_db.url)[2].high_water_ms == ahead
        with pytest.raises(InvalidArgumentError, match="issued_until_ms"):
            alloc.release_reserved(2, issued_until_ms=-1)
        with pytest.raises(WorkerIdExhaustedError, match=r"worker ID 2 .*cannot be reserved"):
            alloc.reserve_worker_id("again", layout=layout, worker_id=2)  # mark ahead of the db


def _run_with_worker_url(script: str, db: ScratchDatabase) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter configured only by ``SNOWFLAKE_WORKER_URL``."""
    env = dict(os.environ, SNOWFLAKE_WORKER_URL=db.url_string, PYTHONPATH=REPO)
    env.pop("SNOWFLAKE_WORKER_ID", None)
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_import_without_sqlalchemy_names_the_extra(sqlite_db: ScratchDatabase) -> None:
    script = (
        "import sys\n"
        "sys.modules['sqlalchemy'] = None\n"  # makes `import sqlalchemy` fail
        "import snowflake_db\n"
        "assert 'sqlalchemy' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "print(snowflake_db.configure(worker_id=3).next_id() > 0)\n"
        "try:\n"
        "    snowflake_db.reset()\n"
        "    snowflake_db.snowflake_default()\n"
        "except ImportError as error:\n"
        "    print('ERROR', error)\n"
    )
    result = _run_with_worker_url(script, sqlite_db)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "True"
    assert "pip install 'snowflake-db[sqlalchemy]'" in result.stdout


def test_worker_url_environment_variable(sqlite_db: ScratchDatabase) -> None:
    script = (
        "import snowflake_db\n"
        "first = snowflake_db.snowflake_default()\n"
        "gen = snowflake_db.get_generator()\n"
        "print(type(gen.lease).__name__, gen.worker_id, gen.layout.decode(first).worker_id)\n"
    )
    result = _run_with_worker_url(script, sqlite_db)
    assert result.returncode == 0, result.stderr
    kind, worker, decoded = result.stdout.split()
    assert kind == "TableLease" and worker == decoded
    # The exit hook released the slot.
    assert read_slots(sqlite_db.url)[int(worker)].state == "free"


def test_a_lost_lease_is_replaced_and_ids_keep_increasing(any_db: ScratchDatabase) -> None:
    with allocator(any_db, lease_seconds=1.2) as alloc:
        gen = SnowflakeGenerator(allocator=alloc)
        before = gen.next_ids(1000)
        lease = _lease(gen)
        # Someone else takes the slot (as a reaper would after an expiry, then a new holder).
        engine = create_engine(any_db.url)
        try:
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "UPDATE snowflake_worker_slots SET lease_token = 'someone-else' "
                        "WHERE worker_id = :w"
                    ),
                    {"w": lease.worker_id},
                )
        finally:
            engine.dispose()
        deadline = time.monotonic() + 10
        while not lease.lost:  # the next renewal finds the token changed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "taken by another holder" in lease.describe_problem()
        after = gen.next_ids(1000)
        assert gen.lease is not lease and gen.worker_id != lease.worker_id
        assert after[0] > before[-1] and len(set(before + after)) == 2000
        # The lost lease is never released: the other holder's row is untouched.
        lease.release()
        assert read_slots(any_db.url)[lease.worker_id].lease_token == "someone-else"
