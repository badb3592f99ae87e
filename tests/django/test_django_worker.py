"""Worker IDs in Django: settings, the table allocator on the app's migrated tables (lazy start,
heartbeat, prefork children), the management command and the system checks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from django.core.management import call_command
from django.db import connections, models
from django.test.utils import isolate_apps, override_settings

import snowflake_db
from snowflake_db.django import checks
from snowflake_db.django.conf import get_layout
from snowflake_db.django.models import WorkerRegistration, WorkerSlot
from snowflake_db.django.narrow_columns import narrow_columns
from snowflake_db.django.worker import DjangoTableWorkerAllocator, configure_from_settings
from tests.django.conftest import backends
from tests.django_project.shop.models import Customer, Order
from tests.plugins.core_support import wait_forked
from tests.plugins.outage_support import STEADY_LEASE_SECONDS

LAYOUT = snowflake_db.Layout()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def table_allocator(tx_backend: str) -> Iterator[DjangoTableWorkerAllocator]:
    """A table allocator on the backend's migrated worker tables; closed after the test."""
    allocator = DjangoTableWorkerAllocator(alias=tx_backend)
    yield allocator
    snowflake_db.reset()
    allocator.close()


# -- settings -----------------------------------------------------------------------------------


def test_static_source_and_layout_from_settings() -> None:
    setting = {"WORKER_SOURCE": "static", "WORKER_ID": 5, "EPOCH": "2024-01-01",
               "LAYOUT": {"worker_bits": 8, "sequence_bits": 14}}
    with override_settings(SNOWFLAKE_DB=setting):
        generator = configure_from_settings()
        assert generator is not None and generator.worker_id == 5
        decoded = get_layout().decode(snowflake_db.snowflake_default())
        assert decoded.worker_id == 5
        assert generator.layout == get_layout()
        assert get_layout().epoch_ms == 1_704_067_200_000 and get_layout().sequence_bits == 14
    assert get_layout() == snowflake_db.Layout()


def test_env_and_manual_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNOWFLAKE_WORKER_URL", raising=False)
    monkeypatch.delenv("SNOWFLAKE_WORKER_ID", raising=False)
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "env"}):
        assert configure_from_settings() is None  # left to the core's fallback (lazy)
        monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "9")
        generator = configure_from_settings()
        assert generator is not None and generator.worker_id == 9
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "manual"}):
        assert configure_from_settings() is None


def test_table_source_touches_no_database_until_the_first_id() -> None:
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table", "LEASE_SECONDS": 5}):
        generator = configure_from_settings()
        assert generator is not None
        allocator = generator._allocator
        assert isinstance(allocator, DjangoTableWorkerAllocator)
        assert allocator._allocator is None and generator.worker_id is None


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ({"BOGUS": 1}, "unknown key(s) BOGUS"),
        ({"WORKER_SOURCE": "static"}, "needs WORKER_ID"),
        ({"WORKER_SOURCE": "static", "WORKER_ID": 1024}, "exceeds the maximum 1023"),
        ({"WORKER_SOURCE": "env", "WORKER_ID": 3}, "only used with WORKER_SOURCE='static'"),
        ({"WORKER_SOURCE": "nope"}, "must be one of"),
        ({"LAYOUT": {"time_bits": 60}}, "exceeds the 63 bits"),
        ({"EPOCH": "2999-01-01"}, "epoch must not lie in the future"),
        ({"EPOCH": 0, "LAYOUT": {"epoch_ms": 0}}, "give the epoch once"),
        ({"LEASE_SECONDS": 0}, "LEASE_SECONDS must be a positive"),
    ],
)
def test_invalid_settings_are_reported_by_check_e001(setting: object, fragment: str) -> None:
    with override_settings(SNOWFLAKE_DB=setting):
        messages = checks.check_settings()
    assert [m.id for m in messages] == ["snowflake_db.E001"]
    assert fragment in messages[0].msg


def test_app_ready_configures_from_settings_in_a_fresh_process() -> None:
    code = (
        "import django, snowflake_db\n"
        "django.setup()\n"
        "g = snowflake_db.get_generator()\n"
        "print(g.worker_id, g.layout.worker_bits)\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.django_project.settings",
        "SNOWFLAKE_DJANGO_TEST_SETTING": json.dumps(
            {"WORKER_SOURCE": "static", "WORKER_ID": 7, "LAYOUT": {"worker_bits": 6}}
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["7", "6"]


@pytest.mark.parametrize(
    ("setting", "fragments"),
    [
        ({"WORKER_SOUCRE": "table"}, ["settings.SNOWFLAKE_DB: unknown key(s) WORKER_SOUCRE",
                                      "snowflake_db.E001"]),
        ({}, ["WORKER_SOURCE 'env' (the default)", "SNOWFLAKE_WORKER_URL",
              '"WORKER_SOURCE": "table"']),
        ({"WORKER_SOURCE": "manual"}, ["WORKER_SOURCE 'manual'", "snowflake_db.configure("]),
    ],
)
def test_not_configured_error_names_the_setting_where_no_check_runs(
    setting: dict[str, str], fragments: list[str]
) -> None:
    """As under `manage.py shell`, gunicorn or Celery: django.setup() runs no system checks."""
    code = (
        "import django, snowflake_db\n"
        "django.setup()\n"
        "try:\n"
        "    snowflake_db.snowflake_default()\n"
        "except snowflake_db.NotConfiguredError as error:\n"
        "    print(error)\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.django_project.settings",
        "SNOWFLAKE_DJANGO_TEST_SETTING": json.dumps(setting),
    }
    env.pop("SNOWFLAKE_WORKER_ID", None)
    env.pop("SNOWFLAKE_WORKER_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert "settings.SNOWFLAKE_DB" in message
    assert 'the docs page "Django: the SNOWFLAKE_DB setting"' in message
    for fragment in fragments:
        assert fragment in message


# -- checks ---------------------------------------------------------------------------------


def _ids(messages: list[object]) -> list[str]:
    return [m.id for m in messages]  # type: ignore[attr-defined]


def test_check_static_worker_with_prefork_hints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sign of a prefork server alone turns a static worker ID into one W001 naming that
    sign; with none (every source controlled here, whatever this run imported) none."""
    static = {"WORKER_SOURCE": "static", "WORKER_ID": 3}
    for variable in ("GUNICORN_CMD_ARGS", "SERVER_SOFTWARE"):
        monkeypatch.delenv(variable, raising=False)
    for module in ("celery", "uwsgi"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(sys, "argv", ["manage.py", "check"])

    def w001(**extra_settings: object) -> list[str]:
        with override_settings(SNOWFLAKE_DB=static, **extra_settings):
            return [m.msg for m in checks.check_settings() if m.id == "snowflake_db.W001"]

    assert w001() == []
    [message] = w001(CELERY_BROKER_URL="redis://localhost")
    assert "CELERY_* settings" in message and "WORKER_ID=3" in message
    signs: list[tuple[str, str, Callable[[pytest.MonkeyPatch], None]]] = [
        ("GUNICORN_CMD_ARGS", "gunicorn (its workers",
         lambda m: m.setenv("GUNICORN_CMD_ARGS", "--preload --workers 4")),
        ("argv", "gunicorn (its workers",
         lambda m: m.setattr(sys, "argv", ["/venv/bin/gunicorn", "shop.wsgi"])),
        ("SERVER_SOFTWARE", "SERVER_SOFTWARE=gunicorn",
         lambda m: m.setenv("SERVER_SOFTWARE", "gunicorn/23.0.0")),
        ("uwsgi", "uWSGI", lambda m: m.setitem(sys.modules, "uwsgi", ModuleType("uwsgi"))),
        ("celery", "the celery package is imported",
         lambda m: m.setitem(sys.modules, "celery", ModuleType("celery"))),
    ]
    for name, fragment, show in signs:
        with monkeypatch.context() as patch:
            show(patch)
            found = w001()
            assert len(found) == 1 and fragment in found[0], (name, found)
            with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table"}):
                assert "snowflake_db.W001" not in _ids(checks.check_settings()), name
    assert w001() == []


def test_check_env_source_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SNOWFLAKE_WORKER_URL", raising=False)
    monkeypatch.delenv("SNOWFLAKE_WORKER_ID", raising=False)
    with override_settings(SNOWFLAKE_DB={}):
        assert _ids(checks.check_settings()) == ["snowflake_db.W003"]
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "4")
    with override_settings(SNOWFLAKE_DB={}):
        assert checks.check_settings() == []


def test_check_table_source(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table", "CONTROL_DATABASE": "nope"}):
        assert _ids(checks.check_settings()) == ["snowflake_db.E002"]
    router = ["snowflake_db.django.routers.ControlDatabaseRouter",
              "tests.django_project.routers.ActiveAliasRouter"]
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table"}, DATABASE_ROUTERS=router):
        assert checks.check_settings() == []
    from django.conf import settings

    if len(settings.DATABASES) > 1:
        # The test router lets every app migrate everywhere: the worker tables would spread.
        with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table"}):
            assert _ids(checks.check_settings()) == ["snowflake_db.W002"]
    real_find_spec = checks.importlib.util.find_spec
    monkeypatch.setattr(
        checks.importlib.util, "find_spec",
        lambda name, *a: None if name == "sqlalchemy" else real_find_spec(name, *a),
    )
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table"}, DATABASE_ROUTERS=router):
        messages = checks.check_settings()
    assert _ids(messages) == ["snowflake_db.E003"]
    assert "pip install 'snowflake-db[django," in messages[0].hint


def test_check_in_memory_sqlite_control_database() -> None:
    real = connections["default"].settings_dict["NAME"]
    connections["default"].settings_dict["NAME"] = ":memory:"
    try:
        router = ["snowflake_db.django.routers.ControlDatabaseRouter"]
        with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table"}, DATABASE_ROUTERS=router):
            messages = checks.check_settings()
    finally:
        connections["default"].settings_dict["NAME"] = real
    assert "snowflake_db.E002" in _ids(messages)


def test_database_checks_pass_on_migrated_tables(backend: str) -> None:
    Customer.objects.create(name="ada")
    assert checks.check_database(databases=[backend]) == []


def test_check_epoch_change_after_ids_exist(backend: str) -> None:
    Customer.objects.create(name="ada")
    assert checks.check_database(databases=[backend]) == []
    # IDs made with an epoch one year earlier decode one year in the future under the current one.
    old_layout = snowflake_db.Layout(epoch_ms=LAYOUT.epoch_ms - 366 * 86_400_000)
    old_id = snowflake_db.SnowflakeGenerator(2, layout=old_layout).next_id()
    Customer.objects.create(id=old_id, name="from the old epoch")
    messages = checks.check_database(databases=[backend])
    assert _ids(messages) == ["snowflake_db.E011"]
    assert "in the future" in messages[0].msg and "shop.Customer" in messages[0].msg


@backends("postgresql", "mariadb", transaction=True)  # every SQLite integer column is 64-bit
def test_check_non_bigint_column_on_servers(tx_backend: str) -> None:
    alias = tx_backend
    with isolate_apps("tests.django_project.shop"):

        class LegacyItem(models.Model):
            id = snowflake_db.django.SnowflakeAutoField(primary_key=True)
            number = snowflake_db.django.SnowflakeField()

            class Meta:
                app_label = "shop"
                db_table = "shop_legacy_item_check"

        db = connections[alias]
        with db.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE shop_legacy_item_check (id INTEGER NOT NULL PRIMARY KEY, "
                "number BIGINT NOT NULL)"
            )
        try:
            # No migration of the app is pending on a fully migrated test database: an error.
            narrow = narrow_columns(db, [LegacyItem])
            messages = checks._check_column_types(db, [LegacyItem])
        finally:
            with db.cursor() as cursor:
                cursor.execute("DROP TABLE shop_legacy_item_check")
    assert [(c.table, c.column) for c in narrow] == [("shop_legacy_item_check", "id")]
    assert _ids(messages) == ["snowflake_db.E010"]
    assert "shop_legacy_item_check.id" in messages[0].msg and " is int" in messages[0].msg.lower()


# -- the table allocator on the Django-migrated tables ----------------------------------------


@pytest.mark.timing(seconds=6)  # see tests/conftest.py
def test_table_allocator_leases_and_heartbeats(
    tx_backend: str, table_allocator: DjangoTableWorkerAllocator
) -> None:
    # The steady lease: with 1.5 s, beside a second suite in its timing stage, the heartbeat
    # and the caller's renewal both came late and the second create() was fenced.
    lease = STEADY_LEASE_SECONDS
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "table", "LEASE_SECONDS": lease}):
        generator = snowflake_db.configure(allocator=table_allocator)
        first = Customer.objects.create(name="ada").pk
        worker_id = generator.worker_id
        assert worker_id is not None and LAYOUT.decode(first).worker_id == worker_id
        slot = WorkerSlot.objects.get(worker_id=worker_id)
        assert slot.pid == os.getpid() and slot.lease_token and slot.expires_at_ms
        assert WorkerRegistration.objects.filter(pid=os.getpid()).exists()
        renewed = slot.renewed_at_ms or slot.acquired_at_ms or 0
        # Longer than the lease, in real time (the subject): only the heartbeat keeps it alive.
        time.sleep(lease + 0.1)
        second = Customer.objects.create(name="bob").pk
        assert second > first and LAYOUT.decode(second).worker_id == worker_id
        slot.refresh_from_db()
        assert (slot.renewed_at_ms or 0) > renewed
        snowflake_db.reset()  # releases the lease
        slot.refresh_from_db()
        assert slot.lease_token is None
        assert slot.high_water_ms >= LAYOUT.decode(second).timestamp_ms


# Forking beside the heartbeat thread is the real scenario (gunicorn --preload does it too).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_prefork_children_each_lease_their_own_worker_id(
    tx_backend: str, table_allocator: DjangoTableWorkerAllocator
) -> None:
    """gunicorn --preload / Celery prefork: Django is set up and IDs were issued in the parent,
    then workers are forked. Every child leases its own worker ID; no key repeats."""
    children, rows_per_child = 4, 300
    generator = snowflake_db.configure(allocator=table_allocator)
    customer = Customer.objects.create(name="parent")
    parent_worker = generator.worker_id
    connections.close_all()  # prefork servers fork before any request opens a connection
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            status = 1
            try:
                mine = os.getpid()
                Order.objects.bulk_create(
                    [Order(customer_id=customer.pk, created_by_pid=mine)
                     for _ in range(rows_per_child - 20)]
                )
                for _ in range(20):
                    Order(customer_id=customer.pk, created_by_pid=mine).save()
                connections.close_all()
                status = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        pids.append(pid)
    for pid in pids:
        assert wait_forked(pid, 300) == 0, f"child {pid} failed"
    rows = list(Order.objects.values_list("pk", "created_by_pid"))
    assert len(rows) == children * rows_per_child
    assert len({pk for pk, _ in rows}) == len(rows)  # zero duplicate keys
    workers_by_pid: dict[int, set[int]] = {}
    for pk, pid in rows:
        workers_by_pid.setdefault(pid, set()).add(LAYOUT.decode(pk).worker_id)
    assert set(workers_by_pid) == set(pids)
    assert all(len(workers) == 1 for workers in workers_by_pid.values())
    child_workers = [next(iter(workers)) for workers in workers_by_pid.values()]
    assert len(set(child_workers)) == children
    assert parent_worker not in child_workers
    assert WorkerSlot.objects.count() >= children + 1


# -- management command -----------------------------------------------------------------------


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("snowflake", *args, stdout=out)
    return out.getvalue()


def test_command_decode(capsys: pytest.CaptureFixture[str]) -> None:
    """``manage.py snowflake decode`` prints what ``snowflake-db parse`` prints (one formatter)."""
    from snowflake_db.cli import main

    ids = [str(snowflake_db.snowflake_default()), "5"]  # 5 decodes to the epoch itself: a warning
    for options in ([], ["--json"]):
        assert main(["parse", *options, *ids]) == 0
        cli = capsys.readouterr()
        out, err = io.StringIO(), io.StringIO()
        call_command("snowflake", "decode", *ids, *options, stdout=out, stderr=err)
        assert out.getvalue() == cli.out
        assert err.getvalue() == cli.err.replace("snowflake-db parse: ", "").replace(
            "see --epoch and the --*-bits options", "see SNOWFLAKE_DB's LAYOUT and EPOCH")
    data = json.loads(out.getvalue())
    assert data[0]["id"] == ids[0] and data[0]["worker_id"] == 1
    assert data[0]["timestamp_ms"] == LAYOUT.decode(int(ids[0])).timestamp_ms
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="cannot decode"):
        _run("decode", "-5")


def test_command_lists_and_reaps_leases(tx_backend: str) -> None:
    far = 4_102_444_800_000  # 2100-01-01
    WorkerSlot.objects.create(worker_id=1, lease_token="a" * 32, hostname="web1", pid=11,
                              acquired_at_ms=1, renewed_at_ms=1, expires_at_ms=far,
                              high_water_ms=5)
    WorkerSlot.objects.create(worker_id=2, lease_token="b" * 32, hostname="web2", pid=12,
                              acquired_at_ms=1, renewed_at_ms=1, expires_at_ms=2,
                              high_water_ms=7)
    WorkerSlot.objects.create(worker_id=3, high_water_ms=9)
    WorkerSlot.objects.create(worker_id=4, lease_token="c" * 32, label="pg function")
    listed = json.loads(_run("leases", "--json", "--database", tx_backend))
    assert {row["worker_id"]: row["state"] for row in listed} == {
        1: "live", 2: "expired", 3: "free", 4: "reserved"
    }
    table = _run("leases", "--database", tx_backend)
    assert "web1  11" in table and "pg function" in table and "expired" in table
    assert "would reap 1 expired lease(s): 2" in _run("reap", "--dry-run", "--database", tx_backend)
    assert "reaped 1 expired lease(s): 2" in _run("reap", "--database", tx_backend)
    slot = WorkerSlot.objects.get(worker_id=2)
    assert slot.lease_token is None and slot.high_water_ms == 7  # the row and its mark stay
    assert WorkerSlot.objects.get(worker_id=1).lease_token == "a" * 32
    assert "reaped 0" in _run("reap", "--database", tx_backend)


@backends("postgresql", "mariadb", transaction=True)
def test_empty_host_means_the_local_server_django_uses(tx_backend: str) -> None:
    """Django leaves HOST empty for the local socket; the worker URL must still name a server."""
    from snowflake_db.django.worker import sqlalchemy_url
    from snowflake_db.worker._engine import check_supported

    connection = connections[tx_backend]
    saved = connection.settings_dict["HOST"]
    connection.close()
    connection.settings_dict["HOST"] = ""
    try:
        url = sqlalchemy_url(tx_backend)
        check_supported(url)  # refused before: no host or socket
        if connection.vendor == "postgresql":
            assert str(url.query["host"]).startswith("/")  # the socket directory
        else:
            assert url.host == "localhost"
        allocator = DjangoTableWorkerAllocator(alias=tx_backend)
        try:
            lease = allocator.acquire(layout=LAYOUT, clock=snowflake_db.MonotonicClock())
            assert 0 <= lease.worker_id <= LAYOUT.max_worker_id
        finally:
            allocator.close()
    finally:
        connection.close()
        connection.settings_dict["HOST"] = saved
