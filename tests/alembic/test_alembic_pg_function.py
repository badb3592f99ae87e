"""The PostgreSQL ``snowflake_next_id()`` server default: same layout as the application, a
permanently reserved worker slot, and no duplicates when many sessions insert at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import MetaData, create_engine, select, text
from sqlalchemy.engine import Engine

import snowflake_db
import snowflake_db.alembic
from snowflake_db import Layout
from snowflake_db.key_functions import _postgres as _pg_function
from snowflake_db.key_functions._slots import floor_id
from snowflake_db.key_functions._spec import FunctionSpec
from snowflake_db.worker import worker_tables

from ..plugins.alembic_support import project_with_orders, write_revision
from ..plugins.databases import ScratchDatabase

APP_WORKER = 4
pytestmark = pytest.mark.static_worker(APP_WORKER)
LAYOUT = Layout()
#: 4 IDs per tick: the function runs out of sequence values constantly and must wait.
TINY = Layout(time_bits=41, worker_bits=10, sequence_bits=2)


def _slots(engine: Engine, table: str = "snowflake_worker_slots") -> list[Any]:
    slots = worker_tables(
        MetaData(), slots_table=table, registrations_table=f"{table}_registrations"
    ).slots
    with engine.connect() as conn:
        return list(conn.execute(select(slots).order_by(slots.c.worker_id)).mappings())


def _run_ops(engine: Engine, action: Any) -> None:
    with engine.begin() as conn:
        action(Operations(MigrationContext.configure(conn)))


def test_migration_installs_function_as_server_default(
    postgres_db: ScratchDatabase, tmp_path: Path
) -> None:
    config = project_with_orders(tmp_path, postgres_db)
    write_revision(
        config,
        "r2",
        "r1",
        """
        op.create_snowflake_worker_tables()
        op.create_snowflake_id_function()
        op.convert_to_snowflake_pk("orders", server_default="snowflake_next_id()")
        """,
        """
        op.revert_snowflake_pk("orders")
        op.drop_snowflake_id_function()
        op.drop_snowflake_worker_tables()
        """,
    )
    command.upgrade(config, "head")
    engine = create_engine(postgres_db.url)
    try:
        (slot,) = _slots(engine)
        assert slot["label"].startswith("postgresql-function:") and slot["expires_at_ms"] is None
        assert slot["lease_token"] and slot["worker_id"] == LAYOUT.max_worker_id
        with engine.begin() as conn:
            server_ids = list(
                conn.scalars(
                    text(
                        "INSERT INTO orders (customer) SELECT 'sql' FROM generate_series(1, 500) "
                        "RETURNING id"
                    )
                )
            )
            app_id = snowflake_db.snowflake_default()
            conn.execute(
                text("INSERT INTO orders (id, customer) VALUES (:i, 'app')"), {"i": app_id}
            )
            conn.execute(
                text("INSERT INTO order_items (order_id) VALUES (:i)"), {"i": server_ids[0]}
            )
            default = conn.scalar(
                text(
                    "SELECT column_default FROM information_schema.columns "
                    "WHERE table_name = 'orders' AND column_name = 'id'"
                )
            )
        assert default == "snowflake_next_id()"
        assert server_ids == sorted(server_ids) and len(set(server_ids)) == 500
        assert {LAYOUT.decode(i).worker_id for i in server_ids} == {LAYOUT.max_worker_id}
        assert LAYOUT.decode(app_id).worker_id == APP_WORKER
        # the application's allocator can never take the reserved slot: it is not expired
        assert _slots(engine)[0]["lease_token"] == slot["lease_token"]

        with engine.begin() as conn:
            conn.execute(text("DELETE FROM order_items WHERE order_id > 2147483647"))
            conn.execute(text("DELETE FROM orders WHERE id > 2147483647"))
        command.downgrade(config, "r1")
        with engine.connect() as conn:
            assert (
                conn.scalar(
                    text("SELECT count(*) FROM pg_proc WHERE proname = 'snowflake_next_id'")
                )
                == 0
            )
            assert (
                conn.scalar(
                    text("SELECT count(*) FROM pg_class WHERE relname = 'snowflake_next_id_state'")
                )
                == 0
            )
            assert conn.scalar(text("SELECT to_regclass('snowflake_worker_slots')")) is None
    finally:
        engine.dispose()


def test_concurrent_sessions_never_duplicate(postgres_db: ScratchDatabase) -> None:
    engine = create_engine(postgres_db.url, pool_size=8)
    _run_ops(engine, lambda op: op.create_snowflake_worker_tables())
    _run_ops(engine, lambda op: op.create_snowflake_id_function())
    # Another layout needs worker tables of its own (the tables record the layout they serve).
    tiny_tables = {"slots_table": "tiny_slots", "registrations_table": "tiny_registrations"}
    _run_ops(engine, lambda op: op.create_snowflake_worker_tables(**tiny_tables))
    _run_ops(
        engine,
        lambda op: op.create_snowflake_id_function("tiny_next_id", layout=TINY, **tiny_tables),
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE events (id bigint PRIMARY KEY DEFAULT snowflake_next_id(), "
                "tiny bigint NOT NULL UNIQUE DEFAULT tiny_next_id(), who text)"
            )
        )
    (big_slot,) = _slots(engine)
    (tiny_slot,) = _slots(engine, "tiny_slots")
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def sql_writer(n: int) -> None:
        try:
            with engine.connect() as conn:
                barrier.wait()
                with conn.begin():  # a long transaction holding its rows while others insert
                    for _ in range(10):
                        conn.execute(
                            text(
                                "INSERT INTO events (who) SELECT 'sql' FROM generate_series(1, 60)"
                            )
                        )
                    for _ in range(40):
                        conn.execute(text("INSERT INTO events (who) VALUES ('sql1')"))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def app_writer() -> None:
        try:
            with engine.connect() as conn:
                barrier.wait()
                for _ in range(10):
                    with conn.begin():
                        rows = [{"id": snowflake_db.snowflake_default()} for _ in range(50)]
                        conn.execute(text("INSERT INTO events (id, who) VALUES (:id, 'app')"), rows)
        except BaseException as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=sql_writer, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=app_writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert not errors, errors
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, tiny, who FROM events")).all()
        assert len(rows) == 4 * (600 + 40) + 2 * 500
        ids = [r.id for r in rows]
        assert len(set(ids)) == len(ids)  # also enforced by the primary key
        server = [r.id for r in rows if r.who != "app"]
        app = [r.id for r in rows if r.who == "app"]
        assert {LAYOUT.decode(i).worker_id for i in server} == {big_slot["worker_id"]}
        assert {LAYOUT.decode(i).worker_id for i in app} == {APP_WORKER}
        assert not set(server) & set(app)
        tiny = [r.tiny for r in rows]
        assert len(set(tiny)) == len(tiny)
        decoded = [TINY.decode(i) for i in tiny]
        assert {d.worker_id for d in decoded} == {tiny_slot["worker_id"]}
        assert max(d.sequence for d in decoded) == TINY.max_sequence  # ticks were used up
    finally:
        engine.dispose()


def test_reservation_respects_high_water_marks(postgres_db: ScratchDatabase) -> None:
    engine = create_engine(postgres_db.url)
    top = LAYOUT.max_worker_id
    try:
        _run_ops(engine, lambda op: op.create_snowflake_worker_tables())
        slots = worker_tables(MetaData()).slots
        with engine.begin() as conn:
            now_ms = conn.scalar(
                text("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            )
            # a previous holder of the top slot reserved time up to 5 s ahead: not usable yet
            conn.execute(slots.insert().values(worker_id=top, high_water_ms=now_ms + 5000))
        _run_ops(engine, lambda op: op.create_snowflake_id_function())
        reserved = [s for s in _slots(engine) if s["label"]]
        assert [s["worker_id"] for s in reserved] == [top - 1]
        with engine.connect() as conn:
            first = conn.scalar(text("SELECT snowflake_next_id()"))
        assert LAYOUT.decode(first).worker_id == top - 1

        # a function started from a floor 300 ms ahead waits and issues only above it
        spec = FunctionSpec("floor_next_id", None)
        start = floor_id(LAYOUT, 5, now_ms + 300)
        with engine.begin() as conn:
            for statement in _pg_function.create_function_sql(
                spec, layout=LAYOUT, worker_id=5, start_after=start
            ):
                conn.execute(text(statement))
            floored = conn.scalar(text("SELECT floor_next_id()"))
        assert LAYOUT.decode(floored).timestamp_ms > now_ms + 300

        # dropping the function frees the slot and records how far it got
        _run_ops(engine, lambda op: op.drop_snowflake_id_function())
        slot = next(s for s in _slots(engine) if s["worker_id"] == top - 1)
        assert slot["lease_token"] is None and slot["label"] is None
        assert slot["high_water_ms"] > LAYOUT.decode(first).timestamp_ms
    finally:
        engine.dispose()


def test_slot_reserved_in_a_separate_control_database(database_factory: Any) -> None:
    app_db: ScratchDatabase = database_factory("postgresql")
    control_db: ScratchDatabase = database_factory("postgresql")
    control = create_engine(control_db.url)
    engine = create_engine(app_db.url)
    try:
        _run_ops(control, lambda op: op.create_snowflake_worker_tables())

        def create(op: Operations) -> None:
            op.create_snowflake_id_function(control_url=control_db.url_string)

        _run_ops(engine, create)
        # a migration that failed after reserving (its DDL rolled back) runs again: the
        # reservation made in the control database is found by its label, not repeated
        with engine.begin() as conn:
            for statement in _pg_function.drop_function_sql(
                FunctionSpec("snowflake_next_id", None)
            ):
                conn.execute(text(statement))
        _run_ops(engine, create)
        (slot,) = [s for s in _slots(control) if s["lease_token"]]
        assert slot["expires_at_ms"] is None and slot["label"].endswith("public.snowflake_next_id")
        with engine.connect() as conn:
            ids = [conn.scalar(text("SELECT snowflake_next_id()")) for _ in range(20)]
        assert {LAYOUT.decode(i).worker_id for i in ids} == {slot["worker_id"]}
        _run_ops(
            engine,
            lambda op: op.drop_snowflake_id_function(control_url=control_db.url_string),
        )
        (freed,) = [s for s in _slots(control) if s["worker_id"] == slot["worker_id"]]
        assert freed["lease_token"] is None
        assert freed["high_water_ms"] >= LAYOUT.decode(max(ids)).timestamp_ms
    finally:
        control.dispose()
        engine.dispose()
