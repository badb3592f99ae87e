"""Real ``alembic upgrade`` / ``downgrade`` runs converting a serial key that holds rows and
foreign-key children to a Snowflake BIGINT key, on PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import BigInteger, Integer, create_engine, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

import snowflake_db
from snowflake_db.alembic import SnowflakeMigrationError

from ..plugins.alembic_support import (
    converted_models,
    make_project,
    project_with_orders,
    write_revision,
)
from ..plugins.databases import ScratchDatabase

APP_WORKER = 12
pytestmark = pytest.mark.static_worker(APP_WORKER)
LAYOUT = snowflake_db.Layout()


def _snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        return {
            "orders": [
                tuple(r) for r in conn.execute(text("SELECT id, customer FROM orders ORDER BY id"))
            ],
            "items": [
                tuple(r)
                for r in conn.execute(text("SELECT id, order_id FROM order_items ORDER BY id"))
            ],
            "notes": [
                tuple(r) for r in conn.execute(text("SELECT id, order_id FROM notes ORDER BY id"))
            ],
        }


def _column(engine: Engine, table: str, column: str) -> dict[str, Any]:
    return {c["name"]: c for c in inspect(engine).get_columns(table)}[column]


def _foreign_keys(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    return sorted(
        (
            fk["name"] or "",
            tuple(fk["constrained_columns"]),
            fk["referred_table"],
            (fk.get("options") or {}).get("ondelete"),
        )
        for fk in inspect(engine).get_foreign_keys(table)
    )


def _assert_snowflake_ddl(engine: Engine, backend: str) -> None:
    for table, column in (("orders", "id"), ("order_items", "order_id"), ("notes", "order_id")):
        assert isinstance(_column(engine, table, column)["type"], BigInteger), (table, column)
    pk = _column(engine, "orders", "id")
    assert not pk.get("identity")
    with engine.connect() as conn:
        if backend == "postgresql":
            assert pk["default"] is None or "snowflake_next_id" in pk["default"]
            sequences = set(conn.scalars(text("SELECT relname FROM pg_class WHERE relkind = 'S'")))
            assert "orders_id_seq" not in sequences
        elif backend == "mariadb":
            extra = conn.scalar(
                text(
                    "SELECT extra FROM information_schema.columns WHERE table_schema = DATABASE() "
                    "AND table_name = 'orders' AND column_name = 'id'"
                )
            )
            assert "auto_increment" not in extra.lower()
        else:
            sql = conn.scalar(text("SELECT sql FROM sqlite_master WHERE name = 'orders'"))
            assert "BIGINT" in sql and "AUTOINCREMENT" not in sql.upper()
    fks = _foreign_keys(engine, "order_items")
    if backend == "sqlite":  # SQLite reflects unnamed-by-the-engine constraints too
        assert [(c, t, d) for _, c, t, d in fks] == [(("order_id",), "orders", "CASCADE")]
    else:
        assert fks == [("fk_items_order", ("order_id",), "orders", "CASCADE")]


def _assert_models_match(config: Config) -> None:
    """Autogenerate against the converted database and the helper models: nothing to do."""
    config.attributes["target_metadata"] = converted_models()
    script = command.revision(config, message="check", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    source = Path(script.path).read_text()
    Path(script.path).unlink()
    assert "op." not in source.split("def upgrade")[1], source


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_convert_serial_key_with_children_and_back(
    backend: str, database_factory: Any, tmp_path: Path
) -> None:
    db: ScratchDatabase = database_factory(backend)
    config = project_with_orders(tmp_path, db)
    write_revision(
        config,
        "r2",
        "r1",
        'op.convert_to_snowflake_pk("orders")',
        'op.revert_snowflake_pk("orders")',
    )
    command.upgrade(config, "r1")
    engine = db.engine()
    try:
        before = _snapshot(engine)
        assert len(before["orders"]) == 20 and len(before["items"]) == 40
        command.upgrade(config, "head")
        assert _snapshot(engine) == before
        _assert_snowflake_ddl(engine, backend)
        _assert_models_match(config)

        # the application now inserts Snowflake IDs; children reference them
        new_id = snowflake_db.snowflake_default()
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO orders (id, customer) VALUES (:id, 'new')"), {"id": new_id}
            )
            conn.execute(text("INSERT INTO order_items (order_id) VALUES (:id)"), {"id": new_id})
            if backend != "sqlite":
                with pytest.raises((IntegrityError, OperationalError)), conn.begin_nested():
                    conn.execute(text("INSERT INTO orders (customer) VALUES ('no id')"))
        assert LAYOUT.decode(new_id).worker_id == APP_WORKER

        # back to INTEGER is impossible while a Snowflake ID is stored, and says so
        if backend != "sqlite":
            with pytest.raises(
                SnowflakeMigrationError, match=r"above the INTEGER maximum.*type_='bigint'"
            ):
                command.downgrade(config, "r1")
            _assert_snowflake_ddl(engine, backend)  # nothing changed
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM order_items WHERE order_id = :id"), {"id": new_id})
            conn.execute(text("DELETE FROM orders WHERE id = :id"), {"id": new_id})
        command.downgrade(config, "r1")
        assert _snapshot(engine) == before
        assert isinstance(_column(engine, "order_items", "order_id")["type"], Integer)
        assert not isinstance(_column(engine, "orders", "id")["type"], BigInteger)
        with engine.begin() as conn:  # auto-increment is back, above the existing rows
            conn.execute(text("INSERT INTO orders (customer) VALUES ('again')"))
            assert conn.scalar(text("SELECT id FROM orders WHERE customer = 'again'")) == 21
        assert len(_foreign_keys(engine, "order_items")) == 1
        command.upgrade(config, "head")  # and forward again
        _assert_snowflake_ddl(engine, backend)
    finally:
        engine.dispose()


def test_identity_key_and_bigint_revert_on_postgresql(
    postgres_db: ScratchDatabase, tmp_path: Path
) -> None:
    config = make_project(tmp_path, postgres_db)
    write_revision(
        config,
        "r1",
        None,
        """
        op.create_table("invoices", sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
                        sa.Column("total", sa.Integer))
        op.create_table("lines", sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
                        sa.Column("invoice_id", sa.Integer,
                                  sa.ForeignKey("invoices.id", name="fk_lines_invoice")))
        op.execute("INSERT INTO invoices (total) SELECT g FROM generate_series(1, 10) g")
        op.execute("INSERT INTO lines (invoice_id) SELECT 1 + g % 10 FROM generate_series(1, 30) g")
        """,
        "op.drop_table('lines')\nop.drop_table('invoices')",
    )
    write_revision(
        config,
        "r2",
        "r1",
        'op.convert_to_snowflake_pk("invoices")\nop.convert_to_snowflake_pk("lines")',
        'op.revert_snowflake_pk("lines", type_="bigint")\n'
        'op.revert_snowflake_pk("invoices", type_="bigint")',
    )
    command.upgrade(config, "head")
    engine = postgres_db.engine()
    try:
        for table in ("invoices", "lines"):
            column = _column(engine, table, "id")
            assert isinstance(column["type"], BigInteger) and not column.get("identity")
        big = snowflake_db.snowflake_default()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO invoices (id, total) VALUES (:id, 0)"), {"id": big})
            assert conn.scalar(text("SELECT count(*) FROM lines")) == 30
        command.downgrade(config, "r1")  # bigint revert keeps the Snowflake row
        column = _column(engine, "invoices", "id")
        assert isinstance(column["type"], BigInteger) and column.get("identity")
        with engine.begin() as conn:
            new = conn.scalar(text("INSERT INTO invoices (total) VALUES (1) RETURNING id"))
            assert new == big + 1
    finally:
        engine.dispose()


def test_conversion_refuses_what_it_cannot_do(sqlite_db: ScratchDatabase) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    engine = create_engine(sqlite_db.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE tokens (code VARCHAR(10) PRIMARY KEY)"))
            conn.execute(text("CREATE TABLE pairs (a INTEGER, b INTEGER, PRIMARY KEY (a, b))"))
            op = Operations(MigrationContext.configure(conn))
            with pytest.raises(SnowflakeMigrationError, match="not an integer type"):
                op.convert_to_snowflake_pk("tokens", "code")
            with pytest.raises(SnowflakeMigrationError, match="only primary-key column"):
                op.convert_to_snowflake_pk("pairs", "a")
            with pytest.raises(SnowflakeMigrationError, match="does not exist"):
                op.convert_to_snowflake_pk("missing")
            with pytest.raises(SnowflakeMigrationError, match="and MariaDB only, not sqlite"):
                op.create_snowflake_id_function()
            with pytest.raises(ValueError, match="server-side function"):
                op.convert_to_snowflake_pk("pairs", "a", server_default="x()")
            with pytest.raises(ValueError, match="'integer' or 'bigint'"):
                op.revert_snowflake_pk("pairs", "a", type_="smallint")  # type: ignore[arg-type]
        offline = Operations(
            MigrationContext.configure(dialect_name="postgresql", opts={"as_sql": True})
        )
        with pytest.raises(SnowflakeMigrationError, match="offline --sql"):
            offline.convert_to_snowflake_pk("orders")
    finally:
        engine.dispose()
