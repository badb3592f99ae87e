"""Run in a subprocess by test_django_database_keys: a project whose key columns carry the
database key function, migrated for real (``makemigrations``, ``migrate``, ``migrate app zero``).

Usage: ``python -m tests.django.keys_scenario MODE WORKDIR`` with ``KEYS_DATABASES`` holding the
Django ``DATABASES`` as JSON. MODE ``same``: the worker tables are in the app's database;
``elsewhere``: in the ``control`` alias (``CONTROL_DATABASE``, ``ControlDatabaseRouter``).
``same-alter`` (after ``same``, in a new process since the models change): an existing key with
rows and a foreign key to it takes ``db_default=KeyFunction()`` (an ``AlterField``).
``no-trigger``: the models carry ``KeyTriggerCheck``, migrated without the trigger migration
first (a raw ``INSERT`` must fail, not store the key 0), then with it, then back without it.
Prints a JSON result on its last line.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.django.scenario_support import write_app

MODELS = """
from django.db import models

from snowflake_db.django import KeyFunction, SnowflakeAutoField, SnowflakeField


class Order(models.Model):
    id = SnowflakeAutoField(primary_key=True, db_default=KeyFunction())
    name = models.CharField(max_length=20)


class Basket(models.Model):
    id = SnowflakeAutoField(primary_key=True{basket_default})
    name = models.CharField(max_length=20)


class Item(models.Model):
    basket = models.ForeignKey(Basket, on_delete=models.CASCADE)


class Ticket(models.Model):
    id = models.BigAutoField(primary_key=True)  # an identity key, a Snowflake number beside it
    number = SnowflakeField(db_default=KeyFunction())
    name = models.CharField(max_length=20)
"""

FUNCTION_MIGRATION = """
from django.db import migrations

from snowflake_db.django.operations import InstallKeyFunction


class Migration(migrations.Migration):
    dependencies = [("snowflake_db", "0003_shard_map")]
    operations = [InstallKeyFunction()]
"""

TRIGGER_MIGRATION = """
from django.db import migrations

from snowflake_db.django.operations import InstallKeyTrigger


class Migration(migrations.Migration):
    dependencies = [("keyapp", "{previous}")]
    operations = [InstallKeyTrigger("order"), InstallKeyTrigger("ticket", "number")]
"""

#: The application's static worker ID.
APP_WORKER = 3


def _write_app(workdir: Path) -> Path:
    app = write_app(workdir, "keyapp", MODELS.format(basket_default=""))
    (app / "migrations" / "0001_key_function.py").write_text(FUNCTION_MIGRATION)
    return app


def setup(mode: str, workdir: Path, app: str = "keyapp", **snowflake_db: Any) -> None:
    """Configure Django for the project in ``workdir`` with ``app``: the application's worker
    ID static, the worker tables in the app's database (``same``) or the ``control`` alias
    (``elsewhere``); more ``SNOWFLAKE_DB`` keys as keyword arguments."""
    sys.path.insert(0, str(workdir))
    import pymysql

    pymysql.install_as_MySQLdb()
    from django.conf import settings

    snowflake: dict[str, Any] = {
        "WORKER_SOURCE": "static", "WORKER_ID": APP_WORKER, **snowflake_db,
    }
    routers: list[str] = []
    if mode == "elsewhere":
        snowflake["CONTROL_DATABASE"] = "control"
        routers = ["snowflake_db.django.routers.ControlDatabaseRouter"]
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "snowflake_db.django", app],
        DATABASES=json.loads(os.environ["KEYS_DATABASES"]),
        DATABASE_ROUTERS=routers,
        DEFAULT_AUTO_FIELD="snowflake_db.django.fields.SnowflakeAutoField",
        SNOWFLAKE_DB=snowflake,
        USE_TZ=True,
    )
    import django

    django.setup()


def _raw_rows(cursor: Any, table: str, column: str, names: list[str]) -> list[int]:
    for name in names:
        cursor.execute(f"INSERT INTO {table} (name) VALUES (%s)", [name])
    placeholders = ", ".join(["%s"] * len(names))
    cursor.execute(
        f"SELECT {column} FROM {table} WHERE name IN ({placeholders}) ORDER BY {column}", names
    )
    return [int(row[0]) for row in cursor.fetchall()]


def _function_slots(control: str, worker_id: int | None = None) -> list[dict[str, Any]]:
    """The slots reserved for a function (by label), or the slot ``worker_id``."""
    from snowflake_db.django.models import WorkerSlot

    slots = WorkerSlot.objects.using(control)
    if worker_id is None:
        slots = slots.filter(label__contains="-function:")
    else:
        slots = slots.filter(worker_id=worker_id)
    return [
        {
            "worker_id": slot.worker_id,
            "label": slot.label,
            "reserved": slot.lease_token is not None and slot.expires_at_ms is None,
            "high_water_ms": slot.high_water_ms,
        }
        for slot in slots
    ]


def _migrate(*args: str, database: str = "default") -> None:
    from django.core.management import call_command

    call_command("migrate", *args, database=database, verbosity=0, stdout=io.StringIO())


def alter(workdir: Path) -> dict[str, Any]:
    """An existing key takes the database default: AlterField, the trigger, raw inserts."""
    app = workdir / "keyapp"
    (app / "models.py").write_text(MODELS.format(basket_default=", db_default=KeyFunction()"))
    setup("same", workdir)
    from django.core.management import call_command
    from django.db import connection
    from keyapp.models import Basket, Item  # type: ignore[import-not-found]

    from snowflake_db.django import decode

    quiet = {"verbosity": 0, "stdout": io.StringIO()}
    old = Basket.objects.create(name="old")
    Item.objects.create(basket=old)
    call_command("makemigrations", "keyapp", **quiet)
    altered = sorted((app / "migrations").glob("0004_*.py"))[0]
    (app / "migrations" / "0005_basket_trigger.py").write_text(
        TRIGGER_MIGRATION.format(previous=altered.stem).replace(
            'InstallKeyTrigger("order"), InstallKeyTrigger("ticket", "number")',
            'InstallKeyTrigger("basket")',
        )
    )
    result: dict[str, Any] = {"migration": altered.read_text()}
    _migrate()
    try:
        call_command("makemigrations", "--check", "--dry-run", **quiet)
        result["check_clean"] = True
    except SystemExit as exit_:
        result["check_clean"] = exit_.code == 0
    with connection.cursor() as cursor:
        raw = _raw_rows(cursor, "keyapp_basket", "id", ["raw1", "raw2"])
    Item.objects.create(basket_id=raw[0])  # the ORM refers to a row the database keyed
    result["raw_workers"] = sorted({decode(key).worker_id for key in raw})
    result["function_worker"] = _function_slots("default")[0]["worker_id"]
    result["old_kept"] = Basket.objects.filter(pk=old.pk, item__isnull=False).exists()
    result["items"] = Item.objects.count()
    result["app_worker"] = decode(Basket.objects.create(name="app").pk).worker_id
    return result


GUARDED_MODELS = """
from django.db import models

from snowflake_db.django import KeyFunction, KeyTriggerCheck, SnowflakeAutoField, SnowflakeField


class Order(models.Model):
    id = SnowflakeAutoField(primary_key=True, db_default=KeyFunction())
    name = models.CharField(max_length=20)

    class Meta:
        constraints = [KeyTriggerCheck()]


class Ticket(models.Model):
    id = models.BigAutoField(primary_key=True)
    number = SnowflakeField(db_default=KeyFunction())
    name = models.CharField(max_length=20)

    class Meta:
        constraints = [KeyTriggerCheck("number")]
"""


def _raw_attempt(table: str, column: str, sql: str) -> Any:
    """The keys a raw ``INSERT`` made, or its error (in a savepoint, rolled back)."""
    from django.db import connection, transaction

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
            cursor.execute(f"SELECT {column} FROM {table} WHERE name LIKE 'raw%%'")
            keys = sorted(int(row[0]) for row in cursor.fetchall())
            transaction.set_rollback(True)
            return keys
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def guarded(workdir: Path) -> dict[str, Any]:
    """KeyTriggerCheck: loud without the trigger, silent with it."""
    app = _write_app(workdir)
    (app / "models.py").write_text(GUARDED_MODELS)
    setup("same", workdir)
    from django.core.management import call_command
    from django.db import connection

    quiet = {"verbosity": 0, "stdout": io.StringIO()}
    call_command("makemigrations", "keyapp", **quiet)
    created = sorted((app / "migrations").glob("0002_*.py"))[0]
    result: dict[str, Any] = {"migration": created.read_text()}
    sql = io.StringIO()
    call_command("sqlmigrate", "keyapp", created.stem, stdout=sql)
    result["sqlmigrate_tables"] = sql.getvalue()
    call_command("migrate", verbosity=0, stdout=io.StringIO(), skip_checks=False)

    def attempts() -> dict[str, Any]:
        return {
            "order": _raw_attempt(
                "keyapp_order", "id", "INSERT INTO keyapp_order (name) VALUES ('raw1')"
            ),
            "order_zero": _raw_attempt(
                "keyapp_order", "id", "INSERT INTO keyapp_order (id, name) VALUES (0, 'raw0')"
            ),
            "ticket": _raw_attempt(
                "keyapp_ticket", "number", "INSERT INTO keyapp_ticket (name) VALUES ('raw1')"
            ),
        }

    result["without_trigger"] = attempts()
    (app / "migrations" / "0003_key_triggers.py").write_text(
        TRIGGER_MIGRATION.format(previous=created.stem)
    )
    _migrate()
    result["with_trigger"] = attempts()
    _migrate("keyapp", created.stem)  # the trigger migration reversed: loud again
    result["trigger_reversed"] = attempts()
    try:
        call_command("makemigrations", "--check", "--dry-run", **quiet)
        result["check_clean"] = True
    except SystemExit as exit_:
        result["check_clean"] = exit_.code == 0
    result["vendor"] = connection.vendor
    connection.close()
    return result


def main() -> None:
    mode, workdir = sys.argv[1], Path(sys.argv[2])
    if mode == "same-alter":
        print(json.dumps(alter(workdir)))
        return
    if mode == "no-trigger":
        print(json.dumps(guarded(workdir)))
        return
    app = _write_app(workdir)
    setup(mode, workdir)
    from django.core.management import call_command
    from django.db import connection, connections, transaction
    from django.db.migrations.state import ProjectState
    from django.test.utils import CaptureQueriesContext
    from keyapp.models import Order, Ticket  # type: ignore[import-not-found]

    from snowflake_db.django import decode
    from snowflake_db.django.operations import InstallKeyFunction

    control = "control" if mode == "elsewhere" else "default"
    result: dict[str, Any] = {"vendor": connection.vendor}
    quiet = {"verbosity": 0, "stdout": io.StringIO()}
    call_command("makemigrations", "keyapp", **quiet)
    created = sorted((app / "migrations").glob("0002_*.py"))[0]
    result["migration"] = created.read_text()
    (app / "migrations" / "0003_key_triggers.py").write_text(
        TRIGGER_MIGRATION.format(previous=created.stem)
    )
    sql = io.StringIO()
    call_command("sqlmigrate", "keyapp", "0001", stdout=sql)
    result["sqlmigrate_function"] = sql.getvalue()
    sql = io.StringIO()
    call_command("sqlmigrate", "keyapp", created.stem, stdout=sql)
    result["sqlmigrate_tables"] = sql.getvalue()

    if mode == "elsewhere":
        try:  # the control database is not migrated yet: refused before anything is made
            _migrate()
            result["control_unmigrated"] = "migrated"
        except Exception as error:
            result["control_unmigrated"] = f"{type(error).__name__}: {error}"
        _migrate("snowflake_db", database="control")
    _migrate()
    try:
        call_command("makemigrations", "--check", "--dry-run", **quiet)
        result["check_clean"] = True
    except SystemExit as exit_:
        result["check_clean"] = exit_.code == 0
    result["slots_after_migrate"] = _function_slots(control)

    with connection.cursor() as cursor:
        raw_orders = _raw_rows(cursor, "keyapp_order", "id", ["raw1", "raw2", "raw3"])
        raw_tickets = _raw_rows(cursor, "keyapp_ticket", "number", ["raw1", "raw2"])
    result["raw_orders"] = raw_orders
    result["raw_tickets"] = raw_tickets
    result["raw_workers"] = sorted({decode(key).worker_id for key in raw_orders + raw_tickets})

    unsaved = Order(name="app")
    result["unsaved_pk"] = unsaved.pk
    with CaptureQueriesContext(connection) as queries:
        unsaved.save()
    # (MariaDB: the first write of a process also reads the column widths, narrow_columns.py)
    result["save_writes"] = [
        query["sql"].split()[0]
        for query in queries.captured_queries
        if query["sql"].split()[0] in ("INSERT", "UPDATE")
    ]
    created_order = Order.objects.create(name="app2")
    bulk = Order.objects.bulk_create([Order(name=f"bulk{i}") for i in range(3)])
    ticket = Ticket.objects.create(name="app")
    app_keys = [unsaved.pk, created_order.pk, *(order.pk for order in bulk), ticket.number]
    result["app_workers"] = sorted({decode(key).worker_id for key in app_keys})
    result["all_distinct"] = len(set(app_keys + raw_orders)) == len(app_keys) + len(raw_orders)
    try:
        with transaction.atomic():
            Order(pk=unsaved.pk, name="again").save()
        result["existing_pk_save"] = "updated"
    except Exception as error:  # Django's rule for a key with a database default: INSERT
        result["existing_pk_save"] = type(error).__name__

    # The operation run again on a database that has the function: a clear error.
    operation = InstallKeyFunction()
    try:
        with connection.schema_editor() as editor:
            operation.database_forwards("keyapp", editor, ProjectState(), ProjectState())
        result["twice"] = "installed again"
    except Exception as error:
        result["twice"] = f"{type(error).__name__}: {error}"
    result["slots_after_twice"] = _function_slots(control)

    _migrate("keyapp", "zero")
    function_worker = result["slots_after_migrate"][0]["worker_id"]
    result["slots_after_zero"] = _function_slots(control, function_worker)
    result["last_raw_ms"] = decode(max(raw_orders + raw_tickets)).timestamp_ms
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT to_regprocedure('snowflake_next_id()')")
            result["function_after_zero"] = cursor.fetchone()[0]
        else:
            cursor.execute(
                "SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = "
                "DATABASE() AND routine_name = 'snowflake_next_id'"
            )
            result["function_after_zero"] = cursor.fetchone()[0] or None
    # Reversed with nothing to drop: a clear error.
    try:
        with connection.schema_editor() as editor:
            operation.database_backwards("keyapp", editor, ProjectState(), ProjectState())
        result["reverse_missing"] = "dropped"
    except Exception as error:
        result["reverse_missing"] = f"{type(error).__name__}: {error}"

    _migrate()  # and forward again: the function is back, with a slot
    with connection.cursor() as cursor:
        result["raw_after_remigrate"] = _raw_rows(cursor, "keyapp_order", "id", ["raw4"])
    result["slots_after_remigrate"] = _function_slots(control)
    for alias in connections:
        connections[alias].close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
