"""What a user installs is what was tested: build the sdist and the wheel (the wheel from the
sdist, as ``python -m build`` does), install the wheel into a fresh venv and use it there.

Offline: no build isolation (``build`` and ``hatchling`` come from the test extra) and the
wheel is installed with ``--no-index --no-deps`` (the core has no dependencies). Django for the
migration check comes from the test venv, placed on ``sys.path`` *after* the fresh venv's
site-packages, so ``snowflake_db`` itself is imported from the installed wheel.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tarfile
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from .packaging_support import install, run

# One group: the sdist and wheel are built once, not once per pytest-xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out)
    return out


def test_sdist_carries_the_sources_tests_and_demo(dist: Path) -> None:
    [sdist] = dist.glob("snowflake_db-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for expected in ("pyproject.toml", "README.md", "snowflake_db/py.typed",
                     "snowflake_db/django/migrations/0001_initial.py", "tests/conftest.py",
                     "example_project/__main__.py", "benchmarks/bench_generate.py"):
        assert expected in names, expected


def test_wheel_installs_into_a_fresh_venv_and_works(dist: Path, tmp_path: Path) -> None:
    [wheel] = dist.glob("snowflake_db-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "snowflake_db/py.typed" in names
    assert "snowflake_db/django/migrations/0001_initial.py" in names
    assert not any(name.startswith(("tests/", "example_project/")) for name in names)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    fresh_python = venv / "bin" / "python"
    install(fresh_python, "--no-index", "--no-deps", wheel)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "SNOWFLAKE_WORKER_ID",
                          "SNOWFLAKE_WORKER_URL")}

    # The console script and the core, with nothing else installed.
    assert run(venv / "bin" / "snowflake-db", "--version", env=env).strip() == (
        f"snowflake-db {version('snowflake-db')}"
    )
    ids = run(venv / "bin" / "snowflake-db", "generate", "-n", "3", "--worker-id", "2", env=env)
    assert len(set(ids.split())) == 3
    site = run(fresh_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                env=env).strip()
    smoke = f"""
import snowflake_db, sys
from importlib.resources import files
assert snowflake_db.__file__.startswith({site!r}), snowflake_db.__file__
assert files("snowflake_db").joinpath("py.typed").is_file()
snowflake_db.configure(worker_id=1)
assert snowflake_db.Layout().decode(snowflake_db.snowflake_default()).worker_id == 1
# Django from the test venv, after this venv's own site-packages: the app's shipped migration
# creates the worker tables.
sys.path.append({sysconfig.get_paths()["purelib"]!r})
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["snowflake_db.django"],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3",
                             "NAME": {str(tmp_path / "control.sqlite3")!r}}}}},
    SNOWFLAKE_DB={{"WORKER_SOURCE": "manual"}},
)
django.setup()
from django.core.management import call_command
from django.db import connection
call_command("migrate", "snowflake_db", verbosity=0)
tables = set(connection.introspection.table_names())
assert {{"snowflake_worker_slots", "snowflake_worker_registrations"}} <= tables, tables
assert snowflake_db.__file__.startswith({site!r})
print("ok")
"""
    assert run(fresh_python, "-c", smoke, cwd=tmp_path, env=env).strip() == "ok"
