"""Throwaway database servers on this machine, for the tests, the benchmarks and the demo.

Each server is private: its own temporary directory, data directory, free loopback port and
socket, started here and stopped by its process ID; the machine's own (shared) servers are never
touched.

* :class:`ThrowawayPostgres` -- ``initdb`` + ``pg_ctl`` from ``pg_bin`` (as the ``postgres``
  user when run as root, which PostgreSQL requires). :func:`postgres_clusters` starts several at
  once (a coordinator and its shards): one ``initdb``, copied for the others, which is several
  times faster than one ``initdb`` each. :func:`postgres_unavailable` says why they cannot run
  (no binaries, no postgres_fdw).
* :class:`ThrowawayMariaDB` -- ``mariadb-install-db`` + ``mariadbd`` with its own ``--tmpdir``
  too: a starting mariadbd deletes every ``#sql*`` file in its tmpdir as left over from a crash,
  so with the default ``/tmp`` it deleted the live temporary tables of the shared server.
  :func:`mariadb_servers` starts several from one install. :func:`spider_server` starts one with
  MariaDB's Spider engine loaded from :func:`find_spider_plugin`, :func:`spider_servers` a Spider
  front and its backend servers (``tests/sharding/fetch_spider_plugin.sh`` unpacks the plugin into
  ``.venv/spider``; installing ``mariadb-plugin-spider`` system-wide would reconfigure the shared
  server). :func:`mariadb_unavailable` says why they cannot run.

Missing binaries raise :class:`ServerUnavailableError` with the reason; the caller decides
whether that skips (tests), fails (tests under ``CI=true``) or stops with a message (demo).
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

DEFAULT_PG_BIN = Path(os.environ.get("SNOWFLAKE_PG_BIN", "/usr/lib/postgresql/15/bin"))
SPIDER_PLUGIN_ENV = "SNOWFLAKE_TEST_SPIDER_PLUGIN"
#: Where tests/sharding/fetch_spider_plugin.sh (run by `make test`) unpacks the Spider plugin.
FETCHED_SPIDER_PLUGIN = (
    Path(__file__).resolve().parents[1] / ".venv/spider/usr/lib/mysql/plugin/ha_spider.so"
)
SYSTEM_SPIDER_PLUGIN = Path("/usr/lib/mysql/plugin/ha_spider.so")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class ServerUnavailableError(RuntimeError):
    """A throwaway server cannot run here (a binary or plugin is missing); says which."""


#: The lowest port a throwaway server is given.
_LOWEST_PORT = 10000
#: How a server says its port was taken between free_port() and its own bind.
_PORT_TAKEN = "Address already in use"
#: Start attempts of a throwaway server, each on another port if the last one's was taken.
_START_ATTEMPTS = 3


def _ephemeral_ports_start() -> int:
    """The first port the kernel hands to outgoing connections (32768 unless configured)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's range for
    outgoing connections: a port from that range (what binding port 0 gives) can become an
    outgoing connection's local port before the server binds it (a throwaway cluster lost
    port 52229 so, beside a Django suite's connections)."""
    highest = max(_ephemeral_ports_start(), _LOWEST_PORT + 1000)
    chooser = random.SystemRandom()
    for _ in range(200):
        port = chooser.randrange(_LOWEST_PORT, highest)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {_LOWEST_PORT}..{highest - 1}")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; an exited process its parent has not reaped yet (a zombie: the
    postmaster's parent is init once pg_ctl returns) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rpartition(")")[2].split()[0] != "Z"


def _stop_pid(pid: int, sig: signal.Signals, timeout: float = STOP_TIMEOUT_S) -> None:
    """Send ``sig`` to ``pid`` and wait (bounded) until it is gone; SIGKILL after ``timeout``."""
    with suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.02)
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# -- PostgreSQL --------------------------------------------------------------------------------


def postgres_unavailable(pg_bin: Path = DEFAULT_PG_BIN) -> str | None:
    """Why throwaway PostgreSQL clusters with postgres_fdw cannot run here, or ``None``."""
    for program in ("initdb", "pg_ctl", "postgres"):
        if not (pg_bin / program).is_file():
            return f"no {program} in {pg_bin} (set SNOWFLAKE_PG_BIN to PostgreSQL's bin directory)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run initdb and pg_ctl as"
    if not list(pg_bin.parent.glob("lib/postgres_fdw.so")):
        return f"postgres_fdw is not installed next to {pg_bin} (lib/postgres_fdw.so)"
    return None


class ThrowawayPostgres:
    """A private PostgreSQL cluster in a temporary directory, on a free port.

    ``template`` copies an existing (stopped) data directory instead of running ``initdb``.
    """

    host = "127.0.0.1"
    user = "postgres"

    def __init__(self, pg_bin: Path | str = DEFAULT_PG_BIN, *, template: Path | None = None,
                 name: str = "pg") -> None:
        self.pg_bin = Path(pg_bin)
        self.directory = Path(tempfile.mkdtemp(prefix=f"sfdb-{name}-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.port = free_port()
        self._started = False  # once it ran, its port is in URLs: a restart keeps it
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            account = pwd.getpwnam("postgres")
            os.chown(self.directory, account.pw_uid, account.pw_gid)
        try:
            if template is None:
                self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                          "--no-sync")
            else:  # cp -a keeps the postgres owner and the 0700 mode PostgreSQL insists on
                subprocess.run(["cp", "-a", str(template), str(self.data)], check=True,
                               capture_output=True, timeout=120)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{self.user}@{self.host}:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        """The postmaster's process ID while the cluster runs."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.pg_bin / program), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the cluster and wait for it. At its first start, on another port (at most
        :data:`_START_ATTEMPTS` in all) if its port was taken before the postmaster bound it."""
        attempts = 1 if self._started else _START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            options = (
                f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=100 -c shared_buffers=16MB"
            )
            try:
                self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                          "-w", "-t", str(int(START_TIMEOUT_S)), "start")
                self._started = True
                return
            except subprocess.CalledProcessError as error:
                log = self.log.read_text() if self.log.exists() else ""
                if _PORT_TAKEN not in log or attempt == attempts:
                    raise RuntimeError(
                        f"PostgreSQL on port {self.port} did not start:\n{log}") from error
            self.port = free_port()
            self.log.unlink(missing_ok=True)

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the postmaster by its PID: SIGINT (fast shutdown) or SIGQUIT (immediate)."""
        pid = self.pid
        if pid is not None:
            _stop_pid(pid, signal.SIGQUIT if immediate else signal.SIGINT)
            (self.data / "postmaster.pid").unlink(missing_ok=True)

    def execute(self, *statements: str, database: str = "postgres") -> None:
        """Run statements in autocommit mode (``CREATE DATABASE`` and the like)."""
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname=database,
                             autocommit=True, connect_timeout=10) as connection:
            for statement in statements:
                connection.execute(statement.encode())

    def create_database(self, name: str) -> None:
        self.execute(f'CREATE DATABASE "{name}"')

    def close(self) -> None:
        """Stop the cluster (if running) and delete its directory."""
        self.stop(immediate=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def postgres_clusters(count: int, pg_bin: Path | str = DEFAULT_PG_BIN,
                      *, names: Sequence[str] | None = None, conf: str = ""
                      ) -> list[ThrowawayPostgres]:
    """Start ``count`` throwaway clusters (e.g. a coordinator and its shards), all running.

    One ``initdb``; the others copy its data directory. ``conf`` is appended to every
    cluster's ``postgresql.conf`` (e.g. ``wal_level = logical``). The caller closes each (or
    use :func:`running_postgres_clusters`).
    """
    problem = postgres_unavailable(Path(pg_bin))
    if problem:
        raise ServerUnavailableError(problem)
    names = names or [f"pg{i}" for i in range(count)]
    clusters: list[ThrowawayPostgres] = []
    try:
        first = ThrowawayPostgres(pg_bin, name=names[0])
        clusters.append(first)
        if conf:
            with (first.data / "postgresql.conf").open("a") as handle:
                handle.write(conf)
        for name in names[1:count]:
            clusters.append(ThrowawayPostgres(pg_bin, template=first.data, name=name))
        for cluster in clusters:
            cluster.start()
    except BaseException:
        for cluster in clusters:
            cluster.close()
        raise
    return clusters


@contextmanager
def running_postgres_clusters(count: int, pg_bin: Path | str = DEFAULT_PG_BIN,
                              *, names: Sequence[str] | None = None, conf: str = ""
                              ) -> Iterator[list[ThrowawayPostgres]]:
    clusters = postgres_clusters(count, pg_bin, names=names, conf=conf)
    try:
        yield clusters
    finally:
        for cluster in clusters:
            cluster.close()


# -- MariaDB and Spider ------------------------------------------------------------------------


def find_spider_plugin() -> Path:
    """``ha_spider.so``: from ``$SNOWFLAKE_TEST_SPIDER_PLUGIN``, else where
    ``tests/sharding/fetch_spider_plugin.sh`` unpacks it, else the system's plugin directory."""
    given = os.environ.get(SPIDER_PLUGIN_ENV)
    candidates = [Path(given)] if given else [FETCHED_SPIDER_PLUGIN, SYSTEM_SPIDER_PLUGIN]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise ServerUnavailableError(
            f"no Spider plugin at {', '.join(map(str, candidates))}: run "
            "bash tests/sharding/fetch_spider_plugin.sh (make test does), or set "
            f"{SPIDER_PLUGIN_ENV} to an ha_spider.so matching the local mariadbd"
        )
    return path


def mariadb_unavailable() -> str | None:
    """Why throwaway MariaDB servers cannot run here, or ``None``."""
    missing = [p for p in ("mariadbd", "mariadb-install-db") if not shutil.which(p)]
    if missing:
        return (f"{' and '.join(missing)} not found on PATH: both are needed to start a "
                "throwaway MariaDB server")
    return None


class ThrowawayMariaDB:
    """A private mariadbd: own datadir, tmpdir, port and socket; stopped by its PID.

    ``options`` are more ``mariadbd`` options, after the defaults (a later option wins: e.g.
    ``--innodb-buffer-pool-size=256M`` for a benchmark's rows).
    """

    host = "127.0.0.1"
    user = "root"

    def __init__(self, *, plugin_dir: Path | None = None, name: str = "mariadb",
                 template: Path | None = None, options: Sequence[str] = ()) -> None:
        problem = mariadb_unavailable()
        if problem:
            raise ServerUnavailableError(problem)
        self.plugin_dir = plugin_dir
        self.options = list(options)
        self.directory = Path(tempfile.mkdtemp(prefix=f"sfdb-{name}-"))
        self.data, self.tmp = self.directory / "data", self.directory / "tmp"
        self.log = self.directory / "server.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._started = False  # once it ran, its port is in URLs: a restart keeps it
        self._as_root = os.geteuid() == 0
        self._user = ["--user=mysql"] if self._as_root else []
        self._environment = {**os.environ, "TMPDIR": str(self.tmp)}
        try:
            for directory in (self.data, self.tmp):
                directory.mkdir()
            if self._as_root:  # mariadbd refuses to run as root; the mysql user owns its files
                self.directory.chmod(0o755)
                for directory in (self.directory, self.data, self.tmp):
                    shutil.chown(directory, "mysql", "mysql")
            if template is not None:  # a never-started install: cp -a keeps its owner
                self.data.rmdir()
                subprocess.run(["cp", "-a", str(template), str(self.data)], check=True,
                               capture_output=True, timeout=120)
            else:
                self._install()
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def _install(self) -> None:
        installed = subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", *self._user,
             f"--tmpdir={self.tmp}", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            check=False, capture_output=True, text=True, timeout=120, env=self._environment,
        )
        if installed.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed:\n{installed.stdout}\n{installed.stderr}"
            )

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def url(self, database: str = "", driver: str = "mysql+pymysql") -> str:
        return f"{driver}://{self.user}@{self.host}:{self.port}/{database}"

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start mariadbd without waiting for it (:meth:`wait_ready` waits): several servers
        then come up in parallel."""
        plugin = [f"--plugin-dir={self.plugin_dir}"] if self.plugin_dir else []
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                ["mariadbd", "--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.tmp}",
                 f"--port={self.port}", "--bind-address=127.0.0.1",
                 f"--socket={self.directory / 'mysqld.sock'}", *plugin, "--skip-log-bin",
                 "--innodb-buffer-pool-size=32M", *self._user, *self.options],
                stdout=log, stderr=subprocess.STDOUT, env=self._environment,
            )

    def wait_ready(self) -> None:
        """Wait (bounded) until the launched server accepts connections."""
        import pymysql

        assert self.process is not None, "launch() first"

        deadline = time.monotonic() + START_TIMEOUT_S
        moves = 0 if self._started else _START_ATTEMPTS - 1
        while True:
            if self.process.poll() is not None:  # it ended: never ask the port who answers
                if moves and _PORT_TAKEN in self.log.read_text():
                    moves -= 1  # its port was taken before it bound it: another one
                    self.port = free_port()
                    self.launch()
                    continue
                raise RuntimeError(
                    f"mariadbd on port {self.port} did not start:\n{self.log.read_text()}")
            try:
                connection = self.connect(read_timeout=5)  # a listener that never greets
            # pymysql.MySQLError, not pymysql.err.*: Django's MySQL backend imports MySQLdb.*
            # through pymysql's install_as_MySQLdb() shim, which loads a second copy of
            # pymysql.err and rebinds pymysql.err to it.
            except pymysql.MySQLError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"mariadbd on port {self.port} did not start in {START_TIMEOUT_S:g} s:"
                        f"\n{self.log.read_text()}") from None
                time.sleep(0.2)
                continue
            with connection, connection.cursor() as cursor:  # this server, not another's
                cursor.execute("SELECT @@datadir")
                datadir = str(cursor.fetchone()[0])
            if Path(datadir).resolve() != self.data.resolve():
                raise RuntimeError(f"port {self.port} is served by another mariadbd "
                                   f"({datadir}), not this one ({self.data})")
            self._started = True
            return

    def connect(self, database: str | None = None, **options: Any) -> Any:
        """A pymysql connection as root, autocommit."""
        import pymysql

        return pymysql.connect(host=self.host, port=self.port, user=self.user,
                               database=database, autocommit=True, connect_timeout=2, **options)

    def execute(self, *statements: str, database: str | None = None) -> None:
        """Run statements in autocommit mode (``CREATE DATABASE`` and the like)."""
        connection = self.connect(database)
        try:
            with connection.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
        finally:
            connection.close()

    def create_database(self, name: str) -> None:
        self.execute(f"CREATE DATABASE `{name}`")

    def stop(self) -> None:
        """SIGTERM to the server's PID (a clean shutdown), SIGKILL if it outlasts the bound."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ThrowawayMariaDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mariadb_servers(count: int, *, names: list[str] | None = None,
                    plugin_dir: Path | None = None, options: Sequence[str] = ()
                    ) -> list[ThrowawayMariaDB]:
    """Start ``count`` throwaway mariadbd servers at once, all running (``options``: more
    ``mariadbd`` options for each).

    One ``mariadb-install-db``; the others copy its (never started) datadir, and all start in
    parallel. The caller closes each.
    """
    names = names or [f"mariadb{i}" for i in range(count)]
    servers: list[ThrowawayMariaDB] = []
    try:
        first = ThrowawayMariaDB(plugin_dir=plugin_dir, name=names[0], options=options)
        servers.append(first)
        for name in names[1:count]:
            servers.append(ThrowawayMariaDB(plugin_dir=plugin_dir, name=name,
                                            template=first.data, options=options))
        for server in servers:
            server.launch()
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


def install_spider(server: ThrowawayMariaDB, plugin: Path) -> None:
    """Load Spider into a running throwaway server (started with ``plugin_dir=plugin.parent``).

    ``spider_same_server_link = 1`` lets its Spider tables link to backend databases on the same
    server (tests use that; real backends are other servers).
    """
    connection = server.connect()
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"INSTALL SONAME '{plugin.stem}'")
            cursor.execute("SET GLOBAL spider_same_server_link = 1")
    finally:
        connection.close()


def spider_server(plugin: Path | None = None) -> ThrowawayMariaDB:
    """A running throwaway mariadbd with the Spider engine installed (see
    :func:`install_spider`)."""
    plugin = plugin or find_spider_plugin()
    server = ThrowawayMariaDB(plugin_dir=plugin.parent, name="spider")
    try:
        server.start()
        install_spider(server, plugin)
    except BaseException:
        server.close()
        raise
    return server


def spider_servers(backends: int, plugin: Path | None = None) -> list[ThrowawayMariaDB]:
    """A Spider front (index 0) and ``backends`` plain mariadbd servers, all running: Spider
    links to other servers, as in production. The caller closes each."""
    plugin = plugin or find_spider_plugin()
    servers = mariadb_servers(1 + backends, plugin_dir=plugin.parent,
                              names=["spider", *(f"backend{i}" for i in range(backends))])
    try:
        install_spider(servers[0], plugin)
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers
