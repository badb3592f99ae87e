"""``snowflake_db.django.bulk.bulk_load`` on every backend: orders and items in one call with
keys made up front, objects left as ``bulk_create`` leaves them, ``pre_save`` run, all or
nothing, and clear refusals (multi-table inheritance, conflict options, local files)."""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import DataError, IntegrityError, connections, models
from django.test.utils import isolate_apps
from django.utils import timezone

import snowflake_db
from snowflake_db.django import SnowflakeAutoField
from snowflake_db.django.bulk import bulk_load
from snowflake_db.errors import (
    BulkLoadError,
    BulkLoadRejectedError,
    LocalInfileRefusedError,
    UnrepresentableValueError,
)
from tests.django.conftest import backends
from tests.django_project.shop.models import Customer, Invoice, Item, Order, Restaurant

LAYOUT = snowflake_db.Layout()


def _orders_with_items(customer: Any, n: int) -> tuple[list[Any], list[Any]]:
    orders = [Order(customer=customer, total_cents=i, note=f"n\t{i}\\") for i in range(n)]
    items = [Item(order=order, sku=f"s{i}-{j}") for i, order in enumerate(orders) for j in range(3)]
    return orders, items


def test_orders_and_items_in_one_call(
    backend: str, static_worker: snowflake_db.SnowflakeGenerator, monkeypatch: Any
) -> None:
    customer = Customer.objects.create(name="ada")
    orders, items = _orders_with_items(customer, 100)
    calls: list[int] = []
    next_ids = static_worker.next_ids

    def counting(n: int) -> list[int]:
        calls.append(n)
        return next_ids(n)

    monkeypatch.setattr(static_worker, "next_ids", counting)
    assert bulk_load(orders, items) == [orders, items]
    # The orders' keys before anything is sent; the items' (every later group's) from one
    # more call while the server stores the orders.
    assert calls == [100, 300]
    for obj in orders + items:
        assert isinstance(obj.pk, int) and LAYOUT.decode(obj.pk).worker_id == 1
        assert obj._state.adding is False and obj._state.db == backend
    assert [item.order_id for item in items] == [order.pk for order in orders for _ in range(3)]
    assert Order.objects.filter(customer=customer).count() == 100
    stored = dict(Item.objects.values_list("sku", "order_id"))
    assert stored == {item.sku: item.order_id for item in items}
    assert Order.objects.get(pk=orders[7].pk).note == "n\t7\\"
    orders[0].total_cents = 99
    orders[0].save()  # a loaded object saves as an UPDATE of its row
    assert Order.objects.get(pk=orders[0].pk).total_cents == 99
    assert Order.objects.count() == 100


def test_a_duplicate_key_fails_everything_and_takes_the_keys_back(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    existing = Item.objects.create(order=Order.objects.create(customer=customer), sku="x")
    orders, items = _orders_with_items(customer, 20)
    items[30].pk = existing.pk
    with pytest.raises((IntegrityError, BulkLoadRejectedError)):
        bulk_load(orders, items)
    assert (Order.objects.count(), Item.objects.count()) == (1, 1)
    assert all(obj.pk is None for obj in orders + items if obj is not items[30])
    assert all(obj._state.adding for obj in orders + items)
    assert bulk_load(orders, items[:30] + items[31:])  # the same objects load on a retry
    assert Item.objects.count() == 60


@backends("postgresql", "mariadb", "sqlite", transaction=True)
def test_a_failure_at_the_commit_gives_back_keys_and_states(tx_backend: str) -> None:
    """Each group's states are set while the server stores its last rows, before the commit
    (as bulk_create sets them); a failure after that (here the deferred foreign-key check at
    the commit, or MariaDB's immediate one) leaves every object as it was before the call."""
    customer = Customer.objects.create(name="ada")
    try:
        orders, items = _orders_with_items(customer, 2_500)
        stray = items[7_000]
        stray.order_id = LAYOUT.encode(timestamp_ms=LAYOUT.epoch_ms + 1, worker_id=1, sequence=0)
        copied = items[10]  # an object read elsewhere, copied here with its key
        copied.pk = LAYOUT.encode(timestamp_ms=LAYOUT.epoch_ms + 2, worker_id=1, sequence=0)
        copied._state.adding, copied._state.db = False, "elsewhere"
        before = [(obj._state.adding, obj._state.db) for obj in orders + items]
        assert before[0] == (True, tx_backend)  # set by Order(customer=...), as Django does
        with pytest.raises((IntegrityError, BulkLoadRejectedError)):
            bulk_load(orders, items)
        assert (Order.objects.count(), Item.objects.count()) == (0, 0)
        assert [(obj._state.adding, obj._state.db) for obj in orders + items] == before
        assert all(obj.pk is None for obj in orders + items if obj is not copied)
        stray.order = orders[2_333]
        bulk_load(orders, items)  # the same objects load on a retry
        assert (Order.objects.count(), Item.objects.count()) == (2_500, 7_500)
        assert all(not obj._state.adding and obj._state.db == tx_backend
                   for obj in orders + items)
    finally:
        Item.objects.all().delete()
        Order.objects.all().delete()
        customer.delete()


@backends("postgresql", "sqlite")
def test_children_before_their_parents_get_the_parents_keys_first(backend: str) -> None:
    """A first group that refers to a later one (items before their orders, which deferred
    foreign keys allow) gets every group's keys before its rows are made."""
    customer = Customer.objects.create(name="ada")
    orders, items = _orders_with_items(customer, 1_000)
    bulk_load(items, orders)
    assert [item.order_id for item in items] == [order.pk for order in orders for _ in range(3)]
    assert Item.objects.filter(order__customer=customer).count() == 3_000


def test_an_error_beside_the_server_aborts_the_load_unchanged(backend: str) -> None:
    """A later group's keys are made while the server stores the first group: a refusal
    there (a key that is not a SnowflakeAutoField) comes out as itself, and nothing loads."""
    customer = Customer.objects.create(name="ada")
    orders = [Order(customer=customer) for _ in range(3_000)]
    invoices = [Invoice(order=order, number=i + 1) for i, order in enumerate(orders)]
    with pytest.raises(BulkLoadError, match=r"Invoice\.id is not a SnowflakeAutoField"):
        bulk_load(orders, invoices)
    assert (Order.objects.count(), Invoice.objects.count()) == (0, 0)
    assert all(order.pk is None and order._state.adding for order in orders)


def test_refuses_multi_table_inheritance_and_conflict_options(backend: str) -> None:
    with pytest.raises(BulkLoadError, match="multi-table inheritance"):
        bulk_load([Restaurant(name="r")])
    with pytest.raises(BulkLoadError, match="conflicts"):
        bulk_load([Customer(name="c")], ignore_conflicts=True)
    with pytest.raises(BulkLoadError, match="one model"):
        bulk_load([Customer(name="c"), Order()])
    assert Customer.objects.count() == 0


@pytest.fixture
def typed_model(tx_backend: str) -> Iterator[Any]:
    with isolate_apps("tests.django_project.shop"):

        class Entry(models.Model):
            id = SnowflakeAutoField(primary_key=True)
            created = models.DateTimeField(auto_now_add=True)
            data = models.JSONField(default=dict)
            amount = models.DecimalField(max_digits=20, decimal_places=6, null=True)
            note = models.TextField(default="")
            flag = models.BooleanField(null=True)
            blob = models.BinaryField(null=True)
            count = models.BigIntegerField(null=True)

            class Meta:
                app_label = "shop"
                db_table = "shop_bulk_entry"

        with _table_of(Entry, tx_backend):
            yield Entry


@contextmanager
def _table_of(model: Any, alias: str) -> Iterator[None]:
    """The model's table on ``alias`` for the duration (a model made inside the test)."""
    connection = connections[alias]
    with connection.schema_editor() as editor:
        editor.create_model(model)
    try:
        yield
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(model)


def test_pre_save_and_types_round_trip(tx_backend: str, typed_model: Any) -> None:
    before = timezone.now()
    values: list[dict[str, Any]] = [
        {"data": {"k": ["v\t\n", 1, None, True]}, "amount": decimal.Decimal("-12345.678901"),
         "note": "tab\there\nnew \\ 'q\" é🚀", "flag": True, "blob": b"\x00\xff\t",
         "count": 2**63 - 1},
        {"data": [], "amount": None, "note": "", "flag": None, "blob": None, "count": -(2**63)},
        {"data": {}, "amount": decimal.Decimal("0.000001"), "note": "\\N", "flag": False,
         "blob": b"", "count": None},
    ]
    objs = [typed_model(**row) for row in values]
    bulk_load(objs)
    after = timezone.now()
    for obj, row in zip(objs, values, strict=True):
        assert before <= obj.created <= after  # auto_now_add ran, as in save()
        got = typed_model.objects.get(pk=obj.pk)
        assert got.created == obj.created
        for name, value in row.items():
            stored = getattr(got, name)
            assert (bytes(stored) if isinstance(stored, memoryview) else stored) == value, name


@backends("mariadb", transaction=True)
def test_mariadb_load_data_with_the_alias_option(tx_backend: str) -> None:
    connection = connections[tx_backend]
    customer = Customer.objects.create(name="ada")
    with pytest.raises(LocalInfileRefusedError, match="local_infile"):
        bulk_load(*_orders_with_items(customer, 2), mariadb_method="load_data")
    options = connection.settings_dict.setdefault("OPTIONS", {})
    connection.close()
    options["local_infile"] = True
    try:
        orders, items = _orders_with_items(customer, 50)
        bulk_load(orders, items, mariadb_method="load_data")
        assert Item.objects.filter(order__in=orders).count() == 150
        more, _ = _orders_with_items(customer, 1)
        more[0].pk = orders[0].pk
        with pytest.raises(BulkLoadRejectedError, match="Duplicate entry"):
            bulk_load(more, mariadb_method="load_data")
        assert Order.objects.count() == 50
    finally:
        connection.close()
        del options["local_infile"]


def test_values_are_converted_as_an_insert_would(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    order = Order(customer=customer, total_cents="12", note=5)  # Django converts these
    orders = [Order(customer_id=customer.pk, total_cents=i) for i in range(3)]
    bulk_load([order, *orders])
    stored = Order.objects.get(pk=order.pk)
    assert (stored.total_cents, stored.note) == (12, "5")
    assert sorted(Order.objects.values_list("total_cents", flat=True)) == [0, 1, 2, 12]


def test_an_unsaved_related_object_is_refused(backend: str) -> None:
    customer = Customer(name="not saved, not loaded")
    with pytest.raises(ValueError, match="unsaved related object 'customer'"):
        bulk_load([Order(customer=customer)])
    assert Order.objects.count() == 0


@backends("mariadb")
def test_mariadb_keeps_djangos_refusal_of_key_zero(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    with pytest.raises(ValueError, match="does not accept 0"):
        bulk_load([Order(pk=0, customer=customer), Order(customer=customer)])
    assert Order.objects.count() == 0


def test_a_lone_surrogate_is_named_and_nothing_loads(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    orders, items = _orders_with_items(customer, 10)
    orders[6].note = "bad \ud800"
    with pytest.raises(UnrepresentableValueError, match="surrogate") as caught:
        bulk_load(orders, items)
    assert (caught.value.column, caught.value.row, caught.value.value) == (
        "note", 6, "bad \ud800")
    assert (Order.objects.count(), Item.objects.count()) == (0, 0)
    assert all(obj.pk is None for obj in orders + items)
    assert items[3].order is orders[1]  # still linked: a retry takes the new keys
    orders[6].note = "good"
    bulk_load(orders, items)
    assert Item.objects.filter(order=orders[1]).count() == 3


def test_errors_past_the_first_block_name_their_row_and_load_nothing(backend: str) -> None:
    """On PostgreSQL the objects are read a 2,000-row block at a time while the COPY runs; a
    value refused in a later block (by Django's conversion, by the loader's check, or by the
    server) still names its row, leaves no row, and takes every key back."""
    customer = Customer.objects.create(name="ada")
    orders, items = _orders_with_items(customer, 2_500)
    good = orders[2_300].note
    cases: list[tuple[str, Any, type[Exception], str]] = [
        ("total_cents", "many", ValueError, "expected a number but got 'many'")
    ]
    vendor = connections[backend].vendor
    if vendor == "postgresql":  # the only one of the three that refuses NUL in text
        cases.append(("note", "NUL \x00 here", UnrepresentableValueError, "NUL"))
    for attribute, bad, error, match in cases:
        setattr(orders[2_300], attribute, bad)
        with pytest.raises(error, match=match) as caught:
            bulk_load(orders, items)
        if isinstance(caught.value, UnrepresentableValueError):
            assert (caught.value.column, caught.value.row) == ("note", 2_300)
        assert (Order.objects.count(), Item.objects.count()) == (0, 0)
        assert all(obj.pk is None and obj._state.adding for obj in orders + items)
        setattr(orders[2_300], attribute, 0 if attribute == "total_cents" else good)
    stray = items[4_500].order
    items[4_500].order = Order(customer=customer)  # neither saved nor in this load
    with pytest.raises(ValueError, match="unsaved related object 'order'"):
        bulk_load(orders, items)
    assert (Order.objects.count(), Item.objects.count()) == (0, 0)
    assert all(obj.pk is None and obj.order_id is None for obj in items)
    items[4_500].order = stray
    if vendor != "sqlite":  # SQLite does not hold text to the column's length
        items[4_000].sku = "s" * 21  # too long for the column: the server refuses it
        with pytest.raises((DataError, BulkLoadRejectedError), match="too long"):
            bulk_load(orders, items)
        assert (Order.objects.count(), Item.objects.count()) == (0, 0)
        items[4_000].sku = "fits"
    bulk_load(orders, items)
    assert (Order.objects.count(), Item.objects.count()) == (2_500, 7_500)
    assert Order.objects.get(pk=orders[2_300].pk).total_cents == 0
    assert Item.objects.get(pk=items[4_000].pk).order_id == orders[1_333].pk


def test_blocks_that_psycopg_adapts_round_trip(tx_backend: str, typed_model: Any) -> None:
    """JSON and bytes columns go through psycopg's own adaptation, block by block."""
    objs = [
        typed_model(data={"n": n, "t": "a\tb"}, blob=n.to_bytes(2, "big"), count=n)
        for n in range(4_500)
    ]
    bulk_load(objs)
    stored = {obj.count: obj for obj in typed_model.objects.all()}
    assert len(stored) == 4_500
    for obj in objs:
        got = stored[obj.count]
        assert (got.pk, got.data, bytes(got.blob)) == (obj.pk, obj.data, bytes(obj.blob))


@backends("postgresql", transaction=True)
def test_a_naive_time_past_the_first_block_is_named_by_its_row(tx_backend: str) -> None:
    with isolate_apps("tests.django_project.shop"):

        class Delivery(models.Model):
            id = SnowflakeAutoField(primary_key=True)
            due = models.DateTimeField()

            class Meta:
                app_label = "shop"
                db_table = "shop_bulk_delivery"

        with _table_of(Delivery, tx_backend):
            due = timezone.now()
            objs = [Delivery(due=due) for _ in range(3_000)]
            objs[2_222].due = due.replace(tzinfo=None)
            with pytest.raises(UnrepresentableValueError, match="naive") as caught:
                bulk_load(objs)
            assert (caught.value.column, caught.value.row) == ("due", 2_222)
            assert Delivery.objects.count() == 0
