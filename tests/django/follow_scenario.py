"""Run in a subprocess by test_django_widen: one step of converting a shop whose migrations
build every key from ``settings.DEFAULT_AUTO_FIELD`` at run time (as django-oscar's do), so
``makemigrations`` finds nothing to change and the columns stay 32-bit.

Usage: ``python -m tests.django.follow_scenario STEP WORKDIR`` with the Django
``DATABASES["default"]`` entry as JSON in ``FOLLOW_DATABASE``; prints a JSON result.

* ``legacy``: ``AutoField``; the app's migrations (keys from the setting), a materialized view
  over the product/category keys with an index, a view on that view, rows.
* ``convert``: ``SnowflakeAutoField``; ``makemigrations`` (no change), ``migrate`` (refused by
  E010, naming the columns and the command), ``snowflake widen``, ``migrate``, then new rows.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.django.scenario_support import manage as _manage

MODELS = '''
from django.db import models


class Category(models.Model):
    name = models.CharField(max_length=20)


class Product(models.Model):
    name = models.CharField(max_length=20)
    categories = models.ManyToManyField(Category)

    class Meta:
        db_table = "oldapp_product"  # a table moved here from another app


class Line(models.Model):
    product = models.ForeignKey(Product, on_delete=models.CASCADE)
    quantity = models.IntegerField()
'''

#: The app's first migration, shaped like django-oscar's: the key class comes from the setting.
MIGRATION = '''
from django.conf import settings
from django.db import migrations, models
from django.utils.module_loading import import_string

AutoKey = import_string(settings.DEFAULT_AUTO_FIELD)


def key():
    return AutoKey(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel("Category", [
            ("id", key()),
            ("name", models.CharField(max_length=20)),
        ]),
        migrations.CreateModel("Product", [
            ("id", key()),
            ("name", models.CharField(max_length=20)),
            ("categories", models.ManyToManyField(to="shopx.category")),
        ], options={"db_table": "oldapp_product"}),
        migrations.CreateModel("Line", [
            ("id", key()),
            ("quantity", models.IntegerField()),
            ("product", models.ForeignKey(on_delete=models.CASCADE, to="shopx.product")),
        ]),
        migrations.RunSQL(
            ["CREATE MATERIALIZED VIEW shopx_product_category AS "
             "SELECT p.product_id, p.category_id, c.name FROM oldapp_product_categories p "
             "JOIN shopx_category c ON c.id = p.category_id",
             "CREATE UNIQUE INDEX shopx_pc_key ON shopx_product_category "
             "(product_id, category_id)",
             "CREATE VIEW shopx_sold AS SELECT l.product_id, sum(l.quantity) AS sold, "
             "(SELECT count(*) FROM shopx_product_category pc "
             "WHERE pc.product_id = l.product_id) AS categories "
             "FROM shopx_line l GROUP BY l.product_id"],
        ),
    ]
'''


def _setup(step: str, workdir: Path) -> None:
    app = workdir / "shopx"
    if not app.exists():
        (app / "migrations").mkdir(parents=True)
        (app / "__init__.py").write_text("")
        (app / "migrations" / "__init__.py").write_text("")
        (app / "migrations" / "0001_initial.py").write_text(MIGRATION)
        (app / "models.py").write_text(MODELS)
    sys.path.insert(0, str(workdir))
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "snowflake_db.django", "shopx"],
        DATABASES={"default": json.loads(os.environ["FOLLOW_DATABASE"])},
        DEFAULT_AUTO_FIELD=(
            "django.db.models.AutoField" if step == "legacy"
            else "snowflake_db.django.fields.SnowflakeAutoField"
        ),
        SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 6},
        USE_TZ=True,
    )
    import django

    django.setup()


def _state() -> dict[str, Any]:
    """Counts, links and the views' rows as SQL reads them."""
    from django.db import connection
    from shopx.models import Category, Line, Product  # type: ignore[import-not-found]

    with connection.cursor() as cursor:
        cursor.execute("SELECT product_id, category_id, name FROM shopx_product_category "
                       "ORDER BY 1, 2")
        materialized = [list(row) for row in cursor.fetchall()]
        cursor.execute("SELECT product_id, sold, categories FROM shopx_sold ORDER BY 1")
        sold = [list(row) for row in cursor.fetchall()]
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = "
                       "'shopx_product_category'")
        indexes = sorted(row[0] for row in cursor.fetchall())
        cursor.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND (column_name = 'id' OR column_name "
            "LIKE '%%_id') AND table_name IN ('oldapp_product', 'shopx_category', 'shopx_line', "
            "'oldapp_product_categories', 'shopx_product_category', 'shopx_sold')"
        )
        types = {f"{t}.{c}": kind for t, c, kind in cursor.fetchall()}
    return {
        "counts": [Category.objects.count(), Product.objects.count(), Line.objects.count()],
        "links": sorted([line.product_id, line.quantity] for line in Line.objects.all()),
        "materialized": materialized,
        "sold": sold,
        "indexes": indexes,
        "types": types,
    }


def _legacy() -> dict[str, Any]:
    from django.db import connection
    from shopx.models import Category, Line, Product

    ok, output = _manage("migrate", verbosity=0)
    assert ok, output
    categories = [Category.objects.create(name=f"c{i}") for i in range(2)]
    for index in range(3):
        product = Product.objects.create(name=f"p{index}")
        product.categories.add(categories[index % 2])
        Line.objects.create(product=product, quantity=index + 1)
    with connection.cursor() as cursor:
        cursor.execute("REFRESH MATERIALIZED VIEW shopx_product_category")
    return _state()


def _convert() -> dict[str, Any]:
    from django.db import connection
    from shopx.models import Category, Line, Product

    result: dict[str, Any] = {}
    result["makemigrations"] = _manage("makemigrations", "shopx", "--check", "--dry-run",
                                       verbosity=1)
    result["migrate_before"] = _manage("migrate", verbosity=1)
    result["dry_run"] = _manage("snowflake", "widen", "--dry-run")
    result["widen"] = _manage("snowflake", "widen")
    result["widen_again"] = _manage("snowflake", "widen")
    result["migrate"] = _manage("migrate", verbosity=1)
    result["check"] = _manage("check", databases=["default"])
    result["after_widen"] = _state()
    # New rows get Snowflake keys and link with old ones; the view is refreshed with them.
    old_category = Category.objects.order_by("pk").first()
    product = Product.objects.create(name="new")
    product.categories.add(old_category)
    Line.objects.create(product=product, quantity=10)
    Line.objects.create(product=Product.objects.order_by("pk").first(), quantity=20)
    with connection.cursor() as cursor:
        cursor.execute("REFRESH MATERIALIZED VIEW CONCURRENTLY shopx_product_category")
    result["new_product"] = product.pk
    result["after_new_rows"] = _state()
    return result


def main() -> None:
    step, workdir = sys.argv[1], Path(sys.argv[2])
    _setup(step, workdir)
    result = _legacy() if step == "legacy" else _convert()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
