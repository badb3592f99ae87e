"""Migrations build sharded orders on real engines, and rows land where ShardRouter says.

One set of throwaway servers for the module (``example_project.local_servers``; stopped by PID
at the end): four PostgreSQL clusters (a coordinator and three shards, postgres_fdw) and one
mariadbd with Spider whose backends are databases on the same server, reached as a user with a
password. Each test migrates its own databases with ``op.create_sharded_orders`` (a real
``alembic upgrade``/``downgrade``) or Django's ``CreateShardedOrders`` (forwards and backwards,
in a subprocess with its own settings), places orders and items for many customers through the
coordinator or the Spider table, and reads each backend directly. Bulk loads go the other
way: straight to each shard, then read through the coordinator or the Spider table. Without
the binaries the tests skip with the reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from alembic import command
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, create_engine
from sqlalchemy.engine import make_url

from example_project import local_servers
from snowflake_db import SnowflakeGenerator
from snowflake_db.sharding import ShardRouter
from snowflake_db.sharding import ddl as d
from snowflake_db.sharding.engines import BIGINT_MAX
from snowflake_db.sqlalchemy import SnowflakeDefault, bulk_load_with_children, snowflake_column

from ..plugins.alembic_support import make_project, write_revision
from ..plugins.databases import ScratchDatabase, unavailable

# The servers are slow to start: one set for the module, in one xdist process. (With pytest 9.2
# and pytest-xdist 3.8 the group is ignored, pytest-dev/pytest-xdist#1386: then each worker that
# runs a test here starts its own set; they are private, so only time is lost.)
pytestmark = pytest.mark.xdist_group("sharding_ddl")

REPO = Path(__file__).resolve().parents[2]
SHARDS = 3
SECRET = "s3cr'et\\pw"  # a quote and a backslash: both must survive the SQL literal
SECRET_ENV = "SFDB_TEST_SHARD_PASSWORD"
SPIDER_USER = "shop"


@pytest.fixture(scope="module")
def postgres() -> Iterator[list[local_servers.ThrowawayPostgres]]:
    """The coordinator (index 0) and three shard clusters."""
    try:
        clusters = local_servers.postgres_clusters(1 + SHARDS, names=["coord", "s0", "s1", "s2"])
    except local_servers.ServerUnavailableError as error:
        unavailable(str(error))
    try:
        ports = {cluster.port for cluster in clusters}
        assert len(ports) == 1 + SHARDS and not ports & {5432, 3306}  # never the shared servers
        yield clusters
    finally:
        for cluster in clusters:
            cluster.close()


@pytest.fixture(scope="module")
def spider() -> Iterator[local_servers.ThrowawayMariaDB]:
    try:
        server = local_servers.spider_server()
    except local_servers.ServerUnavailableError as error:
        unavailable(str(error))
    try:
        assert server.port != 3306  # never the shared server
        with server.connect().cursor() as cursor:
            cursor.execute(f"CREATE USER '{SPIDER_USER}'@'127.0.0.1' IDENTIFIED BY %s", (SECRET,))
        yield server
    finally:
        server.close()


@pytest.fixture
def shard_password(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return SECRET


# -- helpers -----------------------------------------------------------------------------------


def _pg(cluster: local_servers.ThrowawayPostgres, dbname: str) -> psycopg.Connection[Any]:
    return psycopg.connect(host=cluster.host, port=cluster.port, user="postgres",
                           dbname=dbname, autocommit=True)


def _pg_shop(clusters: list[local_servers.ThrowawayPostgres], dbname: str) -> list[d.ShardServer]:
    for cluster in clusters:
        cluster.create_database(dbname)
    return [d.ShardServer(c.host, c.port, dbname, "postgres", password_env=SECRET_ENV)
            for c in clusters[1:]]


def _spider_shop(server: local_servers.ThrowawayMariaDB, prefix: str) -> list[d.ShardServer]:
    with server.connect().cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {prefix}_front")
        for i in range(SHARDS):
            cursor.execute(f"CREATE DATABASE {prefix}_b{i}")
            cursor.execute(f"GRANT ALL ON {prefix}_b{i}.* TO '{SPIDER_USER}'@'127.0.0.1'")
    return [d.ShardServer(server.host, server.port, f"{prefix}_b{i}", SPIDER_USER,
                          password_env=SECRET_ENV) for i in range(SHARDS)]


def _orders() -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int, str, int, int]]]:
    """Orders (id, customer, total) and items for 150 customers: Snowflake customer IDs plus
    edges; 1-3 orders each, 1-2 items per order, every key a Snowflake ID."""
    ids = SnowflakeGenerator(5)
    edges = [0, 1, -1, 2, 42, BIGINT_MAX, -BIGINT_MAX, 2**32, -(2**31), 7]
    customers = [*ids.next_ids(140), *edges]
    orders, items = [], []
    for n, customer in enumerate(customers):
        for _ in range(1 + n % 3):
            order = ids.next_id()
            orders.append((order, customer, 100 + n))
            for k in range(1 + n % 2):
                items.append((ids.next_id(), order, customer, f"sku{k}", 1 + k, 250))
    return orders, items


def _assert_placed(router: ShardRouter, found: list[dict[str, list[tuple[int, int]]]],
                   orders: list[tuple[int, ...]], items: list[tuple[int, ...]]) -> None:
    """Each backend's (id, customer_id) rows are those the router puts there: all of them,
    each once, and every customer on exactly one backend."""
    homes: dict[int, set[int]] = {}
    for index, tables in enumerate(found):
        for rows in tables.values():
            wrong = [row for row in rows if router.target_for_key(row[1]) != f"shard{index}"]
            assert wrong == [], f"shard {index} holds rows routed elsewhere: {wrong[:5]}"
            for _, customer in rows:
                homes.setdefault(customer, set()).add(index)
    assert sorted(r for t in found for r in t["orders"]) == sorted((o[0], o[1]) for o in orders)
    assert sorted(r for t in found for r in t["items"]) == sorted((i[0], i[2]) for i in items)
    assert all(len(backends) == 1 for backends in homes.values())
    assert len({next(iter(b)) for b in homes.values()}) == SHARDS  # every shard got customers


def _pg_rows(connection: psycopg.Connection[Any]) -> dict[str, list[tuple[int, int]]]:
    return {
        "orders": connection.execute("SELECT id, customer_id FROM orders").fetchall(),
        "items": connection.execute("SELECT id, customer_id FROM order_items").fetchall(),
    }


def _pg_objects(connection: psycopg.Connection[Any]) -> list[tuple[str, ...]]:
    """Tables, foreign servers, user mappings and postgres_fdw left in a database."""
    return connection.execute(
        "SELECT 'table', relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
        "AND relkind IN ('r', 'p', 'f') AND relname <> 'alembic_version' UNION ALL "
        "SELECT 'server', srvname FROM pg_foreign_server UNION ALL "
        "SELECT 'mapping', srvname FROM pg_user_mappings UNION ALL "
        "SELECT 'extension', extname FROM pg_extension WHERE extname = 'postgres_fdw'"
    ).fetchall()


def _fill_and_check_postgres(clusters: list[local_servers.ThrowawayPostgres], dbname: str) -> None:
    orders, items = _orders()
    router = ShardRouter([f"shard{i}" for i in range(SHARDS)], logical_shards=SHARDS,
                         engine="postgresql-hash")
    with _pg(clusters[0], dbname) as coordinator:
        with coordinator.transaction():
            coordinator.cursor().executemany("INSERT INTO orders VALUES (%s, %s, %s)", orders)
            coordinator.cursor().executemany(
                "INSERT INTO order_items VALUES (%s, %s, %s, %s, %s, %s)", items)
        customer = orders[0][1]
        home = router.shard_for_key(customer)
        assert coordinator.execute(
            "SELECT count(*) FROM orders WHERE customer_id = %s", (customer,)
        ).fetchone() == (sum(1 for o in orders if o[1] == customer),)
        # Moving a customer to another shard: the shard's own partitioning refuses the row
        # (without the guard, postgres_fdw would leave it on the wrong shard).
        other = next(c for c in range(10**6) if router.shard_for_key(c) != home)
        order_id = SnowflakeGenerator(6).next_id()
        coordinator.execute("INSERT INTO orders VALUES (%s, %s, 1)", (order_id, customer))
        with pytest.raises(psycopg.errors.CheckViolation, match="no partition of relation"):
            coordinator.execute("UPDATE orders SET customer_id = %s WHERE id = %s",
                                (other, order_id))
        coordinator.execute("DELETE FROM orders WHERE id = %s", (order_id,))
        # Why the coordinator's tables have no key (ddl.postgres_coordinator_sql's docstring).
        with pytest.raises(psycopg.errors.WrongObjectType, match="cannot create unique index"):
            coordinator.execute("ALTER TABLE orders ADD PRIMARY KEY (customer_id, id)")
        mapped = coordinator.execute("SELECT umoptions FROM pg_user_mappings").fetchall()
        assert [f"password={SECRET}" in options for (options,) in mapped] == [True] * SHARDS
    found = []
    for cluster in clusters[1:]:
        with _pg(cluster, dbname) as shard:
            found.append(_pg_rows(shard))
    _assert_placed(router, found, orders, items)


def _assert_postgres_empty(clusters: list[local_servers.ThrowawayPostgres], dbname: str) -> None:
    for cluster in clusters:
        with _pg(cluster, dbname) as connection:
            assert _pg_objects(connection) == []


def _spider_rows(server: local_servers.ThrowawayMariaDB, database: str
                 ) -> dict[str, list[tuple[int, int]]]:
    connection = server.connect(database)
    try:
        with connection.cursor() as cursor:
            rows = {}
            for key, table in (("orders", "orders"), ("items", "order_items")):
                cursor.execute(f"SELECT id, customer_id FROM {table}")
                rows[key] = [(int(a), int(b)) for a, b in cursor.fetchall()]
            return rows
    finally:
        connection.close()


def _fill_and_check_spider(server: local_servers.ThrowawayMariaDB, prefix: str) -> None:
    orders, items = _orders()
    router = ShardRouter([f"shard{i}" for i in range(SHARDS)], logical_shards=SHARDS,
                         engine="mariadb-key")
    connection = server.connect(f"{prefix}_front")
    try:
        with connection.cursor() as cursor:
            cursor.executemany("INSERT INTO orders VALUES (%s, %s, %s)", orders)
            cursor.executemany("INSERT INTO order_items VALUES (%s, %s, %s, %s, %s, %s)", items)
            cursor.execute("SELECT count(*) FROM order_items")
            assert cursor.fetchone() == (len(items),)
            cursor.execute("SELECT Password FROM mysql.servers ORDER BY Server_name")
            assert cursor.fetchall() == ((SECRET,),) * SHARDS
            # Moving a customer to another backend through Spider fails too: Spider 10.11
            # answers error 1364 for these tables (no column defaults); the row stays put.
            customer, order_id = orders[0][1], orders[0][0]
            other = next(c for c in range(10**6)
                         if router.shard_for_key(c) != router.shard_for_key(customer))
            with pytest.raises(pymysql.MySQLError, match="doesn't have a default value"):
                cursor.execute("UPDATE orders SET customer_id = %s WHERE id = %s",
                               (other, order_id))
    finally:
        connection.close()
    found = [_spider_rows(server, f"{prefix}_b{i}") for i in range(SHARDS)]
    _assert_placed(router, found, orders, items)


def _assert_spider_empty(server: local_servers.ThrowawayMariaDB, prefix: str) -> None:
    connection = server.connect()
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema LIKE %s AND table_name <> 'alembic_version'",
                (f"{prefix}\\_%",))
            assert cursor.fetchall() == ()
            cursor.execute("SELECT Server_name FROM mysql.servers")
            assert cursor.fetchall() == ()
    finally:
        connection.close()


# -- Alembic -----------------------------------------------------------------------------------

ALEMBIC_UP = """
from snowflake_db.sharding.ddl import ShardServer
shards = {shards}
op.create_sharded_orders({engine!r}, shards)
"""
ALEMBIC_DOWN = """
from snowflake_db.sharding.ddl import ShardServer
shards = {shards}
op.drop_sharded_orders({engine!r}, shards)
"""


def _log_statements(caplog: pytest.LogCaptureFixture) -> None:
    """Capture every statement SQLAlchemy runs (its "sqlalchemy" logger defaults to WARN)."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="sqlalchemy.engine")


def _alembic(tmp_path: Path, url: str, engine: str, shards: str) -> Any:
    parsed = make_url(url)
    config = make_project(tmp_path, ScratchDatabase("x", parsed, parsed.database or ""))
    write_revision(config, "sharded", None,
                   ALEMBIC_UP.format(shards=shards, engine=engine),
                   ALEMBIC_DOWN.format(shards=shards, engine=engine))
    return config


def test_alembic_builds_postgres_fdw_shards_and_drops_them(
    tmp_path: Path, postgres: list[local_servers.ThrowawayPostgres], shard_password: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    servers = _pg_shop(postgres, "alembic_shop")
    config = _alembic(tmp_path, postgres[0].url("alembic_shop"), "postgresql-fdw",
                      repr(servers))  # repr: every field but the password
    _log_statements(caplog)
    command.upgrade(config, "head")
    assert "CREATE FOREIGN TABLE" in caplog.text and shard_password not in caplog.text
    _fill_and_check_postgres(postgres, "alembic_shop")
    command.downgrade(config, "base")
    _assert_postgres_empty(postgres, "alembic_shop")


def test_alembic_builds_local_hash_partitions_the_router_predicts(
    tmp_path: Path, postgres_db: ScratchDatabase,
) -> None:
    # One server, no FDW: the shared server's scratch database will do.
    config = _alembic(tmp_path, postgres_db.url_string, "postgresql-local", "5")
    command.upgrade(config, "head")
    orders, items = _orders()
    router = ShardRouter([f"orders_p{i}" for i in range(5)], logical_shards=5,
                         engine="postgresql-hash")
    with psycopg.connect(postgres_db.url_string.replace("+psycopg", ""),
                         autocommit=True) as connection:
        connection.cursor().executemany("INSERT INTO orders VALUES (%s, %s, %s)", orders)
        connection.cursor().executemany(
            "INSERT INTO order_items VALUES (%s, %s, %s, %s, %s, %s)", items)
        placed = connection.execute(
            "SELECT tableoid::regclass::text, customer_id FROM orders UNION ALL "
            "SELECT replace(tableoid::regclass::text, 'order_items', 'orders'), customer_id "
            "FROM order_items").fetchall()
    assert len(placed) == len(orders) + len(items)
    assert [p for p in placed if router.target_for_key(p[1]) != p[0]] == []
    command.downgrade(config, "base")
    with psycopg.connect(postgres_db.url_string.replace("+psycopg", "")) as connection:
        assert _pg_objects(connection) == []


def test_alembic_builds_spider_backends_and_drops_them(
    tmp_path: Path, spider: local_servers.ThrowawayMariaDB, shard_password: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    servers = _spider_shop(spider, "al")
    config = _alembic(tmp_path, spider.url("al_front"), "spider", repr(servers))
    _log_statements(caplog)
    command.upgrade(config, "head")
    assert "ENGINE=SPIDER" in caplog.text and shard_password not in caplog.text
    _fill_and_check_spider(spider, "al")
    command.downgrade(config, "base")
    _assert_spider_empty(spider, "al")


# -- Django ------------------------------------------------------------------------------------


def _django(mode: str, config: dict[str, Any]) -> dict[str, Any]:
    result = subprocess.run(
        # -m from the repository: run as a file, tests/django would shadow Django itself
        [sys.executable, "-m", "tests.sharding.sharding_ddl_django_scenario", mode],
        check=False, input=json.dumps(config), capture_output=True, text=True, timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), SECRET_ENV: SECRET},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output: dict[str, Any] = json.loads(result.stdout)
    return output


def test_django_operation_forwards_and_backwards_on_postgres_fdw_and_spider(
    postgres: list[local_servers.ThrowawayPostgres], spider: local_servers.ThrowawayMariaDB,
) -> None:
    pg_servers = _pg_shop(postgres, "django_shop")
    spider_servers = _spider_shop(spider, "dj")
    config = {
        "databases": {"default": postgres[0].url("django_shop"),
                      "spider": spider.url("dj_front")},
        # Each operation also meets the other vendor's alias, and must leave it alone.
        "operations": [[alias, engine, [s.as_dict() for s in servers]]
                       for engine, servers in (("postgresql-fdw", pg_servers),
                                               ("spider", spider_servers))
                       for alias in ("default", "spider")],
    }
    shown = _django("sqlmigrate", config)
    assert any("CREATE USER MAPPING" in sql for sql in shown["collected"])
    assert any("CREATE SERVER `sfdb_shard2`" in sql for sql in shown["collected"])
    assert SECRET not in json.dumps(shown)
    _assert_postgres_empty(postgres, "django_shop")  # sqlmigrate ran nothing

    forwards = _django("forwards", config)
    assert "CREATE FOREIGN TABLE" in forwards["log"] and "ENGINE=SPIDER" in forwards["log"]
    assert SECRET not in forwards["log"]
    assert forwards["deconstruct"][1][1][0]["password_env"] == SECRET_ENV
    _fill_and_check_postgres(postgres, "django_shop")
    _fill_and_check_spider(spider, "dj")

    backwards = _django("backwards", config)
    assert SECRET not in backwards["log"]
    _assert_postgres_empty(postgres, "django_shop")
    _assert_spider_empty(spider, "dj")


# -- bulk loads straight to the owning shard ---------------------------------------------------

_direct = MetaData()
_ids = SnowflakeDefault(SnowflakeGenerator(11))
DIRECT_ORDERS = Table("orders", _direct, snowflake_column("id", default=_ids),
                      Column("customer_id", BigInteger), Column("total_cents", BigInteger))
DIRECT_ITEMS = Table(
    "order_items", _direct, snowflake_column("id", default=_ids),
    Column("order_id", BigInteger), Column("customer_id", BigInteger), Column("sku", String(32)),
    Column("quantity", Integer), Column("price_cents", BigInteger),
)


def _families() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """An order with one or two items for each of _orders()'s customers (no keys: the loader
    makes them)."""
    customers = sorted({customer for _, customer, _ in _orders()[0]})
    return [({"customer_id": customer, "total_cents": 100 + n},
             [{"customer_id": customer, "sku": f"sku{k}", "quantity": 1 + k, "price_cents": 250}
              for k in range(1 + n % 2)])
            for n, customer in enumerate(customers)]


def _load_straight_to_shards(router: ShardRouter, shard_urls: list[str],
                             families: list[tuple[dict[str, Any], list[dict[str, Any]]]]
                             ) -> dict[int, list[int]]:
    """``bulk_load_with_children`` once per shard with the families the router gives it;
    returns each customer's order keys."""
    grouped: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {}
    for family in families:
        grouped.setdefault(router.target_for_key(family[0]["customer_id"]), []).append(family)
    assert len(grouped) == SHARDS
    orders_of: dict[int, list[int]] = {}
    for index, url in enumerate(shard_urls):
        mine = grouped[f"shard{index}"]
        engine = create_engine(url, connect_args={"local_infile": True} if "mysql" in url else {})
        try:
            with engine.begin() as connection:
                keys = bulk_load_with_children(connection, DIRECT_ORDERS, DIRECT_ITEMS, mine,
                                               parent_column="order_id")
        finally:
            engine.dispose()
        for (parent, _), key in zip(mine, keys, strict=True):
            orders_of.setdefault(parent["customer_id"], []).append(key)
    return orders_of


def _assert_seen_through_front(cursor: Any, orders_of: dict[int, list[int]],
                               items: int) -> None:
    """The coordinator (or Spider table) finds each customer's orders by ``customer_id``: it
    prunes to the one partition its own hash picks, so a row loaded on another shard would
    be missing here."""
    cursor.execute("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM order_items)")
    assert tuple(int(n) for n in cursor.fetchone()) == (len(orders_of), items)
    for customer, keys in orders_of.items():
        cursor.execute("SELECT id FROM orders WHERE customer_id = %s", (customer,))
        assert sorted(int(r[0]) for r in cursor.fetchall()) == sorted(keys), customer
        cursor.execute("SELECT DISTINCT order_id FROM order_items WHERE customer_id = %s",
                       (customer,))
        assert sorted(int(r[0]) for r in cursor.fetchall()) == sorted(keys), customer


def test_bulk_load_straight_to_each_shard_is_seen_through_the_coordinator_and_spider(
    tmp_path: Path, postgres: list[local_servers.ThrowawayPostgres],
    spider: local_servers.ThrowawayMariaDB, shard_password: str,
) -> None:
    families = _families()
    items = sum(len(kids) for _, kids in families)

    servers = _pg_shop(postgres, "direct_shop")
    command.upgrade(_alembic(tmp_path / "pg", postgres[0].url("direct_shop"), "postgresql-fdw",
                             repr(servers)), "head")
    router = ShardRouter([f"shard{i}" for i in range(SHARDS)], logical_shards=SHARDS,
                         engine="postgresql-hash")
    # Each shard's own table accepts only its remainder: a misrouted COPY would fail here.
    orders_of = _load_straight_to_shards(
        router, [c.url("direct_shop") for c in postgres[1:]], families)
    with _pg(postgres[0], "direct_shop") as coordinator:
        _assert_seen_through_front(coordinator.cursor(), orders_of, items)

    servers = _spider_shop(spider, "dl")
    command.upgrade(_alembic(tmp_path / "spider", spider.url("dl_front"), "spider",
                             repr(servers)), "head")
    router = ShardRouter([f"shard{i}" for i in range(SHARDS)], logical_shards=SHARDS,
                         engine="mariadb-key")
    orders_of = _load_straight_to_shards(
        router, [spider.url(f"dl_b{i}") for i in range(SHARDS)], families)
    front = spider.connect("dl_front")
    try:
        with front.cursor() as cursor:
            _assert_seen_through_front(cursor, orders_of, items)
    finally:
        front.close()
