"""``PublicId``'s system checks: keys missing (W020) or unusable (E020) and a ``field=`` that
names no integer key (E021) reported by ``manage.py check`` rather than by the first number
shown, on throwaway projects run as a user runs them (``django-admin check``, its exit status
and output) and on the test project's own models."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.checks import run_checks

from snowflake_db.public_ids import ENV_VAR, configure_public_ids, generate_key

ROOT = Path(__file__).resolve().parents[2]

NO_ISSUES = "System check identified no issues (0 silenced)."


def _check(
    tmp_path: Path,
    *,
    field: str = 'PublicId(namespace="orders")',
    snowflake_db: str = '{"WORKER_SOURCE": "manual"}',
    env_keys: str | None = None,
    without_cryptography: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``django-admin check`` on a project whose ``demo.Order`` has ``public_id = FIELD``."""
    app = tmp_path / "demo"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(
        "from django.db import models\n\n"
        "from snowflake_db.django.public_ids import PublicId\n\n\n"
        "class Order(models.Model):\n"
        "    note = models.CharField(max_length=20, default='')\n"
        f"    public_id = {field}\n"
    )
    (tmp_path / "demo_settings.py").write_text(
        'INSTALLED_APPS = ["snowflake_db.django", "demo"]\n'
        'DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}\n'
        'DEFAULT_AUTO_FIELD = "snowflake_db.django.fields.SnowflakeAutoField"\n'
        f"SNOWFLAKE_DB = {snowflake_db}\n"
    )
    path = [str(tmp_path), str(ROOT)]
    if without_cryptography:
        # Shadows the installed package, as if the public-ids extra were not installed.
        blocker = tmp_path / "blocked" / "cryptography"
        blocker.mkdir(parents=True)
        (blocker / "__init__.py").write_text("raise ImportError('cryptography is blocked')\n")
        path.insert(0, str(blocker.parent))
    env = {name: value for name, value in os.environ.items()
           if name != ENV_VAR and not name.startswith(("DJANGO_", "SNOWFLAKE_"))}
    env.update(DJANGO_SETTINGS_MODULE="demo_settings", PYTHONPATH=os.pathsep.join(path))
    if env_keys is not None:
        env[ENV_VAR] = env_keys
    return subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def _ids(result: subprocess.CompletedProcess[str]) -> list[str]:
    output = result.stdout + result.stderr
    return sorted(word.strip("()") for word in output.split() if word.startswith("(snowflake_db."))


def test_w020_no_keys_is_reported_by_check_without_blocking_it(tmp_path: Path) -> None:
    result = _check(tmp_path)
    assert result.returncode == 0, result.stderr
    assert _ids(result) == ["snowflake_db.W020"], result.stderr
    assert "demo.Order.public_id: (snowflake_db.W020) no public-ID keys are configured for " \
        "namespace 'orders'" in result.stderr
    assert 'SNOWFLAKE_DB["PUBLIC_ID_KEYS"]' in result.stderr and ENV_VAR in result.stderr


@pytest.mark.parametrize("source", ["setting", "environment"])
def test_configured_keys_leave_check_clean(tmp_path: Path, source: str) -> None:
    key = generate_key()
    if source == "setting":
        result = _check(tmp_path, snowflake_db=f'{{"WORKER_SOURCE": "manual", '
                                               f'"PUBLIC_ID_KEYS": {key!r}}}')
    else:
        result = _check(tmp_path, env_keys=key)
    assert (result.returncode, result.stdout.strip(), _ids(result)) == (0, NO_ISSUES, []), (
        result.stderr
    )


def test_e020_invalid_keys_in_the_environment_stop_check(tmp_path: Path) -> None:
    result = _check(tmp_path, env_keys="1:not*base64")
    assert result.returncode == 1 and _ids(result) == ["snowflake_db.E020"], result.stderr
    assert "cannot encode public numbers of namespace 'orders': environment variable " \
        f"{ENV_VAR}: key version 1 is not URL-safe base64" in result.stderr


def test_e020_without_the_public_ids_extra(tmp_path: Path) -> None:
    result = _check(tmp_path, env_keys=generate_key(), without_cryptography=True)
    assert result.returncode == 1 and _ids(result) == ["snowflake_db.E020"], result.stderr
    assert "cryptography" in result.stderr and "public-ids" in result.stderr


def test_invalid_setting_is_e001_alone(tmp_path: Path) -> None:
    """A bad ``PUBLIC_ID_KEYS`` is E001's to report: no W020 saying the keys are missing."""
    result = _check(tmp_path, snowflake_db='{"WORKER_SOURCE": "manual", "PUBLIC_ID_KEYS": "x"}')
    assert result.returncode == 1 and _ids(result) == ["snowflake_db.E001"], result.stderr


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ('PublicId(namespace="orders", field="number")',
         "field='number' names no field of demo.Order"),
        ('PublicId(namespace="orders", field="note")',
         "field='note' names demo.Order.note, a CharField: a public number encodes an integer key"),
    ],
)
def test_e021_field_must_name_an_integer_key(tmp_path: Path, field: str, message: str) -> None:
    result = _check(tmp_path, field=field, env_keys=generate_key())
    assert result.returncode == 1 and _ids(result) == ["snowflake_db.E021"], result.stderr
    assert f"demo.Order.public_id: (snowflake_db.E021) {message}" in result.stderr


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV_VAR, raising=False)
    configure_public_ids(None)
    yield
    configure_public_ids(None)


PUBLIC_ID_CHECKS = {"snowflake_db.W020", "snowflake_db.E020", "snowflake_db.E021"}


def test_the_test_projects_public_ids_are_checked(no_keys: None) -> None:
    """The test project's two ``PublicId`` fields (one on the primary key, one on a
    ``SnowflakeField``), through the same registry ``manage.py check`` runs (the project's
    other findings, such as its E014 example, are not this test's)."""

    def reported() -> list[tuple[str, str]]:
        return sorted(
            (message.id or "", str(message.obj))
            for message in run_checks(tags=["models"])
            if message.id in PUBLIC_ID_CHECKS
        )

    assert reported() == [
        ("snowflake_db.W020", "shop.Invoice.public_number"),
        ("snowflake_db.W020", "shop.Order.public_id"),
    ]
    configure_public_ids(generate_key())
    assert reported() == []
