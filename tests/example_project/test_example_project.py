"""The demo shops run end to end (SQLite by default, 4 PostgreSQL shards as a load test).

Each run is a subprocess, as a user runs it: the Django shop needs its own settings module,
and pytest-django owns the Django settings of the test process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from example_project.common import SHOP_LAYOUT
from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.sharding import ShardRouter
from tests.plugins.databases import ScratchDatabase
from tests.plugins.scheduler_delay import run_patiently

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ["example_project", "example_project.sqlalchemy_shop"]


def run_demo(module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("SHOP_CONTROL_URL", "SHOP_SHARD_URLS", "DJANGO_SETTINGS_MODULE")}
    env["PYTHONPATH"] = str(REPO)
    return run_patiently([sys.executable, "-m", module, *args], timeout, cwd=REPO, env=env)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_demo_runs_end_to_end_on_sqlite(module: str, tmp_path: Path) -> None:
    result = run_demo(module, "--data-dir", str(tmp_path), "--orders", "1200")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "[FAIL]" not in out and "all checks passed" in out
    assert "zero duplicate IDs (1200 stored, 1200 distinct)" in out
    assert "lookups by ID each found the order querying only its shard (0 did not)" in out
    assert "querying 1 shard\n" in out and out.count("orders/s") == 1  # one throughput figure
    assert "4 shard databases, 16 logical shards" in out
    # Customers see public order numbers; a mistyped and a swapped number are refused.
    assert re.search(r"\[ok\] order number [0-9A-Z]{4}(-[0-9A-Z]{4}){3} finds order \d+", out)
    assert re.search(r"\[ok\] mistyped number \S+ is refused \(.*mistyped", out)
    assert re.search(r"\[ok\] swapped number \S+ is refused \(.*swapped", out)
    assert out.count("  shard") >= 8  # the four shards, listed at start and with their counts
    assert result.stderr == ""  # stderr is no terminal here: no progress frames
    leased = [line for line in out.splitlines() if "leased worker ID" in line]
    assert len(leased) == 1 + 4  # this process (customers) and each of the 4 order processes
    worker_ids = {int(re.findall(r"worker ID (\d+)", line)[0]) for line in leased}
    assert len(worker_ids) == 5  # every process its own
    assert (tmp_path / ("django" if module == "example_project" else "sqlalchemy")).is_dir()


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_data_dir_never_loses_files_the_demo_did_not_create(module: str, tmp_path: Path) -> None:
    subdir = tmp_path / ("django" if module == "example_project" else "sqlalchemy")
    subdir.mkdir()
    mine = subdir / "notes.txt"
    mine.write_text("mine")
    refused = run_demo(module, "--data-dir", str(tmp_path), "--orders", "10", timeout=60)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line == (f"error: --data-dir: {subdir} already holds files this demo did not create "
                    "(notes.txt); give a new or empty directory")
    assert mine.read_text() == "mine"
    mine.unlink()

    # An empty directory is taken; a second run replaces only the demo's own files.
    beside = tmp_path / "keep.txt"
    beside.write_text("beside")
    for _ in range(2):
        result = run_demo(module, "--data-dir", str(tmp_path), "--orders", "20", "--shards", "1",
                          "--processes", "1")
        assert result.returncode == 0, result.stdout + result.stderr
    assert beside.read_text() == "beside"
    assert "1 shard database, 16 logical shards" in result.stdout  # singular
    assert "placed 20 orders" in result.stdout and "on 1 shard\n" in result.stdout
    assert sorted(p.name for p in subdir.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        ".snowflake-db-demo", "control.sqlite3", "shard0.sqlite3"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_bad_input_gets_one_clear_line(module: str, tmp_path: Path) -> None:
    foreign = SnowflakeGenerator(1, layout=Layout(epoch_ms=1_288_834_974_657)).next_id()
    cases = [
        (["--shard", "16"], "--shard 16: unknown shard; this shop has logical shards 0..15"),
        (["--find", str(foreign)], "comes from another layout"),
        (["--find", "abc"], "an order ID is an integer"),
        (["--control-url", "postgresql+psycopg://postgres@127.0.0.1:1/nope",
          "--shard-url", f"sqlite:///{tmp_path / 's.sqlite3'}"], "cannot connect to control"),
        (["--control-url", "sqlite:///x.sqlite3"], "give both --control-url and"),
        (["--control-url", "postgres:///control", "--shard-url", "sqlite:///s.sqlite3"],
         "--control-url postgres:///control names no host"),
        (["--control-url", "sqlite:///c.sqlite3", "--shard-url", "foo://h/db"],
         "--shard-url foo://h/db: unknown database 'foo'"),
    ]
    for args, message in cases:
        result = run_demo(module, "--data-dir", str(tmp_path), *args, timeout=60)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_load_on_four_postgresql_shards(
    module: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    """4 processes insert 4000 orders into 4 PostgreSQL shard databases at once."""
    control = database_factory("postgresql")
    shards = [database_factory("postgresql") for _ in range(4)]
    def plain(database: ScratchDatabase) -> str:  # as a platform's DATABASE_URL spells it
        return database.url.set(drivername="postgres").render_as_string(hide_password=False)

    args = ["--control-url", plain(control), "--orders", "4000", "--processes", "4", "-q"]
    for shard in shards:
        args += ["--shard-url", plain(shard)]
    result = run_demo(module, *args)
    assert result.returncode == 0, result.stdout + result.stderr

    router = ShardRouter([f"shard{i}" for i in range(4)], layout=SHOP_LAYOUT)
    engines = [create_engine(shard.url) for shard in shards]
    try:
        every_id: list[int] = []
        for engine in engines:
            with engine.connect() as connection:
                every_id += connection.exec_driver_sql("SELECT id FROM shop_order").scalars()
        # Look every order up by ID on every shard: each must be found on exactly one.
        found_on: Counter[int] = Counter()
        home: dict[int, str] = {}
        for index, engine in enumerate(engines):
            with engine.connect() as connection:
                hits = list(connection.exec_driver_sql(
                    "SELECT id FROM shop_order WHERE id = ANY(%s)", (every_id,)).scalars())
            found_on.update(hits)
            home.update(dict.fromkeys(hits, f"shard{index}"))
    finally:
        for engine in engines:
            engine.dispose()
    assert sum(found_on.values()) == 4000
    assert set(found_on.values()) == {1}, "an order ID exists on two shards"
    assert all(router.target_for_id(i) == name for i, name in home.items())
    assert len(set(home.values())) == 4
    workers = {SHOP_LAYOUT.decode(i).worker_id for i in found_on}
    assert len(workers) >= 4  # each process leased its own worker ID from the control database


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_demo_on_mariadb(module: str, database_factory: Callable[[str], ScratchDatabase]) -> None:
    """With URLs as platforms spell them (``mysql://``): the installed driver is used."""
    control, *shards = (database_factory("mariadb") for _ in range(3))

    def plain(database: ScratchDatabase) -> str:
        return database.url.set(drivername="mysql").render_as_string(hide_password=False)

    args = ["--control-url", plain(control), "--orders", "400", "--processes", "2", "-q"]
    for shard in shards:
        args += ["--shard-url", plain(shard)]
    result = run_demo(module, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "zero duplicate IDs (400 stored, 400 distinct)" in result.stdout
