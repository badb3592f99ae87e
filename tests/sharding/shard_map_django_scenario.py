"""Django routing by the control database's shard map: the app's migration creates the map's
tables, the dict form of ``SNOWFLAKE_SHARD_ROUTER`` follows the map, and (PostgreSQL) a fenced
write is mapped to ``ShardMovedError`` and retried by ``atomic_with_retry`` on the new target.

Run by ``tests/sharding/test_shard_map_routing.py`` in a subprocess (``pytest -p no:django``)
with the demo shop's settings (``example_project.settings``): a control database and three
shard aliases from the environment. The tests run in file order and share the module fixture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

if os.environ.get("DJANGO_SETTINGS_MODULE") != "example_project.settings":
    pytest.skip(
        "run by tests/sharding/test_shard_map_routing.py in a subprocess",
        allow_module_level=True,
    )

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import DatabaseError, connections  # noqa: E402
from django.db.models import F  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from sqlalchemy import Engine, MetaData, create_engine, inspect, text  # noqa: E402
from sqlalchemy.exc import IntegrityError  # noqa: E402

from example_project.common import SHOP_LAYOUT  # noqa: E402
from example_project.shop.models import Customer, Order  # noqa: E402
from snowflake_db.django.sharding import atomic_with_retry, get_shard_router  # noqa: E402
from snowflake_db.django.worker import sqlalchemy_url  # noqa: E402
from snowflake_db.errors import ShardMovedError  # noqa: E402
from snowflake_db.process import get_generator  # noqa: E402
from snowflake_db.sharding import ControlledShardRouter  # noqa: E402
from snowflake_db.sharding.moved import shard_moved_error  # noqa: E402
from snowflake_db.sharding.shard_map import (  # noqa: E402
    add_target,
    barrier_passed,
    flip_shard,
    init_shard_map,
    shard_map_tables,
)

ALIASES: list[str] = list(settings.SHARD_ALIASES)
NEW = ALIASES[2]  # registered in the map, serving no shard until a flip
POSTGRESQL = connections["default"].vendor == "postgresql"
MASK = (1 << SHOP_LAYOUT.shard_bits) - 1
FENCE_FUNCTION = """
CREATE OR REPLACE FUNCTION sfdb_fence_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'SFM01',
        MESSAGE = format('shard %s of %s moved to %s', TG_ARGV[0], TG_TABLE_NAME, TG_ARGV[1]),
        DETAIL = format('shard=%s target=%s move=%s', TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]);
END $$
"""


@pytest.fixture(scope="module")
def control() -> Iterator[Engine]:
    setting = {"CONTROL_DATABASE": "default", "TARGETS": ALIASES, "REFRESH_SECONDS": 600}
    with override_settings(SNOWFLAKE_SHARD_ROUTER=setting):
        # migrate works before the map exists: the shard aliases are the setting's TARGETS
        for alias in ["default", *ALIASES]:
            call_command("migrate", database=alias, verbosity=0)
        engine = create_engine(sqlalchemy_url("default"))
        backend = "postgresql" if POSTGRESQL else "sqlite"
        init_shard_map(engine, layout=SHOP_LAYOUT, assignment=ALIASES[:2], backend=backend)
        add_target(engine, NEW, backend=backend)
        yield engine
        engine.dispose()


def _router() -> ControlledShardRouter:
    router = get_shard_router()
    assert isinstance(router, ControlledShardRouter)
    return router


def _customer_on(source: str) -> Any:
    """A new customer whose shard is served by ``source``."""
    for attempt in range(200):
        customer = Customer.objects.create(name=f"c{attempt}")
        if customer._state.db == source:
            return customer
    raise AssertionError(f"no customer landed on {source} in 200 tries")


def _copy_customer(customer: Any, alias: str) -> None:
    """What a move's copy does for the customer row."""
    Customer(pk=customer.pk, name=customer.name).save(using=alias, force_insert=True)


def test_the_migration_creates_the_schema_of_the_sqlalchemy_definition(control: Engine) -> None:
    inspector = inspect(control)
    for table in shard_map_tables(MetaData()):
        columns = {c["name"]: c for c in inspector.get_columns(table.name)}
        assert set(columns) == {c.name for c in table.columns}, table.name
        for column in table.columns:
            assert bool(columns[column.name]["nullable"]) == column.nullable, column
        pk = set(inspector.get_pk_constraint(table.name)["constrained_columns"])
        assert pk == {c.name for c in table.primary_key.columns}, table.name
    with pytest.raises(IntegrityError), control.begin() as connection:  # the CHECK is there
        connection.execute(text("UPDATE snowflake_shard_map SET state = 'gone'"))
    assert "snowflake_shard_map" not in connections[ALIASES[0]].introspection.table_names()


def test_writes_and_reads_follow_a_flip(control: Engine) -> None:
    router = _router()
    assert router.targets == tuple(ALIASES[:2]) and router.known_targets == tuple(sorted(ALIASES))
    customer = _customer_on(ALIASES[0])
    shard = router.shard_for_key(customer.pk)
    before = Order.objects.create(customer_id=customer.pk, total_cents=1)
    assert before._state.db == ALIASES[0]
    _copy_customer(customer, NEW)
    version = flip_shard(control, shard, NEW)
    assert router.target_of_shard(shard) == ALIASES[0]  # refreshed every 600 s: not yet
    assert router.refresh() == version
    after = Order.objects.create(customer_id=customer.pk, total_cents=2)
    assert after._state.db == NEW
    assert Order.objects.using(NEW).filter(pk=after.pk).exists()
    assert not Order.objects.using(ALIASES[0]).filter(pk=after.pk).exists()
    assert Order.objects.get(pk=after.pk)._state.db == NEW


def test_the_router_reports_under_the_process_lease(control: Engine) -> None:
    router = _router()
    generator = get_generator()
    lease = generator.lease
    assert lease is not None
    router.refresh()
    assert router.reported == (lease.worker_id, lease.token, router.version)  # type: ignore[attr-defined]
    assert barrier_passed(control, router.version)


def test_a_fenced_write_is_retried_on_the_new_target(control: Engine) -> None:
    """PostgreSQL only (deselected elsewhere): the fence is a PostgreSQL trigger."""
    assert POSTGRESQL
    router = _router()
    source = ALIASES[1]
    customer = _customer_on(source)
    shard = router.shard_for_key(customer.pk)
    _copy_customer(customer, NEW)
    with connections[source].cursor() as cursor:
        cursor.execute(FENCE_FUNCTION)
        cursor.execute(
            f"CREATE TRIGGER sfdb_fence_51_w BEFORE INSERT OR UPDATE ON shop_order "
            f"FOR EACH ROW WHEN ((NEW.id & {MASK}) = {shard}) "
            f"EXECUTE FUNCTION sfdb_fence_refuse('{shard}', '{NEW}', '51')"
        )
    with pytest.raises(DatabaseError) as raised:
        Order.objects.create(customer_id=customer.pk, total_cents=3)
    moved = shard_moved_error(raised.value)
    assert moved is not None and (moved.shard, moved.target, moved.move_id) == (shard, NEW, 51)

    with pytest.raises(ShardMovedError, match=r"gave up after 2 attempt\(s\)"):
        atomic_with_retry(lambda: Order.objects.create(customer_id=customer.pk, total_cents=3),
                          using=lambda: router.target_for_key(customer.pk), attempts=2)

    flip_shard(control, shard, NEW)  # from another connection; the router has not looked
    aliases: list[str] = []

    def place() -> Any:
        aliases.append(router.target_for_key(customer.pk))
        return Order.objects.create(customer_id=customer.pk, total_cents=4)

    order = atomic_with_retry(place, using=lambda: router.target_for_key(customer.pk))
    assert aliases == [source, NEW]
    assert order._state.db == NEW and Order.objects.using(NEW).filter(pk=order.pk).exists()
    assert not Order.objects.using(source).filter(customer_id=customer.pk).exists()


def test_an_update_that_reached_the_old_alias_after_its_rows_left_runs_again(
    control: Engine,
) -> None:
    """A whole move (copy, flip, the barrier, the source's rows deleted) between the routing of
    ``atomic_with_retry`` and its ``update()``: on the old alias the update matches nothing, and
    no fence refuses a statement that touches no row. The attempt's routes are confirmed before
    the commit (this process holds a lease the barrier waited for: its router's own map says
    the shard moved), so it is rolled back and runs on the new alias."""
    router = _router()
    source = ALIASES[0]
    customer = _customer_on(source)
    order = Order.objects.create(customer_id=customer.pk, total_cents=1)
    tries: list[tuple[str, int]] = []
    aliases: list[str] = []

    def using() -> str:
        aliases.append(router.target_for_id(order.pk))
        if len(aliases) == 1:  # routed: now the whole move runs, before the statement
            move()
            version = flip_shard(control, router.shard_for_key(customer.pk), NEW)
            router.refresh()  # what its background check does before the barrier passes
            assert barrier_passed(control, version)
        return aliases[-1]

    def move() -> None:
        """The mover's doing, on its own connections (not this transaction's)."""
        _copy_customer(customer, NEW)
        Order(pk=order.pk, customer_id=customer.pk, total_cents=1).save(using=NEW,
                                                                        force_insert=True)
        engine = create_engine(sqlalchemy_url(source))
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM shop_order WHERE id = :id"), {"id": order.pk})
        engine.dispose()

    def work() -> int:
        updated = Order.objects.using(aliases[-1]).filter(pk=order.pk).update(
            total_cents=F("total_cents") + 10)
        tries.append((aliases[-1], updated))
        return int(updated)

    assert atomic_with_retry(work, using=using) == 1
    assert tries == [(source, 0), (NEW, 1)]
    assert Order.objects.using(NEW).get(pk=order.pk).total_cents == 11


def test_fan_out_reads_count_a_moved_shard_once(control: Engine) -> None:
    """Between a move's copy and its cleanup a shard's orders are on two aliases: queries
    without a shard key read each order once, from the alias the map names."""
    router = _router()
    source = ALIASES[0]
    customer = _customer_on(source)
    shard = router.shard_for_key(customer.pk)
    marker, single = 880001, 880002
    orders = [Order.objects.create(customer_id=customer.pk, total_cents=marker)
              for _ in range(3)]
    lone = Order.objects.create(customer_id=customer.pk, total_cents=single)
    ids = sorted(o.pk for o in orders)
    # What a move's copy does: the shard's rows on the new alias too.
    _copy_customer(customer, NEW)
    for order in [*orders, lone]:
        Order(pk=order.pk, customer_id=customer.pk, total_cents=order.total_cents).save(
            using=NEW, force_insert=True)

    def reads() -> tuple[list[int], int, list[int], int, set[str]]:
        query = Order.objects.filter(total_cents=marker)
        rows = list(query.across_shards())
        return (
            sorted(o.pk for o in rows),
            sum(query.count_by_shard().values()),
            sorted(query.in_bulk()),
            Order.objects.get(total_cents=single).pk,  # MultipleObjectsReturned if doubled
            {o._state.db for o in rows},
        )

    assert reads() == (ids, 3, ids, lone.pk, {source})
    flip_shard(control, shard, NEW)
    router.refresh()
    assert reads() == (ids, 3, ids, lone.pk, {NEW})
    assert sorted(Order.objects.in_bulk(ids)) == ids
    assert {o._state.db for o in Order.objects.in_bulk(ids).values()} == {NEW}
    sliced = list(Order.objects.filter(total_cents=marker).order_by("pk")[:2].across_shards())
    assert [o.pk for o in sliced] == ids[:2]  # a slice of the kept rows, on the one alias
    # The source still holds its copy until the cleanup; nothing above read it.
    assert Order.objects.using(source).filter(total_cents=marker).count() == 3


def test_a_read_by_id_through_a_stale_router_finds_a_moved_order(control: Engine) -> None:
    """After a move's flip and cleanup, a process whose router has not looked at the map yet
    (refreshed every 600 s here) misses the order on the old alias: the miss checks the map
    once and reads again where it now is."""
    router = _router()
    router.refresh()
    source = ALIASES[0]
    customer = _customer_on(source)
    shard = router.shard_for_key(customer.pk)
    order = Order.objects.create(customer_id=customer.pk, total_cents=5)
    # What the move does: the copy, the flip (from another connection), then the cleanup.
    _copy_customer(customer, NEW)
    Order(pk=order.pk, customer_id=customer.pk, total_cents=5).save(using=NEW, force_insert=True)
    version = flip_shard(control, shard, NEW)
    Order.objects.using(source).filter(pk=order.pk).delete()
    assert router.version < version  # stale
    found = Order.objects.get(pk=order.pk)
    assert found._state.db == NEW and found.total_cents == 5
    assert router.version == version
    with pytest.raises(Order.DoesNotExist):  # a true miss stays a miss
        Order.objects.get(pk=(order.pk + (1 << 20)) & ~MASK | shard)
