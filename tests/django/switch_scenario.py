"""Run in a subprocess by test_django_migrations: one step of switching a project's
``DEFAULT_AUTO_FIELD`` from ``BigAutoField`` to ``SnowflakeAutoField``.

A changed ``DEFAULT_AUTO_FIELD`` only takes effect when the models are imported again, hence one
process per step. Usage: ``python -m tests.django.switch_scenario STEP WORKDIR`` with the Django
``DATABASES["default"]`` entry as JSON in ``SWITCH_DATABASE``; prints a JSON result.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

MODELS = '''
from django.db import models


class Shelf(models.Model):
    name = models.CharField(max_length=20)


class Book(models.Model):
    shelf = models.ForeignKey(Shelf, on_delete=models.CASCADE)
'''


def main() -> None:
    step, workdir = sys.argv[1], Path(sys.argv[2])
    app = workdir / "switchapp"
    if not app.exists():
        (app / "migrations").mkdir(parents=True)
        (app / "__init__.py").write_text("")
        (app / "migrations" / "__init__.py").write_text("")
        (app / "models.py").write_text(MODELS)
    sys.path.insert(0, str(workdir))

    import pymysql

    pymysql.install_as_MySQLdb()
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "snowflake_db.django", "switchapp"],
        DATABASES={"default": json.loads(os.environ["SWITCH_DATABASE"])},
        DEFAULT_AUTO_FIELD=(
            "django.db.models.BigAutoField"
            if step == "before"
            else "snowflake_db.django.fields.SnowflakeAutoField"
        ),
        SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 3},
        USE_TZ=True,
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from switchapp.models import Book, Shelf  # type: ignore[import-not-found]

    result: dict[str, object] = {}
    quiet = {"verbosity": 0, "stdout": io.StringIO()}
    if step == "before":
        call_command("makemigrations", "switchapp", **quiet)
        call_command("migrate", **quiet)
        shelf = Shelf.objects.create(name="old")
        Book.objects.create(shelf=shelf)
        result["old_pk"] = shelf.pk
    else:
        call_command("makemigrations", "switchapp", **quiet)
        migration = next((app / "migrations").glob("0002_*.py"))
        result["migration"] = migration.read_text()
        sql = io.StringIO()
        call_command("sqlmigrate", "switchapp", migration.stem, stdout=sql)
        result["sql"] = sql.getvalue()
        call_command("migrate", **quiet)
        try:
            call_command("makemigrations", "--check", "--dry-run", **quiet)
            result["check_clean"] = True
        except SystemExit as exit_:
            result["check_clean"] = exit_.code == 0
        shelf = Shelf(name="new")
        result["new_pk_before_save"] = shelf.pk
        shelf.save()
        result["new_pk_after_save"] = shelf.pk
        Book.objects.create(shelf=shelf)
        result["pks"] = sorted(Shelf.objects.values_list("pk", flat=True))
        result["book_shelves"] = sorted(Book.objects.values_list("shelf_id", flat=True))
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT is_identity, column_default, data_type FROM information_schema.columns"
                    " WHERE table_name = 'switchapp_shelf' AND column_name = 'id'"
                )
                result["column"] = list(cursor.fetchone())
                cursor.execute(
                    "SELECT count(*) FROM pg_class WHERE relkind = 'S' "
                    "AND relname LIKE 'switchapp_%'"
                )
                result["sequences"] = cursor.fetchone()[0]
            elif connection.vendor == "mysql":
                cursor.execute(
                    "SELECT extra, data_type FROM information_schema.columns WHERE "
                    "table_schema = DATABASE() AND table_name = 'switchapp_shelf' "
                    "AND column_name = 'id'"
                )
                result["column"] = list(cursor.fetchone())
            else:
                cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'switchapp_shelf'")
                result["column"] = [cursor.fetchone()[0]]
            fk_types = {
                row.name: row.type_code
                for row in connection.introspection.get_table_description(
                    cursor, "switchapp_book"
                )
            }
            result["fk_type"] = connection.introspection.get_field_type(
                fk_types["shelf_id"],
                next(
                    row
                    for row in connection.introspection.get_table_description(
                        cursor, "switchapp_book"
                    )
                    if row.name == "shelf_id"
                ),
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
