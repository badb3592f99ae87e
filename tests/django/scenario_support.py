"""Running one step of a Django project scenario in its own process.

A changed ``DEFAULT_AUTO_FIELD`` or models module only takes effect when Django is set up again,
so each step of a scenario (``switch_scenario``, ``convert_scenario``) is a fresh interpreter
that prints its result as JSON on its last line.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parents[2]


def django_database(url: URL) -> dict[str, object]:
    """The Django ``DATABASES`` entry for a scratch database's SQLAlchemy URL."""
    if url.get_backend_name() == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": url.database}
    engine = (
        "django.db.backends.postgresql"
        if url.get_backend_name() == "postgresql"
        else "django.db.backends.mysql"
    )
    return {
        "ENGINE": engine,
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }


def run_step(
    module: str, step: str, workdir: Path, database_env: str, database: dict[str, object]
) -> dict[str, Any]:
    """``python -m module STEP WORKDIR`` with the database as JSON in ``database_env``."""
    env = {**os.environ, database_env: json.dumps(database)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-m", module, step, str(workdir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def manage(*args: str, **options: Any) -> tuple[bool, str]:
    """``manage.py ARGS`` as a user runs it: system checks on (call_command skips them)."""
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    out = io.StringIO()
    if args[0] != "check":
        options["skip_checks"] = False
    try:
        call_command(*args, stdout=out, stderr=out, **options)
    except SystemCheckError as error:
        return False, f"{out.getvalue()}{error}"
    except SystemExit as exit_:
        return exit_.code in (0, None), out.getvalue()
    return True, out.getvalue()


def write_app(workdir: Path, name: str, models: str) -> Path:
    """An app package ``name`` under ``workdir`` with ``models`` and an empty migrations
    package; its directory."""
    app = workdir / name
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(models)
    return app
