"""The app behaves as Django expects when installed: ``ready()`` may run many times, the worker
admin pages come from ``admin.py`` through autodiscovery, and admindocs answers beside a
project's own ``AdminSite`` named "admin"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.test.utils import modify_settings, override_settings

import snowflake_db
from snowflake_db import GeneratorClosedError
from snowflake_db.django import apps as app_module
from snowflake_db.django.models import WorkerRegistration, WorkerSlot
from snowflake_db.django.worker import DjangoTableWorkerAllocator
from snowflake_db.django.worker_admin import WorkerRegistrationAdmin, WorkerSlotAdmin, register
from snowflake_db.process import current_generator

ROOT = Path(__file__).resolve().parents[2]
SIMPLE_ADMIN = "django.contrib.admin.apps.SimpleAdminConfig"
ADMINDOCS_PAGES = [
    "/admin/doc/",
    "/admin/doc/models/",
    "/admin/doc/models/auth.user/",
    "/admin/doc/models/snowflake_db.workerslot/",
    "/admin/doc/views/",
    "/admin/",
]


@pytest.fixture(autouse=True)
def _restore_app_record(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests that run ready() with other settings leave the app's record as they found it."""
    monkeypatch.setattr(app_module, "_configured_from", app_module._configured_from)
    monkeypatch.setattr(app_module, "_configured", app_module._configured)
    yield


def _worker_pages_on(site: AdminSite) -> dict[type, type]:
    return {model: type(site._registry[model])
            for model in (WorkerSlot, WorkerRegistration) if model in site._registry}


def test_ready_runs_twice_without_error() -> None:
    before = dict(admin.site._registry)
    config = apps.get_app_config("snowflake_db")
    config.ready()
    config.ready()
    assert admin.site._registry == before


def test_installed_apps_overridden_and_restored() -> None:
    """override_settings(INSTALLED_APPS=...) and modify_settings build a new registry and run
    every app's ready() again, as Django's runtests.py does."""
    with override_settings(INSTALLED_APPS=list(settings.INSTALLED_APPS)):
        assert apps.is_installed("snowflake_db.django")
    with modify_settings(INSTALLED_APPS={"append": "django.contrib.admindocs"}):
        assert apps.is_installed("django.contrib.admindocs")
    assert not apps.is_installed("django.contrib.admindocs")
    assert _worker_pages_on(admin.site) == {
        WorkerSlot: WorkerSlotAdmin, WorkerRegistration: WorkerRegistrationAdmin
    }


def test_ready_again_keeps_the_live_generator_and_its_lease(tx_backend: str) -> None:
    table = {"WORKER_SOURCE": "table", "CONTROL_DATABASE": tx_backend, "LEASE_SECONDS": 30}
    config = apps.get_app_config("snowflake_db")
    with override_settings(SNOWFLAKE_DB=table):
        config.ready()
        generator = current_generator()
        assert generator is not None
        first = snowflake_db.snowflake_default()
        worker_id = generator.worker_id
        token = WorkerSlot.objects.get(worker_id=worker_id).lease_token
        assert token is not None
        table_allocator = generator._allocator
        assert isinstance(table_allocator, DjangoTableWorkerAllocator)

        config.ready()
        with override_settings(INSTALLED_APPS=list(settings.INSTALLED_APPS)):
            pass  # ready() of a new AppConfig instance, with the same SNOWFLAKE_DB
        assert current_generator() is generator
        second = snowflake_db.snowflake_default()
        assert second > first and generator.worker_id == worker_id
        held = WorkerSlot.objects.filter(pid=os.getpid(), lease_token__isnull=False)
        assert [(slot.worker_id, slot.lease_token) for slot in held] == [(worker_id, token)]

    # A changed SNOWFLAKE_DB is applied: the old generator stops and gives its slot back.
    with override_settings(SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 9}):
        config.ready()
        replacement = current_generator()
        assert replacement is not generator and replacement is not None
        assert replacement.worker_id == 9
        with pytest.raises(GeneratorClosedError):
            generator.next_id()
        assert WorkerSlot.objects.get(worker_id=worker_id).lease_token is None
        assert table_allocator._allocator is None  # its engines closed, not left to the GC


def test_ready_leaves_a_later_configure_alone() -> None:
    """A project (or a test) that calls snowflake_db.configure() after start-up keeps its
    generator when the registry is built again."""
    mine = snowflake_db.configure(worker_id=4)
    with override_settings(INSTALLED_APPS=list(settings.INSTALLED_APPS)):
        pass
    apps.get_app_config("snowflake_db").ready()
    assert current_generator() is mine


def test_register_on_another_site_twice() -> None:
    site = AdminSite(name="project_admin")
    register(site)
    register(site)
    assert _worker_pages_on(site) == {
        WorkerSlot: WorkerSlotAdmin, WorkerRegistration: WorkerRegistrationAdmin
    }


def test_register_keeps_a_projects_own_admin_class() -> None:
    class MySlotAdmin(WorkerSlotAdmin):
        list_per_page = 10

    site = AdminSite(name="project_admin")
    site.register(WorkerSlot, MySlotAdmin)
    register(site)
    assert _worker_pages_on(site)[WorkerSlot] is MySlotAdmin


def _scenario(admin_app: str, urlconf: str, paths: list[str]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-m", "tests.django.admin_scenario", admin_app, urlconf, *paths],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    outcome: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return outcome


def test_admindocs_beside_a_projects_own_admin_site_named_admin() -> None:
    """SimpleAdminConfig and the project's own AdminSite named "admin", without the worker
    pages: admindocs draws its context from the default admin.site, which must not hold them
    (before: NoReverseMatch for 'app_list' with app_label 'snowflake_db', a 500 on every
    admindocs page)."""
    outcome = _scenario(SIMPLE_ADMIN, "tests.django_project.admindocs_urls", ADMINDOCS_PAGES)
    assert outcome["errors"] == {}
    assert outcome["statuses"] == dict.fromkeys(ADMINDOCS_PAGES, 200)
    # Nothing of the app on the default site, though the scenario imports its admin module.
    default_site = outcome["default_site"]
    assert isinstance(default_site, list)
    assert not [label for label in default_site if label.startswith("snowflake_db.")]


def test_autodiscovery_puts_the_worker_pages_on_the_default_site() -> None:
    pages = [*ADMINDOCS_PAGES, "/admin/snowflake_db/workerslot/",
             "/admin/snowflake_db/workerregistration/"]
    outcome = _scenario("django.contrib.admin", "tests.django_project.admindocs_default_urls",
                        pages)
    assert outcome["errors"] == {}
    assert outcome["statuses"] == dict.fromkeys(pages, 200)
    default_site = outcome["default_site"]
    assert isinstance(default_site, list)
    assert {"snowflake_db.WorkerSlot", "snowflake_db.WorkerRegistration"} <= set(default_site)
