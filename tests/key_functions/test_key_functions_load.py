"""Zero duplicates between application processes (real generators on TableWorkerAllocator
leases) and 8 raw SQL sessions inserting into the same table at once, on both backends."""

from __future__ import annotations

import multiprocessing
import threading
from array import array
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from snowflake_db import Layout

from ..plugins.databases import ScratchDatabase
from .support import install, keyed_table, series_sql, worker_tables_in

SPAWN = multiprocessing.get_context("spawn")
LAYOUT = Layout()
APP_PROCESSES, APP_ROWS, APP_BATCH = 2, 5000, 50
SQL_SESSIONS, SQL_SINGLE, SQL_SELECTS, SQL_SELECT_ROWS = 8, 500, 100, 20


def app_writer(url: str, start: Any, done: Any) -> None:
    """A separate application process: the process-wide generator on a leased worker ID."""
    import snowflake_db
    from snowflake_db.worker import TableWorkerAllocator

    allocator = TableWorkerAllocator(url)
    snowflake_db.configure(allocator=allocator)
    engine = create_engine(url)
    try:
        snowflake_db.snowflake_default()  # lease before the race starts
        if not start.wait(60):
            raise TimeoutError("the test never started the writers")
        with engine.connect() as conn:
            for _ in range(APP_ROWS // APP_BATCH):
                rows = [{"id": snowflake_db.snowflake_default()} for _ in range(APP_BATCH)]
                with conn.begin():
                    conn.execute(text("INSERT INTO events (id, who) VALUES (:id, 'app')"), rows)
        done.put("ok")
    except BaseException as error:  # pragma: no cover - reported by the test
        done.put(repr(error))
    finally:
        engine.dispose()
        snowflake_db.reset()


@pytest.mark.timing(seconds=40)
@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_application_and_8_sql_sessions_never_collide(
    backend: str, database_factory: Any
) -> None:
    db: ScratchDatabase = database_factory(backend)
    engine = create_engine(db.url, pool_size=SQL_SESSIONS)
    processes: list[Any] = []
    try:
        worker_tables_in(engine)
        function_worker = install(engine)
        keyed_table(engine)
        start, done = SPAWN.Event(), SPAWN.Queue()
        for _ in range(APP_PROCESSES):
            process = SPAWN.Process(target=app_writer, args=(db.url_string, start, done))
            process.start()
            processes.append(process)
        barrier = threading.Barrier(SQL_SESSIONS + 1)
        errors: list[BaseException] = []
        series = series_sql(engine, SQL_SELECT_ROWS)

        def sql_writer() -> None:
            try:
                with engine.connect() as conn:
                    barrier.wait()
                    for _ in range(SQL_SELECTS):
                        with conn.begin():
                            conn.execute(text(f"INSERT INTO events (who) {series}"))
                            for _ in range(SQL_SINGLE // SQL_SELECTS):
                                conn.execute(text("INSERT INTO events (who) VALUES ('sql')"))
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=sql_writer) for _ in range(SQL_SESSIONS)]
        for thread in threads:
            thread.start()
        barrier.wait(60)
        start.set()
        for thread in threads:
            thread.join(300)
        outcomes = [done.get(timeout=300) for _ in processes]
        assert not errors, errors
        assert outcomes == ["ok"] * APP_PROCESSES
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, who FROM events")).all()
        sql_ids = array("q", (r.id for r in rows if r.who != "app"))
        app_ids = array("q", (r.id for r in rows if r.who == "app"))
        assert len(sql_ids) == SQL_SESSIONS * (SQL_SELECTS * SQL_SELECT_ROWS + SQL_SINGLE)
        assert len(app_ids) == APP_PROCESSES * APP_ROWS
        everything = set(sql_ids) | set(app_ids)
        assert len(everything) == len(sql_ids) + len(app_ids)  # not one duplicate
        assert {LAYOUT.decode(i).worker_id for i in sql_ids} == {function_worker}
        app_workers = {LAYOUT.decode(i).worker_id for i in app_ids}
        assert len(app_workers) == APP_PROCESSES and function_worker not in app_workers
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():  # pragma: no cover
                process.kill()
        engine.dispose()
