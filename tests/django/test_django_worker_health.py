"""The layout table in Django: the shipped migration adds it to an install made by 0001 (which
then adopts the first layout that leases), and ``manage.py snowflake check`` / ``doctor`` say
what the ``snowflake-db`` commands say. PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test.utils import override_settings

import snowflake_db
from snowflake_db import AllocatorUnavailableError, Layout, LayoutMismatchError, MonotonicClock
from snowflake_db.django.models import WorkerLayout, WorkerRegistration, WorkerSlot
from snowflake_db.django.worker import DjangoTableWorkerAllocator
from snowflake_db.sharding import partitioning
from snowflake_db.worker._layout_record import layout_text
from tests.django.conftest import backends

OTHER = {"WORKER_SOURCE": "manual", "LAYOUT": {"worker_bits": 9, "sequence_bits": 13}}


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("snowflake", *args, stdout=out)
    return out.getvalue()


def _has_layout_table(alias: str) -> bool:
    with connections[alias].cursor() as cursor:
        return "snowflake_worker_layout" in connections[alias].introspection.table_names(cursor)


def test_the_migration_adds_the_layout_table_to_an_existing_install(tx_backend: str) -> None:
    alias = tx_backend
    call_command("migrate", "snowflake_db", "0001", database=alias, verbosity=0)
    try:
        assert not _has_layout_table(alias)
        WorkerSlot.objects.create(worker_id=7, high_water_ms=42)  # a slot used before
        allocator = DjangoTableWorkerAllocator(alias=alias)
        try:
            with pytest.raises(AllocatorUnavailableError, match="snowflake_worker_layout"):
                allocator.acquire(layout=Layout(), clock=MonotonicClock())
        finally:
            allocator.close()

        call_command("migrate", "snowflake_db", database=alias, verbosity=0)
        assert _has_layout_table(alias) and not WorkerLayout.objects.exists()
        allocator = DjangoTableWorkerAllocator(alias=alias)
        try:
            allocator.acquire(layout=Layout(), clock=MonotonicClock())
            (record,) = WorkerLayout.objects.all()
            assert record.id == 1 and record.layout == layout_text(Layout())
            with pytest.raises(LayoutMismatchError):
                allocator.acquire(layout=Layout(worker_bits=9, sequence_bits=13),
                                  clock=MonotonicClock())
        finally:
            allocator.close()
        # The slot used before kept its row and mark (raised only if the lease above took it).
        assert WorkerSlot.objects.get(worker_id=7).high_water_ms >= 42
    finally:
        call_command("migrate", "snowflake_db", database=alias, verbosity=0)
        snowflake_db.reset()


def test_command_check_takes_nothing_and_refuses_another_layout(tx_backend: str) -> None:
    text = _run("check", "--database", tx_backend)
    assert text.startswith("ok: worker ID ") and "with layout 41/10/12 and was released" in text
    assert not WorkerSlot.objects.exclude(lease_token=None).exists()
    assert not WorkerRegistration.objects.exists()
    assert WorkerLayout.objects.get().layout == layout_text(Layout())
    with override_settings(SNOWFLAKE_DB=OTHER), pytest.raises(CommandError) as refused:
        _run("check", "--database", tx_backend)
    message = str(refused.value)
    assert message.startswith("LayoutMismatchError: ") and "\n" not in message
    assert "worker_bits 10 vs 9" in message


def test_command_doctor_reports_like_the_cli(tx_backend: str) -> None:
    _run("check", "--database", tx_backend)  # records the layout
    report = json.loads(_run("doctor", "--database", tx_backend, "--json"))
    assert report["layout_matches"] is True and report["problems"] == []
    assert report["worker_ids"]["size"] == 1024 and report["worker_ids"]["live"] == 0
    assert report["worker_ids"]["available"] == 1024
    text = _run("doctor", "--database", tx_backend)
    labels = [line.split(":", 1)[0] for line in text.splitlines()]
    assert labels == [
        "layout", "recorded layout", "layout runs out", "clock skew", "worker IDs",
        "control database", "status",
    ]
    out = io.StringIO()
    with override_settings(SNOWFLAKE_DB=OTHER), pytest.raises(CommandError, match="1 problem"):
        call_command("snowflake", "doctor", "--database", tx_backend, stdout=out)
    assert "recorded layout:  DIFFERENT: " in out.getvalue()


@backends("postgresql", transaction=True)
def test_command_doctor_reads_partitions(tx_backend: str) -> None:
    connection = connections[tx_backend]
    partitioning.execute(
        connection,
        partitioning.create_time_partitioned_table_sql(
            "doctor_orders", "id bigint PRIMARY KEY", Layout(), start=datetime.now(UTC),
            periods=2,
        ),
    )
    try:
        _run("check", "--database", tx_backend)
        report = json.loads(
            _run("doctor", "--database", tx_backend, "--json",
                 "--partitioned-table", "doctor_orders", "--partitions-database", tx_backend)
        )
        (runway,) = report["partitions"]
        assert runway["error"] is None and 28 <= runway["days_ahead"] <= 62
        report = json.loads(
            _run("doctor", "--database", tx_backend, "--json", "--partitioned-table", "x")
        )
    except CommandError as error:  # "x" does not exist: a problem, so the command fails
        assert "cannot read its partitions" in str(error)
    else:
        pytest.fail(f"doctor accepted a missing partitioned table: {report}")
    finally:
        partitioning.execute(connection, partitioning.drop_table_sql("doctor_orders"))
