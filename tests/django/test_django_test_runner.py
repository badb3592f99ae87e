"""A project's own Django test run with WORKER_SOURCE = "table" on PostgreSQL and MariaDB: the
allocator's connections to the test database are released before Django drops it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.plugins.databases import ScratchDatabase, drop_database, server_url

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = """\
import json, os
import pymysql
pymysql.install_as_MySQLdb()
SECRET_KEY = "not secret"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "snowflake_db.django", "demo"]
DATABASES = {"default": json.loads(os.environ["SCENARIO_DATABASE"])}
DEFAULT_AUTO_FIELD = "snowflake_db.django.fields.SnowflakeAutoField"
SNOWFLAKE_DB = {"WORKER_SOURCE": "table", "LEASE_SECONDS": 3}
"""
MODELS = """\
from django.db import models


class Order(models.Model):
    total = models.IntegerField(default=0)
"""
TESTS = """\
import time

from django.test import TestCase

from demo.models import Order
from snowflake_db.django.models import WorkerSlot


class OrderTests(TestCase):
    def test_orders_get_snowflake_keys_from_a_leased_worker(self):
        orders = [Order.objects.create() for _ in range(3)]
        self.assertTrue(all(order.pk > 2**32 for order in orders))
        time.sleep(1.5)  # the heartbeat renews the lease on its own connection meanwhile
        self.assertEqual(WorkerSlot.objects.exclude(lease_token=None).count(), 1)
"""


def _exists(backend: str, name: str) -> bool:
    engine = create_engine(server_url(backend))
    try:
        with engine.connect() as connection:
            if backend == "postgresql":
                query = "SELECT count(*) FROM pg_database WHERE datname = :name"
            else:
                query = "SELECT count(*) FROM information_schema.schemata WHERE schema_name = :name"
            return bool(connection.execute(text(query), {"name": name}).scalar())
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_django_test_run_with_the_table_source_drops_its_test_database(
    backend: str, tmp_path: Path, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    database = database_factory(backend)
    test_name = f"{database.name}_t"
    (tmp_path / "scenario_settings.py").write_text(SETTINGS)
    app = tmp_path / "demo"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(MODELS)
    (app / "tests.py").write_text(TESTS)
    url = database.url
    alias = {
        "ENGINE": f"django.db.backends.{'postgresql' if backend == 'postgresql' else 'mysql'}",
        "NAME": database.name, "USER": url.username or "", "PASSWORD": url.password or "",
        "HOST": url.host or "", "PORT": str(url.port or ""), "TEST": {"NAME": test_name},
    }
    env = {**os.environ, "SCENARIO_DATABASE": json.dumps(alias),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("SNOWFLAKE_WORKER_ID", None)
    env.pop("SNOWFLAKE_WORKER_URL", None)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "django", "test", "demo", "--settings=scenario_settings",
             "--noinput", "-v", "1"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        # exactly one test, passed: "OK (skipped=1)" or "Ran 2 tests" would be another outcome
        assert re.search(r"^Ran 1 test in ", result.stderr, re.MULTILINE), result.stderr
        assert re.search(r"^OK$", result.stderr, re.MULTILINE), result.stderr
        assert not _exists(backend, test_name), "the test database was left behind"
    finally:
        drop_database(ScratchDatabase(backend, url.set(database=test_name), test_name))
