"""``snowflake-db workers check`` and ``snowflake-db doctor`` against real databases: exit
statuses, one-line reasons, nothing left behind by ``check``, and what ``doctor`` reports
(layout, its end, clock skew, slots by state, partitions ahead). The first test runs the
installed console script; the others run the CLI's ``main()`` in this process, its output
captured the same way (an interpreter each cost about a second of CPU)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, update

from snowflake_db import Layout, MonotonicClock
from snowflake_db.sharding import partitioning
from snowflake_db.worker import DEFAULT_SLOTS_TABLE, worker_tables

from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import (
    STILL_LIVE_LEASE_S,
    allocator,
    database_now_ms,
    expire_lease,
    read_slots,
    run_cli,
)

SCRIPT = str(Path(sys.executable).parent / "snowflake-db")
OTHER = ["--worker-bits", "9", "--sequence-bits", "13"]


def _run(*args: str, script: bool = False) -> subprocess.CompletedProcess[str]:
    """The command's status and output: the console script in a process of its own with
    ``script``, else ``main()`` here. Neither sees ``SNOWFLAKE_WORKER_URL``."""
    if script:
        env = {k: v for k, v in os.environ.items() if k != "SNOWFLAKE_WORKER_URL"}
        return subprocess.run(
            [SCRIPT, *args], capture_output=True, text=True, timeout=120, check=False, env=env
        )
    return run_cli(*args)


def _registrations(db: ScratchDatabase) -> int:
    from sqlalchemy import MetaData

    table = worker_tables(MetaData()).registrations
    engine = create_engine(db.url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())
    finally:
        engine.dispose()


def _existing(db: ScratchDatabase) -> str:
    """The database's URL, its SQLite file created empty (a missing one is refused, status 2)."""
    if db.backend == "sqlite":
        sqlite3.connect(db.url.database or "").close()
    return db.url_string


def _one_line_failure(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "Traceback" not in line
    return line


# -- workers check -------------------------------------------------------------------------------


def test_check_leases_and_releases_leaving_nothing_behind(any_db: ScratchDatabase) -> None:
    url = any_db.url_string
    with allocator(any_db, lease_seconds=STILL_LIVE_LEASE_S) as alloc:
        held = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        before = read_slots(any_db.url)
        registrations = _registrations(any_db)
        for attempt in range(3):  # the installed script first, then main() here
            result = _run("workers", "check", "--url", url, script=attempt == 0)
            assert result.returncode == 0, result.stderr
            assert result.stderr == ""
            assert result.stdout.startswith("ok: worker ID ")
            assert "could be leased with layout 41/10/12 and was released" in result.stdout
        after = read_slots(any_db.url)
        checked = int(result.stdout.split()[3])
        assert checked != held.worker_id
        # Every slot the checks took is free again, with the mark it had (0 for new rows).
        for worker_id, row in after.items():
            if worker_id == held.worker_id:
                assert row.lease_token == held.token and row.state == "live"
                continue
            assert row.state == "free"
            assert row.high_water_ms == (
                before[worker_id].high_water_ms if worker_id in before else 0
            )
        assert _registrations(any_db) == registrations  # the checks' rows were deleted


def test_check_failures_are_one_line_with_exit_status_1(any_db: ScratchDatabase) -> None:
    url = _existing(any_db)
    line = _one_line_failure(_run("workers", "check", "--url", url), 1)
    assert "no worker tables" in line and "or pass --create-tables" in line

    # --create-tables does what an application's first lease does: tables, then the layout.
    assert _run("workers", "check", "--url", url, "--create-tables").returncode == 0
    line = _one_line_failure(_run("workers", "check", "--url", url, *OTHER), 1)
    assert line.startswith("snowflake-db workers check: LayoutMismatchError: ")
    assert "worker_bits 10 vs 9, sequence_bits 12 vs 13" in line

    # Every worker ID held: exhausted. (Own tables: the layout differs from the one above.)
    tables = ["--slots-table", "one_slots", "--registrations-table", "one_registrations"]
    single = ["--worker-bits", "0", "--sequence-bits", "22"]
    created = _run("workers", "check", "--url", url, "--create-tables", *tables, *single)
    assert created.returncode == 0, created.stderr
    with allocator(any_db, slots_table="one_slots", registrations_table="one_registrations") as a:
        a.acquire(layout=Layout(worker_bits=0, sequence_bits=22), clock=MonotonicClock())
        line = _one_line_failure(_run("workers", "check", "--url", url, *tables, *single), 1)
        assert "WorkerIdExhaustedError: no worker ID is free" in line


def test_check_unreachable_database_is_status_1_and_bad_input_status_2() -> None:
    line = _one_line_failure(
        _run("workers", "check", "--url", "postgresql+psycopg://snow:s3cret@127.0.0.1:1/control"),
        1,
    )
    assert "AllocatorUnavailableError" in line and "s3cret" not in line
    line = _one_line_failure(_run("workers", "check", "--url", "sqlite:///x.db", "--worker-bits",
                                  "99"), 2)
    assert "--worker-bits 99 exceeds the maximum 63" in line
    line = _one_line_failure(_run("workers", "check", "--url", "postgres:///control"), 2)
    assert "names no host" in line


# -- doctor ------------------------------------------------------------------------------------


def _doctor(*args: str) -> tuple[int, dict[str, Any]]:
    result = _run("doctor", "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_doctor_reports_layout_skew_and_slots(any_db: ScratchDatabase) -> None:
    url = any_db.url_string
    layout = Layout()
    with allocator(any_db, lease_seconds=STILL_LIVE_LEASE_S) as alloc:
        live = alloc.acquire(layout=layout, clock=MonotonicClock())
        dead = alloc.acquire(layout=layout, clock=MonotonicClock())
        dead.abandon()  # no more renewals: it expires like a crashed holder's
        reserved = alloc.reserve_worker_id("server function", layout=layout)
        parked = alloc.acquire(layout=layout, clock=MonotonicClock())
        parked.release()
        with alloc._engine.begin() as connection:  # a free slot whose mark is a minute ahead
            slots = alloc.store.tables.slots
            connection.execute(
                update(slots)
                .where(slots.c.worker_id == parked.worker_id)
                .values(high_water_ms=database_now_ms(any_db.url) + 60_000)
            )
        expire_lease(any_db.url, dead.worker_id)

        status, report = _doctor("--url", url)
        assert status == 0, report["problems"]
        assert report["problems"] == [] and report["warnings"] == []
        assert report["layout_matches"] is True
        recorded = report["recorded_layout"]
        assert {k: recorded[k] for k in layout.as_kwargs()} == layout.as_kwargs()
        assert recorded["pid"] == os.getpid()
        assert report["layout_runs_out"] == layout.exhausted_at.isoformat(timespec="milliseconds")
        days = (layout.exhausted_at - datetime.now(UTC)).total_seconds() / 86_400
        assert abs(report["layout_days_left"] - days) < 1
        assert abs(report["clock_skew_ms"]) <= report["clock_skew_uncertainty_ms"] + 50
        assert report["worker_ids"] == {
            "size": 1024,
            "live": 1,
            "reserved": 1,
            "expired": 1,
            "free": 1,
            "never_used": 1020,
            "parked": 1,
            "available": 1021,  # the expired one and the never used; not the parked one
        }
        rows = read_slots(any_db.url)
        assert rows[live.worker_id].state == "live" and rows[reserved].state == "reserved"
        assert rows[dead.worker_id].state == "expired"  # doctor reaps nothing

        text = _run("doctor", "--url", url)
        assert text.returncode == 0
        lines = dict(line.split(": ", 1) for line in text.stdout.splitlines())
        assert lines["recorded layout"].strip().startswith("the same (recorded ")
        assert "ahead of the database clock" in lines["clock skew"] or "behind" in lines[
            "clock skew"]
        assert "(warning above 100 ms, leases refused above 2000 ms)" in lines["clock skew"]
        assert lines["worker IDs"].strip().startswith("1024 in all: 1 live, 1 reserved, 1 expired")
        assert lines["status"].strip() == "ok"

        # Another layout given: a problem, exit status 1, the report still printed.
        status, report = _doctor("--url", url, *OTHER)
        assert status == 1 and report["layout_matches"] is False
        assert "processes with the given layout are refused" in report["problems"][0]
        assert report["worker_ids"]["size"] == 512
        text = _run("doctor", "--url", url, *OTHER)
        assert text.returncode == 1 and "recorded layout:  DIFFERENT: " in text.stdout
        assert "problem: the tables serve layout time_bits=41 worker_bits=10" in text.stdout


def test_doctor_on_missing_or_old_tables(any_db: ScratchDatabase) -> None:
    url = _existing(any_db)
    line = _one_line_failure(_run("doctor", "--url", url), 1)
    assert "no worker tables" in line
    from sqlalchemy import MetaData

    tables = worker_tables(MetaData())
    engine = create_engine(any_db.url)
    try:
        with engine.begin() as connection:
            tables.slots.create(connection)
            tables.registrations.create(connection)
    finally:
        engine.dispose()
    line = _one_line_failure(_run("doctor", "--url", url), 1)
    assert "have no layout table (snowflake_worker_layout): they predate it" in line
    assert "manage.py migrate snowflake_db" in line


def test_doctor_warns_about_a_layout_running_out(sqlite_db: ScratchDatabase) -> None:
    now_ms = time.time_ns() // 1_000_000
    time_bits = 36  # about 795 days of 1 ms ticks
    epoch_ms = now_ms - (1 << time_bits) + 100 * 86_400_000  # runs out in 100 days
    options = ["--time-bits", str(time_bits), "--epoch", str(epoch_ms)]
    assert _run("workers", "check", "--url", sqlite_db.url_string, "--create-tables",
                *options).returncode == 0
    status, report = _doctor("--url", sqlite_db.url_string, *options)
    assert status == 0 and report["problems"] == []
    assert 99 < report["layout_days_left"] < 101
    assert report["warnings"] == [
        f"the layout's time bits run out in 100 days ({report['layout_runs_out']})"
    ]


def _create_time_partitioned(
    db: ScratchDatabase, table: str, start: datetime, *, periods: int, period: partitioning.Period
) -> None:
    engine = create_engine(db.url)
    try:
        with engine.begin() as connection:
            partitioning.execute(
                connection,
                partitioning.create_time_partitioned_table_sql(
                    table, "id bigint PRIMARY KEY, total integer", Layout(),
                    start=start, periods=periods, period=period,
                ),
            )
    finally:
        engine.dispose()


def test_doctor_reports_partitions_ahead(database_factory: Any) -> None:
    control: ScratchDatabase = database_factory("postgresql")
    shop: ScratchDatabase = database_factory("postgresql")
    layout = Layout()
    now = datetime.now(UTC)
    _create_time_partitioned(shop, "orders", now, periods=3, period="month")
    # Today's and tomorrow's partitions: 1-2 days ahead at any time of day (0-1 across midnight).
    _create_time_partitioned(shop, "events", now, periods=2, period="day")
    _create_time_partitioned(shop, "archive", now - timedelta(days=400), periods=2, period="month")
    with allocator(control) as alloc:
        alloc.acquire(layout=layout, clock=MonotonicClock())
        shop_url = shop.url_string
        status, report = _doctor("--url", control.url_string, "--partitions-url", shop_url,
                                 "--partitioned-table", "orders", "--partitioned-table", "events")
        assert status == 0, report["problems"]
        orders, events = report["partitions"]
        assert orders["table"] == "orders" and orders["error"] is None
        assert 59 <= orders["days_ahead"] <= 93  # three months from the start of this one
        first_of_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = partitioning.next_period(
            partitioning.next_period(partitioning.next_period(first_of_month, "month"), "month"),
            "month",
        )
        assert orders["covers_until"] == end.isoformat(timespec="milliseconds")
        assert orders["last_partition"] == f"orders_p{(end - timedelta(days=1)):%Y%m}"
        assert 0 < events["days_ahead"] <= 2  # under 7 days: a warning
        assert report["warnings"] == [
            f"partitions of events: {events['last_partition']} takes IDs until "
            f"{events['covers_until']} ({events['days_ahead']:.1f} days ahead): fewer than 7 days"
        ]

        status, report = _doctor("--url", control.url_string, "--partitions-url", shop_url,
                                 "--partitioned-table", "archive", "--partitioned-table", "nope")
        assert status == 1
        archive, missing = report["partitions"]
        assert archive["days_ahead"] < -300
        assert "new rows are rejected; add partitions" in report["problems"][0]
        assert "cannot read its partitions" in missing["error"]
        # Without --partitions-url the control database is searched (and has no such table).
        status, report = _doctor("--url", control.url_string, "--partitioned-table", "orders")
        assert status == 1 and "cannot read its partitions" in report["partitions"][0]["error"]


def test_doctor_partitions_need_postgresql(sqlite_db: ScratchDatabase) -> None:
    url = sqlite_db.url_string
    assert _run("workers", "check", "--url", url, "--create-tables").returncode == 0
    status, report = _doctor("--url", url, "--partitioned-table", "orders")
    assert status == 1
    assert "partitioning by time is PostgreSQL's; sqlite has none" in report["partitions"][0][
        "error"]
    assert DEFAULT_SLOTS_TABLE in report["control_database"]
