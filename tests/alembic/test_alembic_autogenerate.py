"""Autogenerate on models using the column helpers: plain BIGINT, no BIGSERIAL/AUTO_INCREMENT,
and no spurious diff afterwards; the worker-table operations mirror the schema module exactly;
the custom operations render back to code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import render_python_code
from alembic.operations import ops
from sqlalchemy import BigInteger, Column, MetaData, String, Table, create_engine, inspect, text
from sqlalchemy.exc import DBAPIError

from snowflake_db import Layout
from snowflake_db.alembic import (
    ConvertToSnowflakePkOp,
    CreateSnowflakeIdFunctionOp,
    CreateSnowflakeKeyTriggerOp,
    CreateSnowflakeWorkerTablesOp,
    DropSnowflakeIdFunctionOp,
)
from snowflake_db.sqlalchemy import snowflake_column, snowflake_fk_column
from snowflake_db.worker import worker_tables

from ..key_functions.support import last_id
from ..plugins.alembic_support import (
    converted_models,
    make_project,
    project_with_orders,
    write_revision,
)
from ..plugins.databases import ScratchDatabase


def _models() -> MetaData:
    metadata = MetaData()
    Table("orders", metadata, snowflake_column("id"), Column("customer", String(50)))
    Table(
        "order_items",
        metadata,
        snowflake_column("id"),
        snowflake_fk_column("orders.id", "order_id", nullable=False),
    )
    worker_tables(metadata)
    return metadata


def _function_body(source: str, name: str) -> str:
    match = re.search(rf"def {name}\(\) -> None:\n(.*?)(?=\n\ndef |\Z)", source, re.S)
    assert match, source
    lines = [
        line.strip()
        for line in match.group(1).splitlines()
        if line.strip() and not line.strip().startswith(('"""', "#"))
    ]
    return "\n".join(lines)


def test_autogenerate_renders_bigint_and_then_finds_no_diff(
    any_db: ScratchDatabase, tmp_path: Path
) -> None:
    config = make_project(tmp_path, any_db, _models())
    first = command.revision(config, message="init", autogenerate=True)
    assert first is not None and not isinstance(first, list)
    source = Path(first.path).read_text()
    assert "sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False)" in source
    assert "sa.Column('order_id', sa.BigInteger(), nullable=False)" in source
    assert "Identity" not in source and "BIGSERIAL" not in source.upper()

    command.upgrade(config, "head")
    engine = create_engine(any_db.url)
    try:
        inspector = inspect(engine)
        for table, column in (("orders", "id"), ("order_items", "id"), ("order_items", "order_id")):
            spec = {c["name"]: c for c in inspector.get_columns(table)}[column]
            assert isinstance(spec["type"], BigInteger) and spec["default"] is None
            assert not spec.get("identity")
        with engine.connect() as conn:
            if any_db.backend == "postgresql":
                sequences = set(
                    conn.scalars(text("SELECT relname FROM pg_class WHERE relkind='S'"))
                )
                assert not any(name.startswith("order") for name in sequences), sequences
            elif any_db.backend == "mariadb":
                extras = conn.scalars(
                    text(
                        "SELECT extra FROM information_schema.columns WHERE "
                        "table_schema = DATABASE() AND table_name IN ('orders', 'order_items')"
                    )
                )
                assert not any("auto_increment" in (e or "").lower() for e in extras)
    finally:
        engine.dispose()

    second = command.revision(config, message="no changes", autogenerate=True)
    assert second is not None and not isinstance(second, list)
    again = Path(second.path).read_text()
    assert _function_body(again, "upgrade") == "pass", again
    assert _function_body(again, "downgrade") == "pass", again


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_worker_table_operations_mirror_the_schema(
    backend: str, database_factory: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db: ScratchDatabase = database_factory(backend)  # type: ignore[operator]
    metadata = MetaData()
    worker_tables(metadata)
    config = make_project(tmp_path, db, metadata)
    config.attributes["compare_server_default"] = True
    write_revision(
        config,
        "w1",
        None,
        "op.create_snowflake_worker_tables()",
        "op.drop_snowflake_worker_tables()",
    )
    command.upgrade(config, "w1", sql=True)  # offline: plain DDL, no connection needed
    assert "CREATE TABLE snowflake_worker_slots" in capsys.readouterr().out
    command.upgrade(config, "head")
    script = command.revision(config, message="check", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    source = Path(script.path).read_text()
    assert _function_body(source, "upgrade") == "pass", source
    Path(script.path).unlink()

    # metadata without the worker tables: include_object keeps them out of the diff
    config.attributes["target_metadata"] = MetaData()
    script = command.revision(config, message="ignored", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    assert _function_body(Path(script.path).read_text(), "upgrade") == "pass"
    Path(script.path).unlink()

    command.downgrade(config, "base")
    engine = create_engine(db.url)
    try:
        assert inspect(engine).get_table_names() == ["alembic_version"]
    finally:
        engine.dispose()


def test_operations_render_as_code() -> None:
    layout = Layout(sequence_bits=10, worker_bits=12)
    upgrade = ops.UpgradeOps(
        ops=[
            CreateSnowflakeWorkerTablesOp(),
            CreateSnowflakeIdFunctionOp(layout=layout),
            ConvertToSnowflakePkOp("orders", server_default="snowflake_next_id()"),
            ConvertToSnowflakePkOp("lines", "line_id", schema="shop", revert_type="bigint"),
            CreateSnowflakeKeyTriggerOp("events", zero_default=False),
        ]
    )
    code = render_python_code(upgrade)
    assert "op.create_snowflake_worker_tables()" in code
    assert (
        "op.create_snowflake_id_function(layout=snowflake_db.Layout(worker_bits=12, "
        "sequence_bits=10))" in code
    )
    assert "op.convert_to_snowflake_pk('orders', server_default='snowflake_next_id()')" in code
    assert "op.convert_to_snowflake_pk('lines', 'line_id', schema='shop')" in code
    assert "op.create_snowflake_key_trigger('events', zero_default=False)" in code

    downgrade = ops.DowngradeOps(ops=[op.reverse() for op in reversed(upgrade.ops)])
    code = render_python_code(downgrade)
    assert "op.revert_snowflake_pk('lines', 'line_id', schema='shop', type_='bigint')" in code
    assert "op.revert_snowflake_pk('orders')" in code
    assert "op.drop_snowflake_id_function(layout=snowflake_db.Layout(" in code
    assert "op.drop_snowflake_worker_tables()" in code
    assert "op.drop_snowflake_key_trigger('events', zero_default=False)" in code
    assert isinstance(upgrade.ops[1].reverse(), DropSnowflakeIdFunctionOp)


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_autogenerate_turns_a_switched_model_into_a_conversion(
    backend: str, database_factory: object, tmp_path: Path
) -> None:
    db: ScratchDatabase = database_factory(backend)  # type: ignore[operator]
    config = project_with_orders(tmp_path, db)
    command.upgrade(config, "head")
    before = _snapshot_orders(db)
    # the application switched its models to the helpers: autogenerate proposes the conversion
    config.attributes["target_metadata"] = converted_models()
    script = command.revision(config, message="to snowflake", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    source = Path(script.path).read_text()
    assert _function_body(source, "upgrade") == "op.convert_to_snowflake_pk('orders')", source
    assert _function_body(source, "downgrade") == "op.revert_snowflake_pk('orders')", source
    assert "import snowflake_db.alembic" in source
    command.upgrade(config, "head")
    assert _snapshot_orders(db) == before
    engine = create_engine(db.url)
    try:
        for table, column in (("orders", "id"), ("order_items", "order_id"), ("notes", "order_id")):
            spec = {c["name"]: c for c in inspect(engine).get_columns(table)}[column]
            assert isinstance(spec["type"], BigInteger), (table, spec)
    finally:
        engine.dispose()
    again = command.revision(config, message="nothing", autogenerate=True)
    assert again is not None and not isinstance(again, list)
    assert _function_body(Path(again.path).read_text(), "upgrade") == "pass"
    Path(again.path).unlink()
    command.downgrade(config, "r1")
    assert _snapshot_orders(db) == before


def _snapshot_orders(db: ScratchDatabase) -> list[tuple[object, ...]]:
    engine = create_engine(db.url)
    try:
        with engine.connect() as conn:
            return [
                tuple(row)
                for row in conn.execute(
                    text(
                        "SELECT o.id, o.customer, i.id, i.order_id FROM orders o "
                        "JOIN order_items i ON i.order_id = o.id ORDER BY i.id"
                    )
                )
            ]
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_autogenerate_renders_the_key_function_default(
    backend: str, database_factory: object, tmp_path: Path
) -> None:
    """``snowflake_column(key_function=...)``: autogenerate writes the function call as the
    server default on PostgreSQL (``0``, the trigger's placeholder, on MariaDB), and a second
    run finds no difference without ever calling the function."""
    db: ScratchDatabase = database_factory(backend)  # type: ignore[operator]
    metadata = MetaData()
    Table(
        "orders",
        metadata,
        snowflake_column("id", key_function="snowflake_next_id"),
        Column("customer", String(50)),
    )
    worker_tables(metadata)
    config = make_project(tmp_path, db, metadata)
    config.attributes["compare_server_default"] = True
    trigger = "op.create_snowflake_key_trigger('orders')" if backend == "mariadb" else "pass"
    write_revision(
        config,
        "k1",
        None,
        "op.create_snowflake_worker_tables()\nop.create_snowflake_id_function()",
        "op.drop_snowflake_id_function()\nop.drop_snowflake_worker_tables()",
    )
    command.upgrade(config, "head")
    script = command.revision(config, message="orders", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    source = Path(script.path).read_text()
    default = "snowflake_next_id()" if backend == "postgresql" else "0"
    assert (
        f"sa.Column('id', sa.BigInteger(), server_default=sa.text('{default}'), "
        "autoincrement=False, nullable=False)"
    ) in source, source
    # MariaDB: the placeholder's CHECK, named for what its failure means; nowhere else
    check = "sa.CheckConstraint('id != 0', name='orders_id_key_trigger_missing')"
    assert (check in source) == (backend == "mariadb"), source
    assert ("CheckConstraint" in source) == (backend == "mariadb"), source
    # MariaDB: the trigger is a hand-written line after the table (autogenerate cannot see it)
    end = "    # ### end Alembic commands ###"
    Path(script.path).write_text(source.replace(end, f"    {trigger}\n{end}", 1))
    command.upgrade(config, "head")
    engine = create_engine(db.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO orders (customer) VALUES ('raw sql')"))
        worker_id = Layout().max_worker_id
        with engine.connect() as conn:
            key = conn.scalar(text("SELECT id FROM orders"))
        before = last_id(engine, worker_id)
        assert key == before and Layout().decode(key).worker_id == worker_id
        checks = [c["name"] for c in inspect(engine).get_check_constraints("orders")]
        assert checks == (["orders_id_key_trigger_missing"] if backend == "mariadb" else [])
        second = command.revision(config, message="no changes", autogenerate=True)
        assert second is not None and not isinstance(second, list)
        again = Path(second.path).read_text()
        assert _function_body(again, "upgrade") == "pass", again
        assert last_id(engine, worker_id) == before  # comparing did not call the function
    finally:
        engine.dispose()


def test_autogenerate_gives_an_existing_mariadb_table_the_trigger_check(
    mariadb_db: ScratchDatabase, tmp_path: Path
) -> None:
    """An existing key taking ``key_function=`` (a changed server default) and a new column
    with it: Alembic compares no CHECK, so the revision gets one per column from
    ``process_revision_directives``; without the trigger a raw INSERT is refused naming it,
    and the downgrade drops them."""
    metadata = MetaData()
    Table(
        "orders",
        metadata,
        snowflake_column("id", key_function="snowflake_next_id"),
        snowflake_column("number", key_function="snowflake_next_id", primary_key=False,
                         nullable=False),
        Column("customer", String(50)),
    )
    config = make_project(tmp_path, mariadb_db, metadata)
    config.attributes["compare_server_default"] = True
    write_revision(
        config,
        "k1",
        None,
        "op.create_table('orders', sa.Column('id', sa.BigInteger(), autoincrement=False, "
        "primary_key=True), sa.Column('customer', sa.String(50)))",
        "op.drop_table('orders')",
    )
    command.upgrade(config, "head")
    script = command.revision(config, message="keys", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    source = Path(script.path).read_text()
    for name, column in (("orders_id_key_trigger_missing", "id"),
                         ("orders_number_key_trigger_missing", "number")):
        assert f"op.create_check_constraint('{name}', 'orders', '`{column}` <> 0')" in source, (
            source
        )
    command.upgrade(config, "head")
    engine = create_engine(mariadb_db.url)
    try:
        with engine.connect() as conn, pytest.raises(DBAPIError, match="key_trigger_missing"):
            conn.execute(text("INSERT INTO orders (customer) VALUES ('raw sql')"))
        checks = {c["name"] for c in inspect(engine).get_check_constraints("orders")}
        assert checks == {"orders_id_key_trigger_missing", "orders_number_key_trigger_missing"}
        command.downgrade(config, "k1")
        assert inspect(engine).get_check_constraints("orders") == []
    finally:
        engine.dispose()
