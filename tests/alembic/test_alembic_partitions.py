"""The partition operations through a real ``alembic upgrade``/``downgrade`` on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import render_python_code
from alembic.operations import ops
from sqlalchemy import create_engine, text

import snowflake_db
from snowflake_db.alembic import (
    AddNextTimePartitionOp,
    CreateShardPartitionedTableOp,
    CreateTimePartitionedTableOp,
    SnowflakeMigrationError,
)

from ..plugins.alembic_support import make_project, write_revision
from ..plugins.databases import ScratchDatabase

SHARDED = snowflake_db.Layout(time_bits=41, worker_bits=10, sequence_bits=8, shard_bits=4)
DEFAULT = snowflake_db.Layout()

UP = """
layout = snowflake_db.Layout(time_bits=41, worker_bits=10, sequence_bits=8, shard_bits=4)
op.create_shard_partitioned_table(
    "orders", "id bigint NOT NULL, customer_id bigint NOT NULL", layout
)
op.create_time_partitioned_table(
    "events", "id bigint PRIMARY KEY, kind text NOT NULL", snowflake_db.Layout(),
    start=datetime.datetime(2026, 10, 15, tzinfo=datetime.UTC), periods=2, period="month",
)
op.add_next_time_partition("events", snowflake_db.Layout(), period="month")
"""
DOWN = """
op.drop_table("events")
op.drop_table("orders")
"""


def test_partition_operations_upgrade_and_downgrade(
    tmp_path: Path, postgres_db: ScratchDatabase
) -> None:
    config = make_project(tmp_path, postgres_db)
    write_revision(config, "parts", None, "import datetime\n" + UP, DOWN)
    command.upgrade(config, "head")
    engine = create_engine(postgres_db.url)
    try:
        generator = snowflake_db.SnowflakeGenerator(3, layout=SHARDED)
        with engine.begin() as connection:
            for shard in (0, 7, 15):
                connection.execute(
                    text("INSERT INTO orders (id, customer_id) VALUES (:id, 1)"),
                    {"id": generator.next_id_in_shard(shard)},
                )
            placed = connection.execute(
                text("SELECT tableoid::regclass::text, id FROM orders ORDER BY id")
            ).all()
            assert {(name, SHARDED.decode(i).shard) for name, i in placed} == {
                ("orders_s00", 0), ("orders_s07", 7), ("orders_s15", 15)
            }
            events = connection.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = 'events'::regclass ORDER BY 1"
                )
            ).scalars().all()
            # October and November from the create op, December from add_next_time_partition.
            assert events == ["events_p202610", "events_p202611", "events_p202612"]
            december = DEFAULT.min_id_for_time(datetime(2026, 12, 31, 23, 59, tzinfo=UTC))
            connection.execute(text("INSERT INTO events VALUES (:id, 'x')"), {"id": december})
            where = connection.execute(text("SELECT tableoid::regclass::text FROM events"))
            assert where.scalar_one() == "events_p202612"
        command.downgrade(config, "base")
        with engine.connect() as connection:
            remaining = connection.execute(
                text("SELECT count(*) FROM pg_class WHERE relname LIKE 'orders%' "
                     "OR relname LIKE 'events%'")
            ).scalar_one()
            assert remaining == 0
    finally:
        engine.dispose()


def test_partition_operations_refuse_other_databases(
    tmp_path: Path, sqlite_db: ScratchDatabase
) -> None:
    config = make_project(tmp_path, sqlite_db)
    write_revision(config, "parts", None, "import datetime\n" + UP, DOWN)
    with pytest.raises(SnowflakeMigrationError, match="PostgreSQL only, not sqlite"):
        command.upgrade(config, "head")


def test_partition_operations_render_and_reverse() -> None:
    start = datetime(2026, 10, 15, tzinfo=UTC)
    upgrade = ops.UpgradeOps(
        ops=[
            CreateShardPartitionedTableOp("orders", "id bigint NOT NULL", SHARDED),
            CreateTimePartitionedTableOp(
                "shop.events", "id bigint PRIMARY KEY", DEFAULT, start=start, periods=2
            ),
            AddNextTimePartitionOp("events", DEFAULT, period="week"),
        ]
    )
    code = render_python_code(upgrade)
    assert (
        "op.create_shard_partitioned_table('orders', 'id bigint NOT NULL', "
        "snowflake_db.Layout(sequence_bits=8, shard_bits=4))" in code
    ), code
    assert (
        "op.create_time_partitioned_table('shop.events', 'id bigint PRIMARY KEY', "
        f"snowflake_db.Layout(), start={start!r}, periods=2)" in code
    ), code
    assert "op.add_next_time_partition('events', snowflake_db.Layout(), period='week')" in code

    downgrade = ops.DowngradeOps(ops=[op.reverse() for op in reversed(upgrade.ops[:2])])
    code = render_python_code(downgrade)
    assert "op.drop_table('events', schema='shop')" in code, code
    assert "op.drop_table('orders')" in code, code
    with pytest.raises(NotImplementedError, match="drop it by name"):
        upgrade.ops[2].reverse()
