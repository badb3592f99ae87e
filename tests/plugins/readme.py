"""Set-up for the code blocks of README.md and docs/, which pytest-markdown-docs runs as tests.

Each block runs in its own temporary directory, with the process-wide generator reset before and
after, and the environment restored afterwards. A block that reads ``DATABASE_URL`` or
``CONTROL_URL`` (as the README's examples do, defaulting to a SQLite file for a reader) gets a
fresh PostgreSQL database on the test server (``SNOWFLAKE_TEST_POSTGRES_URL``), dropped after.
Blocks that need Django name ``fixture:django_settings`` or ``fixture:Order`` in their fence. A
block that mentions ``public_id`` gets a fresh public-number key in ``SNOWFLAKE_DB_PUBLIC_ID_KEYS``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import snowflake_db

_ENVIRONMENT = (
    "SNOWFLAKE_WORKER_URL", "SNOWFLAKE_WORKER_ID", "DATABASE_URL", "CONTROL_URL",
    "SNOWFLAKE_DB_PUBLIC_ID_KEYS",
)


def _readme_item(node: pytest.Item) -> bool:
    """A code block of README.md or of the documentation site (docs/)."""
    path = Path(str(node.path))
    return path.suffix == ".md" and (path.name == "README.md" or "docs" in path.parts)


@pytest.fixture(autouse=True)
def _readme_block(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    if not _readme_item(request.node):
        yield
        return
    saved_environment = dict(os.environ)
    saved_directory = os.getcwd()
    for name in _ENVIRONMENT:
        os.environ.pop(name, None)
    os.chdir(tmp_path)
    # Imported here: importing it at plugin load (-p, before conftest.py registers it as a
    # plugin) would keep pytest from rewriting its asserts.
    from .databases import create_database, drop_database

    code: str = getattr(request.node, "code", "")
    database = None
    if "DATABASE_URL" in code or "CONTROL_URL" in code:
        database = create_database("postgresql", tmp_path)
        url = database.url.render_as_string(hide_password=False)
        os.environ["DATABASE_URL"] = os.environ["CONTROL_URL"] = url
    snowflake_db.reset()
    if "public_id" in code:
        # A key of the block's own, as a deployment sets it (never one written in the code).
        from snowflake_db.public_ids import ENV_VAR, configure_public_ids, generate_key

        configure_public_ids(None)
        os.environ[ENV_VAR] = generate_key()
    if "sqlmodel" in sys.modules:
        # SQLModel keeps one global MetaData; a ``continuation`` block runs the block before it
        # again, which would define its tables twice.
        sys.modules["sqlmodel"].SQLModel.metadata.clear()
    try:
        yield
    finally:
        snowflake_db.reset()  # releases a leased worker ID before its database is dropped
        os.chdir(saved_directory)
        os.environ.clear()
        os.environ.update(saved_environment)
        if database is not None:
            drop_database(database)


@pytest.fixture
def django_settings() -> Any:
    """Django set up with the test project's settings (as ``tests/django`` does)."""
    from django.conf import settings

    if not settings.configured:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_project.settings")
    import django

    django.setup()
    return settings


@pytest.fixture
def Order(django_settings: Any) -> Any:  # noqa: N802 - the README block's global of that name
    """The test project's ``Order`` model, for README blocks that refer to one."""
    from tests.django_project.shop.models import Order

    return Order
