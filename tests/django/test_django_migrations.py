"""Migrations: generated text, the shipped worker-table migration against the allocator's schema,
and switching an existing BigAutoField project to SnowflakeAutoField on every backend."""

from __future__ import annotations

import io
import sys
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import override_settings
from sqlalchemy import MetaData, create_engine, inspect
from sqlalchemy.engine import URL

from snowflake_db.django.worker import sqlalchemy_url
from snowflake_db.worker import worker_tables
from tests.django.scenario_support import django_database, run_step
from tests.plugins.databases import create_database, drop_database


# makemigrations checks the migration history of every alias.
@pytest.mark.django_db(databases="__all__")
def test_shipped_worker_migration_matches_the_models() -> None:
    out = io.StringIO()
    call_command("makemigrations", "snowflake_db", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db(databases="__all__")
def test_makemigrations_text_has_no_function_paths(tmp_path: Path) -> None:
    package = f"sfdb_mig_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        with override_settings(MIGRATION_MODULES={"shop": f"{package}.shop_migrations"}):
            call_command("makemigrations", "shop", verbosity=0)
    finally:
        sys.path.remove(str(tmp_path))
    text = (tmp_path / package / "shop_migrations" / "0001_initial.py").read_text()
    assert "import snowflake_db.django.fields" in text
    # Automatic pk (DEFAULT_AUTO_FIELD), explicit pk and the secondary SnowflakeField:
    assert (
        "('id', snowflake_db.django.fields.SnowflakeAutoField(auto_created=True, "
        "primary_key=True, serialize=False, verbose_name='ID'))"
    ) in text
    assert "('id', snowflake_db.django.fields.SnowflakeAutoField(primary_key=True, " in text
    assert "('number', snowflake_db.django.fields.SnowflakeField())" in text
    assert "('id', models.BigAutoField(primary_key=True, serialize=False))" in text
    assert "snowflake_default" not in text and "process" not in text
    assert "default=" not in (
        text.replace("default=''", "").replace("default=0", "").replace("default=False", "")
    )


def _reflect(url: URL) -> dict[str, dict[str, tuple[str, bool, bool]]]:
    engine = create_engine(url)
    try:
        inspector = inspect(engine)
        tables = {}
        for table in (
            "snowflake_worker_slots", "snowflake_worker_registrations", "snowflake_worker_layout"
        ):
            pk = set(inspector.get_pk_constraint(table)["constrained_columns"])
            tables[table] = {
                column["name"]: (
                    type(column["type"]).__name__.upper().replace("BIGINTEGER", "BIGINT"),
                    bool(column["nullable"]),
                    column["name"] in pk,
                )
                for column in inspector.get_columns(table)
            }
            if table == "snowflake_worker_slots":
                default = next(
                    c["default"] for c in inspector.get_columns(table)
                    if c["name"] == "high_water_ms"
                )
                tables[table]["high_water_ms default"] = (str(default).strip("'()"), False, False)
        return tables
    finally:
        engine.dispose()


def _normalise(name: str) -> str:
    name = name.upper()
    return {"BIGINTEGER": "BIGINT", "INTEGER": "INTEGER", "INT": "INTEGER"}.get(name, name)


def test_migrated_worker_tables_mirror_the_allocator_schema(tx_backend: str) -> None:
    """Same column names, types, nullability, primary keys and high_water_ms default as
    snowflake_db.worker._schema (which the table allocator's SQL is written against)."""
    engine = create_engine(sqlalchemy_url(tx_backend))
    dialect = engine.dialect
    engine.dispose()
    expected: dict[str, dict[str, tuple[str, bool, bool]]] = {}
    for table in worker_tables(MetaData()):
        expected[table.name] = {
            column.name: (
                _normalise(column.type.compile(dialect=dialect).split("(")[0]),
                bool(column.nullable),
                column.primary_key,
            )
            for column in table.columns
        }
    expected["snowflake_worker_slots"]["high_water_ms default"] = ("0", False, False)
    actual = _reflect(sqlalchemy_url(tx_backend))
    for columns in actual.values():
        for name, (kind, nullable, pk) in columns.items():
            columns[name] = (_normalise(kind), nullable, pk)
    assert actual == expected


# -- switching DEFAULT_AUTO_FIELD -------------------------------------------------------------


def _step(step: str, workdir: Path, database: dict[str, object]) -> dict[str, object]:
    return run_step("tests.django.switch_scenario", step, workdir, "SWITCH_DATABASE", database)


@pytest.mark.parametrize("backend_name", ["postgresql", "mariadb", "sqlite"])
def test_switching_default_auto_field_gives_a_clean_migration(
    backend_name: str, tmp_path: Path
) -> None:
    from tests.django.conftest import BACKEND_ALIASES, _require

    _require(BACKEND_ALIASES[backend_name])
    scratch = create_database(backend_name, tmp_path)
    try:
        database = django_database(scratch.url)
        before = _step("before", tmp_path, database)
        after = _step("after", tmp_path, database)
    finally:
        drop_database(scratch)
    migration = str(after["migration"])
    assert "migrations.AlterField(" in migration
    assert "model_name='shelf'" in migration and "model_name='book'" in migration
    assert "snowflake_db.django.fields.SnowflakeAutoField(auto_created=True" in migration
    assert "snowflake_default" not in migration
    assert after["check_clean"] is True  # makemigrations --check: nothing left to migrate
    assert after["new_pk_before_save"] is None  # AutoField's contract: no key until saved
    assert isinstance(after["new_pk_after_save"], int)
    pks = after["pks"]
    assert isinstance(pks, list) and pks[0] == before["old_pk"] and pks[1] > 2**53
    assert after["book_shelves"] == pks
    sql = str(after["sql"]).upper()
    column = after["column"]
    assert isinstance(column, list)
    if backend_name == "postgresql":
        assert "DROP IDENTITY" in sql
        assert column == ["NO", None, "bigint"]
        assert after["sequences"] == 0
    elif backend_name == "mariadb":
        assert "AUTO_INCREMENT" not in str(column[0]).upper() and column[1] == "bigint"
    else:
        assert "AUTOINCREMENT" not in str(column[0]).upper()
    assert after["fk_type"] == "BigIntegerField"


def test_migration_recorder_needs_no_worker_id() -> None:
    """django_migrations takes DEFAULT_AUTO_FIELD too; its rows come from the database so that
    `migrate` runs before any worker ID exists (and on old 32-bit django_migrations tables)."""
    from django.db.migrations.recorder import MigrationRecorder

    field = MigrationRecorder.Migration._meta.pk
    assert field.database_generated and not field.has_default()
    assert field in MigrationRecorder.Migration._meta.db_returning_fields
    assert "AUTO" in field.db_type_suffix(connections["default"]).upper()
