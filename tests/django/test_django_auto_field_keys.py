"""``SNOWFLAKE_DB["AUTO_FIELD_DATABASE_KEYS"]``: every ``SnowflakeAutoField`` key, the automatic
one of ``DEFAULT_AUTO_FIELD`` included, takes a key from the database when a raw ``INSERT``
leaves it out, as ``BigAutoField``'s identity does; run for real (``makemigrations``,
``migrate``, raw SQL, the ORM) in a subprocess project per backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from snowflake_db.django.conf import parse
from tests.django.scenario_support import django_database, run_step
from tests.plugins.databases import ScratchDatabase

SCENARIO = "tests.django.auto_keys_scenario"


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
@pytest.mark.parametrize("mode", ["same", "elsewhere"])
def test_raw_inserts_into_automatic_keys_get_keys_from_the_database(
    database_factory: Callable[[str], ScratchDatabase], backend: str, mode: str, tmp_path: Path
) -> None:
    databases = {"default": django_database(database_factory(backend).url)}
    if mode == "elsewhere":
        databases["control"] = django_database(database_factory(backend).url)
    result = run_step(SCENARIO, mode, tmp_path, "KEYS_DATABASES", databases)

    # The migrations are the same with the setting or without it.
    assert "db_default" not in result["migration"] and "KeyFunction" not in result["migration"]
    if mode == "elsewhere":
        assert result["control_unmigrated"].startswith(
            "SnowflakeMigrationError: AUTO_FIELD_DATABASE_KEYS: the worker table "
            "snowflake_worker_slots is not in the control database (alias 'control'): migrate "
            "snowflake_db there first"
        )
    # migrate installed the function on a reserved slot and gave each key its database key:
    # the three automatic keys (the many-to-many table's too) and the explicit one, not the
    # BigAutoField; a second migrate finds nothing to do.
    [slot] = result["slots"]
    assert slot["reserved"] is True
    lines = result["migrate"].splitlines()
    installed = f"snowflake_db: installed snowflake_next_id() on worker ID {slot['worker_id']}"
    assert lines[0] == installed
    given = "DEFAULT snowflake_next_id()" if backend == "postgresql" else "trigger"
    keyed = ["autoapp_explicit.id", "autoapp_order.id", "autoapp_order_tags.id", "autoapp_tag.id"]
    accented = "snowflake_db: autoapp_héllo.id: "
    skipped = (accented + "no trigger, the name is not a plain identifier (letters, digits, "
               "underscores): an INSERT without the key fails there")
    if backend == "postgresql":  # any table name: Django quotes it
        keyed = sorted([*keyed, "autoapp_héllo.id"])
        assert result["accented"] is None
        assert result["migrate_again"] == ""
        assert result["missing_after"] == []
    else:  # the key functions make triggers for plain names only: said, and loud at insert
        assert skipped in lines
        lines.remove(skipped)
        assert "Field 'id' doesn't have a default value" in result["accented"]
        assert result["migrate_again"] == skipped
        assert result["missing_after"] == [["autoapp_héllo", "id"]]
    assert sorted(line.split(": ")[1] for line in lines[1:]) == keyed
    assert all(given in line for line in lines[1:])

    # Raw inserts (one row, executemany, the many-to-many table): keys from the function.
    assert result["raw_errors"] == [None] * 6
    assert len(result["raw"]) == 6 and len(set(result["raw"])) == 6
    assert all(key > 2**40 for key in result["raw"])
    assert result["raw_workers"] == [slot["worker_id"]]
    assert result["counted"] == [1]  # the BigAutoField table keeps its identity

    # The ORM: AutoField's rules, unchanged by a database key.
    assert result["unsaved_pk"] is None
    assert result["save_writes"] == ["INSERT"]
    assert result["app_workers"] == [3]
    assert result["existing_pk_save"] == [["again"]]

    # Taken away by hand: loud (never a key 0), and the next migrate gives it back.
    if backend == "postgresql":
        assert 'null value in column "id"' in result["without"]
    else:
        assert "Field 'id' doesn't have a default value" in result["without"]
    repaired = "snowflake_db: autoapp_order.id: " + (
        "DEFAULT snowflake_next_id()" if backend == "postgresql"
        else "trigger autoapp_order_id_snowflake_key")
    assert result["migrate_repair"] == "\n".join(
        [repaired] if backend == "postgresql" else [skipped, repaired])
    assert result["after_repair"] is None


def test_sqlite_has_no_function_and_numbers_rows_itself(
    database_factory: Callable[[str], ScratchDatabase], tmp_path: Path
) -> None:
    """SQLite: migrate changes nothing and raw inserts take the 64-bit rowid's next number."""
    databases = {"default": django_database(database_factory("sqlite").url)}
    result = run_step(SCENARIO, "same", tmp_path, "KEYS_DATABASES", databases)
    assert result["migrate"] == "" and result["missing_after"] == []
    assert result["raw_errors"] == [None] * 6
    assert all(0 < key < 100 for key in result["raw"])
    assert result["save_writes"] == ["INSERT"] and result["app_workers"] == [3]


def test_the_setting_takes_true_or_false_only() -> None:
    assert parse({}).auto_field_database_keys is False
    assert parse({"AUTO_FIELD_DATABASE_KEYS": True}).auto_field_database_keys is True
    with pytest.raises(ImproperlyConfigured, match=r"AUTO_FIELD_DATABASE_KEYS must be True or "
                                                   r"False, got 'yes'"):
        parse({"AUTO_FIELD_DATABASE_KEYS": "yes"})
