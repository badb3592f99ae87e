"""Run in a subprocess by test_django_auto_field_keys: a project with
``SNOWFLAKE_DB["AUTO_FIELD_DATABASE_KEYS"] = True`` whose models take ``DEFAULT_AUTO_FIELD``,
migrated for real, then written with raw SQL as Django's own ``apps`` tests and other services
write (``INSERT ... (name) VALUES ...``, ``executemany``), and with the ORM.

Usage: ``python -m tests.django.auto_keys_scenario MODE WORKDIR`` with ``KEYS_DATABASES``
holding the Django ``DATABASES`` as JSON. MODE ``same``: the worker tables are in the app's
database; ``elsewhere``: in the ``control`` alias (``CONTROL_DATABASE``,
``ControlDatabaseRouter``). Prints a JSON result on its last line.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

from tests.django.keys_scenario import setup
from tests.django.scenario_support import write_app

MODELS = """
from django.db import models

from snowflake_db.django import SnowflakeAutoField


class Tag(models.Model):
    name = models.CharField(max_length=20)


class Order(models.Model):
    name = models.CharField(max_length=20)
    tags = models.ManyToManyField(Tag)


class Explicit(models.Model):
    id = SnowflakeAutoField(primary_key=True)
    name = models.CharField(max_length=20)


class Accented(models.Model):  # Django's own tests have such a table (admin_views)
    name = models.CharField(max_length=20)

    class Meta:
        db_table = "autoapp_héllo"


class Counted(models.Model):
    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=20)
"""

def _setup(mode: str, workdir: Path) -> Path:
    app = write_app(workdir, "autoapp", MODELS)
    setup(mode, workdir, "autoapp", AUTO_FIELD_DATABASE_KEYS=True)
    return app


def _migrate(*args: str, database: str = "default") -> str:
    """``migrate`` as a user runs it (verbosity 1); what it printed of ours, or its error."""
    from django.core.management import call_command

    out = io.StringIO()
    try:
        call_command("migrate", *args, database=database, verbosity=1, stdout=out)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "\n".join(line.strip() for line in out.getvalue().splitlines()
                     if "snowflake_db:" in line)


def _raw(sql: str, params: Any = None, *, many: bool = False) -> Any:
    """Run a raw INSERT in a savepoint; its error as text, else None."""
    from django.db import connection, transaction

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if many:
                cursor.executemany(sql, params)
            else:
                cursor.execute(sql, params)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def _keys(table: str, where: str) -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE {where} ORDER BY id")
        return [int(row[0]) for row in cursor.fetchall()]


def _function_slots(control: str) -> list[dict[str, Any]]:
    from snowflake_db.django.models import WorkerSlot

    return [
        {"worker_id": slot.worker_id, "label": slot.label,
         "reserved": slot.lease_token is not None and slot.expires_at_ms is None}
        for slot in WorkerSlot.objects.using(control).filter(label__contains="-function:")
    ]


def main() -> None:
    mode, workdir = sys.argv[1], Path(sys.argv[2])
    app = _setup(mode, workdir)
    from django.core.management import call_command
    from django.db import connection, connections, transaction
    from django.test.utils import CaptureQueriesContext

    from snowflake_db.django import decode
    from snowflake_db.django.auto_field_keys import key_columns_without_database_keys

    control = "control" if mode == "elsewhere" else "default"
    result: dict[str, Any] = {"vendor": connection.vendor}
    call_command("makemigrations", "autoapp", verbosity=0, stdout=io.StringIO())
    result["migration"] = (app / "migrations" / "0001_initial.py").read_text()
    if mode == "elsewhere":  # the control database has no worker tables yet
        result["control_unmigrated"] = _migrate()
        _migrate("snowflake_db", database="control")
    result["migrate"] = _migrate()
    result["migrate_again"] = _migrate()
    result["missing_after"] = key_columns_without_database_keys("default")
    result["slots"] = _function_slots(control) if connection.vendor != "sqlite" else []

    # Raw SQL as other writers send it: one row, executemany (Django's apps tests), the
    # many-to-many table; a BigAutoField table beside them keeps its identity.
    result["raw_errors"] = [
        _raw("INSERT INTO autoapp_order (name) VALUES ('raw1')"),
        _raw("INSERT INTO autoapp_order (name) VALUES (%s)", [("raw2",), ("raw3",)], many=True),
        _raw("INSERT INTO autoapp_explicit (name) VALUES ('raw1')"),
        _raw("INSERT INTO autoapp_tag (name) VALUES ('raw1')"),
        _raw("INSERT INTO autoapp_counted (name) VALUES ('raw1')"),
    ]
    result["accented"] = _raw("INSERT INTO autoapp_héllo (name) VALUES ('raw1')")
    orders = _keys("autoapp_order", "name LIKE 'raw%%'")
    raw = orders + _keys("autoapp_explicit", "name = 'raw1'") + _keys(
        "autoapp_tag", "name = 'raw1'")
    result["raw_errors"].append(_raw(
        "INSERT INTO autoapp_order_tags (order_id, tag_id) VALUES (%s, %s)",
        [orders[0], raw[-1]]))
    raw += _keys("autoapp_order_tags", "1 = 1")
    result["raw"] = raw
    result["raw_workers"] = sorted({decode(key).worker_id for key in raw})
    result["counted"] = _keys("autoapp_counted", "name = 'raw1'")

    # The ORM keeps AutoField's rules: pk None until saved, one INSERT with the application's
    # key, and save() of an existing pk updates that row.
    from autoapp.models import Order  # type: ignore[import-not-found]

    order = Order(name="app")
    result["unsaved_pk"] = order.pk
    with CaptureQueriesContext(connection) as queries:
        order.save()
    result["save_writes"] = [query["sql"].split()[0] for query in queries.captured_queries
                             if query["sql"].split()[0] in ("INSERT", "UPDATE")]
    bulk = Order.objects.bulk_create([Order(name=f"bulk{i}") for i in range(3)])
    result["app_workers"] = sorted({decode(o.pk).worker_id for o in [order, *bulk]})
    with transaction.atomic():
        Order(pk=order.pk, name="again").save()
    result["existing_pk_save"] = list(Order.objects.filter(pk=order.pk).values_list("name"))

    # The database key taken away by hand: a raw insert fails loudly (no key 0), and the
    # next migrate gives it back.
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE autoapp_order ALTER COLUMN id DROP DEFAULT")
        elif connection.vendor == "mysql":
            cursor.execute("DROP TRIGGER autoapp_order_id_snowflake_key")
    result["without"] = _raw("INSERT INTO autoapp_order (name) VALUES ('raw9')")
    result["migrate_repair"] = _migrate()
    result["after_repair"] = _raw("INSERT INTO autoapp_order (name) VALUES ('raw9')")
    for alias in connections:
        connections[alias].close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
