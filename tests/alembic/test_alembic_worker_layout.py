"""The worker layout table through Alembic: the server-side ID function's reservation respects
the recorded layout. (The layout table's own operation, for installs from before it, was a
pre-release shim: removed; ``op.create_snowflake_worker_tables()`` creates all three tables.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, create_engine, select

from snowflake_db import Layout, LayoutMismatchError, MonotonicClock
from snowflake_db.worker import worker_tables
from snowflake_db.worker._layout_record import layout_text

from ..plugins.alembic_support import make_project, write_revision
from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import allocator, read_slots


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
    [label] = labels
    assert label.startswith(f"postgresql-function:{postgres_db.url.database}@")
    assert label.endswith(":public.snowflake_next_id")
    command.downgrade(config, "base")
