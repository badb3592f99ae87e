"""Public numbers in Django on every backend: the model attribute, get/filter by number, the URL
converter, REST framework, the admin and the SNOWFLAKE_DB setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.migrations.state import ModelState
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from snowflake_db.django.conf import parse
from snowflake_db.django.public_ids.serializers import PublicIdField, PublicIdRelatedField
from snowflake_db.errors import InvalidArgumentError, PublicIdError
from snowflake_db.public_ids import (
    PublicIdCodec,
    codec_for,
    configure_public_ids,
    generate_key,
    parse_keys,
)
from tests.django_project.shop.models import Customer, Invoice, Item, Order
from tests.plugins.public_ids_support import foreign_number, mistyped

KEY = generate_key()
OTHER_KEY = generate_key()
URLS = "tests.django.public_id_urls"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def public_id_keys() -> Iterator[None]:
    configure_public_ids(KEY)
    yield
    configure_public_ids(None)


def _orders(count: int) -> list[Order]:
    customer = Customer.objects.create(name="ada")
    return [Order.objects.create(customer=customer, total_cents=i) for i in range(count)]


def test_public_id_is_the_codec_number_of_the_key(backend: str) -> None:
    order = _orders(1)[0]
    assert order.public_id == codec_for("orders").encode(order.pk)
    assert len(order.public_id) == 16 and order.public_id != str(order.pk)
    assert Order(total_cents=1).public_id is None  # unsaved: no key, no number
    order.full_clean()  # the column-less field passes model validation
    with pytest.raises(AttributeError, match="derived from the key 'pk'"):
        order.public_id = "0" * 16
    # Nothing stored: no column, nothing for migrations.
    assert "public_id" not in {f.name for f in Order._meta.concrete_fields}
    assert "public_id" not in dict(ModelState.from_model(Order).fields)


def test_get_and_filter_by_public_id_are_key_lookups(backend: str) -> None:
    first, second, third = _orders(3)
    with CaptureQueriesContext(connections[backend]) as queries:
        assert Order.objects.get(public_id=first.public_id) == first
    sql = queries.captured_queries[0]["sql"]
    assert str(first.pk) in sql and first.public_id not in sql  # compared as the key
    grouped = codec_for("orders").encode(second.pk, group=4).lower()
    assert Order.objects.get(public_id=grouped) == second  # any case, hyphens
    assert set(Order.objects.filter(public_id__in=[first.public_id, third.public_id,
                                                   "nonsense"])) == {first, third}
    assert set(Order.objects.exclude(public_id=first.public_id)) == {second, third}
    assert Item.objects.filter(order__public_id=first.public_id).count() == 0
    Item.objects.create(order=first, sku="a")
    assert Item.objects.get(order__public_id=first.public_id).order_id == first.pk
    numbers = set(Order.objects.values_list("public_id", flat=True))
    assert numbers == {first.public_id, second.public_id, third.public_id}
    assert Order.objects.filter(public_id=second.public_id).update(note="paid") == 1
    assert Order.objects.filter(public_id=mistyped(second.public_id)).update(note="x") == 0
    assert list(Order.objects.filter(note="paid")) == [second]
    assert Order.objects.filter(public_id=mistyped(third.public_id)).delete()[0] == 0
    assert Order.objects.filter(public_id=third.public_id).delete()[0] == 1
    assert set(Order.objects.all()) == {first, second}


def test_a_wrong_number_finds_nothing_and_decoding_says_why(backend: str) -> None:
    order = _orders(1)[0]
    orders = codec_for("orders")
    other_namespace = foreign_number(codec_for("invoices"), orders, order.pk)
    other_key = foreign_number(PublicIdCodec(parse_keys(OTHER_KEY), namespace="orders"), orders,
                               order.pk)
    for wrong in (mistyped(order.public_id), other_namespace, other_key, "", "x" * 16):
        with pytest.raises(Order.DoesNotExist):
            Order.objects.get(public_id=wrong)
        assert not Order.objects.filter(public_id=wrong).exists()
        assert Order.objects.exclude(public_id=wrong).count() == 1
        assert Order.objects.filter(public_id__iexact=wrong).count() == 0
    assert Order.objects.filter(public_id__in=["bad", mistyped(order.public_id)]).count() == 0
    with pytest.raises(PublicIdError, match="check symbol") as caught:
        Order.public_id_field.decode(mistyped(order.public_id))
    assert caught.value.reason == "check"
    with pytest.raises(PublicIdError, match="namespace 'orders'"):
        Order.public_id_field.decode(other_namespace)
    with pytest.raises(TypeError):
        Order.objects.filter(public_id=order.pk)  # the key itself is not a public number


def test_public_id_arguments_are_checked() -> None:
    from snowflake_db.django.public_ids import PublicId

    with pytest.raises(InvalidArgumentError, match="namespace"):
        PublicId(namespace="")
    with pytest.raises(InvalidArgumentError, match="group"):
        PublicId(namespace="orders", group=17)
    field = Order._meta.get_field("public_id")
    assert field.deconstruct()[3] == {"namespace": "orders"}


def test_public_id_of_another_field_with_groups(backend: str) -> None:
    invoice = Invoice.objects.create(number=2**62 + 5)
    number = invoice.public_number
    assert number == codec_for("invoices").encode(2**62 + 5, group=4)
    assert number.count("-") == 3
    assert Invoice.objects.get(public_number=number.replace("-", "")) == invoice
    assert Invoice.objects.filter(public_number="not a number").count() == 0


@override_settings(ROOT_URLCONF=URLS)
def test_url_converter_decodes_or_gives_404(backend: str) -> None:
    order = _orders(1)[0]
    url = reverse("order", kwargs={"pk": order.pk})
    assert url == f"/orders/{order.public_id}/"
    client = Client()
    response = client.get(url)
    assert response.status_code == 200 and response.json()["pk"] == str(order.pk)
    assert client.get(url.lower()).status_code == 200
    assert client.get(f"/orders/{mistyped(order.public_id)}/").status_code == 404
    assert client.get(f"/orders/{codec_for('invoices').encode(order.pk)}/").status_code == 404
    assert client.get(f"/orders/{order.pk}/").status_code == 404  # the key is no number
    assert client.get(f"/by-lookup/{order.public_id}/").status_code == 200
    assert client.get(f"/by-lookup/{mistyped(order.public_id)}/").status_code == 404


class OrderOut(serializers.ModelSerializer):  # type: ignore[type-arg]
    number = PublicIdField(namespace="orders", source="pk", read_only=True)

    class Meta:
        model = Order
        fields = ["number", "total_cents"]


class ItemIn(serializers.ModelSerializer):  # type: ignore[type-arg]
    order = PublicIdRelatedField(namespace="orders", queryset=Order.objects.all())

    class Meta:
        model = Item
        fields = ["order", "sku"]


def test_rest_framework_round_trip(backend: str) -> None:
    order = _orders(1)[0]
    payload = json.loads(JSONRenderer().render(OrderOut(order).data))
    assert payload == {"number": order.public_id, "total_cents": 0}
    assert str(order.pk) not in json.dumps(payload)
    created = ItemIn(data={"order": payload["number"].lower(), "sku": "x"})
    assert created.is_valid(), created.errors
    item = created.save()
    assert item.order_id == order.pk
    assert json.loads(JSONRenderer().render(ItemIn(item).data))["order"] == order.public_id
    refused = ItemIn(data={"order": mistyped(order.public_id), "sku": "x"})
    assert not refused.is_valid()
    assert "check symbol" in str(refused.errors["order"][0])
    assert not ItemIn(data={"order": order.pk, "sku": "x"}).is_valid()  # the key: refused
    field = PublicIdField(namespace="orders")
    assert field.to_internal_value(order.public_id) == order.pk
    with pytest.raises(serializers.ValidationError):
        field.to_internal_value(foreign_number(codec_for("invoices"), codec_for("orders"),
                                               order.pk))


@override_settings(ROOT_URLCONF=URLS)
def test_admin_shows_and_searches_public_numbers(backend: str) -> None:
    from tests.django.public_id_urls import site

    assert site.check(None) == []
    first, second = _orders(2)
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    assert client.login(username="admin", password="pw")
    changelist = client.get("/admin/shop/order/")
    assert changelist.status_code == 200
    assert first.public_id.encode() in changelist.content
    assert second.public_id.encode() in changelist.content
    grouped = codec_for("orders").encode(first.pk, group=4).lower()
    for term in (first.public_id, grouped):
        found = client.get("/admin/shop/order/", {"q": term})
        assert found.status_code == 200
        assert found.context["cl"].result_count == 1
        assert list(found.context["cl"].result_list) == [first]
    none = client.get("/admin/shop/order/", {"q": mistyped(first.public_id)})
    assert none.status_code == 200 and none.context["cl"].result_count == 0
    Order.objects.filter(pk=second.pk).update(note="tea")
    by_note = client.get("/admin/shop/order/", {"q": "tea"})  # other search fields still apply
    assert list(by_note.context["cl"].result_list) == [second]
    change = client.get(f"/admin/shop/order/{first.pk}/change/")
    assert change.status_code == 200 and first.public_id.encode() in change.content


def test_setting_configures_the_keys_and_is_validated() -> None:
    key = generate_key(version=3)
    expected = PublicIdCodec(parse_keys(key), namespace="orders").encode(12345)
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "manual", "PUBLIC_ID_KEYS": key}):
        assert codec_for("orders").encode(12345) == expected
        assert codec_for("orders").current_version == 3
    for bad in ("1:short", 42, {1: b"x" * 15}, "", {99: b"x" * 16}):
        with pytest.raises(ImproperlyConfigured, match="PUBLIC_ID_KEYS"):
            parse({"PUBLIC_ID_KEYS": bad})
    assert parse({"PUBLIC_ID_KEYS": {2: b"k" * 16}}).public_id_keys == {2: b"k" * 16}
    assert parse({"PUBLIC_ID_KEYS": b"k" * 32}).public_id_keys == {1: b"k" * 32}
    assert parse({}).public_id_keys is None


def test_ready_configures_from_the_setting_and_env_is_the_fallback() -> None:
    key, env_key = generate_key(), generate_key()
    script = (
        "import django; django.setup()\n"
        "from snowflake_db.public_ids import codec_for\n"
        "print(codec_for('orders').encode(12345))\n"
    )

    def number(setting: dict[str, object]) -> str:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.django_project.settings",
               "SNOWFLAKE_DJANGO_TEST_SETTING": json.dumps(setting),
               "SNOWFLAKE_DB_PUBLIC_ID_KEYS": env_key}
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=False,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def expected(text: str) -> str:
        return PublicIdCodec(parse_keys(text), namespace="orders").encode(12345)

    assert number({"WORKER_SOURCE": "manual", "PUBLIC_ID_KEYS": key}) == expected(key)
    assert number({"WORKER_SOURCE": "manual"}) == expected(env_key)
