"""``snowflake-db workers list`` and ``workers reap`` against real databases."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from snowflake_db import Layout, MonotonicClock
from snowflake_db.cli import main

from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import allocator, expire_lease, read_slots, run_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_list_and_reap(any_db: ScratchDatabase, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(worker_bits=3)
    # A 30 s lease: the dead one's lapse is set in the table, and the live one must stay live
    # through the listing (a 2 s one had lapsed under load, its heartbeat not yet run).
    with allocator(any_db, lease_seconds=30) as alloc:
        live = alloc.acquire(layout=layout, clock=MonotonicClock())
        dead = alloc.acquire(layout=layout, clock=MonotonicClock())
        dead.abandon()  # no more renewals: it expires like a crashed holder's
        reserved = alloc.reserve_worker_id("pg function", layout=layout)
        expire_lease(any_db.url, dead.worker_id)
        url = any_db.url_string

        mark_before = live.high_water_ms  # the heartbeat may raise it while we list
        assert main(["workers", "list", "--url", url, "--json"]) == 0
        records = {r["worker_id"]: r for r in json.loads(capsys.readouterr().out)}
        assert records[live.worker_id]["state"] == "live"
        assert records[live.worker_id]["pid"] == os.getpid()
        assert records[live.worker_id]["expires_in_seconds"] > 0
        assert records[dead.worker_id]["state"] == "expired"
        assert records[reserved]["state"] == "reserved"
        assert records[reserved]["label"] == "pg function"
        assert mark_before <= records[live.worker_id]["high_water_ms"] <= live.high_water_ms + 5000

        assert main(["workers", "list", "--url", url]) == 0
        table = capsys.readouterr().out
        assert table.splitlines()[0].split()[:3] == ["worker", "state", "holder"]
        assert "expired" in table and "reserved" in table and "never" in table

        dead_mark = read_slots(any_db.url)[dead.worker_id].high_water_ms
        assert main(["workers", "reap", "--url", url]) == 0
        assert capsys.readouterr().out.strip() == (
            f"reaped 1 expired lease(s): worker IDs {dead.worker_id}"
        )
        rows = read_slots(any_db.url)
        assert rows[dead.worker_id].state == "free"
        assert rows[dead.worker_id].high_water_ms == dead_mark  # the mark survives reaping
        assert rows[live.worker_id].lease_token == live.token and rows[live.worker_id].live
        assert rows[reserved].state == "reserved"
        assert main(["workers", "reap", "--url", url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"reaped": [], "pruned_registrations": None}

        # Registrations are a log: unreferenced old rows can be pruned, referenced ones stay.
        registrations = alloc.store.tables.registrations
        with alloc._engine.begin() as connection:
            orphan = alloc.store.register(connection, hostname="gone", pid=1)
            connection.execute(registrations.update().values(started_at_ms=0))  # all ancient
        assert main(["workers", "reap", "--url", url, "--prune-registrations", "1"]) == 0
        assert "pruned 1 registration row(s) older than 1 day(s)" in capsys.readouterr().out
        with alloc._engine.begin() as connection:
            left = {row.id for row in connection.execute(registrations.select())}
        assert orphan not in left
        assert {live.registration_id, dead.registration_id} <= left  # slots still name them


def test_errors_are_one_line_with_exit_status_2(
    sqlite_db: ScratchDatabase, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SNOWFLAKE_WORKER_URL", raising=False)
    assert main(["workers", "list"]) == 2
    assert "give --url" in capsys.readouterr().err
    assert main(["workers", "reap", "--url", sqlite_db.url_string,
                 "--prune-registrations", "-1"]) == 2
    assert "--prune-registrations must be a number of days >= 0" in capsys.readouterr().err


#: Every command that reads the control database, as run against an unusable one.
DATABASE_COMMANDS = [["workers", "list"], ["workers", "reap"], ["workers", "check"], ["doctor"]]


def _one_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    return line


def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command's ``main()`` in this process (test_console_command and the environment's URL
    run ``python -m snowflake_db.cli``): status, stdout, stderr."""
    return run_cli(*args, cwd=cwd)


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
def test_unreachable_database_is_status_1_for_every_command(command: list[str]) -> None:
    """The command is right, the database does not answer: 1, as the README's Health section
    says for check and doctor (list and reap used to exit 2, the status of a mistake)."""
    line = _one_line(_cli(*command, "--url", "postgres://snow:s3cret@127.0.0.1:1/control"), 1)
    assert line.startswith(f"snowflake-db {' '.join(command)}: ")
    assert "postgresql+psycopg://snow:***@127.0.0.1:1/control" in line
    assert "Connection refused" in line and "s3cret" not in line


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
def test_empty_database_is_status_1_for_every_command(
    command: list[str], sqlite_db: ScratchDatabase
) -> None:
    sqlite3.connect(sqlite_db.url.database or "").close()  # an existing, empty database
    line = _one_line(_cli(*command, "--url", sqlite_db.url_string), 1)
    assert "no worker tables" in line


@pytest.mark.parametrize("command", DATABASE_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("url", ["sqlite:///nothere.db", "sqlite:///file:nothere.db?uri=true"])
def test_missing_sqlite_file_is_refused_and_not_created(
    command: list[str], url: str, tmp_path: Path
) -> None:
    """sqlite3 creates the file it is asked to open: a typo in the path would leave an empty
    database behind. Only check --create-tables, as an application's first lease, creates it."""
    line = _one_line(_cli(*command, "--url", url, cwd=str(tmp_path)), 2)
    assert line == (
        f"snowflake-db {command[0]}: error: --url: no such SQLite file {tmp_path}/nothere.db; "
        f"check the path{' or pass --create-tables' if command[-1] == 'check' else ''} "
        "(nothing was created)"
    )
    assert list(tmp_path.iterdir()) == []
    created = _cli("workers", "check", "--create-tables", "--url", url, cwd=str(tmp_path))
    assert created.returncode == 0, created.stderr
    assert (tmp_path / "nothere.db").is_file()


def test_console_command(sqlite_db: ScratchDatabase) -> None:
    with allocator(sqlite_db) as alloc:
        lease = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        env = dict(os.environ, PYTHONPATH=REPO, SNOWFLAKE_WORKER_URL=sqlite_db.url_string)
        result = subprocess.run(
            [sys.executable, "-m", "snowflake_db.cli", "workers", "list"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert f"\n{lease.worker_id} " in result.stdout and " live " in result.stdout


def _plain_url(database: ScratchDatabase, scheme: str) -> str:
    """The scratch database's URL as a platform's DATABASE_URL spells it (no driver)."""
    return database.url.set(drivername=scheme).render_as_string(hide_password=False)


@pytest.mark.parametrize(("backend", "scheme"),
                         [("postgresql", "postgres"), ("postgresql", "postgresql"),
                          ("mariadb", "mysql"), ("mariadb", "mariadb")])
def test_database_url_forms_map_to_the_installed_driver(
    backend: str, scheme: str, database_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    database: ScratchDatabase = database_factory(backend)
    with allocator(database) as alloc:
        lease = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        assert main(["workers", "list", "--json", "--url", _plain_url(database, scheme)]) == 0
        records = json.loads(capsys.readouterr().out)
        assert [r["worker_id"] for r in records if r["state"] == "live"] == [lease.worker_id]


def test_worker_url_from_the_environment_takes_the_same_forms(postgres_db: ScratchDatabase) -> None:
    with allocator(postgres_db) as alloc:
        lease = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        env = dict(os.environ, PYTHONPATH=REPO,
                   SNOWFLAKE_WORKER_URL=_plain_url(postgres_db, "postgres"))
        result = subprocess.run([sys.executable, "-m", "snowflake_db.cli", "workers", "list"],
                                capture_output=True, text=True, env=env, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        assert f"\n{lease.worker_id} " in result.stdout


#: (URL, what the one line of stderr must say). PGHOST/PGPORT point nowhere during these, so a
#: URL the CLI failed to refuse could not reach the shared server through libpq's defaults.
BAD_URLS = [
    ("foo://user@host/db", "--url foo://user@host/db: unknown database 'foo'; use postgresql://"),
    ("oracle://u@h/db", "unknown database 'oracle'"),
    ("not a url", "--url 'not a url' is not a database URL; use postgresql://"),
    ("postgres:///control", "--url postgres:///control names no host"),
    ("postgres://app@db.example", "--url postgres://app@db.example names no database"),
    ("mysql://root@/control", "--url mysql://root@/control names no host"),
    ("mariadb://root@127.0.0.1", "names no database; add /DBNAME"),
    ("sqlite://", "names no SQLite file; use sqlite:///PATH"),
    ("sqlite:///:memory:", "names no SQLite file"),
    ("sqlite:///file::memory:?uri=true", "names no SQLite file"),
    ("sqlite:///file:x?mode=memory&uri=true", "names no SQLite file"),
    ("postgresql+nosuchdriver://u@h/db", "nosuchdriver"),
]


@pytest.mark.parametrize(("url", "expected"), BAD_URLS)
def test_bad_urls_are_one_line_and_exit_status_2(url: str, expected: str) -> None:
    result = run_cli("workers", "list", "--url", url, env={"PGHOST": "127.0.0.1", "PGPORT": "1"})
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("snowflake-db workers: error: ")
    assert expected in line
    assert "s3cret" not in line


def test_bad_url_in_the_environment_names_the_variable() -> None:
    result = run_cli("workers", "reap", env={"PGHOST": "127.0.0.1", "PGPORT": "1",
                                             "SNOWFLAKE_WORKER_URL": "postgres:///control"})
    assert result.returncode == 2
    assert result.stderr == (
        "snowflake-db workers: error: SNOWFLAKE_WORKER_URL=postgres:///control names no host or "
        "socket; write it out (e.g. postgresql://USER@127.0.0.1/DB, or ?host=/path/to/socket) "
        "rather than relying on the driver's defaults\n"
    )


def test_empty_control_database_says_where_tables_come_from(
    postgres_db: ScratchDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["workers", "list", "--url", postgres_db.url_string]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        "no worker tables (snowflake_worker_slots, snowflake_worker_registrations, "
        "snowflake_worker_layout)"
    ) in err
    assert "create_tables" not in err  # not an option of this command


def test_help_names_the_url_forms() -> None:
    result = subprocess.run([sys.executable, "-m", "snowflake_db.cli", "workers", "list",
                             "--help"], capture_output=True, text=True, timeout=60, check=False,
                            env=dict(os.environ, PYTHONPATH=REPO, COLUMNS="200"))
    assert "postgres:// and mysql:// use the installed driver" in result.stdout
