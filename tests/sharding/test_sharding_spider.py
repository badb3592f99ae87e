"""MariaDB Spider routes ``PARTITION BY KEY`` rows to the backend ``mariadb_key_partition`` names.

Spider is a plugin the shared server does not load, so this test starts its own throwaway
mariadbd (``example_project.local_servers.spider_server``: own datadir, tmpdir, port and socket;
stopped by PID) with ``ha_spider.so``: from ``SNOWFLAKE_TEST_SPIDER_PLUGIN`` (a path to the
file), else where ``tests/sharding/fetch_spider_plugin.sh`` unpacks it (``make test`` runs it;
the package is never installed, which would reconfigure the shared server). Without the plugin
the test is skipped with that reason, except under ``CI=true``, where it fails. The Spider
table's partitions are links to backend tables on the same server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest

from example_project import local_servers
from snowflake_db.sharding import ShardRouter, mariadb_key_partition
from tests.plugins.databases import server_url, unavailable
from tests.sharding.engine_values import VALUES

# One throwaway server for the module: under pytest -n its tests stay in one process, one after
# another (spread over processes, each started its own mariadbd at once and they failed to start).
pytestmark = pytest.mark.xdist_group("spider")


@pytest.fixture(scope="module")
def shared_temporary_table() -> Iterator[pymysql.connections.Connection]:
    """A temporary table on the shared server, made before the Spider server starts.

    Its files live in the shared server's tmpdir; the test that drops it proves the throwaway
    server's start left them alone.
    """
    url = server_url("mariadb")
    try:
        connection = pymysql.connect(
            host=url.host or "127.0.0.1", port=url.port or 3306, user=url.username or "root",
            password=url.password or "", autocommit=True, connect_timeout=3,
        )
    except pymysql.MySQLError as error:
        unavailable(f"the shared MariaDB server {url.host}:{url.port} is unreachable: {error}")
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE test.sfdb_spider_witness (x INT) ENGINE=Aria")
        cursor.execute("INSERT INTO test.sfdb_spider_witness VALUES (1)")
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def spider_server(
    shared_temporary_table: pymysql.connections.Connection,
) -> Iterator[pymysql.connections.Connection]:
    try:
        server = local_servers.spider_server()
    except local_servers.ServerUnavailableError as error:
        unavailable(str(error))
    try:
        connection = server.connect()
        yield connection
        connection.close()
    finally:
        server.close()


@pytest.mark.parametrize("count", [3, 7, 16])
def test_spider_sends_each_row_to_the_backend_the_router_names(
    spider_server: pymysql.connections.Connection, count: int
) -> None:
    port = spider_server.port
    backends = [f"orders_b{i}" for i in range(count)]
    router = ShardRouter(backends, logical_shards=count, engine="mariadb-key")
    with spider_server.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE backend_{count}")
        cursor.execute(f"CREATE DATABASE front_{count}")
        links = []
        for i, name in enumerate(backends):
            cursor.execute(
                f"CREATE TABLE backend_{count}.{name} (customer_id BIGINT NOT NULL PRIMARY KEY)"
            )
            links.append(
                f"PARTITION p{i} COMMENT = 'wrapper \"mysql\", host \"127.0.0.1\", port "
                f"\"{port}\", user \"root\", database \"backend_{count}\", table \"{name}\"'"
            )
        cursor.execute(
            f"CREATE TABLE front_{count}.orders (customer_id BIGINT NOT NULL PRIMARY KEY) "
            f"ENGINE=SPIDER PARTITION BY KEY (customer_id) ({', '.join(links)})"
        )
        cursor.executemany(
            f"INSERT INTO front_{count}.orders VALUES (%s)", [(v,) for v in VALUES]
        )
        landed: dict[int, str] = {}
        for name in backends:
            cursor.execute(f"SELECT customer_id FROM backend_{count}.{name}")
            landed.update((int(value), name) for (value,) in cursor.fetchall())
    assert len(landed) == len(VALUES)
    wrong = [(v, b) for v, b in landed.items() if router.target_for_key(v) != b]
    assert wrong == [], f"{count} backends: {len(wrong)} rows elsewhere, e.g. {wrong[:5]}"
    assert all(backends[mariadb_key_partition(v, count)] == b for v, b in landed.items())


def test_the_spider_server_leaves_the_shared_servers_temporary_files_alone(
    spider_server: pymysql.connections.Connection,
    shared_temporary_table: pymysql.connections.Connection,
) -> None:
    # With the default tmpdir (/tmp, the shared server's too) the throwaway server's start deleted
    # the witness table's files, and this DROP failed with "Unknown table".
    with shared_temporary_table.cursor() as cursor:
        cursor.execute("INSERT INTO test.sfdb_spider_witness VALUES (2)")
        cursor.execute("DROP TEMPORARY TABLE test.sfdb_spider_witness")
