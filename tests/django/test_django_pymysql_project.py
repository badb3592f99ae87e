"""A Django project on MariaDB with PyMySQL and no mysqlclient, set up as the Django quick start
says: ``manage.py check``, ``migrate`` and a saved row, each in a fresh ``manage.py`` process.

The settings take the quick start's MariaDB block word for word, so the page and the test
cannot drift apart; without its two PyMySQL lines the same project stops at start-up with a
message that names them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.django.scenario_support import django_database
from tests.plugins.databases import ScratchDatabase

QUICK_START = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "django.md"

MANAGE_PY = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""

MODELS = """\
from django.db import models


class Order(models.Model):
    note = models.CharField(max_length=20)
"""


def _mariadb_block() -> str:
    """The quick start's Python block that sets up PyMySQL."""
    blocks = re.findall(r"```python\n(.*?)```", QUICK_START.read_text(), re.S)
    matching = [block for block in blocks if "install_as_MySQLdb" in block]
    assert len(matching) == 1, "the Django quick start has no (or two) PyMySQL blocks"
    return matching[0]


def _project(tmp_path: Path, database: dict[str, object], *, pymysql_lines: bool) -> Path:
    project = tmp_path / ("with_pymysql" if pymysql_lines else "without")
    (project / "shop" / "migrations").mkdir(parents=True)
    (project / "manage.py").write_text(MANAGE_PY)
    (project / "shop" / "__init__.py").write_text("")
    (project / "shop" / "migrations" / "__init__.py").write_text("")
    (project / "shop" / "models.py").write_text(MODELS)
    block = _mariadb_block() if pymysql_lines else ""
    (project / "site_settings.py").write_text(
        f"{block}\n"
        "SECRET_KEY = 'test'\n"
        "USE_TZ = True\n"
        "INSTALLED_APPS = ['snowflake_db.django', 'shop']\n"
        "DEFAULT_AUTO_FIELD = 'snowflake_db.django.fields.SnowflakeAutoField'\n"
        "SNOWFLAKE_DB = {'WORKER_SOURCE': 'table'}\n"
        f"DATABASES = {{'default': {database!r}}}\n"
    )
    return project


def _manage(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DJANGO_SETTINGS_MODULE", "SNOWFLAKE_WORKER_ID")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def test_mariadb_project_runs_on_pymysql_as_the_quick_start_sets_it_up(
    mariadb_db: ScratchDatabase, tmp_path: Path
) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; "
         "print(u.find_spec('MySQLdb'), u.find_spec('pymysql') is not None)"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert probe.stdout.split() == ["None", "True"], "mysqlclient is installed here"
    database = django_database(mariadb_db.url)

    # Without the two lines: one message saying what to add (Django's own, "Did you install
    # mysqlclient?", sends a newcomer to build a C extension).
    without = _project(tmp_path, database, pymysql_lines=False)
    refused = _manage(without, "check")
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert last == (
        "django.core.exceptions.ImproperlyConfigured: DATABASES['default'] uses Django's MySQL "
        "backend, which imports MySQLdb, and mysqlclient is not installed: to use PyMySQL (the "
        "'mysql' extra), put 'import pymysql; pymysql.install_as_MySQLdb()' at the top of "
        "settings.py (Django quick start, 'On MariaDB or MySQL')"
    ), refused.stderr[-2000:]

    project = _project(tmp_path, database, pymysql_lines=True)
    for args in (("makemigrations", "shop"), ("check",), ("migrate",)):
        done = _manage(project, *args)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    assert "System check identified no issues" in _manage(project, "check").stdout
    saved = _manage(project, "shell", "-c", (
        "from django.db import connection; from shop.models import Order; "
        "order = Order.objects.create(note='tea'); "
        "print(type(order._meta.pk).__name__, connection.vendor, order.pk, "
        "Order.objects.get(note='tea').pk)"
    ))
    assert saved.returncode == 0, saved.stderr[-2000:]
    field, vendor, key, read_back = saved.stdout.splitlines()[-1].split()
    assert (field, vendor) == ("SnowflakeAutoField", "mysql")
    assert int(key) == int(read_back) > 2**53  # a Snowflake key, not an auto-increment one
