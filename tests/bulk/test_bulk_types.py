"""Every value a bulk load writes is read back unchanged, on real PostgreSQL (COPY) and MariaDB
(``LOAD DATA LOCAL INFILE`` and multi-row INSERTs): property tests over times with zones,
decimals, JSON, text with tabs, newlines, backslashes and quotes, NULLs, booleans, bytes and
64-bit integers at their edges. Each example loads in a transaction, reads every row back and
rolls back."""

from __future__ import annotations

import datetime as dt
import decimal
import math
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
    Float,
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

from snowflake_db.errors import UnrepresentableValueError
from snowflake_db.sqlalchemy import bulk_load, snowflake_column
from tests.plugins.databases import ScratchDatabase

pytestmark = pytest.mark.static_worker(9)

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
    engine = postgres_db.engine(meta)
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
    engine = postgres_db.engine(meta)

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
    engine = mariadb_db.engine(meta, local_infile=True)

    @PROPERTY
    @given(rows=_rows(st.one_of(TEXT, TEXT.map(lambda s: s + "\x00" + s))))
    def check(rows: list[dict[str, Any]]) -> None:
        _round_trip(engine, rows, mariadb_method=method)

    try:
        check()
    finally:
        engine.dispose()


def test_postgresql_refuses_nul_in_text_and_json(postgres_db: ScratchDatabase) -> None:
    engine = postgres_db.engine(meta)
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
    engine = mariadb_db.engine(meta, local_infile=True)
    try:
        rows: list[dict[str, Any]] = [{"d": decimal.Decimal(1)} for _ in range(4)]
        rows[2]["d"] = decimal.Decimal("NaN")
        with engine.connect() as connection:
            with pytest.raises(UnrepresentableValueError, match="finite") as caught:
                bulk_load(connection, values, rows, mariadb_method=method)
            assert (caught.value.column, caught.value.row) == ("d", 2)
    finally:
        engine.dispose()


def test_postgresql_text_path_formats_each_object_as_itself(postgres_db: ScratchDatabase) -> None:
    """Datetimes shared by many rows are formatted once per object (copy_text), never merged
    by equality: equal instants with other offsets, or another fold, keep their own text and
    instant. 4,500 rows cross the 2,000-row blocks; ints with NULLs, NULL-only columns."""
    engine = postgres_db.engine(meta)
    utc = dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.UTC)
    shifted = utc.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30)))  # == utc
    assert shifted == utc
    shared = [utc, shifted]
    try:
        from zoneinfo import ZoneInfo

        berlin = ZoneInfo("Europe/Berlin")
        first = dt.datetime(2026, 10, 25, 2, 30, tzinfo=berlin)  # the hour that repeats
        second = first.replace(fold=1)
        assert first == second and first.utcoffset() != second.utcoffset()
        shared += [first, second]
    except Exception:  # no time zone database here: the offsets alone
        pass
    rows = [
        {"s": shared[i % len(shared)], "ts": shared[i % len(shared)],
         "n": None if i % 7 == 0 else i - 2000, "b": None, "d": None}
        for i in range(4500)
    ]
    try:
        with engine.connect() as connection:
            keys = bulk_load(connection, plain, rows)
            back = {r.id: r for r in connection.execute(select(plain))}
            connection.rollback()
        for key, expected in zip(keys, rows, strict=True):
            got = back[key]
            assert got.s == expected["s"].isoformat()  # the object's own offset, as text
            # the same instant (fold=1: an hour later); == is False across zones for a
            # repeated wall time (PEP 495), so both are compared in UTC
            assert got.ts.astimezone(dt.UTC) == expected["ts"].astimezone(dt.UTC)
            assert (got.n, got.b, got.d) == (expected["n"], None, None)
    finally:
        engine.dispose()


def test_postgresql_non_finite_floats_and_decimals_round_trip(
    postgres_db: ScratchDatabase,
) -> None:
    engine = create_engine(postgres_db.url)
    floats = Table("bulk_floats", MetaData(), snowflake_column("id"), Column("f", Float(53)),
                   Column("d", Numeric(asdecimal=True)))
    floats.metadata.create_all(engine)
    rows = [{"f": value, "d": number} for value, number in [
        (math.nan, decimal.Decimal("NaN")), (math.inf, decimal.Decimal("Infinity")),
        (-math.inf, decimal.Decimal("-Infinity")), (-0.0, decimal.Decimal("0.000")),
        (5e-324, decimal.Decimal("1.10")), (1.7976931348623157e308, decimal.Decimal("1.1")),
    ]]
    try:
        with engine.connect() as connection:
            keys = bulk_load(connection, floats, rows)
            back = {r.id: r for r in connection.execute(select(floats))}
        for key, expected in zip(keys, rows, strict=True):
            got, want = back[key], expected["f"]
            assert (math.isnan(got.f) and math.isnan(want)) or (
                got.f == want and math.copysign(1, got.f) == math.copysign(1, want))
            assert str(got.d) == str(expected["d"])  # the scale too: 1.10 stays 1.10
    finally:
        engine.dispose()


LONE = "ok\ud800ko"


@pytest.mark.parametrize("target", ["plain", "values"])  # COPY text path / write_row path
def test_postgresql_names_a_lone_surrogate(postgres_db: ScratchDatabase, target: str) -> None:
    engine = postgres_db.engine(meta)
    table = plain if target == "plain" else values
    try:
        rows: list[dict[str, Any]] = [{"s": f"row {i}\t\\"} for i in range(2500)]
        rows[2100]["s"] = LONE  # in the second block
        with engine.connect() as connection:
            with pytest.raises(UnrepresentableValueError, match="surrogate") as caught:
                bulk_load(connection, table, rows)
            assert (caught.value.column, caught.value.row, caught.value.value) == (
                "s", 2100, LONE)
            assert f"{table.name}.s, row 2100" in str(caught.value)
            assert connection.execute(select(table)).all() == []
        if target == "values":  # inside JSON
            rows = [{"s": "x", "j": {"k": "v"}} for _ in range(3)]
            rows[1]["j"] = {"k": [LONE]}
            with engine.connect() as connection:
                with pytest.raises(UnrepresentableValueError, match="surrogate") as caught:
                    bulk_load(connection, values, rows)
                assert (caught.value.column, caught.value.row) == ("j", 1)
    finally:
        engine.dispose()


@pytest.mark.parametrize("method", ["load_data", "insert"])
def test_mariadb_names_a_lone_surrogate(mariadb_db: ScratchDatabase, method: str) -> None:
    engine = mariadb_db.engine(meta, local_infile=True)
    try:
        rows: list[dict[str, Any]] = [{"s": f"row {i}"} for i in range(5)]
        rows[3]["s"] = LONE
        with engine.connect() as connection:
            with pytest.raises(UnrepresentableValueError, match="surrogate") as caught:
                bulk_load(connection, values, rows, mariadb_method=method)
            assert (caught.value.column, caught.value.row, caught.value.value) == ("s", 3, LONE)
            assert connection.execute(select(values)).all() == []
    finally:
        engine.dispose()


def test_sqlite_names_a_lone_surrogate(tmp_path: Any) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'lone.db'}")
    meta.create_all(engine)
    try:
        rows: list[dict[str, Any]] = [{"s": "a"}, {"s": LONE}]
        with engine.connect() as connection:
            with pytest.raises(UnrepresentableValueError, match="surrogate") as caught:
                bulk_load(connection, values, rows)
            assert (caught.value.column, caught.value.row) == ("s", 1)
    finally:
        engine.dispose()


@pytest.mark.parametrize("method", ["load_data", "insert"])
def test_mariadb_timestamp_is_exact_whatever_the_session_zone(
    mariadb_db: ScratchDatabase, method: str
) -> None:
    """TIMESTAMP reads wall times in the session's zone: the load puts the session at UTC for
    its aware datetimes (sent as UTC), then gives the session its zone back."""
    engine = create_engine(mariadb_db.url, connect_args={
        "local_infile": True, "init_command": "SET time_zone = '+05:30'"})
    stamps = Table("bulk_stamps", MetaData(), snowflake_column("id"),
                   Column("at", mysql.TIMESTAMP(fsp=6), nullable=True))
    stamps.metadata.create_all(engine)
    india = dt.timezone(dt.timedelta(hours=5, minutes=30))
    rows: list[dict[str, Any]] = [
        {"at": dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)},
        {"at": dt.datetime(2026, 3, 1, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=11)))},
        {"at": dt.datetime(2030, 1, 1, 0, 0, tzinfo=india)},
        {"at": None},
    ]
    try:
        with engine.connect() as connection:
            keys = bulk_load(connection, stamps, rows, mariadb_method=method)
            zone = connection.exec_driver_sql("SELECT @@session.time_zone").scalar()
            assert zone == "+05:30"  # given back
            back = dict(connection.execute(select(stamps.c.id, stamps.c.at)).all())
            for key, row in zip(keys, rows, strict=True):
                expected = row["at"]
                assert back[key] == (  # shown in the session's zone, +05:30
                    None if expected is None else expected.astimezone(india).replace(tzinfo=None)
                )
            naive = [{"at": dt.datetime(2026, 1, 1)}, {"at": dt.datetime(2026, 1, 2)}]
            with pytest.raises(UnrepresentableValueError, match="naive") as caught:
                bulk_load(connection, stamps, naive, mariadb_method=method)
            assert (caught.value.column, caught.value.row) == ("at", 0)
    finally:
        engine.dispose()
