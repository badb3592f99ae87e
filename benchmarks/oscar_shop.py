"""Convert a real django-oscar shop full of orders from ``AutoField`` to Snowflake keys, as a user
following docs/converting/django.md would, and prove nothing was lost (issue 34, part 3).

Run it with ``python benchmarks/oscar_shop.py --check`` (or ``make oscar-shop``; not part of
``make test``). It builds (once) the venv of ``benchmarks/shop_suites.py`` (django-oscar 4.2.1 and
django-taggit 6.1.0 from PyPI, this checkout installed editable), writes an Oscar project into
``--work-dir`` as Oscar's getting-started guide sets one up (``oscar.config.Shop`` and Oscar's apps
in ``INSTALLED_APPS``, its materialized views on, ``DEFAULT_AUTO_FIELD = AutoField``, the
catalogue forked with ``oscar_fork_app`` to tag products with django-taggit) on a fresh database
of the PostgreSQL server at ``SNOWFLAKE_TEST_POSTGRES_URL`` (dropped at the end), and then:

1. **fills** it through Oscar's own APIs: categories (so that the materialized view
   ``catalogue_product_category_hierarchy`` has rows), products with stock records, entity
   attributes and tags, a category range with a site offer, a voucher with its own offer, and
   ``--orders`` orders placed with ``OrderCreator`` after Oscar's ``Applicator`` applied the
   offers (``OrderDiscount`` rows with ``offer_id`` and ``voucher_id``); it records the row
   count of every table and view and a checksum of the key relations;
2. **converts** it: ``DEFAULT_AUTO_FIELD`` set to ``SnowflakeAutoField``, ``snowflake_db.django``
   installed, worker IDs leased from its table (Django quick start); records what ``check``,
   ``check --database default`` and ``migrate`` say; forks Oscar's order app with
   ``oscar_fork_app`` and declares the 64-bit fields (:data:`OSCAR_64BIT_FIELDS`) in the order
   and catalogue forks, moves the tags to a ``SnowflakeTaggedItemBase`` through model with a
   data migration; ``check`` (nothing may be left), ``snowflake widen``, ``makemigrations``,
   ``migrate``, ``check --database default`` and ``makemigrations --check`` (both clean);
3. **verifies**: every table's count and every checksum identical, every old order's discounts
   still linked to their offer and voucher, a new category and new products (keys above 2**53)
   found through the refreshed materialized view, a basket discounted by a category offer and a
   voucher, new orders placed with Snowflake keys recording ``OrderDiscount`` rows, per-user
   offer limits counting them, tags (filter, ``most_common``, ``names``) on new products.

It prints a table of the numbers; ``--check`` exits 1 on any failure. The project stays in
``--work-dir`` for reading (``convert.log`` holds every command's output).

:data:`OSCAR_64BIT_FIELDS` and :func:`fork_models` are what a user writes into Oscar's forks;
``shop_suites.py --oscar-converted`` uses them to run Oscar's own suite on a converted test site.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_AUTO = "django.db.models.AutoField"
_SNOWFLAKE = "snowflake_db.django.fields.SnowflakeAutoField"

#: The fields ``manage.py check`` reports in Oscar 4.2.1's models (E014: keys kept in plain
#: integer fields; E012: a generic relation's object ID), as a fork declares them: app label ->
#: (imports, model classes). Oscar's ``models.py`` registers a model only when no fork did.
OSCAR_64BIT_FIELDS: dict[str, tuple[str, str]] = {
    "order": (
        "from django.db import models\n"
        "from django.utils.translation import gettext_lazy as _\n"
        "from oscar.apps.order.abstract_models import AbstractOrderDiscount\n",
        '''
class OrderDiscount(AbstractOrderDiscount):
    """Offer and voucher keys are Snowflake IDs: 64 bits (snowflake_db.E014)."""

    offer_id = models.PositiveBigIntegerField(_("Offer ID"), blank=True, null=True)
    voucher_id = models.PositiveBigIntegerField(_("Voucher ID"), blank=True, null=True)
''',
    ),
    "catalogue": (
        "from django.db import models\n"
        "from oscar.apps.catalogue.abstract_models import (\n"
        "    AbstractProductAttributeValue,\n"
        "    AbstractProductCategoryHierarchy,\n"
        ")\n",
        '''
class ProductAttributeValue(AbstractProductAttributeValue):
    """An entity attribute points at a Snowflake-keyed row (snowflake_db.E012)."""

    entity_object_id = models.PositiveBigIntegerField(null=True, blank=True, editable=False)


class ProductCategoryHierarchy(AbstractProductCategoryHierarchy):
    """The unmanaged model over Oscar's materialized view (snowflake_db.E014)."""

    product_id = models.BigIntegerField()
    category_id = models.BigIntegerField()
''',
    ),
}


def fork_models(label: str, models_module: str, *, imports: str = "", body: str = "") -> str:
    """The ``models.py`` of a fork of Oscar's app ``label``: the 64-bit fields of
    :data:`OSCAR_64BIT_FIELDS`, the fork's own ``imports``/``body``, then the star import of
    ``models_module`` (Oscar's, or the app forked) that registers every model not declared."""
    wide_imports, wide_body = OSCAR_64BIT_FIELDS[label]
    return (f'"""The {label} app, forked with oscar_fork_app: keys in 64-bit fields."""\n'
            f"{wide_imports}{imports}\n{wide_body}{body}\n\n"
            f"from {models_module} import *  # noqa: E402,F403\n")


# ---------------------------------------------------------------------------------------------
# The project (written outside the venv; its settings edited as a user edits them)

_OSCAR_APPS = [
    "oscar.config.Shop", "oscar.apps.analytics.apps.AnalyticsConfig",
    "oscar.apps.checkout.apps.CheckoutConfig", "oscar.apps.address.apps.AddressConfig",
    "oscar.apps.shipping.apps.ShippingConfig", "oscar.apps.catalogue.apps.CatalogueConfig",
    "oscar.apps.catalogue.reviews.apps.CatalogueReviewsConfig",
    "oscar.apps.communication.apps.CommunicationConfig", "oscar.apps.partner.apps.PartnerConfig",
    "oscar.apps.basket.apps.BasketConfig", "oscar.apps.payment.apps.PaymentConfig",
    "oscar.apps.offer.apps.OfferConfig", "oscar.apps.order.apps.OrderConfig",
    "oscar.apps.customer.apps.CustomerConfig", "oscar.apps.search.apps.SearchConfig",
    "oscar.apps.voucher.apps.VoucherConfig", "oscar.apps.wishlists.apps.WishlistsConfig",
    "oscar.apps.dashboard.apps.DashboardConfig",
    *(f"oscar.apps.dashboard.{name}.apps.{name.capitalize()}DashboardConfig" for name in (
        "reports", "users", "orders", "catalogue", "offers", "partners", "pages", "ranges",
        "reviews", "vouchers", "communications", "shipping")),
]

_SETTINGS = '''\
"""An Oscar shop's settings, as Oscar's getting-started guide writes them (oscar_shop.py)."""
import os

from oscar.defaults import *  # noqa: F403

SECRET_KEY = "oscar-shop-benchmark"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shopsite.urls"
SITE_ID = 1
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django.contrib.staticfiles",
    "django.contrib.sites", "django.contrib.flatpages",
{oscar_apps}
    "widget_tweaks", "haystack", "treebeard", "sorl.thumbnail", "django_tables2", "taggit",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "oscar.apps.basket.middleware.BasketMiddleware",
    "django.contrib.flatpages.middleware.FlatpageFallbackMiddleware",
]
TEMPLATES = [{{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {{"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
        "oscar.apps.search.context_processors.search_form",
        "oscar.apps.checkout.context_processors.checkout",
        "oscar.apps.communication.notifications.context_processors.notifications",
        "oscar.core.context_processors.metadata",
    ]}},
}}]
AUTHENTICATION_BACKENDS = (
    "oscar.apps.customer.auth_backends.EmailBackend",
    "django.contrib.auth.backends.ModelBackend",
)
HAYSTACK_CONNECTIONS = {{"default": {{"ENGINE": "haystack.backends.simple_backend.SimpleEngine"}}}}
STATIC_URL = "/static/"
MEDIA_URL = "/media/"
MEDIA_ROOT = os.path.join(os.path.dirname(__file__), "media")
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.postgresql",
    "NAME": os.environ["OSCAR_SHOP_DB"],
    "USER": os.environ["SUITE_DB_USER"],
    "PASSWORD": os.environ["SUITE_DB_PASSWORD"],
    "HOST": os.environ["SUITE_DB_HOST"],
    "PORT": os.environ["SUITE_DB_PORT"],
    "ATOMIC_REQUESTS": True,
}}}}
OSCAR_CATALOGUE_USE_POSTGRES_MATERIALISED_VIEWS = True
DEFAULT_AUTO_FIELD = "{auto}"
'''

_URLS = '''\
from django.apps import apps
from django.urls import include, path

urlpatterns = [path("", include(apps.get_app_config("oscar").urls[0]))]
'''

_MANAGE = '''\
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
'''

#: The shop's catalogue fork before the conversion: products tagged with taggit's TaggedItem.
_CATALOGUE_TAGGED = '''\
"""The catalogue app, forked with oscar_fork_app: products carry tags."""
from oscar.apps.catalogue.abstract_models import AbstractProduct
from taggit.managers import TaggableManager


class Product(AbstractProduct):
    tags = TaggableManager(blank=True)


from oscar.apps.catalogue.models import *  # noqa: E402,F403
'''

#: After it: the tags go through a model with a 64-bit object_id (docs: Tags with django-taggit).
_CATALOGUE_TAGS_IMPORTS = (
    "from oscar.apps.catalogue.abstract_models import AbstractProduct\n"
    "from taggit.managers import TaggableManager\n\n"
    "from snowflake_db.django.taggit import SnowflakeTaggedItemBase\n"
)
_CATALOGUE_TAGS_BODY = '''

class TaggedProduct(SnowflakeTaggedItemBase):
    """Tags of Snowflake-keyed products: object_id is 64-bit."""


class Product(AbstractProduct):
    tags = TaggableManager(blank=True, through=TaggedProduct)
'''

#: The data migration a user writes (``makemigrations catalogue --empty``) to copy the tags.
_COPY_TAGS = '''\
"""Copy the products' tags from taggit's TaggedItem to the 64-bit TaggedProduct."""
from django.db import migrations


def copy_tags(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    TaggedItem = apps.get_model("taggit", "TaggedItem")
    TaggedProduct = apps.get_model("catalogue", "TaggedProduct")
    product = ContentType.objects.get(app_label="catalogue", model="product")
    TaggedProduct.objects.bulk_create(
        TaggedProduct(content_type_id=item.content_type_id, object_id=item.object_id,
                      tag_id=item.tag_id)
        for item in TaggedItem.objects.filter(content_type=product).order_by("pk")
    )


class Migration(migrations.Migration):
    dependencies = [
        ("catalogue", "{previous}"),
        ("taggit", "{taggit}"),
        # the new rows get Snowflake keys: the worker tables must exist first
        ("snowflake_db", "{snowflake_db}"),
    ]
    operations = [migrations.RunPython(copy_tags, migrations.RunPython.noop)]
'''


class Shop:
    """The project folder, its database and the commands run on it (logged)."""

    def __init__(self, work_dir: Path, venv_python: Path) -> None:
        from shop_suites import _server

        self.dir = work_dir / "project"
        self.venv_python = venv_python
        self.db = f"oscar_shop_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.env = {**os.environ, **_server(), "OSCAR_SHOP_DB": self.db,
                    "DJANGO_SETTINGS_MODULE": "shopsite.settings", "PYTHONPATH": str(self.dir)}
        for variable in ("SNOWFLAKE_WORKER_ID", "SNOWFLAKE_WORKER_URL"):
            self.env.pop(variable, None)
        self.log = work_dir / "convert.log"

    def database(self, action: str) -> None:
        from shop_suites import _database

        _database(self.venv_python, self.env, action, self.db)

    def run(self, *arguments: str, ok: bool = True) -> tuple[int, str]:
        """``manage.py ARGUMENTS``; its exit status and output (raises on failure if ``ok``)."""
        started = time.monotonic()
        result = subprocess.run([str(self.venv_python), "manage.py", *arguments], cwd=self.dir,
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=1800, check=False)
        took = time.monotonic() - started
        with self.log.open("a") as out:
            out.write(f"$ manage.py {' '.join(arguments)}  (exit {result.returncode}, "
                      f"{took:.1f} s)\n{result.stdout}\n")
        if ok and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(arguments)} failed:\n{result.stdout[-3000:]}")
        return result.returncode, result.stdout

    def inside(self, step: str, **options: object) -> dict[str, Any]:
        """Run this script's ``step`` in the shop's venv and Django setup; its JSON answer."""
        answer = self.dir.parent / f"{step}.json"
        answer.unlink(missing_ok=True)
        result = subprocess.run(
            [str(self.venv_python), __file__, "--inside", step, "--answer", str(answer),
             "--options", json.dumps(options)],
            cwd=self.dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=3600, check=False)
        with self.log.open("a") as out:
            out.write(f"$ oscar_shop.py --inside {step}  (exit {result.returncode})\n"
                      f"{result.stdout}\n")
        if result.returncode != 0:
            raise RuntimeError(f"step {step} failed:\n{result.stdout[-4000:]}")
        data: dict[str, Any] = json.loads(answer.read_text())
        return data

    def edit(self, path: str, old: str, new: str) -> None:
        """Replace ``old`` (exactly once) in the project's file ``path``."""
        file = self.dir / path
        text = file.read_text()
        if text.count(old) != 1:
            raise RuntimeError(f"{path}: expected {old!r} once")
        file.write_text(text.replace(old, new))

    def write(self, path: str, text: str) -> None:
        file = self.dir / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)


def findings(output: str) -> list[str]:
    """The snowflake_db check messages in a command's output: 'ID object'."""
    found = []
    for line in output.splitlines():
        match = re.match(r"^(\S.*?): \((snowflake_db\.[EWI]\d+)\) (.*)$", line.strip())
        if match:
            # the field (E012, E014) or column (E010) named, else the object
            named = re.search(r"object IDs in (\S+),|^(\S+) is a |column (\S+) on database",
                              match[3])
            found.append(f"{match[2]} {next(filter(None, named.groups())) if named else match[1]}")
    return found


def build(shop: Shop) -> None:
    """The shop under ``AutoField``: Oscar's apps, the catalogue forked to tag products."""
    shutil.rmtree(shop.dir, ignore_errors=True)
    shop.log.unlink(missing_ok=True)
    apps = "\n".join(f'    "{app}",' for app in _OSCAR_APPS)
    shop.write("manage.py", _MANAGE)
    shop.write("shopsite/__init__.py", "")
    shop.write("shopsite/settings.py", _SETTINGS.format(oscar_apps=apps, auto=_AUTO))
    shop.write("shopsite/urls.py", _URLS)
    shop.run("oscar_fork_app", "catalogue", "shopapps")
    shop.edit("shopsite/settings.py", '"oscar.apps.catalogue.apps.CatalogueConfig"',
              '"shopapps.catalogue.apps.CatalogueConfig"')
    shop.write("shopapps/catalogue/models.py", _CATALOGUE_TAGGED)
    shop.run("makemigrations", "catalogue", "--name", "product_tags")
    shop.run("migrate", "--noinput")


def convert(shop: Shop) -> dict[str, Any]:
    """The conversion, step by step as docs/converting/django.md says; what check said."""
    said: dict[str, Any] = {}
    shop.edit("shopsite/settings.py", f'DEFAULT_AUTO_FIELD = "{_AUTO}"',
              f'DEFAULT_AUTO_FIELD = "{_SNOWFLAKE}"\n'
              'SNOWFLAKE_DB = {"WORKER_SOURCE": "table"}')
    shop.edit("shopsite/settings.py", '"taggit",\n', '"taggit",\n    "snowflake_db.django",\n')
    for name, command in (("check", ["check"]),
                          ("check --database", ["check", "--database", "default"]),
                          ("migrate", ["migrate", "--noinput"])):
        status, output = shop.run(*command, ok=False)
        said[f"before: {name}"] = {"exit": status, "findings": findings(output)}

    # Oscar's documented way to replace a model: fork the app, declare the model before the
    # star import of Oscar's models.
    shop.run("oscar_fork_app", "order", "shopapps", "--skip-checks")
    shop.edit("shopsite/settings.py", '"oscar.apps.order.apps.OrderConfig"',
              '"shopapps.order.apps.OrderConfig"')
    shop.write("shopapps/order/models.py", fork_models("order", "oscar.apps.order.models"))
    shop.write("shopapps/catalogue/models.py", fork_models(
        "catalogue", "oscar.apps.catalogue.models", imports=_CATALOGUE_TAGS_IMPORTS,
        body=_CATALOGUE_TAGS_BODY))
    shop.edit("shopsite/settings.py", 'SNOWFLAKE_DB = {"WORKER_SOURCE": "table"}',
              'SNOWFLAKE_DB = {"WORKER_SOURCE": "table",\n'
              '                "NOT_KEY_COLUMNS": ["taggit.TaggedItem.object_id"]}')
    status, output = shop.run("check", ok=False)
    said["after the forks: check"] = {"exit": status, "findings": findings(output)}

    _, output = shop.run("snowflake", "widen", "--dry-run", "--database", "default")
    said["widen --dry-run"] = [line for line in output.splitlines() if "->" in line]
    _, output = shop.run("snowflake", "widen", "--database", "default")
    said["widen"] = [line for line in output.splitlines() if "->" in line]
    _, output = shop.run("makemigrations")
    said["makemigrations"] = [line.strip() for line in output.splitlines()
                              if line.strip()[:1] in ("~", "+", "-")]
    _, output = shop.run("makemigrations", "catalogue", "--empty", "--name", "copy_product_tags")
    copy = sorted((shop.dir / "shopapps/catalogue/migrations").glob("*_copy_product_tags.py"))[-1]
    previous = sorted(path.stem for path in copy.parent.glob("0*.py") if path != copy)[-1]
    shop.write(str(copy.relative_to(shop.dir)), _COPY_TAGS.format(
        previous=previous, taggit=_last_migration(shop, "taggit"),
        snowflake_db=_last_migration(shop, "snowflake_db.django")))
    status, output = shop.run("migrate", "--noinput")
    said["migrate"] = [line.strip() for line in output.splitlines() if "Applying" in line]
    said["migrate"].append(f"and widened {output.count('snowflake_db: widened')} auto-created "
                           "many-to-many keys")
    status, output = shop.run("check", "--database", "default", ok=False)
    said["after: check --database"] = {"exit": status, "findings": findings(output)}
    status, output = shop.run("makemigrations", "--check", "--dry-run", ok=False)
    said["after: makemigrations --check"] = {"exit": status, "output": output.strip()[-300:]}
    return said


def _last_migration(shop: Shop, package: str) -> str:
    code = (f"import importlib.resources as r; print(sorted(p.name[:-3] for p in "
            f"r.files('{package}.migrations').iterdir() if p.name[:4].isdigit() and "
            "p.name.endswith('.py'))[-1])")
    return subprocess.run([str(shop.venv_python), "-c", code], check=True, text=True,
                          capture_output=True, env=shop.env).stdout.strip()


# ---------------------------------------------------------------------------------------------
# Inside the shop's venv: fill, snapshot, verify (Oscar's APIs)

#: Key relations whose rows must be identical after the conversion: table -> columns.
KEY_RELATIONS = {
    "order_order": "id, number, user_id, basket_id, total_incl_tax",
    "order_line": "id, order_id, product_id, stockrecord_id, quantity",
    "order_orderdiscount": "id, order_id, offer_id, voucher_id, amount",
    "order_orderlinediscount": "id, line_id, order_discount_id, amount",
    "voucher_voucher_offers": "voucher_id, conditionaloffer_id",
    "voucher_voucherapplication": "voucher_id, user_id, order_id",
    "catalogue_productcategory": "product_id, category_id",
    "catalogue_product_category_hierarchy": "id, product_id, category_id",
    "catalogue_productattributevalue": "product_id, attribute_id, entity_object_id",
    "partner_stockrecord": "id, product_id, partner_id, num_in_stock, num_allocated",
    "offer_range_included_categories": "range_id, category_id",
    "basket_line": "basket_id, product_id, quantity",
    "taggit_taggeditem": "content_type_id, object_id, tag_id",
}


#: Django's own bookkeeping, which grows with the new models and migrations by design.
BOOKKEEPING = ("django_migrations", "django_content_type", "auth_permission")


def _models() -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from oscar.core.loading import get_class, get_model

    found: dict[str, Any] = {"User": get_user_model()}
    for label, names in {
        "catalogue": ["Category", "Product", "ProductClass", "ProductCategory",
                      "ProductAttribute", "ProductAttributeValue", "ProductCategoryHierarchy"],
        "partner": ["Partner", "StockRecord"], "basket": ["Basket"],
        "offer": ["Range", "Condition", "Benefit", "ConditionalOffer"],
        "voucher": ["Voucher"], "order": ["Order", "OrderDiscount"],
    }.items():
        for name in names:
            found[name] = get_model(label, name)
    for module, name in (("offer.applicator", "Applicator"), ("partner.strategy", "Selector"),
                         ("order.utils", "OrderCreator"), ("shipping.methods", "Free"),
                         ("checkout.calculators", "OrderTotalCalculator"),
                         ("checkout.applicator", "SurchargeApplicator")):
        found[name] = get_class(module, name)
    return found


def place_order(m: dict[str, Any], user: object, products: list[Any],
                vouchers: Sequence[Any] = ()) -> Any:
    """A basket with ``products`` and ``vouchers``, Oscar's offers applied, placed as an
    order with ``OrderCreator`` (what Oscar's checkout does at the end)."""
    basket = m["Basket"].objects.create(owner=user)
    basket.strategy = m["Selector"]().strategy(user=user)
    for product in products:
        basket.add_product(product)
    for voucher in vouchers:
        basket.vouchers.add(voucher)
    m["Applicator"]().apply(basket, user)
    method = m["Free"]()
    charge = method.calculate(basket)
    surcharges = m["SurchargeApplicator"]().get_applicable_surcharges(basket)
    total = m["OrderTotalCalculator"]().calculate(basket, charge, surcharges=surcharges)
    order = m["OrderCreator"]().place_order(
        basket=basket, total=total, shipping_method=method, shipping_charge=charge, user=user,
        surcharges=surcharges)
    basket.submit()
    return order


def _offer(m: dict[str, Any], name: str, rng: object, *, kind: str, benefit: str, value: str,
           **fields: object) -> Any:
    from decimal import Decimal

    condition = m["Condition"].objects.create(range=rng, type=m["Condition"].COUNT, value=1)
    benefit_row = m["Benefit"].objects.create(range=rng, type=benefit, value=Decimal(value))
    return m["ConditionalOffer"].objects.create(name=name, offer_type=kind, condition=condition,
                                                benefit=benefit_row, **fields)


def _voucher(m: dict[str, Any], code: str, offer: object) -> Any:
    from datetime import timedelta

    from django.utils import timezone

    voucher = m["Voucher"].objects.create(
        name=f"Voucher {code}", code=code, start_datetime=timezone.now() - timedelta(days=1),
        end_datetime=timezone.now() + timedelta(days=365))
    voucher.offers.add(offer)
    return voucher


def _products(m: dict[str, Any], prefix: str, count: int, *, categories: list[Any],
              partner: Any, product_class: Any, attribute: Any, tags: list[str]) -> list[Any]:
    from decimal import Decimal

    made: list[Any] = []
    for i in range(count):
        product = m["Product"].objects.create(title=f"{prefix} {i}", product_class=product_class,
                                              upc=f"{prefix}-{i}")
        m["ProductCategory"].objects.create(product=product,
                                            category=categories[i % len(categories)])
        m["StockRecord"].objects.create(product=product, partner=partner,
                                        partner_sku=f"{prefix}-sku-{i}",
                                        price=Decimal(10 + i % 7), num_in_stock=10_000)
        if made and i % 4 == 0:  # an entity attribute pointing at another product
            m["ProductAttributeValue"].objects.create(attribute=attribute, product=product,
                                                      value_entity=made[-1])
        product.tags.add(*tags[: 1 + i % len(tags)])
        made.append(product)
    return made


def fill(options: dict[str, Any]) -> dict[str, Any]:
    """The shop before the conversion, through Oscar's APIs."""
    import random

    m = _models()
    root_books = m["Category"].add_root(name="Books")
    books = [root_books.add_child(name="Fiction"), root_books.add_child(name="Science")]
    music = [m["Category"].add_root(name="Music").add_child(name="Jazz")]
    partner = m["Partner"].objects.create(name="Warehouse")
    book_class = m["ProductClass"].objects.create(name="Book", track_stock=True)
    attribute = m["ProductAttribute"].objects.create(product_class=book_class, name="Sequel of",
                                                     code="sequel_of", type="entity")
    common = {"partner": partner, "product_class": book_class, "attribute": attribute}
    products = (_products(m, "book", 60, categories=books, tags=["paper", "bestseller", "classic"],
                          **common)
                + _products(m, "record", 20, categories=music, tags=["vinyl"], **common))
    book_range = m["Range"].objects.create(name="All books")
    book_range.included_categories.add(root_books)
    every = m["Range"].objects.create(name="Everything", includes_all_products=True)
    site_offer = _offer(m, "10% off books", book_range, kind="Site",
                        benefit=m["Benefit"].PERCENTAGE, value="10")
    voucher_offer = _offer(m, "2 off with SAVE2", every, kind="Voucher",
                           benefit=m["Benefit"].FIXED, value="2")
    voucher = _voucher(m, "SAVE2", voucher_offer)
    users = [m["User"].objects.create_user(f"customer{i}", f"customer{i}@example.com", "pw")
             for i in range(30)]
    pick = random.Random(34)
    for i in range(int(options["orders"])):
        place_order(m, users[i % len(users)], pick.sample(products, 1 + i % 3),
                    [voucher] if i % 3 == 0 else [])
    return {"snapshot": snapshot(), "offers": [site_offer.pk, voucher_offer.pk],
            "voucher": voucher.pk}


def snapshot() -> dict[str, Any]:
    """Row counts of every table and materialized view, and checksums of KEY_RELATIONS."""
    import hashlib

    from django.db import connection

    counts: dict[str, int] = {}
    sums: dict[str, str] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                       "UNION SELECT matviewname FROM pg_matviews "
                       "WHERE schemaname = current_schema()")
        for (table,) in sorted(cursor.fetchall()):
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            counts[table] = cursor.fetchone()[0]
        for table, columns in KEY_RELATIONS.items():
            cursor.execute(f"SELECT {columns} FROM {table} ORDER BY {columns}")
            digest = hashlib.sha256()
            for row in cursor.fetchall():
                digest.update(repr(tuple(str(value) for value in row)).encode())
            sums[table] = digest.hexdigest()[:16]
    return {"counts": counts, "checksums": sums}


def verify(options: dict[str, Any]) -> dict[str, Any]:
    """After the conversion: (what, before, after, ok) rows."""
    from collections import Counter

    from django.db import connection

    m = _models()
    before = options["before"]
    rows: list[list[object]] = []

    def row(what: str, old: object, new: object, ok: object) -> None:
        rows.append([what, old, new, bool(ok)])

    now = snapshot()
    counts, old_counts = now["counts"], before["snapshot"]["counts"]
    shop_tables = [t for t in old_counts if t not in BOOKKEEPING]
    changed = sorted(t for t in shop_tables if counts.get(t) != old_counts[t])
    row(f"shop tables with the same row count ({sum(old_counts[t] for t in shop_tables)} rows)",
        len(shop_tables), len(shop_tables) - len(changed), not changed)
    if changed:
        row(f"changed: {', '.join(changed[:5])}", "", "", False)
    grew = ", ".join(f"{t.split('_', 1)[1]} +{counts[t] - old_counts[t]}" for t in BOOKKEEPING)
    row(f"(bookkeeping grew: {grew})", "", "", True)
    sums, old_sums = now["checksums"], before["snapshot"]["checksums"]
    differ = sorted(t for t in old_sums if sums[t] != old_sums[t])
    row("key relations with the same checksum", len(old_sums), len(old_sums) - len(differ),
        not differ)
    if differ:
        row(f"differ: {', '.join(differ)}", "", "", False)

    with connection.cursor() as cursor:
        cursor.execute("SELECT content_type_id, object_id, tag_id FROM taggit_taggeditem "
                       "WHERE content_type_id = (SELECT id FROM django_content_type WHERE "
                       "app_label = 'catalogue' AND model = 'product')")
        old_tags = Counter(cursor.fetchall())
        cursor.execute("SELECT content_type_id, object_id, tag_id FROM catalogue_taggedproduct")
        moved = Counter(cursor.fetchall())
    row("product tags copied to the 64-bit through model", sum(old_tags.values()),
        sum(moved.values()), old_tags == moved and bool(moved))

    discounts = list(m["OrderDiscount"].objects.all())
    with_offer = [d for d in discounts if d.offer_id]
    with_voucher = [d for d in discounts if d.voucher_id]
    linked = sum(d.offer is not None for d in with_offer)
    row("old order discounts still linked to their offer", len(with_offer), linked,
        linked == len(with_offer) and with_offer)
    linked = sum(d.voucher is not None for d in with_voucher)
    row("... and to their voucher", len(with_voucher), linked,
        linked == len(with_voucher) and with_voucher)
    site_offer_id, _ = before["offers"]
    old_uses = m["OrderDiscount"].objects.filter(offer_id=site_offer_id).count()
    row("OrderDiscount.objects.filter(offer_id=<old offer>)",
        sum(d.offer_id == site_offer_id for d in discounts), old_uses, old_uses > 0)

    # New rows: Snowflake keys.
    books = m["Category"].objects.get(name="Books", depth=1)
    new_category = books.add_child(name="Poetry")
    partner = m["Partner"].objects.get(name="Warehouse")
    book_class = m["ProductClass"].objects.get(name="Book")
    attribute = m["ProductAttribute"].objects.get(code="sequel_of")
    new_products = _products(m, "poem", 8, categories=[new_category], partner=partner,
                             product_class=book_class, attribute=attribute,
                             tags=["paper", "new-poetry"])
    row("new category key > 2**31", 2**31, new_category.pk, new_category.pk > 2**31)
    row("new product keys > 2**53 (default layout)", 2**53, min(p.pk for p in new_products),
        all(p.pk > 2**53 for p in new_products))
    # Oscar's own lookups compare one key at a time (an __in list is not range-checked by
    # Django): filter(product_id=...) per product, as Range.get_category_query does.
    in_view = sum(m["ProductCategoryHierarchy"].objects.filter(product_id=p.pk).count()
                  for p in new_products)
    row("materialized view rows for the new products (by product_id)", 2 * len(new_products),
        in_view, in_view == 2 * len(new_products))  # Poetry and Books
    by_category = m["ProductCategoryHierarchy"].objects.filter(category_id=new_category.pk)
    row("... by the new category's key", len(new_products), by_category.count(),
        by_category.count() == len(new_products))
    sequel = list(m["ProductAttributeValue"].objects.filter(product__in=new_products,
                                                             attribute=attribute))
    pointing = sum(value.value_entity in new_products for value in sequel)
    row("entity attributes pointing at new products", len(sequel), pointing,
        sequel and pointing == len(sequel))

    old_offer = m["ConditionalOffer"].objects.get(pk=site_offer_id)
    book_range = old_offer.benefit.range
    row("old category range contains a new product (view lookup)", True,
        book_range.contains_product(new_products[0]), book_range.contains_product(new_products[0]))
    poetry_range = m["Range"].objects.create(name="Poetry")
    poetry_range.included_categories.add(new_category)
    new_offer = _offer(m, "3 off poetry, twice per customer", poetry_range, kind="Site",
                       benefit=m["Benefit"].FIXED, value="3", max_user_applications=2,
                       priority=10)
    every = m["Range"].objects.get(name="Everything")
    new_voucher_offer = _offer(m, "1 off with NEW1", every, kind="Voucher",
                               benefit=m["Benefit"].FIXED, value="1")
    new_voucher = _voucher(m, "NEW1", new_voucher_offer)
    row("new offer and voucher keys > 2**53", 2**53, min(new_offer.pk, new_voucher.pk),
        min(new_offer.pk, new_voucher.pk, new_voucher_offer.pk) > 2**53)

    customer = m["User"].objects.create_user("newcustomer", "new@example.com", "pw")
    old_books = list(m["Product"].objects.filter(upc__startswith="book-").order_by("pk")[:5])
    basket = m["Basket"].objects.create(owner=customer)
    basket.strategy = m["Selector"]().strategy(user=customer)
    basket.add_product(new_products[0])
    basket.add_product(old_books[0])
    basket.vouchers.add(new_voucher)
    m["Applicator"]().apply(basket, customer)
    offers = {d["offer"].pk for d in basket.offer_discounts}
    vouchers = {d["voucher"].pk for d in basket.voucher_discounts if d.get("voucher")}
    row("basket: the new category offer gives its discount", new_offer.pk in offers,
        new_offer.pk in offers, new_offer.pk in offers)
    row("basket: the new voucher applies", True, vouchers == {new_voucher.pk},
        vouchers == {new_voucher.pk})
    basket.delete()

    old_voucher = m["Voucher"].objects.get(pk=before["voucher"])
    orders = [place_order(m, customer, [new_products[i], old_books[i]],
                          [new_voucher] if i % 2 else [old_voucher]) for i in range(4)]
    regular = m["User"].objects.get(username="customer0")
    orders += [place_order(m, regular, [new_products[4 + i]], [new_voucher]) for i in range(3)]
    row("new order keys > 2**53", 2**53, min(o.pk for o in orders),
        all(o.pk > 2**53 for o in orders))
    new_discounts = list(m["OrderDiscount"].objects.filter(order__in=orders))
    row("OrderDiscount rows of the new orders", f">= {len(orders)}", len(new_discounts),
        len(new_discounts) >= len(orders))
    every_discount = list(m["OrderDiscount"].objects.all())
    for what, column, key, least in (("new offer", "offer_id", new_offer.pk, 4),
                                     ("new voucher", "voucher_id", new_voucher.pk, 1),
                                     ("old voucher", "voucher_id", before["voucher"], 1),
                                     ("old offer", "offer_id", site_offer_id, old_uses)):
        counted = sum(getattr(d, column) == key for d in every_discount)
        found = m["OrderDiscount"].objects.filter(**{column: key}).count()
        row(f"OrderDiscount.objects.filter({column}=<{what}>).count()", counted, found,
            found == counted and found >= least)
    user_uses = new_offer.get_num_user_applications(customer)
    row("offer limit: applications counted for the new customer", 2, user_uses, user_uses == 2)
    left = new_offer.get_max_applications(customer)
    row("offer limit: applications left for them (max 2)", 0, left, left == 0)
    again = place_order(m, customer, [new_products[7]])
    used = {d.offer_id for d in m["OrderDiscount"].objects.filter(order=again)}
    row("next order: no new-offer discount, the old category offer's", "old offer",
        "old offer" if used == {site_offer_id} else used, used == {site_offer_id})

    tagged = m["Product"].objects.filter(tags__name="new-poetry")
    row("tags: filter(tags__name='new-poetry')", len(new_products) // 2, tagged.count(),
        tagged.count() == len(new_products) // 2)  # the odd ones: see _products
    common = {tag.name: tag.num_times for tag in m["Product"].tags.most_common()}
    expected_paper = sum(1 for _ in m["Product"].objects.filter(tags__name="paper"))
    row("tags: most_common() counts 'paper' on old and new products", expected_paper,
        common.get("paper"), common.get("paper") == expected_paper and expected_paper > 60)
    names = set(new_products[1].tags.names())
    row("tags: names() of a new product", "paper, new-poetry", ", ".join(sorted(names)),
        names == {"paper", "new-poetry"})
    old_names = m["Product"].objects.get(upc="book-2").tags.names()
    row("tags: names() of an old product", 3, len(old_names), len(old_names) == 3)
    old_paper = m["Product"].objects.filter(tags__name="paper", upc__startswith="book-")
    row("tags: old products still found by tag", 60, old_paper.count(), old_paper.count() == 60)
    return {"rows": rows}


def _inside(step: str, answer: Path, options: dict[str, Any]) -> None:
    sys.path.insert(0, os.getcwd())
    import django

    django.setup()
    result = {"fill": fill, "verify": verify}[step](options)
    answer.write_text(json.dumps(result, default=str))


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=300, help="orders placed before")
    parser.add_argument("--oscar", default="4.2.1", help="django-oscar release (PyPI)")
    parser.add_argument("--taggit", default="6.1.0", help="django-taggit release (PyPI)")
    parser.add_argument("--django", default="5.2", help="Django release series")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venv")
    parser.add_argument("--venv-dir", type=Path, default=ROOT / ".venv" / "shop-suites",
                        help="where shop_suites.py builds its venv (shared)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".venv" / "oscar-shop")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 on any failure")
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    parser.add_argument("--answer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        _inside(args.inside, args.answer, json.loads(args.options))
        return 0

    from shop_suites import prepare

    venv_python = prepare(args.venv_dir.resolve(), args.python, args.django, args.oscar,
                          args.taggit)
    work_dir = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    shop = Shop(work_dir, venv_python)
    shop.database("drop")  # leftovers of a killed run of this process id
    shop.database("create")
    started = time.monotonic()
    try:
        build(shop)
        filled = shop.inside("fill", orders=args.orders)
        built = time.monotonic()
        said = convert(shop)
        converted = time.monotonic()
        checked = shop.inside("verify", before=filled)
    finally:
        if not args.keep_database:
            shop.database("drop")
    return report(filled, said, checked["rows"], {
        "build and fill": built - started, "conversion": converted - built}, check=args.check)


def report(filled: dict[str, Any], said: dict[str, Any], rows: list[list[Any]],
           seconds: dict[str, float], *, check: bool) -> int:
    """Print what check said and the table of numbers; the exit status."""
    failures = 0
    print("What check and migrate said:")
    for step, what in said.items():
        if isinstance(what, dict) and "findings" in what:
            kinds: dict[str, list[str]] = {}
            for finding in what["findings"]:
                code, _, obj = finding.partition(" ")
                kinds.setdefault(code, []).append(obj)
            listed = "; ".join(
                f"{code} x{len(objs)}: {', '.join(sorted(set(objs))[:6])}"
                f"{', ...' if len(set(objs)) > 6 else ''}" for code, objs in sorted(kinds.items()))
            print(f"  {step} (exit {what['exit']}): {listed or 'nothing'}")
        elif isinstance(what, list):
            views = [line for line in what if "recreated" in line]
            print(f"  {step}: {len(what)} line(s){', of which' if views else ''}")
            for line in views if step.startswith("widen") else what:
                print(f"      {line}")
        else:
            print(f"  {step}: {what}")
    before = said["before: check --database"]
    wanted = {"snowflake_db.E010", "snowflake_db.E012", "snowflake_db.E014"}
    seen = {finding.split()[0] for finding in before["findings"]}
    extra_rows = [
        ["before: check --database reports E010, E012 and E014", "3 kinds",
         len(wanted & seen), wanted <= seen],
        ["before: migrate stops on them", "exit 1", f"exit {said['before: migrate']['exit']}",
         said["before: migrate"]["exit"] != 0],
        ["after the forks: check reports nothing narrow", 0,
         len(said["after the forks: check"]["findings"]),
         not said["after the forks: check"]["findings"]],
        ["after: check --database reports nothing", 0,
         len(said["after: check --database"]["findings"]),
         not said["after: check --database"]["findings"]
         and said["after: check --database"]["exit"] == 0],
        ["after: makemigrations --check", "exit 0",
         f"exit {said['after: makemigrations --check']['exit']}",
         said["after: makemigrations --check"]["exit"] == 0],
    ]
    print(f"\nOscar shop conversion ({filled['snapshot']['counts']['order_order']} orders "
          f"before; build and fill {seconds['build and fill']:.0f} s, conversion "
          f"{seconds['conversion']:.0f} s)")
    print(f"{'check':68} {'expected':>20} {'measured':>20}  result")
    for what, expected, measured, ok in [*extra_rows, *rows]:
        failures += not ok
        print(f"{what[:68]:68} {str(expected)[:20]:>20} {str(measured)[:20]:>20}  "
              f"{'ok' if ok else 'FAIL'}")
    print(f"target: every check ok -> {'PASS' if not failures else 'FAIL'} ({failures} failed)")
    return 1 if check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
