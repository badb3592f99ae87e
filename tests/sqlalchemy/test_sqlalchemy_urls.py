"""``engine_url``: a platform's ``DATABASE_URL`` works in the application's own ``create_engine``,
and the README's SQLAlchemy quick start runs as written with one, on PostgreSQL and MariaDB."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError

from snowflake_db.errors import InvalidArgumentError, InvalidArgumentTypeError
from snowflake_db.sqlalchemy import engine_url

from ..plugins.databases import ScratchDatabase

REPO = Path(__file__).resolve().parents[2]

#: (backend of the scratch database, scheme as platforms write it, driver engine_url names)
FORMS = [
    ("postgresql", "postgres", "postgresql+psycopg"),
    ("postgresql", "postgresql", "postgresql+psycopg"),
    ("mariadb", "mysql", "mysql+pymysql"),
    ("mariadb", "mariadb", "mariadb+pymysql"),
]


def _plain_url(database: ScratchDatabase, scheme: str) -> str:
    """The scratch database's URL as a platform's DATABASE_URL spells it (no driver)."""
    return database.url.set(drivername=scheme).render_as_string(hide_password=False)


def _quick_start_block() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### SQLAlchemy quick start", 1)[1].split("\n### ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(code)


@pytest.mark.parametrize(("backend", "scheme", "drivername"), FORMS)
def test_platform_urls_open_the_database(
    backend: str, scheme: str, drivername: str, database_factory: Any
) -> None:
    database: ScratchDatabase = database_factory(backend)
    plain = _plain_url(database, scheme)
    url = engine_url(plain)
    assert url.drivername == drivername
    assert (url.host, url.port, url.database) == (database.url.host, database.url.port,
                                                  database.url.database)
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
    assert engine_url(make_url(plain)) == url  # a URL object maps the same


def test_create_engine_alone_refuses_postgres_urls() -> None:
    """Why the helper exists (no connection is attempted)."""
    with pytest.raises(NoSuchModuleError):
        create_engine("postgres://app@127.0.0.1:1/shop")


def test_sqlite_and_named_drivers_are_kept() -> None:
    assert engine_url("sqlite:///shop.db") == make_url("sqlite:///shop.db")
    assert engine_url(" postgresql+psycopg2://u@h/db ").drivername == "postgresql+psycopg2"
    assert engine_url("mysql+pymysql://u@h/db").drivername == "mysql+pymysql"


@pytest.mark.parametrize(("url", "expected"), [
    ("oracle://scott:tiger@h/db", "oracle://scott:***@h/db: unknown database 'oracle'"),
    ("postgresql+nosuchdriver://u:pw@h/db", "SQLAlchemy knows no postgresql driver"),
    ("not a url", "'not a url' is not a database URL; use postgresql://"),
    ("::bad::@secret", "'<unparsable URL>' is not a database URL"),
])
def test_bad_urls_name_the_url_without_its_password(url: str, expected: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        engine_url(url)
    assert expected in str(caught.value)
    assert "tiger" not in str(caught.value) and "secret" not in str(caught.value)


def test_wrong_type() -> None:
    with pytest.raises(InvalidArgumentTypeError, match="got int"):
        engine_url(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("backend", "scheme"), [("postgresql", "postgres"),
                                                 ("mariadb", "mysql")])
def test_readme_quick_start_runs_with_a_platform_url(
    backend: str, scheme: str, database_factory: Any, tmp_path: Path
) -> None:
    database: ScratchDatabase = database_factory(backend)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFLAKE_")}
    env.update(DATABASE_URL=_plain_url(database, scheme), PYTHONPATH=str(REPO))
    (tmp_path / "quick_start.py").write_text(_quick_start_block() + "\nprint(order.id)\n")
    result = subprocess.run([sys.executable, "quick_start.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 2**53
    engine = create_engine(database.url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT id, total_cents FROM orders")).all()
    finally:
        engine.dispose()
    assert rows == [(int(result.stdout), 1250)]
