"""Keys from the database for raw SQL inserts, Django's side: ``KeyFunction`` as a key column's
``db_default``, ``InstallKeyFunction`` and ``InstallKeyTrigger`` migrations, run for real
(``makemigrations``, ``migrate``, ``migrate app zero``) in a subprocess project per backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import Error
from django.db import NotSupportedError, connections, models
from django.db.migrations.state import ModelState, ProjectState
from django.test.utils import isolate_apps

from snowflake_db.django import KeyFunction, KeyTriggerCheck, SnowflakeAutoField, SnowflakeField
from snowflake_db.django.database_keys import DEFAULT_FUNCTION_NAME
from snowflake_db.django.operations import InstallKeyFunction, InstallKeyTrigger
from snowflake_db.errors import InvalidArgumentError, SnowflakeMigrationError
from snowflake_db.key_functions import DEFAULT_FUNCTION_NAME as CORE_FUNCTION_NAME
from tests.django.conftest import backends
from tests.django.scenario_support import django_database, run_step
from tests.plugins.databases import ScratchDatabase

# -- the scenario on real databases ------------------------------------------------------------


def _scenario(
    database_factory: Callable[[str], ScratchDatabase], backend: str, mode: str, workdir: Path
) -> dict[str, Any]:
    databases = {"default": django_database(database_factory(backend).url)}
    if mode == "elsewhere":
        databases["control"] = django_database(database_factory(backend).url)
    return run_step("tests.django.keys_scenario", mode, workdir, "KEYS_DATABASES", databases)


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
@pytest.mark.parametrize("mode", ["same", "elsewhere"])
def test_raw_inserts_get_keys_from_the_migrated_function(
    database_factory: Callable[[str], ScratchDatabase], backend: str, mode: str, tmp_path: Path
) -> None:
    result = _scenario(database_factory, backend, mode, tmp_path)

    # makemigrations writes the default, and nothing else of ours; nothing left to migrate.
    migration = result["migration"]
    assert (
        "('id', snowflake_db.django.fields.SnowflakeAutoField(db_default=snowflake_db.django."
        "KeyFunction(), primary_key=True, serialize=False))"
    ) in migration
    assert "('number', snowflake_db.django.fields.SnowflakeField(db_default=snowflake_db." in (
        migration
    )
    assert "snowflake_default" not in migration
    assert result["check_clean"] is True
    assert "CANNOT BE WRITTEN AS SQL" in result["sqlmigrate_function"]
    tables_sql = result["sqlmigrate_tables"]
    if backend == "postgresql":
        assert "DEFAULT (snowflake_next_id())" in tables_sql
    else:
        assert "DEFAULT (0)" in tables_sql  # MariaDB refuses a function: the trigger fills 0

    if mode == "elsewhere":
        assert result["control_unmigrated"].startswith(
            "SnowflakeMigrationError: InstallKeyFunction: the worker table "
            "snowflake_worker_slots is not in the control database (alias 'control')"
        )
    # One slot reserved for the function, in the control database's worker table.
    [slot] = result["slots_after_migrate"]
    assert slot["reserved"] is True
    assert slot["label"].startswith(
        "postgresql-function:" if backend == "postgresql" else "mariadb-function:"
    )

    # Raw INSERTs without the key: keys from the function's slot, all distinct.
    raw = result["raw_orders"] + result["raw_tickets"]
    assert len(set(raw)) == 5 and all(key > 2**40 for key in raw)
    assert result["raw_workers"] == [slot["worker_id"]]

    # The application's keys stay the application's: pk None until saved, one INSERT.
    assert result["unsaved_pk"] is None
    assert result["save_writes"] == ["INSERT"]
    assert result["app_workers"] == [3]
    assert result["all_distinct"] is True
    # Django's rule for a key with a database default: a new object's save() INSERTs.
    assert result["existing_pk_save"] == "IntegrityError"

    # Run twice: refused with the reason, no second slot taken.
    assert result["twice"].startswith("SnowflakeMigrationError: InstallKeyFunction: a function")
    assert "already exists" in result["twice"]
    assert result["slots_after_twice"] == result["slots_after_migrate"]

    # Reversed: the function is gone and its slot free; reversed again: a clear error.
    assert result["function_after_zero"] is None
    [released] = result["slots_after_zero"]
    assert released["reserved"] is False
    assert released["high_water_ms"] >= result["last_raw_ms"]  # a later holder starts above
    assert result["reverse_missing"].startswith(
        "SnowflakeMigrationError: InstallKeyFunction (reversed): there is no function"
    )
    # Migrated forward again: a slot again, and raw inserts work.
    assert [s["reserved"] for s in result["slots_after_remigrate"]].count(True) == 1
    assert len(result["raw_after_remigrate"]) == 1


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_an_existing_key_with_rows_takes_the_default(
    database_factory: Callable[[str], ScratchDatabase], backend: str, tmp_path: Path
) -> None:
    """The recipe's path for existing tables: ``db_default=KeyFunction()`` added to a key that
    has rows and a foreign key to it is an ``AlterField``; then raw inserts get keys."""
    databases = {"default": django_database(database_factory(backend).url)}
    run_step("tests.django.keys_scenario", "same", tmp_path, "KEYS_DATABASES", databases)
    result = run_step(
        "tests.django.keys_scenario", "same-alter", tmp_path, "KEYS_DATABASES", databases
    )
    assert "migrations.AlterField(" in result["migration"]
    assert "db_default=snowflake_db.django.KeyFunction()" in result["migration"]
    assert result["check_clean"] is True
    assert result["raw_workers"] == [result["function_worker"]]
    assert result["old_kept"] is True and result["items"] == 2
    assert result["app_worker"] == 3


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_without_the_trigger_a_raw_insert_fails_naming_the_check(
    database_factory: Callable[[str], ScratchDatabase], backend: str, tmp_path: Path
) -> None:
    """MariaDB: ``KeyTriggerCheck`` refuses the placeholder 0 a missing trigger leaves (never
    migrated, or reversed), and lets the trigger's keys through; PostgreSQL needs neither."""
    databases = {"default": django_database(database_factory(backend).url)}
    result = run_step("tests.django.keys_scenario", "no-trigger", tmp_path, "KEYS_DATABASES",
                      databases)
    assert "snowflake_db.django.KeyTriggerCheck(name='keyapp_order_id_key_trigger_missing')" in (
        result["migration"]
    )
    assert "snowflake_db.django.KeyTriggerCheck(field_name='number', name='keyapp_ticket_" in (
        result["migration"]
    )
    assert result["check_clean"] is True
    with_trigger = result["with_trigger"]
    for key in ("order", "ticket"):
        assert len(with_trigger[key]) == 1 and with_trigger[key][0] > 2**40
    if backend == "postgresql":  # the default is the function itself: no trigger to miss
        assert "CHECK" not in result["sqlmigrate_tables"]
        for state in ("without_trigger", "trigger_reversed"):
            assert result[state]["order"][0] > 2**40 and result[state]["ticket"][0] > 2**40
        assert with_trigger["order_zero"] == [0]  # a key the INSERT gives is kept, as ever
        return
    assert with_trigger["order_zero"][0] > 2**40  # MariaDB's trigger replaces a given 0
    for state in ("without_trigger", "trigger_reversed"):
        attempts = result[state]
        for key, constraint in (
            ("order", "keyapp_order_id_key_trigger_missing"),
            ("order_zero", "keyapp_order_id_key_trigger_missing"),
            ("ticket", "keyapp_ticket_number_key_trigger_missing"),
        ):
            assert f"CONSTRAINT `{constraint}` failed" in attempts[key], (state, attempts)
    assert (
        "CONSTRAINT `keyapp_order_id_key_trigger_missing` CHECK (`id` <> 0)"
        in result["sqlmigrate_tables"]
    )


# -- bad arguments, SQLite, checks (no server needed) -------------------------------------------


def test_the_default_function_name_is_the_core_one() -> None:
    assert DEFAULT_FUNCTION_NAME == CORE_FUNCTION_NAME


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: InstallKeyFunction("next id"), "function name 'next id'"),
        (lambda: InstallKeyFunction(schema="a;b"), "schema name 'a;b'"),
        (lambda: InstallKeyFunction(rollback_tolerance_ms=-1), "rollback_tolerance_ms=-1"),
        (lambda: InstallKeyFunction(max_wait_ms=1.5), "max_wait_ms=1.5"),
        (lambda: InstallKeyFunction(label=""), "label=''"),
        (lambda: InstallKeyTrigger(""), "model_name=''"),
        (lambda: KeyFunction("1st"), "function name '1st'"),
    ],
)
def test_bad_arguments_are_refused_with_the_value(make: Callable[[], Any], words: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        make()
    assert words in str(caught.value)


def test_operations_deconstruct_only_what_was_given() -> None:
    assert InstallKeyFunction().deconstruct() == ("InstallKeyFunction", [], {})
    assert InstallKeyFunction("ids", schema="keys", max_wait_ms=50).deconstruct() == (
        "InstallKeyFunction", ["ids"], {"schema": "keys", "max_wait_ms": 50}
    )
    assert InstallKeyTrigger("order").deconstruct() == ("InstallKeyTrigger", ["order"], {})
    assert KeyFunction().deconstruct() == ("snowflake_db.django.KeyFunction", (), {})
    assert KeyFunction("ids", "keys") == KeyFunction("ids", "keys") != KeyFunction()


def test_sqlite_refuses_the_operations_with_the_reason() -> None:
    state = ProjectState()
    state.add_model(ModelState("shop", "Plain", [("id", SnowflakeAutoField(primary_key=True))]))
    editor = connections["default"].schema_editor()  # refused before any use
    with pytest.raises(SnowflakeMigrationError, match="SQLite has no stored functions"):
        InstallKeyFunction().database_forwards("shop", editor, state, state)
    with pytest.raises(SnowflakeMigrationError, match="need PostgreSQL or MariaDB"):
        InstallKeyFunction().database_backwards("shop", editor, state, state)
    with pytest.raises(SnowflakeMigrationError, match="InstallKeyTrigger on database alias"):
        InstallKeyTrigger("plain").database_forwards("shop", editor, state, state)


@isolate_apps("tests.django_project.shop")
def test_key_function_default_is_refused_on_sqlite_by_check_and_ddl() -> None:
    class Keyed(models.Model):
        id = SnowflakeAutoField(primary_key=True, db_default=KeyFunction())
        number = SnowflakeField(db_default=KeyFunction())

        class Meta:
            app_label = "shop"

    errors = [
        error for error in Keyed.check(databases=["default"]) if isinstance(error, Error)
    ]
    assert [error.id for error in errors] == ["snowflake_db.E015", "snowflake_db.E015"]
    assert "'default' (sqlite) has no stored functions" in errors[0].msg
    assert Keyed.check() == []  # without databases (plain `check`) nothing is said
    assert Keyed(number=5).pk is None  # AutoField's contract, default or not
    editor = connections["default"].schema_editor(collect_sql=True)
    with pytest.raises(NotSupportedError, match="SQLite has no stored functions"):
        editor.column_sql(Keyed, Keyed._meta.pk)


@backends("postgresql")
def test_trigger_on_postgresql_needs_the_field_default(backend: str) -> None:
    """On PostgreSQL the column's default is the key: a trigger operation for a field without
    ``db_default=KeyFunction()`` says so instead of doing nothing."""
    state = ProjectState()
    state.add_model(ModelState("shop", "Plain", [("id", SnowflakeAutoField(primary_key=True))]))
    with (
        connections[backend].schema_editor() as editor,
        pytest.raises(SnowflakeMigrationError, match="db_default=KeyFunction"),
    ):
        InstallKeyTrigger("plain").database_forwards("shop", editor, state, state)



@backends("mariadb")
def test_a_key_function_field_on_mariadb_needs_its_trigger_check(backend: str) -> None:
    """E016 where the model migrates to MariaDB, for each field without its KeyTriggerCheck;
    a model that declares them is clean."""
    with isolate_apps("tests.django_project.shop"):

        class Bare(models.Model):
            id = SnowflakeAutoField(primary_key=True, db_default=KeyFunction())
            number = SnowflakeField(db_default=KeyFunction())

            class Meta:
                app_label = "shop"

        class Guarded(models.Model):
            id = SnowflakeAutoField(primary_key=True, db_default=KeyFunction())
            number = SnowflakeField(db_default=KeyFunction())

            class Meta:
                app_label = "shop"
                constraints = [KeyTriggerCheck(), KeyTriggerCheck("number")]

        errors = Bare.check(databases=[backend])
        assert [error.id for error in errors] == ["snowflake_db.E016", "snowflake_db.E016"]
        assert "shop.Bare.id has db_default=KeyFunction()" in errors[0].msg
        assert "Add KeyTriggerCheck() (from snowflake_db.django)" in errors[0].hint
        assert "Add KeyTriggerCheck('number')" in errors[1].hint
        assert Guarded.check(databases=[backend]) == []
        assert Bare.check() == []  # without databases (plain `check`) nothing is said
        names = [constraint.name for constraint in Guarded._meta.constraints]
        assert names == ["shop_guarded_id_key_trigger_missing",
                         "shop_guarded_number_key_trigger_missing"]


def test_trigger_check_deconstructs_with_its_formatted_name_and_is_silent_elsewhere() -> None:
    check = KeyTriggerCheck("number", name="orders_number_guard")
    assert check.deconstruct() == (
        "snowflake_db.django.KeyTriggerCheck", (), {"field_name": "number",
                                                    "name": "orders_number_guard"}
    )
    assert check.clone() == check != KeyTriggerCheck(name="orders_number_guard")
    assert KeyTriggerCheck().deconstruct()[2] == {
        "name": "%(app_label)s_%(class)s_id_key_trigger_missing"
    }
    with pytest.raises(InvalidArgumentError, match="field_name=''"):
        KeyTriggerCheck("")
    editor = connections["default"].schema_editor(collect_sql=True)  # SQLite: nothing
    with isolate_apps("tests.django_project.shop"):

        class Keyed(models.Model):
            number = SnowflakeField()

            class Meta:
                app_label = "shop"

        assert check.constraint_sql(Keyed, editor) is None
        assert check.create_sql(Keyed, editor) is None
        assert check.remove_sql(Keyed, editor) is None
        check.validate(Keyed, Keyed(number=0))  # nothing to validate in Python
