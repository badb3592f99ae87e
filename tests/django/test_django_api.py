"""IDs at the edges: Django REST framework, Django's JSON encoder, the admin."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.core import serializers as django_serializers
from django.http import JsonResponse
from django.test import Client
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

import snowflake_db
from snowflake_db.django.admin import created_at, snowflake_created_display
from snowflake_db.django.json import MAX_SAFE_INTEGER, SnowflakeJSONEncoder
from snowflake_db.django.rest_framework import (
    SnowflakeIdField,
    SnowflakeModelSerializerMixin,
    SnowflakePrimaryKeyRelatedField,
)
from tests.django_project.shop.models import Customer, Invoice, Item, Order, Tag

LAYOUT = snowflake_db.Layout()


class OrderSerializer(SnowflakeModelSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Order
        fields = ["id", "customer", "total_cents", "items"]
        extra_kwargs = {"items": {"read_only": True}}


class ItemSerializer(SnowflakeModelSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Item
        fields = ["id", "order", "sku", "tags"]


class InvoiceSerializer(SnowflakeModelSerializerMixin, serializers.ModelSerializer):
    class Meta:
        model = Invoice
        fields = ["id", "number", "order"]


def test_drf_renders_ids_and_relations_as_strings(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    order = Order.objects.create(customer=customer, total_cents=3)
    item = Item.objects.create(order=order, sku="x")
    tag = Tag.objects.create(name="red")
    item.tags.add(tag)
    invoice = Invoice.objects.create(order=order)

    data = OrderSerializer(order).data
    assert data == {"id": str(order.pk), "customer": str(customer.pk), "total_cents": 3,
                    "items": [str(item.pk)]}
    assert ItemSerializer(item).data == {
        "id": str(item.pk), "order": str(order.pk), "sku": "x", "tags": [str(tag.pk)]
    }
    # A BigAutoField pk stays a number; the SnowflakeField and the Snowflake FK are strings.
    assert InvoiceSerializer(invoice).data == {
        "id": invoice.pk, "number": str(invoice.number), "order": str(order.pk)
    }
    rendered = json.loads(JSONRenderer().render(data))
    assert rendered["id"] == str(order.pk)  # survives JavaScript's JSON.parse unchanged


def test_drf_accepts_strings_back(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    serializer = OrderSerializer(data={"customer": str(customer.pk), "total_cents": 9})
    assert serializer.is_valid(), serializer.errors
    order = serializer.save()
    assert order.customer_id == customer.pk and isinstance(order.pk, int)
    # An int is fine too; a float has already lost digits and is refused.
    assert OrderSerializer(data={"customer": customer.pk, "total_cents": 1}).is_valid()
    rejected = OrderSerializer(data={"customer": float(customer.pk), "total_cents": 1})
    assert not rejected.is_valid()
    assert "floating-point" in str(rejected.errors["customer"][0])
    missing = OrderSerializer(data={"customer": str(customer.pk + 1), "total_cents": 1})
    assert not missing.is_valid() and "does not exist" in str(missing.errors["customer"][0])


def test_drf_fields_by_hand() -> None:
    field = SnowflakeIdField()
    assert field.to_representation(2**60) == str(2**60)
    assert field.to_internal_value(" 1152921504606846976 ") == 2**60
    assert field.to_internal_value(2**60) == 2**60
    for bad in ("12a", "-1", "1e5", True, 1.5, str(2**63)):
        with pytest.raises(serializers.ValidationError):
            field.run_validation(bad)
    related = SnowflakePrimaryKeyRelatedField(queryset=Customer.objects.all())
    assert isinstance(related.pk_field, SnowflakeIdField)


def test_json_encoder_writes_big_ints_as_strings() -> None:
    big = 2**60
    data = {"id": big, "small": 7, "edge": MAX_SAFE_INTEGER, "negative": -(2**60),
            "flag": True, "nested": [{"fk": big}], "tuple": (big,)}
    decoded = json.loads(json.dumps(data, cls=SnowflakeJSONEncoder))
    assert decoded == {"id": str(big), "small": 7, "edge": MAX_SAFE_INTEGER,
                       "negative": str(-(2**60)), "flag": True, "nested": [{"fk": str(big)}],
                       "tuple": [str(big)]}
    # json.dump / indent go through iterencode too.
    assert json.loads(json.dumps({"id": big}, cls=SnowflakeJSONEncoder, indent=2)) == {
        "id": str(big)
    }
    response = JsonResponse({"id": big}, encoder=SnowflakeJSONEncoder)
    assert json.loads(response.content) == {"id": str(big)}


def test_django_serializer_with_the_encoder(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    order = Order.objects.create(customer=customer)
    text = django_serializers.serialize("json", Order.objects.all(), cls=SnowflakeJSONEncoder)
    row = json.loads(text)[0]
    assert row["pk"] == str(order.pk) and row["fields"]["customer"] == str(customer.pk)


def test_admin_shows_the_decoded_creation_time(backend: str) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    assert client.login(username="admin", password="pw")
    response = client.post("/admin/shop/customer/add/", {"name": "ada"})
    assert response.status_code == 302, response.content[:2000]
    customer = Customer.objects.get(name="ada")
    created = LAYOUT.decode(customer.pk).datetime
    changelist = client.get("/admin/shop/customer/")
    assert changelist.status_code == 200
    assert b"created (from id)" in changelist.content.lower()
    change = client.get(f"/admin/shop/customer/{customer.pk}/change/")
    assert change.status_code == 200
    assert b"created (from id)" in change.content.lower()
    assert str(created.year).encode() in change.content
    response = client.post(f"/admin/shop/customer/{customer.pk}/change/", {"name": "bea"})
    assert response.status_code == 302
    assert Customer.objects.get(pk=customer.pk).name == "bea"
    # Order change form: the FK widget posts the customer's ID as a string.
    response = client.post("/admin/shop/order/add/", {
        "customer": str(customer.pk), "total_cents": "5", "note": "", "created_by_pid": "0"
    })
    assert response.status_code == 302
    assert Order.objects.get().customer_id == customer.pk


def test_admin_helpers() -> None:
    snowflake_id = snowflake_db.snowflake_default()
    assert created_at(snowflake_id) == LAYOUT.decode(snowflake_id).datetime
    assert created_at(None) is None and created_at(-1) is None and created_at("x") is None
    display = snowflake_created_display("number", description="issued")
    invoice = Invoice()
    assert display(invoice) == LAYOUT.decode(invoice.number).datetime
    assert display.short_description == "issued"  # type: ignore[attr-defined]
    assert display.admin_order_field == "number"  # type: ignore[attr-defined]
