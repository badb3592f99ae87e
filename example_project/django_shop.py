"""The shop on Django: orders sharded over N database aliases by ``ShardedDatabaseRouter``.

Flow: migrate the control alias (worker table) and every shard alias (shop tables), create
customers, place orders from several processes at once, then verify: zero duplicate IDs, every
order on the shard its ID names, lookups by ID touching one alias, a time range as an ID range.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from .common import (
    BadInputError,
    Checks,
    Options,
    check_find_and_shard,
    display_url,
    iso,
    one_line,
    parse_options,
    place_orders_in_processes,
    plural,
    report_worker,
)
from .public_numbers import check_public_numbers, ensure_demo_key

BATCH = 50


def setup_django(options: Options) -> None:
    """Point the settings at the given URLs (children inherit the environment) and set up."""
    os.environ["SHOP_CONTROL_URL"] = options.control_url
    os.environ["SHOP_SHARD_URLS"] = ",".join(options.shard_urls)
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    ensure_demo_key()
    import django

    django.setup()


def place_orders(
    *, customer_ids: Sequence[int], count: int, seed: int,
    progress: Callable[[int], None] = lambda n: None,
) -> list[int]:
    """The demo's insert path: per batch and shard, one transaction with two bulk inserts."""
    from django.db import transaction

    from snowflake_db.django.sharding import alias_for_instance, ensure_pk

    from .shop.models import Order, OrderItem

    rng = random.Random(seed)
    ids: list[int] = []
    done = 0
    while done < count:
        size = min(BATCH, count - done)
        groups: dict[str, tuple[list[Any], list[Any]]] = {}
        for _ in range(size):
            order = Order(customer_id=rng.choice(customer_ids), total_cents=0)
            ensure_pk(order)
            items = [
                OrderItem(order=order, sku=f"SKU-{rng.randrange(1000):04d}",
                          quantity=rng.randint(1, 3), price_cents=rng.randrange(100, 10_000))
                for _ in range(rng.randint(1, 3))
            ]
            order.total_cents = sum(i.quantity * i.price_cents for i in items)
            orders, all_items = groups.setdefault(alias_for_instance(order), ([], []))
            orders.append(order)
            all_items.extend(items)
        for alias, (orders, items) in groups.items():
            with transaction.atomic(using=alias):
                Order.objects.using(alias).bulk_create(orders)
                OrderItem.objects.using(alias).bulk_create(items)
            ids.extend(order.pk for order in orders)
        done += size
        progress(size)
    return ids


def _child(options: Options, customer_ids: list[int], count: int, seed: int, queue: Any) -> None:
    setup_django(options)  # the snowflake_db app configures a table allocator from settings
    import snowflake_db

    report_worker(queue, seed, snowflake_db.get_generator().ensure_worker())
    queue.put(place_orders(customer_ids=customer_ids, count=count, seed=seed,
                           progress=queue.put))


@contextmanager
def count_queries(aliases: Sequence[str]) -> Iterator[Counter[str]]:
    """Count the statements each alias runs inside the block."""
    from django.db import connections

    counts: Counter[str] = Counter()

    def wrapper_for(alias: str) -> Callable[..., Any]:
        def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                    context: Any) -> Any:
            counts[alias] += 1
            return execute(sql, params, many, context)

        return wrapper

    with ExitStack() as stack:
        for alias in aliases:
            stack.enter_context(connections[alias].execute_wrapper(wrapper_for(alias)))
        yield counts


def migrate(options: Options, aliases: list[str]) -> None:
    from django.core.management import call_command
    from django.db import connections

    for alias, url in [("default", options.control_url), *zip(aliases, options.shard_urls,
                                                              strict=True)]:
        try:
            connections[alias].ensure_connection()
        except Exception as error:
            name = "control" if alias == "default" else alias
            raise BadInputError(
                f"cannot connect to {name} ({display_url(url)}): {one_line(error)}"
            ) from None
    # The demo owns the shop tables: start from empty ones on every run.
    for alias in aliases:
        connection = connections[alias]
        with connection.cursor() as cursor:
            for table in ("shop_orderitem", "shop_order", "shop_customer"):
                cursor.execute(f"DROP TABLE IF EXISTS {table}")
            if "django_migrations" in connection.introspection.table_names(cursor):
                cursor.execute("DELETE FROM django_migrations WHERE app = 'shop'")
    for alias in ["default", *aliases]:
        call_command("migrate", database=alias, verbosity=0, interactive=False)


def run(options: Options) -> int:
    setup_django(options)
    from django.conf import settings

    from snowflake_db.django.sharding import get_shard_router

    from .shop.models import Customer

    router = get_shard_router()
    find_ids = check_find_and_shard(options, router)
    aliases: list[str] = list(settings.SHARD_ALIASES)
    print(f"Django shop: {plural(len(aliases), 'shard database')}, "
          f"{plural(router.logical_shards, 'logical shard')}, worker table on "
          f"{display_url(options.control_url)}")
    for alias, url in zip(aliases, options.shard_urls, strict=True):
        print(f"  {alias}: {display_url(url)}  logical shards {router.shards_on(alias)}")
    migrate(options, aliases)

    customers = Customer.objects.bulk_create(
        [Customer(name=f"customer {i}") for i in range(options.customers)]
    )
    customer_ids = [c.pk for c in customers]
    import snowflake_db

    print(f"  this process (pid {os.getpid()}) leased worker ID "
          f"{snowflake_db.get_generator().worker_id} for the customers")
    from django.db import connections

    connections.close_all()  # no connection is shared with the spawned processes

    placed, elapsed = place_orders_in_processes(options, customer_ids, _child)
    return verify(options, aliases=aliases, placed=placed, elapsed=elapsed, find_ids=find_ids)


def verify(
    options: Options, *, aliases: list[str], placed: list[int], elapsed: float,
    find_ids: list[int],
) -> int:
    from snowflake_db.django.sharding import get_shard_router

    from .shop.models import Order

    router = get_shard_router()
    checks = Checks()
    print(f"placed {plural(len(placed), 'order')} in {elapsed:.2f} s: "
          f"{len(placed) / max(elapsed, 1e-9):,.0f} orders/s")
    checks.check(len(placed) == options.orders,
                 f"{options.orders} orders reported by the processes")

    stored = {alias: list(Order.objects.using(alias).values_list("pk", flat=True))
              for alias in aliases}
    all_ids = [i for ids in stored.values() for i in ids]
    checks.check(len(all_ids) == len(set(all_ids)) == len(set(placed)) == len(placed),
                 f"zero duplicate IDs ({len(all_ids)} stored, {len(set(all_ids))} distinct)")
    misplaced = [i for alias, ids in stored.items() for i in ids
                 if router.target_for_id(i) != alias]
    checks.check(not misplaced, f"every order is on the shard its ID names ({len(misplaced)} not)")
    print("orders per shard:")
    for alias, count in Order.objects.count_by_shard().items():
        print(f"  {alias}: {count}")

    sample = random.Random(7).sample(placed, min(20, len(placed)))
    wrong = []
    for order_id in sample + find_ids:
        expected = router.target_for_id(order_id)
        with count_queries(aliases) as counts:
            try:
                order = Order.objects.get(pk=order_id)
                items = list(order.items.all())
            except Order.DoesNotExist:
                order, items = None, []
        if order_id in find_ids:
            found = f"on {expected}, {plural(len(items), 'item')}" if order else "not found"
            print(f"  --find {order_id}: {found} (queried {sorted(counts)})")
        elif order is None or set(counts) != {expected} or not items:
            wrong.append(order_id)
    checks.check(not wrong, f"{len(sample)} lookups by ID each found the order querying only "
                 f"its shard ({len(wrong)} did not)")

    customer_id = Order.objects.get(pk=placed[0]).customer_id
    with count_queries(aliases) as counts:
        of_customer = list(Order.objects.filter(customer_id=customer_id))
    checks.check(len(counts) == 1 and bool(of_customer),
                 f"orders of customer {customer_id}: {len(of_customer)} found querying "
                 f"{plural(len(counts), 'shard')}")

    def find_by_number(number: str) -> tuple[int | None, int]:
        with count_queries(aliases) as counts:
            try:
                found: int | None = Order.objects.get(public_id=number).pk
            except Order.DoesNotExist:
                found = None
        return found, len(counts)

    check_public_numbers(checks, placed[0], find_by_number)

    times = sorted(router.layout.decode(i).timestamp_ms for i in placed)
    start, end = times[0], times[len(times) // 2]
    expected_count = sum(1 for t in times if start <= t <= end)
    with count_queries(aliases) as counts:
        in_window = sum(1 for _ in Order.objects.time_range(start, end).across_shards())
    low, high = router.id_range(start, end)
    checks.check(in_window == expected_count,
                 f"time range {iso(start)}..{iso(end)}: {in_window} orders (expected "
                 f"{expected_count}) via id BETWEEN {low} AND {high} on "
                 f"{plural(len(counts), 'shard')}")

    if options.shard is not None:
        target = router.target_of_shard(options.shard)
        first = [i for i in stored[target] if router.shard_of_id(i) == options.shard][:5]
        print(f"logical shard {options.shard} lives on {target}; first orders: {first}")
    return checks.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_options(argv, "example_project", __doc__.splitlines()[0],
                                data_subdir="django")
        return run(options)
    except BadInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
