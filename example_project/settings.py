"""Django settings of the demo shop: a control database and N shard databases from URLs.

``SHOP_CONTROL_URL`` (the worker table) and ``SHOP_SHARD_URLS`` (comma-separated) are set by
``python -m example_project`` from its arguments; the aliases are ``default`` (control) and
``shard0`` .. ``shardN-1``. URLs: ``sqlite:///path``, ``postgresql://user:pw@host:port/db``,
``mysql://user:pw@host:port/db`` (SQLAlchemy driver suffixes such as ``+psycopg`` are ignored).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

SECRET_KEY = "demo-only-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["snowflake_db.django", "example_project.shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for a URL (just the parts the demo needs)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": unquote(parts.path[1:]),
            # WAL and IMMEDIATE transactions let several processes write without "locked" errors.
            "OPTIONS": {"timeout": 60, "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        }
    postgres, mysql = "django.db.backends.postgresql", "django.db.backends.mysql"
    engines = {"postgresql": postgres, "postgres": postgres, "mysql": mysql, "mariadb": mysql}
    if scheme not in engines:
        raise ValueError(f"unsupported database URL scheme {parts.scheme!r} in {url!r}")
    if engines[scheme].endswith("mysql"):
        import pymysql

        pymysql.install_as_MySQLdb()  # Django's MySQL backend imports MySQLdb
    return {
        "ENGINE": engines[scheme],
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": {"connect_timeout": 5},
    }


_control = os.environ.get("SHOP_CONTROL_URL", "sqlite:///example_project/var/control.sqlite3")
_shards = os.environ.get("SHOP_SHARD_URLS", "sqlite:///example_project/var/shard0.sqlite3")
SHARD_ALIASES = [f"shard{i}" for i, _ in enumerate(_shards.replace(",", " ").split())]
DATABASES = {"default": database_from_url(_control)} | {
    alias: database_from_url(url)
    for alias, url in zip(SHARD_ALIASES, _shards.replace(",", " ").split(), strict=True)
}
DATABASE_ROUTERS = [
    "snowflake_db.django.routers.ControlDatabaseRouter",  # worker table: control only
    "snowflake_db.django.sharding.ShardedDatabaseRouter",  # shop models: their shard
]
SNOWFLAKE_SHARD_ROUTER = "example_project.shop.sharding.router"
SNOWFLAKE_DB = {
    "WORKER_SOURCE": "table",
    "CONTROL_DATABASE": "default",
    "LAYOUT": {"time_bits": 41, "worker_bits": 10, "sequence_bits": 8, "shard_bits": 4},
}
