"""MariaDB Spider routes ``PARTITION BY KEY`` rows to the backend ``mariadb_key_partition`` names.

Spider is a plugin the shared server does not load, so this test starts its own throwaway
mariadbd (own datadir, port and socket; stopped by PID) with ``ha_spider.so``: from
``SNOWFLAKE_TEST_SPIDER_PLUGIN`` (a path to the file), else where
``tests/fetch_spider_plugin.sh`` unpacks it (``make test`` runs it; the package is never
installed, which would reconfigure the shared server). Without the plugin the test is skipped
with that reason, except under ``CI=true``, where it fails. The Spider table's partitions are
links to backend tables on the same server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from snowflake_db.sharding import ShardRouter, mariadb_key_partition
from tests.engine_values import VALUES
from tests.plugins.databases import in_ci, server_url

PLUGIN_ENV = "SNOWFLAKE_TEST_SPIDER_PLUGIN"
#: Where tests/fetch_spider_plugin.sh (run by `make test`) unpacks the plugin.
FETCHED_PLUGIN = (
    Path(__file__).resolve().parents[1] / ".venv/spider/usr/lib/mysql/plugin/ha_spider.so"
)
SYSTEM_PLUGIN = Path("/usr/lib/mysql/plugin/ha_spider.so")

# One throwaway server for the module: under pytest -n its tests stay in one process, one after
# another (spread over processes, each started its own mariadbd at once and they failed to start).
pytestmark = pytest.mark.xdist_group("spider")


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the Spider tests must run)", pytrace=False)
    pytest.skip(reason)


def _plugin() -> Path:
    given = os.environ.get(PLUGIN_ENV)
    candidates = [Path(given)] if given else [FETCHED_PLUGIN, SYSTEM_PLUGIN]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        _unavailable(
            f"no Spider plugin at {', '.join(map(str, candidates))}: run "
            f"bash tests/fetch_spider_plugin.sh (make test does), or set {PLUGIN_ENV} to an "
            "ha_spider.so matching the local mariadbd"
        )
    if not shutil.which("mariadbd") or not shutil.which("mariadb-install-db"):
        _unavailable("mariadbd and mariadb-install-db are needed to start a Spider server")
    assert path is not None
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
        _unavailable(f"the shared MariaDB server {url.host}:{url.port} is unreachable: {error}")
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE test.sfdb_spider_witness (x INT) ENGINE=Aria")
        cursor.execute("INSERT INTO test.sfdb_spider_witness VALUES (1)")
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def spider_server(
    shared_temporary_table: pymysql.connections.Connection,
) -> Iterator[pymysql.connections.Connection]:
    plugin = _plugin()
    home = Path(tempfile.mkdtemp(prefix="sfdb_spider_"))
    as_root = os.geteuid() == 0
    user = ["--user=mysql"] if as_root else []
    process = None
    try:
        # Its own tmpdir too: a starting mariadbd deletes every #sql* file in its tmpdir as
        # left over from a crash, so with the default /tmp it deleted the live temporary tables of
        # the shared server (and the shared server's of it), failing both.
        private = {"data": home / "data", "tmp": home / "tmp"}
        for directory in private.values():
            directory.mkdir()
        if as_root:  # mariadbd refuses to run as root; the mysql user must own its files
            home.chmod(0o755)
            for directory in (home, *private.values()):
                shutil.chown(directory, "mysql", "mysql")
        environment = {**os.environ, "TMPDIR": str(private["tmp"])}
        installed = subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={private['data']}", *user,
             f"--tmpdir={private['tmp']}", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            check=False, capture_output=True, text=True, timeout=120, env=environment,
        )
        if installed.returncode != 0:
            pytest.fail(f"mariadb-install-db failed:\n{installed.stdout}\n{installed.stderr}")
        port = _free_port()
        log = (home / "server.log").open("w")
        process = subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={private['data']}",
             f"--tmpdir={private['tmp']}", f"--port={port}",
             "--bind-address=127.0.0.1", f"--socket={home / 'mysqld.sock'}",
             f"--plugin-dir={plugin.parent}", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
             *user],
            stdout=log, stderr=subprocess.STDOUT, env=environment,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = pymysql.connect(
                    host="127.0.0.1", port=port, user="root", autocommit=True, connect_timeout=2
                )
                break
            # pymysql.MySQLError, not pymysql.err.*: Django's MySQL backend imports MySQLdb.*
            # through pymysql's install_as_MySQLdb() shim, which loads a second copy of
            # pymysql.err and rebinds pymysql.err to it (after any Django test in this process).
            except pymysql.MySQLError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log_text = (home / "server.log").read_text()
                    pytest.fail(f"the Spider server did not start:\n{log_text}")
                time.sleep(0.2)
        with connection.cursor() as cursor:
            cursor.execute(f"INSTALL SONAME '{plugin.stem}'")
            cursor.execute("SET GLOBAL spider_same_server_link = 1")  # backends on this server
        yield connection
        connection.close()
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(home, ignore_errors=True)


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
