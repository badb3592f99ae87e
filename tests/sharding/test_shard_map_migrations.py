"""The shard map tables through Alembic: ``op.create_snowflake_shard_map_tables()`` creates
exactly what :mod:`snowflake_db.sharding.shard_map` defines (autogenerate then finds nothing),
the map's functions work on them, and the downgrade drops them, on every backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, create_engine, inspect

from snowflake_db import Layout
from snowflake_db.sharding.shard_map import (
    TABLE_NAMES,
    flip_shard,
    init_shard_map,
    read_shard_map,
    shard_map_tables,
)
from tests.plugins.alembic_support import make_project, write_revision
from tests.plugins.databases import ScratchDatabase


def _upgrade_body(source: str) -> str:
    match = re.search(r"def upgrade\(\)[^:]*:\n(.*?)(?:\n\n|\Z)", source, re.S)
    assert match is not None, source
    lines = [line.strip() for line in match.group(1).splitlines()]
    return "\n".join(line for line in lines if line and not line.startswith(("#", "\"\"\"")))


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_the_alembic_operation_creates_the_schema(
    backend: str, database_factory: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db: ScratchDatabase = database_factory(backend)  # type: ignore[operator]
    metadata = MetaData()
    shard_map_tables(metadata)
    config = make_project(tmp_path, db, metadata)
    write_revision(
        config, "m1", None,
        "op.create_snowflake_shard_map_tables()", "op.drop_snowflake_shard_map_tables()",
    )
    command.upgrade(config, "m1", sql=True)  # offline: plain DDL
    offline = capsys.readouterr().out
    assert "CREATE TABLE snowflake_shard_map_version" in offline
    assert "CHECK (state IN ('serving', 'moving', 'cutover'))" in offline
    command.upgrade(config, "head")
    script = command.revision(config, message="check", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    assert _upgrade_body(Path(script.path).read_text()) == "pass"
    Path(script.path).unlink()

    # Without the tables in the metadata, include_object keeps them out of the diff.
    config.attributes["target_metadata"] = MetaData()
    script = command.revision(config, message="ignored", autogenerate=True)
    assert script is not None and not isinstance(script, list)
    assert _upgrade_body(Path(script.path).read_text()) == "pass"
    Path(script.path).unlink()

    engine = create_engine(db.url)
    try:
        layout = Layout(sequence_bits=8, shard_bits=1)
        init_shard_map(engine, layout=layout, assignment=["a", "b"], backend="postgresql")
        flip_shard(engine, 0, "b")
        assert read_shard_map(engine).mapping == {0: "b", 1: "b"}
        command.downgrade(config, "base")
        left = set(inspect(engine).get_table_names())
        assert left == {"alembic_version"} and not left & set(TABLE_NAMES)
    finally:
        engine.dispose()
