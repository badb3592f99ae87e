"""Database key functions on PostgreSQL and MariaDB: raw SQL inserts get keys of the
application's layout from a permanently reserved worker slot; faults give clear errors and
never a duplicate."""

from __future__ import annotations

import threading
from array import array
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from snowflake_db import Layout
from snowflake_db.clock import wall_clock
from snowflake_db.errors import (
    InvalidArgumentError,
    LayoutMismatchError,
    WorkerIdExhaustedError,
)
from snowflake_db.key_functions import (
    drop_key_function,
    drop_key_trigger,
    install_key_function,
    install_key_trigger,
    key_default_sql,
)
from snowflake_db.worker import TableLease, TableWorkerAllocator

from ..plugins.databases import ScratchDatabase, drop_database, throwaway_server
from .support import (
    install,
    keyed_table,
    last_id,
    series_sql,
    set_last_id,
    slots,
    worker_tables_in,
)

LAYOUT = Layout()
#: 4 IDs per tick: the function runs out of sequence values constantly and must wait.
TINY = Layout(time_bits=41, worker_bits=10, sequence_bits=2)
BACKENDS = ["postgresql", "mariadb"]


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, database_factory: Any) -> ScratchDatabase:
    database: ScratchDatabase = database_factory(request.param)
    return database


def test_raw_inserts_get_keys_and_given_keys_are_kept(db: ScratchDatabase) -> None:
    engine = create_engine(db.url)
    try:
        worker_tables_in(engine)
        worker_id = install(engine)
        keyed_table(engine)
        (slot,) = slots(engine)
        assert slot["worker_id"] == worker_id == LAYOUT.max_worker_id
        assert slot["expires_at_ms"] is None and slot["lease_token"]
        backend = "postgresql" if engine.dialect.name == "postgresql" else "mariadb"
        with engine.connect() as conn:  # the server's identity: system identifier, server_uid
            server = conn.scalar(text(
                "SELECT system_identifier::text FROM pg_control_system()"
                if backend == "postgresql" else "SELECT @@server_uid"))
        assert slot["label"] == f"{backend}-function:{db.url.database}@{server}:" + (
            "public.snowflake_next_id" if backend == "postgresql"
            else f"{db.url.database}.snowflake_next_id"
        )
        given = LAYOUT.encode(timestamp_ms=LAYOUT.epoch_ms + 5, worker_id=3, sequence=0)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO events (who) VALUES ('one')"))
            conn.execute(text("INSERT INTO events (who) VALUES ('multi'), ('multi'), ('multi')"))
            conn.execute(text(f"INSERT INTO events (who) {series_sql(engine, 2000)}"))
            conn.execute(text("INSERT INTO events (id, who) VALUES (:i, 'given')"), {"i": given})
            if backend == "mariadb":  # the trigger also fills an explicit NULL or 0
                conn.execute(
                    text("INSERT INTO events (id, who) VALUES (NULL, 'null'), (0, 'zero')")
                )
            rows = conn.execute(text("SELECT id, who FROM events")).all()
        assert len(rows) == 2005 + (2 if backend == "mariadb" else 0)
        made = [r.id for r in rows if r.who != "given"]
        assert len(set(made)) == len(made)
        assert {LAYOUT.decode(i).worker_id for i in made} == {worker_id}
        assert [r.id for r in rows if r.who == "given"] == [given]
    finally:
        engine.dispose()


def test_mariadb_refuses_a_function_in_default(mariadb_db: ScratchDatabase) -> None:
    engine = create_engine(mariadb_db.url)
    try:
        worker_tables_in(engine)
        install(engine)
        with engine.begin() as conn, pytest.raises(DBAPIError, match="1901"):
            conn.execute(
                text("CREATE TABLE d (id BIGINT PRIMARY KEY DEFAULT snowflake_next_id())")
            )
        with pytest.raises(InvalidArgumentError, match="BEFORE INSERT trigger"):
            key_default_sql("mariadb")
        assert key_default_sql("postgresql", schema="app") == "app.snowflake_next_id()"
        with pytest.raises(InvalidArgumentError, match="'sqlite'"):
            key_default_sql("sqlite")
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (id BIGINT NOT NULL PRIMARY KEY, x INT)"))
            install_key_trigger(conn, "t", zero_default=False)
        with engine.begin() as conn:  # VALUES without the key: the trigger fills it
            conn.execute(text("INSERT INTO t (x) VALUES (1), (2)"))
        # strict mode checks a missing default before the trigger runs for INSERT ... SELECT:
        # hence DEFAULT 0 (zero_default, the default)
        with engine.begin() as conn, pytest.raises(DBAPIError, match="1364"):
            conn.execute(text("INSERT INTO t (x) SELECT seq FROM seq_1_to_3"))
        with engine.begin() as conn:
            drop_key_trigger(conn, "t", zero_default=False)
            install_key_trigger(conn, "t")
            conn.execute(text("INSERT INTO t (x) SELECT seq FROM seq_1_to_3"))
            assert conn.scalar(text("SELECT COUNT(DISTINCT id) FROM t WHERE id > 0")) == 5
    finally:
        engine.dispose()


def test_clock_behind_the_last_id_is_refused(db: ScratchDatabase) -> None:
    engine = create_engine(db.url)
    try:
        worker_tables_in(engine)
        worker_id = install(engine)
        keyed_table(engine)
        with engine.connect() as conn:
            first = conn.scalar(text("SELECT snowflake_next_id()"))
        now_ms = LAYOUT.decode(first).timestamp_ms
        # within the tolerance the function goes on from its last ID, as the generator does
        near = LAYOUT.encode(timestamp_ms=now_ms + 1_500, worker_id=worker_id, sequence=7)
        set_last_id(engine, near)
        with engine.connect() as conn:
            after = conn.scalar(text("SELECT snowflake_next_id()"))
        assert after == near + 1
        ahead = LAYOUT.encode(timestamp_ms=now_ms + 10_000, worker_id=worker_id, sequence=7)
        set_last_id(engine, ahead)  # as if the clock had jumped back by 10 s
        refused = r"clock moved backwards by \d+ ms, more than the tolerated 2000"
        with engine.connect() as first, engine.connect() as second:
            for conn in (first, second, first):  # the error released the function's lock
                with pytest.raises(DBAPIError, match=refused):
                    conn.execute(text("INSERT INTO events (who) VALUES ('x')"))
                conn.rollback()
        state = last_id(engine, worker_id)
        if db.backend == "postgresql":  # its state moved only past values refused, 2 a call
            assert state is not None and ahead < state <= ahead + 6
        else:
            assert state == ahead  # MariaDB: nothing issued, state untouched
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM events")) == 0
    finally:
        engine.dispose()


def test_exhausted_ticks_wait_under_8_sessions(db: ScratchDatabase) -> None:
    engine = create_engine(db.url, pool_size=8)
    tables = {"slots_table": "tiny_slots", "registrations_table": "tiny_registrations"}
    try:
        worker_tables_in(engine, **tables)
        worker_id = install(engine, name="tiny_next_id", layout=TINY, **tables)
        keyed_table(engine, function="tiny_next_id")
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []
        series = series_sql(engine, 20)

        def writer() -> None:
            try:
                with engine.connect() as conn:
                    barrier.wait()
                    with conn.begin():  # one long transaction each
                        for _ in range(5):
                            conn.execute(text(f"INSERT INTO events (who) {series}"))
                        for _ in range(50):
                            conn.execute(text("INSERT INTO events (who) VALUES ('s')"))
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=writer) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        with engine.connect() as conn:
            ids = array("q", conn.scalars(text("SELECT id FROM events")))
        assert len(ids) == 1200 and len(set(ids)) == 1200
        decoded = [TINY.decode(i) for i in ids]
        assert {d.worker_id for d in decoded} == {worker_id}
        per_tick: dict[int, int] = {}
        for d in decoded:
            per_tick[d.timestamp_ms] = per_tick.get(d.timestamp_ms, 0) + 1
        assert max(per_tick.values()) == TINY.max_sequence + 1  # ticks were used up, not wrapped
    finally:
        engine.dispose()


def test_a_layout_the_worker_tables_do_not_record_is_refused(db: ScratchDatabase) -> None:
    engine = create_engine(db.url)
    try:
        worker_tables_in(engine)
        install(engine)  # records the default layout
        with pytest.raises(LayoutMismatchError, match="worker_bits"):
            install(engine, name="tiny_next_id", layout=TINY)
        with pytest.raises(LayoutMismatchError):  # a re-run under the same label too
            install(engine, layout=TINY)
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                count = conn.scalar(
                    text("SELECT count(*) FROM pg_proc WHERE proname = 'tiny_next_id'")
                )
            else:
                count = conn.scalar(
                    text(
                        "SELECT COUNT(*) FROM information_schema.routines "
                        "WHERE routine_schema = DATABASE() AND routine_name = 'tiny_next_id'"
                    )
                )
        assert count == 0
        assert len(slots(engine)) == 1
    finally:
        engine.dispose()


def test_the_reserved_slot_is_never_leased(db: ScratchDatabase) -> None:
    small = Layout(time_bits=41, worker_bits=2, sequence_bits=20)  # 4 worker slots
    engine = create_engine(db.url)
    allocators: list[TableWorkerAllocator] = []
    leases: list[TableLease] = []
    full = {"slots_table": "full_slots", "registrations_table": "full_registrations"}
    try:
        worker_tables_in(engine)
        worker_tables_in(engine, **full)
        for tables in ({}, full, full, full):
            allocators.append(TableWorkerAllocator(db.url_string, **tables))
            leases.append(allocators[-1].acquire(layout=small, clock=wall_clock))
        worker_id = install(engine, layout=small, label="fn")
        # the application cannot lease the function's slot, even when it needs one
        for _ in range(2):
            allocators.append(TableWorkerAllocator(db.url_string))
            leases.append(allocators[-1].acquire(layout=small, clock=wall_clock))
        extra = TableWorkerAllocator(db.url_string)
        allocators.append(extra)
        with pytest.raises(WorkerIdExhaustedError):
            extra.acquire(layout=small, clock=wall_clock)
        (reserved,) = [s for s in slots(engine) if s["label"] == "fn"]
        assert reserved["worker_id"] == worker_id and reserved["expires_at_ms"] is None
        leased = {lease.worker_id for lease in leases[:1] + leases[4:6]}
        assert worker_id not in leased and len(leased) == 3
        # every slot leased: no function, a clear error naming the table
        allocators.append(TableWorkerAllocator(db.url_string, **full))
        leases.append(allocators[-1].acquire(layout=small, clock=wall_clock))
        with pytest.raises(WorkerIdExhaustedError, match="full_slots"):
            install(engine, name="full_next_id", layout=small, **full)
    finally:
        for lease in leases:
            lease.release()
        for allocator in allocators:
            allocator.close()
        engine.dispose()


def test_the_insert_path_never_needs_the_control_database(
    db: ScratchDatabase, database_factory: Any
) -> None:
    control_db: ScratchDatabase = database_factory(db.backend)
    control = create_engine(control_db.url)
    engine = create_engine(db.url)
    try:
        worker_tables_in(control)
        worker_id = install(engine, control_url=control_db.url_string)
        keyed_table(engine)
        control.dispose()
        drop_database(control_db)  # the worker tables and their database are gone
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO events (who) {series_sql(engine, 300)}"))
            ids = list(conn.scalars(text("SELECT id FROM events")))
        assert len(set(ids)) == 300
        assert {LAYOUT.decode(i).worker_id for i in ids} == {worker_id}
        # only dropping the function needs it again (to free the slot)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE events"))
        with engine.begin() as conn, pytest.raises(Exception, match=control_db.name):
            drop_key_function(conn, control_url=control_db.url_string)
    finally:
        control.dispose()
        engine.dispose()


def test_shard_servers_each_get_their_own_slot(database_factory: Any) -> None:
    """Two PostgreSQL and two MariaDB shard databases, one control database: four functions,
    four reserved slots, keys that never collide."""
    control_db: ScratchDatabase = database_factory("postgresql")
    shards = [database_factory(b) for b in ("postgresql", "postgresql", "mariadb", "mariadb")]
    control = create_engine(control_db.url)
    engines = [create_engine(shard.url) for shard in shards]
    try:
        worker_tables_in(control)
        workers = [install(engine, control_url=control_db.url_string) for engine in engines]
        assert len(set(workers)) == 4
        # a second install on the same shard finds its reservation by label: still 4 slots
        with engines[2].begin() as conn:
            conn.execute(text("DROP FUNCTION snowflake_next_id"))
        assert install(engines[2], control_url=control_db.url_string) == workers[2]
        labels = {s["label"]: s["worker_id"] for s in slots(control) if s["lease_token"]}
        assert sorted(labels.values()) == sorted(workers)
        assert {label.split(":")[0] for label in labels} == {
            "postgresql-function", "mariadb-function"
        }
        ids = array("q")
        for engine, worker_id in zip(engines, workers, strict=True):
            keyed_table(engine)
            with engine.begin() as conn:
                conn.execute(text(f"INSERT INTO events (who) {series_sql(engine, 500)}"))
                made = list(conn.scalars(text("SELECT id FROM events")))
            assert {LAYOUT.decode(i).worker_id for i in made} == {worker_id}
            ids.extend(made)
        assert len(set(ids)) == len(ids) == 2000
    finally:
        control.dispose()
        for engine in engines:
            engine.dispose()


def test_mariadb_writers_never_wait_for_each_other_through_the_function(
    mariadb_db: ScratchDatabase,
) -> None:
    """A statement waiting for a row lock (a foreign-key check on a parent row that another
    open transaction updated) holds nothing the function needs: that transaction inserts
    through the trigger at once and commits, then the waiting statement goes on. (With the
    state in an Aria table, locked for each whole statement, the two waited on each other until
    ``innodb_lock_wait_timeout`` failed the first.)"""
    engine = create_engine(mariadb_db.url, pool_size=2)
    try:
        worker_tables_in(engine)
        install(engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE p (id BIGINT NOT NULL PRIMARY KEY, n INT)"))
            conn.execute(
                text(
                    "CREATE TABLE ch (id BIGINT NOT NULL PRIMARY KEY, p_id BIGINT NOT NULL, "
                    "FOREIGN KEY (p_id) REFERENCES p (id))"
                )
            )
            install_key_trigger(conn, "ch")
            conn.execute(text("INSERT INTO p VALUES (1, 0)"))
        outcome: list[str] = []
        with engine.connect() as holder:
            holder.execute(text("SET SESSION innodb_lock_wait_timeout = 20"))
            holder.commit()
            holder.begin()
            holder.execute(text("UPDATE p SET n = n + 1 WHERE id = 1"))

            child_id: list[int] = []

            def child() -> None:
                with engine.connect() as conn:
                    conn.execute(text("SET SESSION innodb_lock_wait_timeout = 20"))
                    child_id.append(int(conn.scalar(text("SELECT CONNECTION_ID()"))))
                    conn.commit()
                    try:
                        with conn.begin():
                            conn.execute(text("INSERT INTO ch (p_id) VALUES (1)"))
                        outcome.append("inserted")
                    except DBAPIError as error:
                        outcome.append(str(error.orig))

            thread = threading.Thread(target=child)
            thread.start()
            # until the child's INSERT runs (bounded: it times out after 20 s); it then waits
            # for the parent row the holder updated
            while thread.is_alive() and not _running_insert(engine, child_id):
                pass
            holder.execute(text("INSERT INTO ch (p_id) VALUES (1)"))
            holder.commit()
            thread.join(30)
        assert outcome == ["inserted"]
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT COUNT(DISTINCT id) FROM ch")) == 2
    finally:
        engine.dispose()


def _running_insert(engine: Any, connection_ids: list[int]) -> bool:
    if not connection_ids:
        return False
    with engine.connect() as conn:
        return bool(
            conn.scalar(
                text(
                    "SELECT COUNT(*) FROM information_schema.processlist "
                    "WHERE id = :id AND info LIKE 'INSERT INTO ch%'"
                ),
                {"id": connection_ids[0]},
            )
        )


def test_a_copy_of_a_database_is_given_its_own_slot_before_it_takes_writes(
    database_factory: Any,
) -> None:
    """A copy (here ``CREATE DATABASE ... TEMPLATE``; a restored dump or a promoted replica
    alike) carries the function with the original's worker ID baked in: both would issue the
    same keys. The documented repair gives the copy a slot of its own and keeps the original's."""
    control_db: ScratchDatabase = database_factory("postgresql")
    original_db: ScratchDatabase = database_factory("postgresql")
    copy_db: ScratchDatabase = database_factory("postgresql")
    control = create_engine(control_db.url)
    original = create_engine(original_db.url)
    admin = create_engine(control_db.url, isolation_level="AUTOCOMMIT")
    try:
        worker_tables_in(control)
        worker_id = install(original, control_url=control_db.url_string)
        keyed_table(original)
        original.dispose()  # a template has no other session
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{copy_db.name}"'))
            conn.execute(text(f'CREATE DATABASE "{copy_db.name}" TEMPLATE "{original_db.name}"'))
        copy = copy_db.engine()

        def worker_of_a_new_row(engine: Any) -> int:
            with engine.begin() as conn:
                key = conn.scalar(text("INSERT INTO events (who) VALUES ('x') RETURNING id"))
            return LAYOUT.decode(key).worker_id

        assert worker_of_a_new_row(copy) == worker_id  # the hazard: the original's worker ID

        with copy.begin() as conn:  # the repair, before the copy takes writes of its own
            conn.execute(text("ALTER TABLE events ALTER COLUMN id DROP DEFAULT"))
            assert drop_key_function(conn, control_url=control_db.url_string,
                                     release_worker=False) is None
            own = install_key_function(conn, control_url=control_db.url_string)  # its own label
            conn.execute(text(f"ALTER TABLE events ALTER COLUMN id SET DEFAULT "
                              f"{key_default_sql('postgresql')}"))
        assert own != worker_id
        assert worker_of_a_new_row(copy) == own
        assert worker_of_a_new_row(original) == worker_id
        reserved = {s["worker_id"] for s in slots(control) if s["lease_token"]}
        assert reserved == {worker_id, own}  # the original's slot stayed reserved
    finally:
        admin.dispose()
        original.dispose()
        control.dispose()


def _another_server(backend: str) -> Any:
    """A throwaway server of ``backend``, started (its ``close()`` stops and removes it)."""
    server = throwaway_server(backend)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


@pytest.mark.parametrize("backend", BACKENDS)
def test_databases_of_one_name_on_two_servers_get_slots_of_their_own(
    backend: str, database_factory: Any
) -> None:
    """Shard servers often each hold a database of the same name ("shop"). The default label
    names the server too: a second server's install must not find the first's reservation and
    bake the same worker ID into its function."""
    control_db: ScratchDatabase = database_factory(backend)
    first_db: ScratchDatabase = database_factory(backend)
    server = _another_server(backend)
    control = create_engine(control_db.url)
    first = create_engine(first_db.url)
    try:
        server.create_database(first_db.name)
        second = create_engine(server.url(first_db.name))
        worker_tables_in(control)
        workers = [install(engine, control_url=control_db.url_string)
                   for engine in (first, second)]
        assert workers[0] != workers[1]
        with second.begin() as conn:  # installed again: it finds its own reservation
            drop_key_function(conn, control_url=control_db.url_string, release_worker=False)
        assert install(second, control_url=control_db.url_string) == workers[1]
        second.dispose()
        reserved = {s["label"]: s["worker_id"] for s in slots(control) if s["lease_token"]}
        assert sorted(reserved.values()) == sorted(workers), reserved
    finally:
        first.dispose()
        control.dispose()
        server.close()
