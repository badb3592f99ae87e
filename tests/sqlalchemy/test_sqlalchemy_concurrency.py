"""The SQLAlchemy defaults under real concurrency: threads sharing one engine, and forked and
spawned processes with their own workers, all inserting at once through Core executemany (one
batch of IDs per statement) and the ORM (keys set at flush), on PostgreSQL and MariaDB."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import snowflake_db
from snowflake_db.sqlalchemy import snowflake_column, snowflake_mapped_column
from tests.plugins.databases import ScratchDatabase

LAYOUT = snowflake_db.Layout()
STATEMENTS = 12  # per thread or process, each half Core and half ORM
ROWS = 400  # per statement

core = MetaData()
events = Table(
    "concurrent_events",
    core,
    snowflake_column("id"),
    Column("writer", Integer, nullable=False),
    Column("n", Integer, nullable=False),
)


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "concurrent_notes"
    id: Mapped[int] = snowflake_mapped_column()
    writer: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(String(20))


def _write(url: str, writer: int) -> None:
    """One writer's statements: Core executemany batches and ORM flushes, alternately."""
    engine = create_engine(url, pool_size=1)
    try:
        for statement in range(STATEMENTS):
            if statement % 2:
                with Session(engine) as session, session.begin():
                    session.add_all(Note(writer=writer, text=f"{n}") for n in range(ROWS))
            else:
                rows = [{"writer": writer, "n": n} for n in range(ROWS)]
                with engine.begin() as connection:
                    connection.execute(events.insert(), rows)
    finally:
        engine.dispose()


def _child(url: str, writer: int) -> None:
    """A process of its own: its own worker ID, then the same statements."""
    snowflake_db.configure(worker_id=writer)
    _write(url, writer)


@pytest.fixture(params=["postgresql", "mariadb"])
def server_db(
    request: pytest.FixtureRequest, database_factory: Callable[[str], ScratchDatabase]
) -> Iterator[ScratchDatabase]:
    database = database_factory(request.param)
    engine = create_engine(database.url)
    core.create_all(engine)
    Base.metadata.create_all(engine)
    engine.dispose()
    yield database
    snowflake_db.reset()


def _stored(database: ScratchDatabase) -> list[tuple[int, int]]:
    """(id, writer) of every row in both tables."""
    engine = create_engine(database.url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(events.c.id, events.c.writer)).all()
            rows += connection.execute(select(Note.id, Note.writer)).all()
            assert connection.scalar(select(func.count()).select_from(events)) == len(rows) // 2
        return [(row[0], row[1]) for row in rows]
    finally:
        engine.dispose()


def _assert_unique_per_writer(
    rows: list[tuple[int, int]], writers: int, worker_of: dict[int, int]
) -> None:
    assert len(rows) == writers * STATEMENTS * ROWS
    assert len({snowflake_id for snowflake_id, _ in rows}) == len(rows)  # no ID twice
    assert all(LAYOUT.decode(i).worker_id == worker_of[writer] for i, writer in rows)


def test_threads_sharing_one_generator_never_share_an_id(server_db: ScratchDatabase) -> None:
    snowflake_db.configure(worker_id=3)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        try:
            start.wait()
            _write(server_db.url_string, writer)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(writer,)) for writer in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    _assert_unique_per_writer(_stored(server_db), 8, dict.fromkeys(range(8), 3))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_processes_with_their_own_workers_never_share_an_id(
    server_db: ScratchDatabase, start_method: str
) -> None:
    snowflake_db.configure(worker_id=1)
    _write(server_db.url_string, 1)  # the parent has used the generator before the children
    context = multiprocessing.get_context(start_method)
    children = [
        context.Process(target=_child, args=(server_db.url_string, writer))
        for writer in range(2, 6)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [0] * 4
    _assert_unique_per_writer(_stored(server_db), 5, {w: w for w in range(1, 6)})
