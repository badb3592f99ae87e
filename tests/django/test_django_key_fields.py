"""snowflake_db.E014 (a plain integer field that receives Snowflake keys by name or declaration)
and E012's hints for models the project cannot edit, on throwaway projects shaped like
django-oscar and django-taggit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SNOWFLAKE = "snowflake_db.django.fields.SnowflakeAutoField"

#: django-oscar's shapes: offer and voucher keys in PositiveIntegerFields of OrderDiscount, and
#: an unmanaged model over a materialized view with IntegerField keys.
OSCAR_LIKE = '''
from django.db import models


class ConditionalOffer(models.Model):
    name = models.CharField(max_length=50)


class Voucher(models.Model):
    code = models.CharField(max_length=20)


class Product(models.Model):
    title = models.CharField(max_length=50)


class OrderDiscount(models.Model):
    offer_id = models.PositiveIntegerField(null=True)
    voucher_id = models.PositiveIntegerField(null=True)
    frequency = models.PositiveIntegerField(null=True)
    basket_line_pk = models.IntegerField(null=True)


class ProductCategoryHierarchy(models.Model):
    id = models.IntegerField(primary_key=True)
    product_id = models.IntegerField()
    category_id = models.IntegerField()

    class Meta:
        managed = False
        db_table = "demo_product_category_hierarchy"


class Worker(models.Model):  # snowflake_db's worker_id columns hold worker IDs, not its keys
    name = models.CharField(max_length=20)


class Wide(models.Model):
    product_id = models.PositiveBigIntegerField()
    voucher_pk = models.BigIntegerField()
'''


def _write_app(where: Path, name: str, models: str) -> None:
    app = where / name
    app.mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(models)


def _checks(tmp_path: Path, *, models: str = OSCAR_LIKE, default_auto_field: str = SNOWFLAKE,
            extra: dict[str, Any] | None = None) -> list[dict[str, str]]:
    _write_app(tmp_path, "demo", models)
    result = subprocess.run(
        [sys.executable, "-m", "tests.django.check_scenario", str(tmp_path), default_auto_field,
         json.dumps(extra or {})],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    messages: list[dict[str, str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return messages


def _by_field(messages: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {message["msg"].split(" ", 1)[0]: message for message in messages}


def test_e014_finds_oscars_key_columns_by_name(tmp_path: Path) -> None:
    found = _by_field(_checks(tmp_path))
    assert set(found) == {
        "demo.OrderDiscount.offer_id", "demo.OrderDiscount.voucher_id",
        "demo.ProductCategoryHierarchy.product_id",
    }
    assert {message["id"] for message in found.values()} == {"snowflake_db.E014"}
    offer = found["demo.OrderDiscount.offer_id"]
    assert "is a PositiveIntegerField (32 bits or fewer)" in offer["msg"]
    assert "its name says it holds keys of demo.ConditionalOffer" in offer["msg"]
    assert "Make offer_id a PositiveBigIntegerField" in offer["hint"]
    assert "'demo.OrderDiscount.offer_id' in SNOWFLAKE_DB['NOT_KEY_COLUMNS']" in offer["hint"]
    view = found["demo.ProductCategoryHierarchy.product_id"]
    assert "keys of demo.Product" in view["msg"]
    assert "not managed by Django" in view["hint"] and "BigIntegerField" in view["hint"]


def test_e014_takes_declared_columns_and_exceptions(tmp_path: Path) -> None:
    declared = {"KEY_COLUMNS": ["demo.ProductCategoryHierarchy.category_id",
                                "demo.OrderDiscount.basket_line_pk",
                                "demo.ProductCategoryHierarchy.id"],
                "NOT_KEY_COLUMNS": ["demo.OrderDiscount.voucher_id"]}
    found = _by_field(_checks(tmp_path, extra={
        "settings": {"SNOWFLAKE_DB": {"WORKER_SOURCE": "manual", **declared}}}))
    assert set(found) == {
        "demo.OrderDiscount.offer_id", "demo.ProductCategoryHierarchy.product_id",
        "demo.ProductCategoryHierarchy.category_id", "demo.OrderDiscount.basket_line_pk",
        "demo.ProductCategoryHierarchy.id",
    }
    assert "SNOWFLAKE_DB['KEY_COLUMNS'] lists it" in (
        found["demo.ProductCategoryHierarchy.category_id"]["msg"]
    )


def test_e014_names_unknown_declarations(tmp_path: Path) -> None:
    messages = _checks(tmp_path, extra={"settings": {"SNOWFLAKE_DB": {
        "WORKER_SOURCE": "manual", "NOT_KEY_COLUMNS": ["demo.OrderDiscount.offerid"]}}})
    (unknown,) = [message for message in messages if message["id"] == "snowflake_db.E001"]
    assert "demo.orderdiscount.offerid, which is no field of an installed model" in unknown["msg"]


def test_e014_silent_without_snowflake_keys(tmp_path: Path) -> None:
    assert _checks(tmp_path, default_auto_field="django.db.models.BigAutoField") == []


def test_e014_hint_for_an_app_outside_the_project(tmp_path: Path) -> None:
    """An app the project does not own (outside BASE_DIR): the hint says how to replace the
    model rather than to edit it."""
    _write_app(tmp_path / "vendor", "shopapp", OSCAR_LIKE.replace("class Wide", "class W"))
    found = _by_field(_checks(tmp_path, models=OSCAR_LIKE.replace("class OrderDiscount",
                                                                  "class Unused"), extra={
        "apps": ["shopapp"], "path": [str(tmp_path / "vendor")],
        "settings": {"BASE_DIR": str(tmp_path / "demo")},
    }))
    hint = found["shopapp.OrderDiscount.offer_id"]["hint"]
    assert "belongs to the installed app 'shopapp', which you cannot edit" in hint
    assert "offer_id = models.PositiveBigIntegerField(...)" in hint
    assert "Make offer_id" in found["demo.Unused.offer_id"]["hint"]


#: A false positive: a Snowflake-keyed Carrier, and a carrier_id that is the carrier's number
#: in an outside system (not a key of ours).
CARRIER_LIKE = '''
from django.db import models


class Carrier(models.Model):
    name = models.CharField(max_length=50)


class Parcel(models.Model):
    carrier_id = models.IntegerField()
'''


def _migrate(tmp_path: Path, extra: dict[str, Any]) -> list[Any]:
    result: list[Any] = _checks(tmp_path, models=CARRIER_LIKE, extra={**extra, "migrate": True})
    return result


def _not_key_entry(output: str) -> str:
    """The NOT_KEY_COLUMNS entry E014's hint names, exactly as written there."""
    entries = re.findall(r"list '([^']+)' in SNOWFLAKE_DB\['NOT_KEY_COLUMNS'\]", output)
    assert len(entries) == 1, output
    return entries[0]


def test_e014_false_positive_stops_migrate_until_the_entry_its_hint_names_is_added(
    tmp_path: Path,
) -> None:
    migrated, output = _migrate(tmp_path / "before", {})
    assert not migrated
    assert "demo.Parcel.carrier_id is an IntegerField (32 bits or fewer) but its name " \
        "says it holds keys of demo.Carrier" in output
    entry = _not_key_entry(output)
    assert entry == "demo.Parcel.carrier_id"
    settings = {"SNOWFLAKE_DB": {"WORKER_SOURCE": "manual", "NOT_KEY_COLUMNS": [entry]}}
    # The next command takes it: no migration, nothing else reported.
    assert _migrate(tmp_path / "after", {"settings": settings}) == [True, ""]


def test_e014_false_positive_in_an_installed_app_has_the_same_way_out(tmp_path: Path) -> None:
    """The same one-line way out for a field of an app the project cannot edit."""
    _write_app(tmp_path / "vendor", "carriers", CARRIER_LIKE)
    outside = {"apps": ["carriers"], "path": [str(tmp_path / "vendor")]}
    project = {"BASE_DIR": str(tmp_path / "demo")}
    migrated, output = _migrate(tmp_path / "before", {**outside, "settings": project})
    assert not migrated
    assert "belongs to the installed app 'carriers', which you cannot edit" in output
    entries = sorted(re.findall(r"list '([^']+)' in SNOWFLAKE_DB", output))
    assert entries == ["carriers.Parcel.carrier_id", "demo.Parcel.carrier_id"]
    settings = {**project, "SNOWFLAKE_DB": {"WORKER_SOURCE": "manual",
                                            "NOT_KEY_COLUMNS": entries}}
    assert _migrate(tmp_path / "after", {**outside, "settings": settings}) == [True, ""]


def test_key_lookups_raise_on_reported_fields_and_in_only_on_plain_ones(tmp_path: Path) -> None:
    """``in`` raises on E014 fields only: on a generic object ID Django itself asks
    ``object_id__in`` with the keys of objects it deletes (GenericRelation)."""
    generic = CARRIER_LIKE + (
        "\n\nfrom django.contrib.contenttypes.fields import GenericForeignKey\n"
        "from django.contrib.contenttypes.models import ContentType\n\n\n"
        "class Note(models.Model):\n"
        "    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)\n"
        "    object_id = models.PositiveIntegerField()\n"
        "    target = GenericForeignKey()\n"
        "    quantity = models.IntegerField()\n"
    )
    fields = ["demo.Parcel.carrier_id", "demo.Note.object_id", "demo.Note.quantity"]
    found = _checks(tmp_path, models=generic, extra={"lookups": fields})
    assert found == {
        "demo.Parcel.carrier_id": {"exact": "KeyExact", "lt": "KeyLessThan", "in": "KeyIn"},
        "demo.Note.object_id": {"exact": "KeyExact", "lt": "KeyLessThan", "in": "In"},
        "demo.Note.quantity": {"exact": "IntegerFieldExact", "lt": "IntegerLessThan",
                               "in": "In"},
    }


def test_e012_points_taggit_users_to_the_through_model(tmp_path: Path) -> None:
    product = "from django.db import models\n\n\nclass Product(models.Model):\n    pass\n"
    (error,) = _checks(tmp_path, models=product, extra={"apps": ["taggit"]})
    assert error["id"] == "snowflake_db.E012"
    assert error["msg"].startswith("taggit.TaggedItem.content_object stores object IDs")
    assert "class TaggedItem(SnowflakeTaggedItemBase)" in error["hint"]
    assert "TaggableManager(through=TaggedItem)" in error["hint"]
    assert _checks(tmp_path / "declared", models=product, extra={
        "apps": ["taggit"], "settings": {"SNOWFLAKE_DB": {
            "WORKER_SOURCE": "manual", "NOT_KEY_COLUMNS": ["taggit.TaggedItem.object_id"]}},
    }) == []
