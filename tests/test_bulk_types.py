"""Every value a bulk load writes is read back unchanged, on real PostgreSQL (COPY) and MariaDB
(``LOAD DATA LOCAL INFILE`` and multi-row INSERTs): property tests over times with zones,
decimals, JSON, text with tabs, newlines, backslashes and quotes, NULLs, booleans, bytes and
64-bit integers at their edges. Each example loads in a transaction, reads every row back and
rolls back."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    LargeBinary,
    MetaData,
    Numeric,
    Table,
    Text,
    create_engine,
    select,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Engine

import snowflake_db
from snowflake_db.errors import UnrepresentableValueError
from snowflake_db.sqlalchemy import bulk_load, snowflake_column
from tests.plugins.databases import ScratchDatabase

meta = MetaData()
values = Table(
    "bulk_values", meta, snowflake_column("id"),
    Column("s", Text),
    Column("ts", DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")),
    Column("d", Numeric(30, 10, asdecimal=True)),
    Column("j", JSON().with_variant(postgresql.JSONB(), "postgresql")),
    Column("b", Boolean),
    Column("by", LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")),
    Column("n", BigInteger),
)

EDGES = [-(2**63), -(2**63) + 1, -1, 0, 1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 2, 2**63 - 1]
SPECIAL = st.sampled_from(["\t", "\n", "\r", "\\", "\\N", "'", '"', "\\t", "NULL", " ", "é", "🚀"])
TEXT = st.lists(st.one_of(SPECIAL, st.text(max_size=8)), max_size=6).map("".join)
ZONES = st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)),
                         dt.timezone(dt.timedelta(hours=-11))])
TIMES = st.datetimes(min_value=dt.datetime(1001, 1, 2), max_value=dt.datetime(9998, 12, 30),
                     timezones=ZONES)
DECIMALS = st.decimals(min_value=-(10**19), max_value=10**19, places=10, allow_nan=False)


def _json(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=8,
    )


def _rows(text: st.SearchStrategy[str]) -> st.SearchStrategy[list[dict[str, Any]]]:
    json_values = _json(text)
    row = st.fixed_dictionaries({
        "s": st.none() | text,
        "ts": st.none() | TIMES,
        "d": st.none() | DECIMALS,
        "j": st.one_of(st.dictionaries(text, json_values, max_size=3),
                       st.lists(json_values, max_size=3)),
        "b": st.none() | st.booleans(),
        "by": st.none() | st.binary(max_size=40),
        "n": st.none() | st.sampled_from(EDGES) | st.integers(-(2**63), 2**63 - 1),
    })
    return st.lists(row, min_size=1, max_size=15)


PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def configured() -> Iterator[None]:
    snowflake_db.configure(worker_id=9)
    yield
    snowflake_db.reset()


def _engine(db: ScratchDatabase, **connect_args: Any) -> Engine:
    engine = create_engine(db.url, connect_args=connect_args)
    meta.create_all(engine)
    return engine


def _same(expected: dict[str, Any], got: Any, zoned: bool) -> None:
    assert got.s == expected["s"]
    ts = expected["ts"]
    if ts is None:
        assert got.ts is None
    elif zoned:
        assert got.ts == ts  # the same instant, whatever zone it is shown in
    else:  # DATETIME without zone: the UTC wall time
        assert got.ts == ts.astimezone(dt.UTC).replace(tzinfo=None)
    assert got.d == expected["d"]
    assert got.j == expected["j"]
    assert got.b is expected["b"]
    assert got.by == expected["by"]
    assert got.n == expected["n"]


def _round_trip(engine: Engine, rows: list[dict[str, Any]], **options: Any) -> None:
    with engine.connect() as connection:
        keys = bulk_load(connection, values, rows, **options)
        back = {row.id: row for row in connection.execute(select(values))}
        connection.rollback()
    assert set(back) == set(keys) and len(keys) == len(rows)
    zoned = engine.dialect.name == "postgresql"
    for key, row in zip(keys, rows, strict=True):
        _same(row, back[key], zoned)


plain = Table(  # only types that snowflake_db.bulk.copy_text formats itself
    "bulk_plain", meta, snowflake_column("id"),
    Column("s", Text), Column("ts", DateTime(timezone=True).with_variant(
        mysql.DATETIME(fsp=6), "mysql", "mariadb")),
    Column("d", Numeric(30, 10, asdecimal=True)), Column("b", Boolean), Column("n", BigInteger),
)


def test_postgresql_copy_text_path_round_trips(postgres_db: ScratchDatabase) -> None:
    """Columns of plain values skip psycopg's per-row adaptation: still exact."""
    engine = _engine(postgres_db)
    no_nul = TEXT.filter(lambda s: "\x00" not in s)
    row = st.fixed_dictionaries({
        "s": st.none() | no_nul, "ts": st.none() | TIMES, "d": st.none() | DECIMALS,
        "b": st.none() | st.booleans(),
        "n": st.none() | st.sampled_from(EDGES) | st.integers(-(2**63), 2**63 - 1),
    })

    @PROPERTY
    @given(rows=st.lists(row, min_size=1, max_size=15))
    def check(rows: list[dict[str, Any]]) -> None:
        with engine.connect() as connection:
            keys = bulk_load(connection, plain, rows)
            back = {r.id: r for r in connection.execute(select(plain))}
            connection.rollback()
        for key, expected in zip(keys, rows, strict=True):
            got = back[key]
            assert (got.s, got.ts, got.d, got.n) == (
                expected["s"], expected["ts"], expected["d"], expected["n"],
            )
            assert got.b is expected["b"]

    try:
        check()
    finally:
        engine.dispose()


def test_postgresql_copy_round_trips_every_value(postgres_db: ScratchDatabase) -> None:
    engine = _engine(postgres_db)

    @PROPERTY
    @given(rows=_rows(TEXT.filter(lambda s: "\x00" not in s)))
    def check(rows: list[dict[str, Any]]) -> None:
        _round_trip(engine, rows)

    try:
        check()
    finally:
        engine.dispose()


@pytest.mark.parametrize("method", ["load_data", "insert"])
def test_mariadb_round_trips_every_value(mariadb_db: ScratchDatabase, method: str) -> None:
    engine = _engine(mariadb_db, local_infile=True)

    @PROPERTY
    @given(rows=_rows(st.one_of(TEXT, TEXT.map(lambda s: s + "\x00" + s))))
    def check(rows: list[dict[str, Any]]) -> None:
        _round_trip(engine, rows, mariadb_method=method)

    try:
        check()
    finally:
        engine.dispose()


def test_postgresql_refuses_nul_in_text_and_json(postgres_db: ScratchDatabase) -> None:
    engine = _engine(postgres_db)
    try:
        for column, bad in (("s", "tab\there\x00"), ("j", {"k": "v\x00"})):
            rows: list[dict[str, Any]] = [{"s": "ok", "j": []} for _ in range(5)]
            rows[3][column] = bad
            with engine.connect() as connection:
                with pytest.raises(UnrepresentableValueError, match="NUL") as caught:
                    bulk_load(connection, values, rows)
                assert (caught.value.column, caught.value.row, caught.value.value) == (
                    column, 3, bad,
                )
                assert connection.execute(select(values)).all() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("method", ["load_data", "insert"])
def test_mariadb_refuses_numbers_it_cannot_store(mariadb_db: ScratchDatabase, method: str) -> None:
    engine = _engine(mariadb_db, local_infile=True)
    try:
        rows: list[dict[str, Any]] = [{"d": decimal.Decimal(1)} for _ in range(4)]
        rows[2]["d"] = decimal.Decimal("NaN")
        with engine.connect() as connection:
            with pytest.raises(UnrepresentableValueError, match="finite") as caught:
                bulk_load(connection, values, rows, mariadb_method=method)
            assert (caught.value.column, caught.value.row) == ("d", 2)
    finally:
        engine.dispose()
