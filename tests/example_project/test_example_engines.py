"""The demo shop places its orders through a distributed engine (``--engine``).

Subprocess runs of ``python -m example_project.sqlalchemy_shop --engine ...``, as a user runs it:
once per engine with the throwaway servers the demo starts (and must stop), once on PostgreSQL
servers given as URLs, where the test reads every shard itself and runs the demo twice (the demo
owns its tables and recreates them). Without PostgreSQL's binaries, mariadbd or the Spider plugin
the tests skip with the reason; under ``CI=true`` they fail.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import psycopg
import pytest

from example_project import local_servers
from snowflake_db.sharding import ShardRouter

from ..plugins.core_support import has_ended
from ..plugins.databases import unavailable
from ..plugins.scheduler_delay import SchedulerDelay, run_patiently

# Each run starts its own private servers; one xdist worker keeps them from competing.
pytestmark = pytest.mark.xdist_group("example_engines")

REPO = Path(__file__).resolve().parents[2]
ROUTER_ENGINE = {"postgresql-fdw": "postgresql-hash", "spider": "mariadb-key"}


def _require(engine: str) -> None:
    if engine == "postgresql-fdw":
        problem = local_servers.postgres_unavailable()
        if problem:
            unavailable(problem)
        return
    if not shutil.which("mariadbd") or not shutil.which("mariadb-install-db"):
        unavailable("mariadbd and mariadb-install-db are needed for the Spider demo")
    try:
        local_servers.find_spider_plugin()
    except local_servers.ServerUnavailableError as error:
        unavailable(str(error))


def run_demo(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SHOP_") and key != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(REPO)
    return run_patiently([sys.executable, "-m", "example_project.sqlalchemy_shop", *args],
                         timeout, cwd=REPO, env=env)


def _assert_passed(out: str, engine: str, orders: int, shards: int) -> dict[str, int]:
    """The demo's own checks passed; returns its orders per shard."""
    assert "[FAIL]" not in out and "all checks passed" in out
    assert f"migrated: op.create_sharded_orders({engine!r}, {shards} shards)" in out
    assert f"zero duplicate IDs ({orders} orders and" in out
    assert (f"every order is on the shard ShardRouter(engine={ROUTER_ENGINE[engine]!r}) "
            "predicted (0 not)") in out
    assert "every item is on its order's shard (0 not)" in out
    assert f"the coordinator sees {orders} orders" in out
    [(read, named, again)] = re.findall(
        r"through the coordinator: read from (shard\d+) \(.*\), the router names (shard\d+); "
        r"(shard\d+) read directly holds the same \d+, the other shards 0", out)
    assert read == named == again
    per_shard = {name: int(count) for name, count in
                 re.findall(r"^  (shard\d+): (\d+) orders?, \d+ items?$", out, re.MULTILINE)}
    assert sorted(per_shard) == [f"shard{i}" for i in range(shards)]
    assert sum(per_shard.values()) == orders and all(per_shard.values())
    leased = re.findall(r"leased worker ID (\d+)", out)
    assert len(leased) == 3 and len(set(leased)) == 3  # this process and 2 order processes
    return per_shard


@pytest.mark.parametrize("engine", ["postgresql-fdw", "spider"])
def test_shop_on_throwaway_servers_it_starts_and_stops(engine: str) -> None:
    _require(engine)
    result = run_demo("--engine", engine, "--shards", "3", "--orders", "300",
                      "--processes", "2", "--customers", "40")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    _assert_passed(out, engine, 300, 3)
    [pids] = re.findall(r"^started 4 throwaway .* servers, pids ([\d, ]+);", out, re.MULTILINE)
    assert "stopped the 4 throwaway servers" in out
    assert all(has_ended(int(pid)) for pid in pids.split(", "))  # stopped by the demo
    assert result.stderr == ""  # no progress frames (no terminal), no release warnings


#: How long the SIGTERM test's demo may take to start its servers and migrate (about 10 s).
MIGRATED_WITHIN_S = 240.0


def test_sigterm_stops_the_throwaway_servers(tmp_path: Path) -> None:
    """Stopped at the end even on failure: SIGTERM while orders are placed."""
    _require("postgresql-fdw")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHOP_")}
    # PYTHONFAULTHANDLER: should the demo outlast the wait, SIGABRT prints where it is.
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "example_project.sqlalchemy_shop", "--engine",
             "postgresql-fdw", "--shards", "2", "--orders", "100000", "--processes", "2"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert demo.stdout is not None
    lines: list[str] = []

    def abort(why: str) -> NoReturn:
        demo.send_signal(signal.SIGABRT)
        time.sleep(5)
        for pids in re.findall(r"servers, pids ([\d, ]+);", "".join(lines)):
            for pid in pids.split(", "):  # the servers the aborted demo can no longer stop
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGQUIT)
        pytest.fail(f"the demo {why}; its output and stacks:\n"
                    + "".join(lines) + errors.read_text()[-6000:])

    # A demo stalled before it migrated would keep the loop below reading for ever: SIGABRT
    # (its stacks printed) ends its output.
    watchdog = threading.Timer(MIGRATED_WITHIN_S, demo.send_signal, (signal.SIGABRT,))
    watchdog.start()
    try:
        for line in demo.stdout:  # ends when the demo does
            lines.append(line)
            if line.startswith("migrated:"):
                watchdog.cancel()
                demo.send_signal(signal.SIGTERM)
                break
        else:
            watchdog.cancel()
            abort(f"ended or stalled without migrating in {MIGRATED_WITHIN_S:g} s")
        rest, _ = demo.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        abort("outlasted 120 s after SIGTERM")
    finally:
        watchdog.cancel()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    out = "".join(lines) + rest
    assert demo.returncode == 128 + signal.SIGTERM, out
    [pids] = re.findall(r"^started 3 throwaway .* servers, pids ([\d, ]+);", out, re.MULTILINE)
    assert "stopped the 3 throwaway servers" in out
    assert all(has_ended(int(pid)) for pid in pids.split(", "))


@pytest.fixture(scope="module")
def given_postgres() -> Iterator[list[local_servers.ThrowawayPostgres]]:
    """Servers the test starts and gives to the demo as URLs: a coordinator and two shards."""
    _require("postgresql-fdw")
    with local_servers.running_postgres_clusters(3, names=["coord", "s0", "s1"]) as clusters:
        yield clusters


def _url_args(clusters: list[local_servers.ThrowawayPostgres], dbname: str) -> list[str]:
    clusters[0].create_database(f"{dbname}_control")
    for cluster in clusters:
        cluster.create_database(dbname)
    urls = [c.url(dbname, driver="postgresql") for c in clusters]
    return ["--engine", "postgresql-fdw", "--control-url", clusters[0].url(f"{dbname}_control"),
            "--coordinator-url", urls[0], "--shard-url", urls[1], "--shard-url", urls[2],
            "--processes", "2", "--customers", "30"]


def test_shop_on_given_postgres_urls_lands_where_the_router_says(
    given_postgres: list[local_servers.ThrowawayPostgres],
) -> None:
    """URLs mode: the test reads every shard itself; a second run recreates the tables."""
    clusters = given_postgres
    args = _url_args(clusters, "shop")
    first = run_demo(*args, "--orders", "120")
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_demo(*args, "--orders", "80")
    assert second.returncode == 0, second.stdout + second.stderr
    per_shard = _assert_passed(second.stdout, "postgresql-fdw", 80, 2)
    assert "throwaway" not in second.stdout  # the given servers, none of its own

    router = ShardRouter(["shard0", "shard1"], logical_shards=2, engine="postgresql-hash")
    for index, cluster in enumerate(clusters[1:]):
        with psycopg.connect(host=cluster.host, port=cluster.port, user="postgres",
                             dbname="shop") as shard:
            rows = shard.execute("SELECT id, customer_id FROM orders").fetchall()
        assert len(rows) == per_shard[f"shard{index}"]  # only the second run's orders
        assert {router.target_for_key(customer) for _, customer in rows} == {f"shard{index}"}
    with psycopg.connect(host=clusters[0].host, port=clusters[0].port, user="postgres",
                         dbname="shop") as coordinator:
        servers = coordinator.execute("SELECT srvname FROM pg_foreign_server "
                                      "ORDER BY 1").fetchall()
    assert servers == [("shop_shard0",), ("shop_shard1",)]  # the first run's were replaced


#: Armed on shard 0: whenever the demo's migration creates the shard's partitions, a trigger
#: that silently discards every row written to them (the shard "accepts" and loses them).
LOSE_ROWS = [
    "CREATE FUNCTION lose_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
    """CREATE FUNCTION arm_loss() RETURNS event_trigger LANGUAGE plpgsql AS $$
    DECLARE name text;
    BEGIN
      FOR name IN SELECT object_identity FROM pg_event_trigger_ddl_commands()
                  WHERE object_identity IN ('public.orders_p0', 'public.order_items_p0') LOOP
        EXECUTE format('CREATE TRIGGER lose BEFORE INSERT ON %s FOR EACH ROW '
                       'EXECUTE FUNCTION lose_row()', name);
      END LOOP;
    END $$""",
    "CREATE EVENT TRIGGER arm_loss ON ddl_command_end WHEN TAG IN ('CREATE TABLE') "
    "EXECUTE FUNCTION arm_loss()",
]


def test_a_shard_that_loses_rows_fails_the_checks_with_exit_1(
    given_postgres: list[local_servers.ThrowawayPostgres],
) -> None:
    clusters = given_postgres
    args = _url_args(clusters, "lossy")
    clusters[1].execute(*LOSE_ROWS, database="lossy")
    result = run_demo(*args, "--orders", "60")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "[ok] 60 orders reported by the processes" in out  # every INSERT "succeeded"
    assert re.search(r"\[FAIL\] zero duplicate IDs \(\d+ orders", out)  # not all 60 stored
    assert re.search(r"\[FAIL\] the coordinator sees \d+ orders", out)
    assert "  shard0: 0 orders, 0 items" in out
    assert result.stderr.endswith("check failed\n") or "checks failed" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "spider", "--coordinator-url", "mysql://root@127.0.0.1/x"],
     "error: with --engine give --control-url, --coordinator-url and at least one --shard-url "
     "(or none of them, to start throwaway local servers)"),
    (["--engine", "postgresql-fdw", "--control-url", "sqlite:///control.sqlite3",
      "--coordinator-url", "mysql://root@127.0.0.1/x", "--shard-url", "mysql://root@127.0.0.1/y"],
     "error: --coordinator-url mysql+pymysql://root@127.0.0.1/x: --engine postgresql-fdw runs on "
     "postgresql, not mysql"),
    (["--coordinator-url", "postgres://p@127.0.0.1/x"], "error: --coordinator-url needs --engine"),
    (["--engine", "spider", "--shards", "9"],
     "error: --shards=9: throwaway servers take 1 to 8 shards (give --shard-url for more)"),
    (["--engine", "spider", "--find", "5"], "error: --find is not available with --engine"),
    (["--engine", "spider", "--control-url", "sqlite:///control.sqlite3", "--coordinator-url",
      "mysql://root@127.0.0.1/shop", "--shard-url", "mysql://root@localhost:3307/shop"],
     "error: --shard-url mysql+pymysql://root@localhost:3307/shop: Spider reaches a backend "
     "named 'localhost' through the front's own Unix socket; give 127.0.0.1 or a host name"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = run_demo(*args, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [message]
    assert result.stdout == ""


SWALLOWED_SIGTERM = """
import os, signal, sys, time, weakref
from example_project.engine_shop import sigterm_exits

class Thing:
    pass

def collected(ref):  # the handler runs in here, where Python drops its exception
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000):
        pass

with sigterm_exits():
    try:
        thing = Thing()
        ref = weakref.ref(thing, collected)
        del thing
        print("the callback ran", flush=True)
        print("sleeping from", time.monotonic(), file=sys.stderr, flush=True)
        time.sleep(10)
        print("survived", flush=True)
    finally:
        print("cleaned up at", time.monotonic(), file=sys.stderr, flush=True)
        print("cleaned up", flush=True)
"""


def test_a_sigterm_python_drops_in_a_gc_callback_is_raised_again(
    scheduler_delay: SchedulerDelay,
) -> None:
    """The demo's SIGTERM handler raises SystemExit; raised inside a weakref callback it is
    printed and dropped, so the SIGTERM is delivered again and ends the process through its
    ``finally``."""
    result = subprocess.run([sys.executable, "-c", SWALLOWED_SIGTERM], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert "Exception ignored" in result.stderr and "SystemExit: 143" in result.stderr
    assert result.stdout == "the callback ran\ncleaned up\n" and result.returncode == 143, result
    # The child's own clock (one monotonic clock for both processes): its 10 s sleep ended
    # early, at the SIGTERM delivered again, not at its end. Its start-up is not timed.
    slept = re.search(r"^sleeping from (\S+)$", result.stderr, re.MULTILINE)
    woke = re.search(r"^cleaned up at (\S+)$", result.stderr, re.MULTILINE)
    assert slept and woke, result.stderr
    started, ended = float(slept[1]), float(woke[1])
    assert ended - started < scheduler_delay.widen(8, started, ended)
