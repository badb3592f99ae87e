"""Run in a subprocess by test_django_widen: one step of converting a shop whose migrations
build every key from ``settings.DEFAULT_AUTO_FIELD`` at run time (as django-oscar's do), so
``makemigrations`` finds nothing to change and the columns stay 32-bit.

Usage: ``python -m tests.django.follow_scenario STEP WORKDIR`` with the Django
``DATABASES["default"]`` entry as JSON in ``FOLLOW_DATABASE``; prints a JSON result.

* ``legacy``: ``AutoField``; two apps whose migrations take the key class from the setting:
  ``oldapp`` (``Product`` with a many-to-many to categories, ``Review`` -> ``Product``) and
  ``shopx`` (``Category``, ``Line`` -> ``Product``); a view over the product/category keys (a
  materialized view with a unique index on PostgreSQL) and a view on that view; rows.
* ``move``: still ``AutoField``; ``Product`` moved from ``oldapp`` to ``shopx`` keeping its
  table, with ``SeparateDatabaseAndState`` (state-only ``CreateModel`` in ``shopx``,
  ``AlterField`` of the foreign keys to it and ``DeleteModel`` in ``oldapp``); a row more.
* ``convert``: ``SnowflakeAutoField``; ``makemigrations`` (no change), ``migrate`` (refused by
  E010 naming the columns and the command, except on SQLite), ``snowflake widen``, ``migrate``,
  then new rows linked to old ones.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.django.scenario_support import manage as _manage

OLDAPP_MODELS = '''
from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=20)
    categories = models.ManyToManyField("shopx.Category")


class Review(models.Model):
    product = models.ForeignKey(Product, on_delete=models.CASCADE)
    stars = models.IntegerField()
'''

SHOPX_MODELS = '''
from django.db import models


class Category(models.Model):
    name = models.CharField(max_length=20)


class Line(models.Model):
    product = models.ForeignKey("oldapp.Product", on_delete=models.CASCADE)
    quantity = models.IntegerField()
'''

#: After the move: Product lives in shopx and keeps oldapp's table.
MOVED_OLDAPP_MODELS = '''
from django.db import models


class Review(models.Model):
    product = models.ForeignKey("shopx.Product", on_delete=models.CASCADE)
    stars = models.IntegerField()
'''

MOVED_SHOPX_MODELS = SHOPX_MODELS.replace('"oldapp.Product"', '"Product"') + '''

class Product(models.Model):
    name = models.CharField(max_length=20)
    categories = models.ManyToManyField(Category)

    class Meta:
        db_table = "oldapp_product"  # moved here from oldapp, table kept
'''

#: Shaped like django-oscar's migrations: the key class comes from the setting.
KEY = '''
from django.conf import settings
from django.db import migrations, models
from django.utils.module_loading import import_string

AutoKey = import_string(settings.DEFAULT_AUTO_FIELD)


def key():
    return AutoKey(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")
'''

OLDAPP_0001 = KEY + '''

class Migration(migrations.Migration):
    initial = True
    dependencies = [("shopx", "0001_initial")]
    operations = [
        migrations.CreateModel("Product", [
            ("id", key()),
            ("name", models.CharField(max_length=20)),
            ("categories", models.ManyToManyField(to="shopx.category")),
        ]),
        migrations.CreateModel("Review", [
            ("id", key()),
            ("stars", models.IntegerField()),
            ("product", models.ForeignKey(on_delete=models.CASCADE, to="oldapp.product")),
        ]),
    ]
'''

SHOPX_0001 = KEY + '''

class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel("Category", [
            ("id", key()),
            ("name", models.CharField(max_length=20)),
        ]),
    ]
'''

SHOPX_0002 = KEY + '''

class Migration(migrations.Migration):
    dependencies = [("shopx", "0001_initial"), ("oldapp", "0001_initial")]
    operations = [
        migrations.CreateModel("Line", [
            ("id", key()),
            ("quantity", models.IntegerField()),
            ("product", models.ForeignKey(on_delete=models.CASCADE, to="oldapp.product")),
        ]),
        migrations.RunSQL(VIEWS),
    ]
'''

#: The views over the keys: PostgreSQL's product/category view is materialized, with an index.
POSTGRESQL_VIEWS = [
    "CREATE MATERIALIZED VIEW shopx_product_category AS SELECT p.product_id, p.category_id, "
    "c.name FROM oldapp_product_categories p JOIN shopx_category c ON c.id = p.category_id",
    "CREATE UNIQUE INDEX shopx_pc_key ON shopx_product_category (product_id, category_id)",
]
PLAIN_VIEWS = [
    "CREATE VIEW shopx_product_category AS SELECT p.product_id, p.category_id, c.name "
    "FROM oldapp_product_categories p JOIN shopx_category c ON c.id = p.category_id",
]
SOLD_VIEW = (
    "CREATE VIEW shopx_sold AS SELECT l.product_id, sum(l.quantity) AS sold, "
    "(SELECT count(*) FROM shopx_product_category pc WHERE pc.product_id = l.product_id) "
    "AS categories FROM shopx_line l GROUP BY l.product_id"
)

#: The move, as a move that keeps the table is written: state only, no SQL.
SHOPX_0003 = KEY + '''

class Migration(migrations.Migration):
    dependencies = [("shopx", "0002_line"), ("oldapp", "0001_initial")]
    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel("Product", [
                ("id", key()),
                ("name", models.CharField(max_length=20)),
                ("categories", models.ManyToManyField(to="shopx.category")),
            ], options={"db_table": "oldapp_product"}),
            migrations.AlterField("line", "product", models.ForeignKey(
                on_delete=models.CASCADE, to="shopx.product")),
        ]),
    ]
'''

OLDAPP_0002 = KEY + '''

class Migration(migrations.Migration):
    dependencies = [("oldapp", "0001_initial"), ("shopx", "0003_move_product")]
    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.AlterField("review", "product", models.ForeignKey(
                on_delete=models.CASCADE, to="shopx.product")),
            migrations.DeleteModel("Product"),
        ]),
    ]
'''

#: Every key and foreign key column of the shop, and the views' key columns.
COLUMNS = [
    ("oldapp_product", "id"), ("oldapp_review", "id"), ("oldapp_review", "product_id"),
    ("oldapp_product_categories", "id"), ("oldapp_product_categories", "product_id"),
    ("oldapp_product_categories", "category_id"), ("shopx_category", "id"),
    ("shopx_line", "id"), ("shopx_line", "product_id"),
    ("shopx_product_category", "product_id"), ("shopx_sold", "product_id"),
]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(text)


def _setup(step: str, workdir: Path) -> None:
    database = json.loads(os.environ["FOLLOW_DATABASE"])
    views = POSTGRESQL_VIEWS if "postgresql" in database["ENGINE"] else PLAIN_VIEWS
    for app in ("oldapp", "shopx"):
        _write(workdir / app / "__init__.py", "")
        _write(workdir / app / "migrations" / "__init__.py", "")
    _write(workdir / "oldapp" / "migrations" / "0001_initial.py", OLDAPP_0001)
    _write(workdir / "shopx" / "migrations" / "0001_initial.py", SHOPX_0001)
    _write(workdir / "shopx" / "migrations" / "0002_line.py",
           SHOPX_0002.replace("VIEWS", repr([*views, SOLD_VIEW])))
    moved = step != "legacy"
    if moved:
        _write(workdir / "shopx" / "migrations" / "0003_move_product.py", SHOPX_0003)
        _write(workdir / "oldapp" / "migrations" / "0002_move_product.py", OLDAPP_0002)
    (workdir / "oldapp" / "models.py").write_text(MOVED_OLDAPP_MODELS if moved else OLDAPP_MODELS)
    (workdir / "shopx" / "models.py").write_text(MOVED_SHOPX_MODELS if moved else SHOPX_MODELS)
    sys.path.insert(0, str(workdir))

    import pymysql

    pymysql.install_as_MySQLdb()
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "snowflake_db.django", "shopx", "oldapp"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD=(
            "snowflake_db.django.fields.SnowflakeAutoField" if step == "convert"
            else "django.db.models.AutoField"
        ),
        SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 6},
        USE_TZ=True,
    )
    import django

    django.setup()


def _models() -> tuple[Any, Any, Any, Any]:
    from django.apps import apps

    product_app = "oldapp" if apps.get_app_config("oldapp").models.get("product") else "shopx"
    return (apps.get_model("shopx", "Category"), apps.get_model(product_app, "Product"),
            apps.get_model("shopx", "Line"), apps.get_model("oldapp", "Review"))


def _column_types(cursor: Any, vendor: str) -> dict[str, str]:
    """``table.column`` -> the type the database reports, for :data:`COLUMNS`."""
    if vendor == "sqlite":
        types = {}
        for table in {table for table, _ in COLUMNS}:
            cursor.execute(f'PRAGMA table_info("{table}")')
            types.update({f"{table}.{row[1]}": row[2].lower() for row in cursor.fetchall()})
    elif vendor == "postgresql":  # materialized views are not in information_schema
        cursor.execute("SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) "
                       "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                       "WHERE c.relnamespace = current_schema()::regnamespace AND a.attnum > 0")
        types = {f"{t}.{c}": kind for t, c, kind in cursor.fetchall()}
    else:
        cursor.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                       "WHERE table_schema = DATABASE()")
        types = {f"{t}.{c}": kind for t, c, kind in cursor.fetchall()}
    return {f"{t}.{c}": types[f"{t}.{c}"] for t, c in COLUMNS}


def _state() -> dict[str, Any]:
    """Counts, links, the views' rows as SQL reads them, and the column types."""
    from django.db import connection

    category, product, line, review = _models()
    with connection.cursor() as cursor:
        cursor.execute("SELECT product_id, category_id, name FROM shopx_product_category "
                       "ORDER BY 1, 2")
        in_view = [list(row) for row in cursor.fetchall()]
        cursor.execute("SELECT product_id, sold, categories FROM shopx_sold ORDER BY 1")
        sold = [[int(value) for value in row] for row in cursor.fetchall()]
        indexes: list[str] = []
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = "
                           "'shopx_product_category'")
            indexes = sorted(row[0] for row in cursor.fetchall())
        types = _column_types(cursor, connection.vendor)
        foreign_keys = sorted(
            [table, column, *constraint["foreign_key"]]
            for table in ("oldapp_review", "oldapp_product_categories", "shopx_line")
            for constraint in connection.introspection.get_constraints(cursor, table).values()
            if constraint["foreign_key"] for column in constraint["columns"]
        )
    return {
        "counts": [category.objects.count(), product.objects.count(), line.objects.count(),
                   review.objects.count()],
        "links": sorted([row.product_id, row.quantity] for row in line.objects.all()),
        "reviews": sorted([row.product_id, row.stars] for row in review.objects.all()),
        "categories": sorted([p.pk, c.pk] for p in product.objects.all()
                             for c in p.categories.all()),
        "in_view": in_view,
        "sold": sold,
        "indexes": indexes,
        "types": types,
        "foreign_keys": foreign_keys,
    }


def _refresh() -> None:
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("REFRESH MATERIALIZED VIEW CONCURRENTLY shopx_product_category")


def _legacy() -> dict[str, Any]:
    ok, output = _manage("migrate", verbosity=0)
    assert ok, output
    category, product, line, review = _models()
    categories = [category.objects.create(name=f"c{i}") for i in range(2)]
    for index in range(3):
        made = product.objects.create(name=f"p{index}")
        made.categories.add(categories[index % 2])
        line.objects.create(product=made, quantity=index + 1)
        review.objects.create(product=made, stars=index + 3)
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("REFRESH MATERIALIZED VIEW shopx_product_category")
    return _state()


def _move() -> dict[str, Any]:
    result: dict[str, Any] = {"migrate": _manage("migrate", verbosity=1)}
    result["makemigrations"] = _manage("makemigrations", "--check", "--dry-run", verbosity=1)
    category, product, line, review = _models()
    result["product_model"] = product._meta.label
    made = product.objects.create(name="moved")
    made.categories.add(category.objects.order_by("pk").last())
    line.objects.create(product=made, quantity=4)
    review.objects.create(product=made, stars=1)
    _refresh()
    result["state"] = _state()
    return result


def _convert() -> dict[str, Any]:
    result: dict[str, Any] = {}
    result["makemigrations"] = _manage("makemigrations", "--check", "--dry-run", verbosity=1)
    result["migrate_before"] = _manage("migrate", verbosity=1)
    result["dry_run"] = _manage("snowflake", "widen", "--dry-run")
    result["widen"] = _manage("snowflake", "widen")
    result["widen_again"] = _manage("snowflake", "widen")
    result["migrate"] = _manage("migrate", verbosity=1)
    result["check"] = _manage("check", databases=["default"])
    result["after_widen"] = _state()
    # New rows get Snowflake keys and link with old ones, through every relation.
    category, product, line, review = _models()
    made = product.objects.create(name="new")
    made.categories.add(category.objects.order_by("pk").first())
    new_category = category.objects.create(name="cnew")
    product.objects.order_by("pk").first().categories.add(new_category)
    line.objects.create(product=made, quantity=10)
    line.objects.create(product=product.objects.order_by("pk").first(), quantity=20)
    review.objects.create(product=made, stars=5)
    _refresh()
    result["new_product"] = made.pk
    result["new_category"] = new_category.pk
    result["after_new_rows"] = _state()
    return result


def main() -> None:
    step, workdir = sys.argv[1], Path(sys.argv[2])
    _setup(step, workdir)
    result = {"legacy": _legacy, "move": _move, "convert": _convert}[step]()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
