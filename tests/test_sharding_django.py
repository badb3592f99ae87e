"""The Django database router and ShardedManager on 4 real shard databases plus a control one.

Django settings are process-global and pytest-django configures them for the whole run (the
tests/django suite owns that configuration), so each scenario here runs in a subprocess with the
demo shop's own settings module (``example_project.settings``) and URLs from the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.plugins.databases import ScratchDatabase

REPO = Path(__file__).resolve().parent.parent

SCENARIO = r'''
import django
django.setup()
from django.core.management import call_command
from django.db import connections, connection
from django.conf import settings
from snowflake_db.sharding import ShardingError
from snowflake_db.sharding.django import get_shard_router
from example_project.shop.models import Customer, Order, OrderItem
from example_project.django_shop import count_queries

aliases = list(settings.SHARD_ALIASES)
for alias in ["default", *aliases]:
    call_command("migrate", database=alias, verbosity=0)
router = get_shard_router()

# Migrations: shop tables on the shards only, the worker tables on the control database only.
def tables(alias):
    with connections[alias].cursor() as cursor:
        return set(connections[alias].introspection.table_names(cursor))
assert "shop_order" not in tables("default"), tables("default")
for alias in aliases:
    assert {"shop_customer", "shop_order", "shop_orderitem"} <= tables(alias)
    assert not any(t.startswith("snowflake_db") for t in tables(alias)), tables(alias)

customers = [Customer.objects.create(name=f"c{i}") for i in range(24)]
for c in customers:
    assert c._state.db == router.target_for_key(c.pk)
orders = []
for c in customers:
    o = Order.objects.create(customer=c, total_cents=10)
    assert o._state.db == router.target_for_key(c.pk) == router.target_for_id(o.pk)
    OrderItem.objects.create(order=o, sku="A", quantity=1, price_cents=10)
    orders.append(o)
# A plain save() is routed by the instance (DATABASE_ROUTERS, instance hint).
extra = Order(customer=customers[0], total_cents=5)
extra.save()
assert extra._state.db == router.target_for_key(customers[0].pk)
# bulk_create groups by shard.
bulk = Order.objects.bulk_create([Order(customer=c, total_cents=1) for c in customers])
for o in bulk:
    assert Order.objects.using(router.target_for_id(o.pk)).filter(pk=o.pk).exists()

# Every row only on its own shard.
for o in orders:
    where = [a for a in aliases if Order.objects.using(a).filter(pk=o.pk).exists()]
    assert where == [router.target_for_id(o.pk)], where

# get(pk=...) and shard-key filters: one alias; related managers stay there.
for o in orders[:8]:
    with count_queries(aliases) as counts:
        got = Order.objects.get(pk=o.pk)
        items = list(got.items.all())
        assert got.customer.pk == o.customer_id
    assert set(counts) == {router.target_for_id(o.pk)}, counts
    assert len(items) == 1
with count_queries(aliases) as counts:
    assert Order.objects.get(pk=str(orders[2].pk)).pk == orders[2].pk  # a URL kwarg
assert set(counts) == {router.target_for_id(orders[2].pk)}
with count_queries(aliases) as counts:
    mine = list(Order.objects.filter(customer=customers[5]))
assert len(mine) == 2 and set(counts) == {router.target_for_key(customers[5].pk)}
with count_queries(aliases) as counts:
    assert Order.objects.filter(customer_id=customers[5].pk).count() == 2
assert len(counts) == 1

# Fan out explicitly; unrouted queries fail loudly instead of reading the control database.
assert sum(1 for _ in Order.objects.all().across_shards()) == 49
assert sum(Order.objects.count_by_shard().values()) == 49
assert set(Order.objects.in_bulk([o.pk for o in orders])) == {o.pk for o in orders}
try:
    list(Order.objects.filter(total_cents__gt=0))
except ShardingError as error:
    assert "across_shards" in str(error)
else:
    raise AssertionError("an unrouted query must not run")
try:
    Order.objects.get(pk=orders[0].pk ^ (1 << 40))
except Order.DoesNotExist:
    pass
# A primary key that does not embed the customer's shard is refused.
home = router.shard_for_key(customers[0].pk)
other = next(c for c in customers if router.shard_for_key(c.pk) != home)
try:
    Order(id=orders[0].pk ^ (1 << 40), customer=other, total_cents=1).save(force_insert=True)
except ShardingError as error:
    assert "disagree" in str(error)
else:
    raise AssertionError("a mismatched primary key must be refused")

if connection.vendor == "postgresql":
    from snowflake_db.sharding.django import (
        AddTimePartitions, CreateShardPartitionedTable, CreateTimePartitionedTable)
    layout = {"sequence_bits": 8, "shard_bits": 4}
    ops = [
        CreateShardPartitionedTable("orders_by_shard", "id bigint NOT NULL", layout),
        CreateTimePartitionedTable("orders_by_time", "id bigint PRIMARY KEY", layout,
                                   start="2026-01-01", periods=1),
        AddTimePartitions("orders_by_time", layout, days_ahead=40),
    ]
    for op in ops:
        name, args, kwargs = op.deconstruct()
        assert type(op)(*args, **kwargs).deconstruct() == (name, args, kwargs)
    with connections["shard0"].schema_editor() as editor:
        for op in ops:
            op.database_forwards("shop", editor, None, None)
    with connections["shard0"].cursor() as cursor:
        count = "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass"
        cursor.execute(count, ["orders_by_shard"])
        assert cursor.fetchone()[0] == 16
        cursor.execute(count, ["orders_by_time"])
        assert cursor.fetchone()[0] >= 2
print("SCENARIO OK")
'''


def run_scenario(control: str, shards: list[str]) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "SHOP_CONTROL_URL": control,
        "SHOP_SHARD_URLS": ",".join(shards),
    }
    result = subprocess.run([sys.executable, "-c", SCENARIO], check=False, env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SCENARIO OK" in result.stdout


def test_django_router_on_four_postgresql_databases(
    database_factory: Callable[[str], ScratchDatabase],
) -> None:
    databases = [database_factory("postgresql") for _ in range(5)]
    run_scenario(databases[0].url_string, [d.url_string for d in databases[1:]])


def test_django_router_on_sqlite_files(database_factory: Callable[[str], ScratchDatabase]) -> None:
    databases = [database_factory("sqlite") for _ in range(5)]
    run_scenario(databases[0].url_string, [d.url_string for d in databases[1:]])


@pytest.mark.parametrize("url", ["mongodb://x/y"])
def test_settings_reject_unknown_url_schemes(url: str) -> None:
    from example_project.settings import database_from_url

    with pytest.raises(ValueError, match="unsupported database URL scheme"):
        database_from_url(url)


def test_partition_operations_keep_every_layout_field() -> None:
    from snowflake_db import Layout
    from snowflake_db.sharding.django import (
        AddTimePartitions,
        CreateShardPartitionedTable,
        CreateTimePartitionedTable,
    )

    layout = Layout(sequence_bits=8, shard_bits=4, datacenter_bits=3, tick_ms=2)
    ops = [
        CreateShardPartitionedTable("by_shard", "id bigint NOT NULL", layout),
        CreateTimePartitionedTable("by_time", "id bigint PRIMARY KEY", layout, start="2026-01-01"),
        AddTimePartitions("by_time", layout),
    ]
    for op in ops:
        _, args, _ = op.deconstruct()
        frozen = next(arg for arg in args if isinstance(arg, dict))
        assert Layout(**frozen) == layout, type(op).__name__
