"""Lookups on a field that holds Snowflake keys raise KeyLookupOutOfRangeError where Django
would answer with an empty result and no query; other fields keep Django's behaviour."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from snowflake_db import SnowflakeError
from snowflake_db.errors import KeyLookupOutOfRangeError
from tests.django.conftest import backends
from tests.django_project.shop.models import Order
from tests.django_project.tagged.models import Discount, Product


@backends("postgresql", "mariadb")
def test_a_key_beyond_the_columns_range_raises_naming_field_column_and_value(
    backend: str,
) -> None:
    key = Product.objects.create(name="lamp").pk
    Discount.objects.create(product_id=7, amount=3)
    with CaptureQueriesContext(connections[backend]) as queries:
        for lookup in ("product_id", "product_id__gte", "product_id__lt"):
            with pytest.raises(KeyLookupOutOfRangeError) as caught:
                list(Discount.objects.filter(**{lookup: key}))
            error = caught.value
            assert isinstance(error, SnowflakeError) and isinstance(error, ValueError)
            assert error.field == "tagged.Discount.product_id" and error.value == key
            assert f"column tagged_discount.product_id on database {backend!r}" in str(error)
            assert f"cannot hold {key}" in str(error)
    assert len(queries) == 0  # refused before any query
    # Within the range nothing changes.
    assert list(Discount.objects.filter(product_id=7).values_list("amount", flat=True)) == [3]
    assert Discount.objects.filter(product_id__lt=2**31 - 1).count() == 1


@backends("postgresql", "mariadb")
def test_in_with_a_key_beyond_the_columns_range_raises(backend: str) -> None:
    """Django sends ``__in`` values to the database, which compares them as 64-bit and finds
    nothing for the key: the rows of the other values come back, the key's silently not."""
    key = Product.objects.create(name="lamp").pk
    Discount.objects.create(product_id=7, amount=3)
    with (CaptureQueriesContext(connections[backend]) as queries,
          pytest.raises(KeyLookupOutOfRangeError) as caught):
        list(Discount.objects.filter(product_id__in=[7, key]))
    assert len(queries) == 0
    assert caught.value.field == "tagged.Discount.product_id" and caught.value.value == key
    assert list(Discount.objects.filter(product_id__in=[7, 8]).values_list("amount", flat=True)) \
        == [3]
    # A subquery is the database's business: no values to judge here.
    assert Discount.objects.filter(product_id__in=Discount.objects.values("product_id")).count() \
        == 1


@backends("postgresql", "mariadb")
def test_other_integer_fields_keep_djangos_empty_result(backend: str) -> None:
    """Django's own behaviour (5.0+) on a field that holds no keys: empty, no query."""
    Order.objects.create(customer=_customer(), total_cents=5)
    with CaptureQueriesContext(connections[backend]) as queries:
        assert list(Order.objects.filter(total_cents=2**40)) == []
        assert list(Discount.objects.filter(amount=2**40)) == []
    assert len(queries) == 0
    assert Order.objects.filter(total_cents__lt=2**40).count() == 1  # a full result


@backends("sqlite")
def test_sqlite_holds_64_bits_so_the_lookup_finds_the_row(backend: str) -> None:
    key = Product.objects.create(name="lamp").pk
    Discount.objects.create(product_id=key, amount=9)
    assert list(Discount.objects.filter(product_id=key).values_list("amount", flat=True)) == [9]


def _customer() -> object:
    from tests.django_project.shop.models import Customer

    return Customer.objects.create(name="ada")
