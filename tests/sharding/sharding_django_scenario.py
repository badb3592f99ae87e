"""The Django database router and ShardedManager on real shard databases plus a control one.

Run by ``tests/sharding/test_sharding_django.py`` in a subprocess (``pytest -p no:django`` on
this file) with the demo shop's settings (``example_project.settings``) and its URLs in the
environment: Django settings are process-global, and the main run's belong to ``tests/django``.
The module fixture migrates every alias and writes the rows once; the tests only read them (or
are refused a write), so each can fail on its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

if os.environ.get("DJANGO_SETTINGS_MODULE") != "example_project.settings":
    pytest.skip(
        "run by tests/sharding/test_sharding_django.py in a subprocess", allow_module_level=True
    )

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from example_project.django_shop import count_queries  # noqa: E402
from example_project.shop.models import Customer, Order, OrderItem  # noqa: E402
from snowflake_db.django.operations import (  # noqa: E402
    AddTimePartitions,
    CreateShardPartitionedTable,
    CreateTimePartitionedTable,
)
from snowflake_db.django.sharding import get_shard_router  # noqa: E402
from snowflake_db.errors import ShardingError  # noqa: E402
from snowflake_db.sharding import ShardRouter  # noqa: E402

ALIASES: list[str] = list(settings.SHARD_ALIASES)


@dataclass
class Shop:
    router: ShardRouter
    customers: list[Any]
    orders: list[Any]  # one per customer, each with one item
    extra: Any  # a plain save()
    bulk: list[Any]  # bulk_create, one more order per customer


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    for alias in ["default", *ALIASES]:
        call_command("migrate", database=alias, verbosity=0)
    customers = [Customer.objects.create(name=f"c{i}") for i in range(24)]
    orders = []
    for customer in customers:
        order = Order.objects.create(customer=customer, total_cents=10)
        OrderItem.objects.create(order=order, sku="A", quantity=1, price_cents=10)
        orders.append(order)
    extra = Order(customer=customers[0], total_cents=5)
    extra.save()  # routed by the instance (DATABASE_ROUTERS, instance hint)
    bulk = Order.objects.bulk_create([Order(customer=c, total_cents=1) for c in customers])
    yield Shop(get_shard_router(), customers, orders, extra, bulk)


def _tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        return set(connections[alias].introspection.table_names(cursor))


def test_shop_tables_on_the_shards_and_worker_tables_on_the_control_database(shop: Shop) -> None:
    assert "shop_order" not in _tables("default")
    for alias in ALIASES:
        tables = _tables(alias)
        assert {"shop_customer", "shop_order", "shop_orderitem"} <= tables
        assert not any(t.startswith("snowflake_db") for t in tables), tables


def test_rows_are_written_to_the_shard_of_their_customer(shop: Shop) -> None:
    router = shop.router
    for customer, order in zip(shop.customers, shop.orders, strict=True):
        assert customer._state.db == router.target_for_key(customer.pk)
        assert order._state.db == router.target_for_key(customer.pk) == router.target_for_id(
            order.pk
        )
    assert shop.extra._state.db == router.target_for_key(shop.customers[0].pk)
    for order in shop.bulk:  # bulk_create groups by shard
        assert Order.objects.using(router.target_for_id(order.pk)).filter(pk=order.pk).exists()


def test_every_row_lives_only_on_its_own_shard(shop: Shop) -> None:
    for order in shop.orders:
        where = [a for a in ALIASES if Order.objects.using(a).filter(pk=order.pk).exists()]
        assert where == [shop.router.target_for_id(order.pk)]


def test_get_by_pk_reads_one_shard_and_related_managers_stay_there(shop: Shop) -> None:
    for order in shop.orders[:8]:
        with count_queries(ALIASES) as counts:
            got = Order.objects.get(pk=order.pk)
            items = list(got.items.all())
            assert got.customer.pk == order.customer_id
        assert set(counts) == {shop.router.target_for_id(order.pk)}, counts
        assert len(items) == 1


def test_a_string_pk_from_a_url_is_routed_like_an_int(shop: Shop) -> None:
    order = shop.orders[2]
    with count_queries(ALIASES) as counts:
        assert Order.objects.get(pk=str(order.pk)).pk == order.pk
    assert set(counts) == {shop.router.target_for_id(order.pk)}


def test_an_order_number_is_routed_like_its_key(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snowflake_db.public_ids import ENV_VAR, generate_key  # the public-ids extra

    if not os.environ.get(ENV_VAR):
        monkeypatch.setenv(ENV_VAR, generate_key())
    order = shop.orders[3]
    number = order.public_id
    home = shop.router.target_for_id(order.pk)
    with count_queries(ALIASES) as counts:
        assert Order.objects.get(public_id=number).pk == order.pk
        assert [o.pk for o in Order.objects.filter(public_id__in=[number, "not-a-number"])] == [
            order.pk
        ]
    assert set(counts) == {home}, counts
    with count_queries(ALIASES) as counts, pytest.raises(Order.DoesNotExist):
        Order.objects.get(public_id="not-a-number")  # refused: no shard can hold it
    assert not counts, counts


def test_shard_key_filters_read_one_shard(shop: Shop) -> None:
    customer = shop.customers[5]
    with count_queries(ALIASES) as counts:
        mine = list(Order.objects.filter(customer=customer))
    assert len(mine) == 2
    assert set(counts) == {shop.router.target_for_key(customer.pk)}
    with count_queries(ALIASES) as counts:
        assert Order.objects.filter(customer_id=customer.pk).count() == 2
    assert len(counts) == 1


def test_explicit_fan_out_sees_every_shard(shop: Shop) -> None:
    total = len(shop.orders) + 1 + len(shop.bulk)
    assert sum(1 for _ in Order.objects.all().across_shards()) == total
    assert sum(Order.objects.count_by_shard().values()) == total
    assert set(Order.objects.in_bulk([o.pk for o in shop.orders])) == {o.pk for o in shop.orders}


def test_an_unrouted_query_fails_instead_of_reading_the_control_database(shop: Shop) -> None:
    with pytest.raises(ShardingError, match="across_shards"):
        list(Order.objects.filter(total_cents__gt=0))


def test_get_of_a_missing_id_raises_does_not_exist(shop: Shop) -> None:
    with pytest.raises(Order.DoesNotExist):
        Order.objects.get(pk=shop.orders[0].pk ^ (1 << 40))


def test_a_pk_that_does_not_embed_the_customers_shard_is_refused(shop: Shop) -> None:
    router = shop.router
    home = router.shard_for_key(shop.customers[0].pk)
    other = next(c for c in shop.customers if router.shard_for_key(c.pk) != home)
    wrong = Order(id=shop.orders[0].pk ^ (1 << 40), customer=other, total_cents=1)
    with pytest.raises(ShardingError, match="disagree"):
        wrong.save(force_insert=True)


def test_partition_operations_create_partitions(shop: Shop) -> None:
    """PostgreSQL only: tests/sharding/test_sharding_django.py deselects it elsewhere."""
    assert connection.vendor == "postgresql", "PostgreSQL partitioning"
    layout = {"sequence_bits": 8, "shard_bits": 4}
    ops = [
        CreateShardPartitionedTable("orders_by_shard", "id bigint NOT NULL", layout),
        CreateTimePartitionedTable(
            "orders_by_time", "id bigint PRIMARY KEY", layout, start="2026-01-01", periods=1
        ),
        AddTimePartitions("orders_by_time", layout, days_ahead=40),
    ]
    for op in ops:
        name, args, kwargs = op.deconstruct()
        assert type(op)(*args, **kwargs).deconstruct() == (name, args, kwargs)
    with connections[ALIASES[0]].schema_editor() as editor:
        for op in ops:
            op.database_forwards("shop", editor, None, None)
    count = "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass"
    with connections[ALIASES[0]].cursor() as cursor:
        cursor.execute(count, ["orders_by_shard"])
        assert cursor.fetchone()[0] == 16
        cursor.execute(count, ["orders_by_time"])
        assert cursor.fetchone()[0] >= 2
