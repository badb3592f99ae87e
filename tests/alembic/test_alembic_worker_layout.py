"""The worker layout table through Alembic: autogenerate on an install from before it writes
``op.create_snowflake_worker_layout_table()``, upgrade/downgrade run for real on PostgreSQL,
MariaDB and SQLite, old and new revisions combine in both directions, and the server-side ID
function's reservation respects the recorded layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import render_python_code
from alembic.operations import ops
from sqlalchemy import MetaData, create_engine, inspect, select

from snowflake_db import Layout, LayoutMismatchError, MonotonicClock
from snowflake_db.alembic import (
    CreateSnowflakeWorkerLayoutTableOp,
    DropSnowflakeWorkerLayoutTableOp,
)
from snowflake_db.worker import worker_tables
from snowflake_db.worker.layouts import layout_text

from ..plugins.alembic_support import make_project, write_revision
from ..plugins.databases import ScratchDatabase
from ..plugins.outage_support import STEADY_LEASE_SECONDS
from ..plugins.worker_support import allocator, read_slots


def _body(source: str, name: str) -> list[str]:
    match = re.search(rf"def {name}\(\) -> None:\n(.*?)(?=\n\ndef |\Z)", source, re.S)
    assert match, source
    return [
        line.strip()
        for line in match.group(1).splitlines()
        if line.strip() and not line.strip().startswith(('"""', "#"))
    ]


def _tables(db: ScratchDatabase) -> set[str]:
    engine = create_engine(db.url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_autogenerate_adds_the_layout_table_to_an_older_install(
    any_db: ScratchDatabase, tmp_path: Path
) -> None:
    # An install from before the layout table: slots (one used, with its mark) and registrations.
    old = worker_tables(MetaData())
    engine = create_engine(any_db.url)
    try:
        with engine.begin() as connection:
            old.slots.create(connection)
            old.registrations.create(connection)
            connection.execute(old.slots.insert().values(worker_id=5, high_water_ms=1234))
    finally:
        engine.dispose()
    metadata = MetaData()
    worker_tables(metadata)  # the application's metadata, as the README says to do
    config = make_project(tmp_path, any_db, metadata)

    script = command.revision(config, message="layout table", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    source = Path(script.path).read_text()
    assert _body(source, "upgrade") == ["op.create_snowflake_worker_layout_table()"], source
    assert _body(source, "downgrade") == ["op.drop_snowflake_worker_layout_table()"], source
    assert "import snowflake_db.alembic" in source

    command.upgrade(config, "head")
    assert _tables(any_db) == {
        "snowflake_worker_slots", "snowflake_worker_registrations", "snowflake_worker_layout"
    }
    again = command.revision(config, message="nothing left", autogenerate=True)
    assert again is not None and not isinstance(again, list)
    assert _body(Path(again.path).read_text(), "upgrade") == ["pass"]
    Path(again.path).unlink()

    # The first process adopts its layout (the migration leaves the table empty).
    # The steady lease: this test judges no lease timing, and a 2 s lease's 2 s read timeout
    # lost a MariaDB COMMIT beside the lease benchmark (AllocatorUnavailableError, a safe refusal).
    with allocator(any_db, create_tables=False, lease_seconds=STEADY_LEASE_SECONDS) as alloc:
        alloc.acquire(layout=Layout(worker_bits=9, sequence_bits=13), clock=MonotonicClock())
        with pytest.raises(LayoutMismatchError):
            alloc.acquire(layout=Layout(), clock=MonotonicClock())
    assert read_slots(any_db.url)[5].high_water_ms == 1234

    command.downgrade(config, "base")
    assert _tables(any_db) == {"snowflake_worker_slots", "snowflake_worker_registrations"}


def test_old_and_new_worker_table_revisions_combine_both_ways(
    any_db: ScratchDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``create_snowflake_worker_tables()`` now makes the layout table too; a later revision
    adding it (written for installs from before) must still run, and both must downgrade."""
    config = make_project(tmp_path, any_db)
    write_revision(config, "w1", None, "op.create_snowflake_worker_tables()",
                   "op.drop_snowflake_worker_tables()")
    write_revision(config, "w2", "w1", "op.create_snowflake_worker_layout_table()",
                   "op.drop_snowflake_worker_layout_table()")
    command.upgrade(config, "w2", sql=True)  # offline: plain DDL
    offline = capsys.readouterr().out
    assert "CREATE TABLE IF NOT EXISTS snowflake_worker_layout" in offline
    command.upgrade(config, "head")
    assert "snowflake_worker_layout" in _tables(any_db)
    command.downgrade(config, "w1")
    assert "snowflake_worker_layout" not in _tables(any_db)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    assert _tables(any_db) == set()


def test_layout_table_operations_render_and_reverse() -> None:
    upgrade = ops.UpgradeOps(
        ops=[
            CreateSnowflakeWorkerLayoutTableOp(),
            CreateSnowflakeWorkerLayoutTableOp(slots_table="billing_slots", schema="ops"),
        ]
    )
    code = render_python_code(upgrade)
    assert "op.create_snowflake_worker_layout_table()" in code
    assert (
        "op.create_snowflake_worker_layout_table(slots_table='billing_slots', schema='ops')"
    ) in code
    reverse = upgrade.ops[1].reverse()
    assert isinstance(reverse, DropSnowflakeWorkerLayoutTableOp)
    assert reverse.slots_table == "billing_slots" and reverse.schema == "ops"
    assert isinstance(reverse.reverse(), CreateSnowflakeWorkerLayoutTableOp)
    assert worker_tables(MetaData(), slots_table="billing_slots").layout.name == "billing_layout"


@pytest.mark.static_worker(4)
def test_id_function_reservation_respects_the_recorded_layout(
    postgres_db: ScratchDatabase, tmp_path: Path
) -> None:
    with allocator(postgres_db) as alloc:
        alloc.acquire(layout=Layout(), clock=MonotonicClock())  # the application's layout
    config = make_project(tmp_path, postgres_db)
    write_revision(
        config, "f1", None,
        "op.create_snowflake_id_function(layout=snowflake_db.Layout(worker_bits=9, "
        "sequence_bits=13))",
        "op.drop_snowflake_id_function(layout=snowflake_db.Layout(worker_bits=9, "
        "sequence_bits=13))",
    )
    with pytest.raises(LayoutMismatchError, match="worker_bits 10 vs 9"):
        command.upgrade(config, "head")
    assert not [row for row in read_slots(postgres_db.url).values() if row.reserved]
    engine = create_engine(postgres_db.url)
    try:
        with engine.connect() as connection:
            recorded = connection.execute(select(worker_tables(MetaData()).layout.c.layout)).all()
    finally:
        engine.dispose()
    assert [row[0] for row in recorded] == [layout_text(Layout())]  # the application's, unchanged

    # With the application's layout the function gets its slot.
    (Path(config.get_main_option("script_location") or "") / "versions" / "f1.py").unlink()
    write_revision(config, "f1", None, "op.create_snowflake_id_function()",
                   "op.drop_snowflake_id_function()")
    command.upgrade(config, "head")
    labels = [row.label for row in read_slots(postgres_db.url).values() if row.reserved]
    assert labels == [f"postgresql-function:{postgres_db.url.database}:public.snowflake_next_id"]
    command.downgrade(config, "base")
