"""Run in a subprocess by test_django_convert: one step of converting a project built with
32-bit ``AutoField`` keys to ``SnowflakeAutoField``, as the README's path says.

A changed ``DEFAULT_AUTO_FIELD`` only takes effect when the models are imported again, hence one
process per step. Usage: ``python -m tests.django.convert_scenario STEP WORKDIR`` with the Django
``DATABASES["default"]`` entry as JSON in ``CONVERT_DATABASE``; prints a JSON result.

Steps:

* ``legacy``: ``DEFAULT_AUTO_FIELD = AutoField``; the shop's tables and rows (foreign keys, an
  auto-created many-to-many table, a ``through=`` model, generic relations).
* ``convert``: ``DEFAULT_AUTO_FIELD = SnowflakeAutoField`` and the generic object ID made 64-bit;
  ``makemigrations`` then a plain ``migrate`` (system checks on), then new rows linked to old ones.
* ``later``: a many-to-many field added after the switch (its table is made under Snowflake keys).
* ``premature``: the converted code run before ``makemigrations``/``migrate``: every write of a
  Snowflake key fails loudly (never a clamped key and a dropped row on MariaDB).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.django.scenario_support import manage as _manage

LEGACY_MODELS = '''
from django.contrib.contenttypes.fields import GenericForeignKey
from django.contrib.contenttypes.models import ContentType
from django.db import models


class Customer(models.Model):
    name = models.CharField(max_length=20)


class Product(models.Model):
    name = models.CharField(max_length=20)


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE)
    products = models.ManyToManyField(Product, related_name="orders")
    gifts = models.ManyToManyField(Product, through="Gift", related_name="gift_orders")
    # LATER


class Gift(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    product = models.ForeignKey(Product, on_delete=models.CASCADE)
    note = models.CharField(max_length=20)


class Note(models.Model):
    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_id = models.PositiveIntegerField()
    target = GenericForeignKey("content_type", "object_id")
    text = models.CharField(max_length=20)
'''

CONVERTED_MODELS = LEGACY_MODELS.replace(
    "object_id = models.PositiveIntegerField()", "object_id = models.PositiveBigIntegerField()"
)
LATER_MODELS = CONVERTED_MODELS.replace(
    "    # LATER",
    '    coupons = models.ManyToManyField(Product, related_name="coupon_orders")',
)

#: What MariaDB's INSERT IGNORE makes of an out-of-range key in a 32-bit column.
CLAMPED = 2**31 - 1


def _setup(step: str, workdir: Path) -> None:
    app = workdir / "shop"
    if not app.exists():
        (app / "migrations").mkdir(parents=True)
        (app / "__init__.py").write_text("")
        (app / "migrations" / "__init__.py").write_text("")
    models = {
        "legacy": LEGACY_MODELS,
        "convert": CONVERTED_MODELS,
        "later": LATER_MODELS,
        "premature": CONVERTED_MODELS,
    }[step]
    (app / "models.py").write_text(models)
    sys.path.insert(0, str(workdir))

    import pymysql

    pymysql.install_as_MySQLdb()
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "snowflake_db.django",
            "shop",
        ],
        DATABASES={"default": json.loads(os.environ["CONVERT_DATABASE"])},
        DEFAULT_AUTO_FIELD=(
            "django.db.models.AutoField"
            if step == "legacy"
            else "snowflake_db.django.fields.SnowflakeAutoField"
        ),
        SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 5},
        USE_TZ=True,
    )
    import django

    django.setup()


def _link_rows() -> dict[str, list[list[int]]]:
    from shop.models import Gift, Note, Order  # type: ignore[import-not-found]

    through = Order.products.through
    return {
        "products": sorted([r.order_id, r.product_id] for r in through.objects.all()),
        "through_keys": sorted([r.pk] for r in through.objects.all()),
        "gifts": sorted([g.order_id, g.product_id] for g in Gift.objects.all()),
        "notes": sorted([n.object_id] for n in Note.objects.all()),
    }


def _legacy() -> dict[str, Any]:
    from shop.models import Customer, Gift, Note, Order, Product

    _manage("makemigrations", "shop", verbosity=0)
    ok, output = _manage("migrate", verbosity=0)
    assert ok, output
    customers = [Customer.objects.create(name=f"c{i}") for i in range(2)]
    products = [Product.objects.create(name=f"p{i}") for i in range(3)]
    orders = [Order.objects.create(customer=customers[i % 2]) for i in range(2)]
    orders[0].products.add(products[0], products[1])
    orders[1].products.add(products[2])
    Gift.objects.create(order=orders[0], product=products[2], note="old")
    Note.objects.create(target=orders[0], text="old")
    return {
        "customers": [c.pk for c in customers],
        "products": [p.pk for p in products],
        "orders": [o.pk for o in orders],
        **_link_rows(),
    }


def _column_types() -> dict[str, str]:
    """``table.column`` -> the database's type for every key and foreign key column of the app."""
    from django.apps import apps
    from django.db import connection

    types: dict[str, str] = {}
    with connection.cursor() as cursor:
        for model in apps.get_app_config("shop").get_models(include_auto_created=True):
            table = model._meta.db_table
            described = {
                row.name: row for row in connection.introspection.get_table_description(
                    cursor, table
                )
            }
            for field in model._meta.local_fields:
                if field.primary_key or field.is_relation:
                    row = described[field.column]
                    types[f"{table}.{field.column}"] = connection.introspection.get_field_type(
                        row.type_code, row
                    )
    return types


def _convert(step: str, workdir: Path) -> dict[str, Any]:
    from shop.models import Customer, Gift, Note, Order, Product

    result: dict[str, Any] = {}
    made, output = _manage("makemigrations", "shop", verbosity=1)
    result["makemigrations"] = [made, output]
    migrated, output = _manage("migrate", verbosity=1)
    result["migrate"] = [migrated, output]
    if not migrated:
        return result
    result["check"] = list(_manage("check", databases=["default"]))
    result["makemigrations_check"] = list(_manage("makemigrations", "--check", "--dry-run"))
    result["types"] = _column_types()

    old_orders = list(Order.objects.order_by("pk"))
    old_products = list(Product.objects.order_by("pk"))
    customer = Customer.objects.create(name=f"{step}-c")
    products = [Product.objects.create(name=f"{step}-p{i}") for i in range(2)]
    order = Order.objects.create(customer=old_orders[0].customer)
    # Old and new rows mixed, on both sides, through add() (INSERT IGNORE on MariaDB).
    order.products.add(old_products[0], *products)
    old_orders[0].products.add(*products)
    old_products[1].orders.add(order)
    Gift.objects.create(order=order, product=old_products[0], note="new")
    Gift.objects.create(order=old_orders[1], product=products[0], note="new")
    Note.objects.create(target=order, text="new")
    Note.objects.create(target=customer, text="new")
    if step == "later":
        order.coupons.add(old_products[0], products[1])
        old_orders[1].coupons.add(products[0], old_products[2])
        result["coupons"] = sorted(
            [r.order_id, r.product_id] for r in Order.coupons.through.objects.all()
        )
        result["coupon_keys"] = sorted(r.pk for r in Order.coupons.through.objects.all())
    result.update(
        customer=customer.pk,
        new_products=[p.pk for p in products],
        order=order.pk,
        old_products=[p.pk for p in old_products],
        old_orders=[o.pk for o in old_orders],
        **_link_rows(),
        note_targets=sorted(
            [type(n.target).__name__, n.target.pk] for n in Note.objects.all()
        ),
    )
    return result


def _attempt(write: Any) -> str | None:
    """The class name of the error ``write()`` raised, or None if it succeeded."""
    from django.db import transaction

    try:
        with transaction.atomic():
            write()
    except Exception as error:
        return type(error).__name__
    return None


def _premature() -> dict[str, Any]:
    from shop.models import Order, Product

    order, product = Order.objects.order_by("pk").first(), Product.objects.order_by("pk").last()
    through = Order.products.through
    return {
        "create": _attempt(lambda: Product.objects.create(name="early")),
        "add": _attempt(lambda: order.products.add(product)),
        "bulk_ignore": _attempt(
            lambda: Product.objects.bulk_create(
                [Product(name="a"), Product(name="b")], ignore_conflicts=True
            )
        ),
        "check": list(_manage("check", databases=["default"])),
        "product_keys": sorted(Product.objects.values_list("pk", flat=True)),
        "through_keys": sorted(through.objects.values_list("pk", flat=True)),
    }


def main() -> None:
    step, workdir = sys.argv[1], Path(sys.argv[2])
    _setup(step, workdir)
    if step == "legacy":
        result = _legacy()
    elif step == "premature":
        result = _premature()
    else:
        result = _convert(step, workdir)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
