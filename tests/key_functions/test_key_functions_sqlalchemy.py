"""``snowflake_mapped_column(key_function=...)``: the ORM keeps issuing keys in the application;
a raw ``INSERT`` without the key gets one from the database (a DEFAULT on PostgreSQL, the
trigger over ``DEFAULT 0`` on MariaDB)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import String, create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.schema import CreateTable

from snowflake_db import Layout
from snowflake_db.errors import InvalidArgumentError
from snowflake_db.key_functions import install_key_trigger
from snowflake_db.sqlalchemy import snowflake_column, snowflake_mapped_column

from ..plugins.databases import ScratchDatabase
from .support import install, worker_tables_in

APP_WORKER = 7
pytestmark = pytest.mark.static_worker(APP_WORKER)
LAYOUT = Layout()


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = snowflake_mapped_column(key_function="snowflake_next_id")
    customer: Mapped[str] = mapped_column(String(20))


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_orm_keys_stay_in_the_application_raw_sql_gets_database_keys(
    backend: str, database_factory: Any
) -> None:
    db: ScratchDatabase = database_factory(backend)
    engine = create_engine(db.url)
    try:
        worker_tables_in(engine)
        function_worker = install(engine)
        Base.metadata.create_all(engine)
        if backend == "mariadb":
            with engine.begin() as conn:
                install_key_trigger(conn, "orders")
        with Session(engine) as session, session.begin():
            session.add_all([Order(customer="orm") for _ in range(20)])
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO orders (customer) VALUES ('sql'), ('sql')"))
            rows = conn.execute(text("SELECT id, customer FROM orders")).all()
        workers = {(r.customer, LAYOUT.decode(r.id).worker_id) for r in rows}
        assert workers == {("orm", APP_WORKER), ("sql", function_worker)}
        assert len({r.id for r in rows}) == 22
    finally:
        engine.dispose()


def test_key_function_option_refuses_a_second_server_default() -> None:
    with pytest.raises(InvalidArgumentError, match="drop server_default"):
        snowflake_column("id", key_function="snowflake_next_id", server_default="1")
    with pytest.raises(InvalidArgumentError, match="not a plain identifier"):
        snowflake_column("id", key_function="next id()")
    ddl = str(CreateTable(Order.__table__).compile(dialect=_sqlite()))
    assert "DEFAULT NULL" in ddl  # no key function on SQLite: nothing changes


def _sqlite() -> Any:
    from sqlalchemy.dialects import sqlite

    return sqlite.dialect()


class _KeyMixin:
    id: Mapped[int] = snowflake_mapped_column(key_function="snowflake_next_id")


class _MixedA(_KeyMixin, Base):
    __tablename__ = "mixed_a"


class _MixedB(_KeyMixin, Base):
    __tablename__ = "mixed_b"


def _ddl(table: Any, url: str) -> str:
    from sqlalchemy import MetaData
    from sqlalchemy.engine import create_mock_engine

    out: list[str] = []
    engine = create_mock_engine(url, lambda sql, *a, **k: out.append(str(sql.compile(
        dialect=engine.dialect))))
    metadata = MetaData()
    table.to_metadata(metadata)  # a copy keeps one CHECK, not two
    metadata.create_all(engine, checkfirst=False)
    return "".join(out)


@pytest.mark.parametrize("table", [Order.__table__, _MixedA.__table__, _MixedB.__table__])
def test_the_trigger_check_is_mariadbs_alone(table: Any) -> None:
    """Each table (mixin copies too) gets its own CHECK, created on MariaDB only."""
    name = f"{table.name}_id_key_trigger_missing"
    for url in ("mysql+pymysql://", "mariadb+pymysql://"):
        ddl = _ddl(table, url)
        assert ddl.count(f"CONSTRAINT {name} CHECK (id != 0)") == 1, ddl
    for url in ("postgresql+psycopg://", "sqlite://"):
        assert "CHECK" not in _ddl(table, url)
    plain = snowflake_column("id")
    assert "snowflake_db.key_function" not in plain.info
