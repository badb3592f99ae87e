"""Settings for the Django tests: one process, three backends as three database aliases.

``default`` is a SQLite file; ``postgresql`` and ``mariadb`` are added when their servers (the
URLs of tests/plugins/databases.py) answer. Test databases get names unique to this process, so
concurrent test runs never share one. ``UNAVAILABLE`` records why a backend is missing; the
``backend`` fixture skips its tests with that reason (or fails them under CI=true).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pymysql

from tests.plugins.databases import PROBE_CONNECT_SECONDS, server_url

pymysql.install_as_MySQLdb()  # Django's MySQL backend imports MySQLdb

_RUN = f"sfdb_dj_{os.getpid()}_{uuid.uuid4().hex[:8]}"
WORK_DIR = Path(tempfile.mkdtemp(prefix=_RUN))
atexit.register(shutil.rmtree, WORK_DIR, ignore_errors=True)

SECRET_KEY = "snowflake-db-tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.django_project.urls"
DEFAULT_AUTO_FIELD = "snowflake_db.django.fields.SnowflakeAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "snowflake_db.django",
    "tests.django_project.shop",
    "taggit",
    "tests.django_project.tagged",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The tests configure snowflake_db themselves (fixtures), so importing Django here never
# changes the process-wide generator that the core tests in the same pytest run rely on.
# Subprocess tests pass another value as JSON in SNOWFLAKE_DJANGO_TEST_SETTING.
SNOWFLAKE_DB: dict[str, Any] = json.loads(
    os.environ.get("SNOWFLAKE_DJANGO_TEST_SETTING") or '{"WORKER_SOURCE": "manual"}'
)
# Every TaggableManager here goes through tagged.TaggedItem (64-bit object IDs): taggit's own
# TaggedItem never receives a Snowflake key (snowflake_db.E012 says to declare it).
SNOWFLAKE_DB.setdefault("NOT_KEY_COLUMNS", ["taggit.TaggedItem.object_id"])

# Tests pick a backend per test: the router sends every query to that alias.
DATABASE_ROUTERS = ["tests.django_project.routers.ActiveAliasRouter"]

UNAVAILABLE: dict[str, str] = {}


def _server_alias(backend: str, engine: str) -> dict[str, Any] | None:
    url = server_url(backend)
    try:
        if backend == "postgresql":
            import psycopg

            psycopg.connect(
                host=url.host, port=url.port or 5432, user=url.username,
                password=url.password or "", dbname=url.database or "postgres",
                connect_timeout=PROBE_CONNECT_SECONDS,
            ).close()
        else:
            pymysql.connect(
                host=url.host, port=url.port or 3306, user=url.username,
                password=url.password or "", connect_timeout=PROBE_CONNECT_SECONDS,
            ).close()
    except Exception as error:
        first_line = f"{type(error).__name__}: {error}".splitlines()[0]
        UNAVAILABLE[backend] = (
            f"{backend} server at {url.render_as_string(hide_password=True)} is not reachable "
            f"({first_line})"
        )
        return None
    name = f"{_RUN}_{backend[:2]}"
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
        # No dependency on "default" (Django's default), so a run that selects only this
        # backend's tests (pytest -k mariadb) can set its database up alone.
        "TEST": {"NAME": name, "DEPENDENCIES": []},
        **({"OPTIONS": {"charset": "utf8mb4"}} if backend == "mariadb" else {}),
    }


DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(WORK_DIR / "default.sqlite3"),
        # A file, not the in-memory default: forked children and the worker allocator's own
        # SQLAlchemy engine must see the same database.
        "TEST": {"NAME": str(WORK_DIR / "test_default.sqlite3")},
        # Forked children write concurrently: wait for the file lock rather than fail.
        "OPTIONS": {"timeout": 60},
    }
}
for _backend, _engine in (
    ("postgresql", "django.db.backends.postgresql"),
    ("mariadb", "django.db.backends.mysql"),
):
    _alias = _server_alias(_backend, _engine)
    if _alias is not None:
        DATABASES[_backend] = _alias
