"""A key column whose database key comes from MariaDB's trigger has ``DEFAULT 0``: without the
trigger (never installed, dropped, the table made again) a raw ``INSERT`` without the key must
fail loudly, never store the key 0. PostgreSQL has no such silent path."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, inspect, text
from sqlalchemy.exc import DBAPIError

from snowflake_db import Layout
from snowflake_db.key_functions import install_key_trigger, key_check_name
from snowflake_db.sqlalchemy import snowflake_column

from ..plugins.databases import ScratchDatabase
from .support import install, worker_tables_in

LAYOUT = Layout()
MISSING = "orders_id_key_trigger_missing"


def _orders(metadata: MetaData) -> Table:
    return Table(
        "orders",
        metadata,
        snowflake_column("id", key_function="snowflake_next_id"),
        Column("customer", String(20)),
    )


def _refused(conn: Any, sql: str) -> str:
    """The database's error for ``sql`` (PyMySQL reports MariaDB's 4025 as OperationalError)."""
    with pytest.raises(DBAPIError) as caught:
        conn.execute(text(sql))
    return str(caught.value.orig)


def test_the_check_is_named_for_the_missing_trigger() -> None:
    assert key_check_name("orders", "id") == MISSING
    long = key_check_name("t" * 60, "id")
    assert len(long) <= 64 and long.endswith("_key_trigger_missing")
    assert long != key_check_name("t" * 61, "id")  # a hash keeps truncated names apart
    # any table name a model may have: the listener runs when the model is declared
    assert key_check_name("Order Items", "id") == "Order Items_id_key_trigger_missing"


def test_mariadb_without_the_trigger_refuses_a_missing_key(mariadb_db: ScratchDatabase) -> None:
    engine = create_engine(mariadb_db.url)
    try:
        _orders(metadata := MetaData())
        metadata.create_all(engine)
        with engine.connect() as conn:  # strict mode and not: the CHECK refuses either way
            for mode in ("STRICT_TRANS_TABLES", ""):
                conn.execute(text(f"SET SESSION sql_mode = '{mode}'"))
                message = _refused(conn, "INSERT INTO orders (customer) VALUES ('raw')")
                assert f"CONSTRAINT `{MISSING}` failed" in message, message
                conn.rollback()
            _refused(conn, "INSERT INTO orders (id, customer) VALUES (0, 'zero')")
            conn.rollback()
            _refused(conn, "INSERT INTO orders (customer) SELECT 'sel' FROM seq_1_to_2")
            conn.rollback()
            assert conn.scalar(text("SELECT COUNT(*) FROM orders")) == 0

        # The trigger installed: the CHECK sees the key the trigger made, and passes.
        worker_tables_in(engine)
        function_worker = install(engine)
        with engine.begin() as conn:
            install_key_trigger(conn, "orders")  # adds the same CHECK again: IF NOT EXISTS
            conn.execute(text("INSERT INTO orders (customer) VALUES ('raw'), ('raw')"))
            conn.execute(text("INSERT INTO orders (id, customer) VALUES (0, 'zero')"))
            conn.execute(text("INSERT INTO orders (customer) SELECT 'sel' FROM seq_1_to_3"))
            keys = list(conn.scalars(text("SELECT id FROM orders")))
        assert len(set(keys)) == 6 and 0 not in keys
        assert {LAYOUT.decode(key).worker_id for key in keys} == {function_worker}
        checks = [c["name"] for c in inspect(engine).get_check_constraints("orders")]
        assert checks == [MISSING]

        # The trigger dropped by hand: loud again.
        with engine.begin() as conn:
            conn.execute(text("DROP TRIGGER orders_id_snowflake_key"))
        with engine.connect() as conn:
            assert MISSING in _refused(conn, "INSERT INTO orders (customer) VALUES ('raw')")
    finally:
        engine.dispose()


def test_mariadb_trigger_on_a_table_with_a_long_name(mariadb_db: ScratchDatabase) -> None:
    """A table name of 50 characters (Django's auth_tests has one): the trigger's name is cut
    to a plain identifier with a hash; two tables cut alike keep their own triggers. (It was
    cut to 64 characters, which install_key_trigger then refused as not a plain identifier.)"""
    tables = ["auth_tests_custompermissionsuser_user_permissions" + end for end in "ab"]
    engine = create_engine(mariadb_db.url)
    try:
        worker_tables_in(engine)
        install(engine)
        with engine.begin() as conn:
            triggers = []
            for table in tables:
                conn.execute(text(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT)"))
                triggers.append(install_key_trigger(conn, table, zero_default=False))
                conn.execute(text(f"INSERT INTO {table} (name) VALUES ('raw')"))
            keys = [conn.execute(text(f"SELECT id FROM {table}")).scalar_one() for table in tables]
        assert all(len(name) <= 63 for name in triggers) and len(set(triggers)) == 2
        assert all(key > 2**40 for key in keys)
    finally:
        engine.dispose()


def test_mariadb_trigger_on_a_plain_column_brings_the_check(mariadb_db: ScratchDatabase) -> None:
    """``install_key_trigger`` (``zero_default``) gives a column without a default ``DEFAULT 0``
    and the CHECK with it; ``drop_key_trigger`` takes both away."""
    from snowflake_db.key_functions import drop_key_trigger

    engine = create_engine(mariadb_db.url)
    try:
        worker_tables_in(engine)
        install(engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE orders (id BIGINT PRIMARY KEY, customer TEXT)"))
            install_key_trigger(conn, "orders")
        assert [c["name"] for c in inspect(engine).get_check_constraints("orders")] == [MISSING]
        with engine.begin() as conn:
            conn.execute(text("DROP TRIGGER orders_id_snowflake_key"))
        with engine.connect() as conn:
            assert MISSING in _refused(conn, "INSERT INTO orders (customer) VALUES ('raw')")
        with engine.begin() as conn:
            drop_key_trigger(conn, "orders")  # the trigger is gone already: IF EXISTS
        assert inspect(engine).get_check_constraints("orders") == []
    finally:
        engine.dispose()


def test_postgresql_has_no_silent_path(postgres_db: ScratchDatabase) -> None:
    """The default names the function: PostgreSQL refuses the table without the function and
    the function's drop while a default uses it; dropped with CASCADE, the default goes and a
    missing key fails the NOT NULL. No CHECK is made there (it is MariaDB's placeholder's)."""
    engine = create_engine(postgres_db.url)
    try:
        _orders(metadata := MetaData())
        with pytest.raises(DBAPIError, match="snowflake_next_id"):
            metadata.create_all(engine)
        worker_tables_in(engine)
        install(engine)
        metadata.create_all(engine)
        assert inspect(engine).get_check_constraints("orders") == []
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO orders (customer) VALUES ('raw')"))
        with engine.begin() as conn, pytest.raises(DBAPIError, match="depend"):
            conn.execute(text("DROP FUNCTION snowflake_next_id()"))
        with engine.begin() as conn:
            conn.execute(text("DROP FUNCTION snowflake_next_id() CASCADE"))
        with engine.connect() as conn:
            message = _refused(conn, "INSERT INTO orders (customer) VALUES ('raw')")
            assert "null value in column \"id\"" in message, message
    finally:
        engine.dispose()


def test_mariadb_trigger_on_a_table_in_another_database(database_factory: Any) -> None:
    """``table_schema``: the trigger sits in the table's database and calls the function of
    the connection's database (unqualified, MariaDB would look for it in the trigger's)."""
    home: ScratchDatabase = database_factory("mariadb")
    other: ScratchDatabase = database_factory("mariadb")
    engine = create_engine(home.url)
    try:
        worker_tables_in(engine)
        function_worker = install(engine)
        schema = other.url.database
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE `{schema}`.orders (id BIGINT PRIMARY KEY, c TEXT)"))
            install_key_trigger(conn, "orders", table_schema=schema)
            conn.execute(text(f"INSERT INTO `{schema}`.orders (c) VALUES ('raw'), ('raw')"))
            keys = list(conn.scalars(text(f"SELECT id FROM `{schema}`.orders")))
        assert len(set(keys)) == 2
        assert {LAYOUT.decode(key).worker_id for key in keys} == {function_worker}
        checks = inspect(engine).get_check_constraints("orders", schema=schema)
        assert [c["name"] for c in checks] == [MISSING]
        with engine.begin() as conn:
            from snowflake_db.key_functions import drop_key_trigger

            drop_key_trigger(conn, "orders", table_schema=schema)
            assert inspect(conn).get_check_constraints("orders", schema=schema) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
@pytest.mark.parametrize("where", ["here", "control"])
def test_a_key_function_never_creates_the_worker_tables(
    database_factory: Any, backend: str, where: str
) -> None:
    """Without the worker tables, in this database or the control database, the install is
    refused with the reason, and nothing is created on either (a slot in tables made on the
    spot would be one the application's allocators never see)."""
    from snowflake_db.errors import SnowflakeMigrationError
    from snowflake_db.key_functions import install_key_function

    db: ScratchDatabase = database_factory(backend)
    control: ScratchDatabase = database_factory(backend)
    engine = create_engine(db.url)
    options = {} if where == "here" else {
        "control_url": control.url.render_as_string(hide_password=False)
    }
    try:
        with pytest.raises(SnowflakeMigrationError) as caught, engine.begin() as conn:
            install_key_function(conn, **options)
        message = str(caught.value)
        assert "the worker tables snowflake_worker_slots" in message
        assert (control.url.database if where == "control" else db.url.database) in message
        assert "op.create_snowflake_worker_tables()" in message
        for database in (db, control):
            probe = create_engine(database.url)
            try:
                assert inspect(probe).get_table_names() == []
            finally:
                probe.dispose()
    finally:
        engine.dispose()
