"""System checks W004 (an app's default_auto_field overriding Snowflake keys) and E012 (a
GenericForeignKey whose object ID column is too narrow), run on throwaway projects both ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNOWFLAKE = "snowflake_db.django.fields.SnowflakeAutoField"
STARTAPP_LINE = '    default_auto_field = "django.db.models.BigAutoField"\n'


def _checks(tmp_path: Path, *, default_auto_field: str = SNOWFLAKE, app_line: str = "",
            object_id: str | None = None) -> list[dict[str, str]]:
    app = tmp_path / "demo"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "apps.py").write_text(
        "from django.apps import AppConfig\n\n\nclass DemoConfig(AppConfig):\n"
        f"{app_line}    name = 'demo'\n"
    )
    models = ["from django.db import models", "", "", "class Order(models.Model):",
              "    total = models.IntegerField(default=0)", ""]
    if object_id is not None:
        models[:1] = ["from django.contrib.contenttypes.fields import GenericForeignKey",
                      "from django.contrib.contenttypes.models import ContentType",
                      "from django.db import models"]
        models += ["", "class Note(models.Model):",
                   "    content_type = models.ForeignKey(ContentType, models.CASCADE)",
                   f"    object_id = models.{object_id}()",
                   "    target = GenericForeignKey('content_type', 'object_id')", ""]
    (app / "models.py").write_text("\n".join(models))
    result = subprocess.run(
        [sys.executable, "-m", "tests.django.check_scenario", str(tmp_path), default_auto_field],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    messages: list[dict[str, str]] = json.loads(result.stdout.strip().splitlines()[-1])
    return messages


def test_w004_names_the_app_its_models_and_the_fix(tmp_path: Path) -> None:
    (message,) = _checks(tmp_path, app_line=STARTAPP_LINE)
    assert message["id"] == "snowflake_db.W004"
    assert "app 'demo' sets default_auto_field = 'django.db.models.BigAutoField'" in message["msg"]
    assert "demo.apps.DemoConfig" in message["msg"] and "Order" in message["msg"]
    assert "Delete the default_auto_field line from demo.apps" in message["hint"]


@pytest.mark.parametrize(
    ("default_auto_field", "app_line"),
    [
        (SNOWFLAKE, ""),  # the fix: no override
        (SNOWFLAKE, f'    default_auto_field = "{SNOWFLAKE}"\n'),
        ("django.db.models.BigAutoField", STARTAPP_LINE),  # Snowflake keys not asked for
    ],
)
def test_w004_silent_on_a_correct_project(
    tmp_path: Path, default_auto_field: str, app_line: str
) -> None:
    assert _checks(tmp_path, default_auto_field=default_auto_field, app_line=app_line) == []


@pytest.mark.parametrize("narrow", ["PositiveIntegerField", "IntegerField"])
def test_e012_generic_foreign_key_with_a_32_bit_object_id(tmp_path: Path, narrow: str) -> None:
    (message,) = _checks(tmp_path, object_id=narrow)
    assert message["id"] == "snowflake_db.E012"
    article = "an" if narrow == "IntegerField" else "a"
    assert f"demo.Note.target stores object IDs in demo.Note.object_id, {article} {narrow}" in (
        message["msg"]
    )
    assert "PositiveBigIntegerField" in message["hint"]


@pytest.mark.parametrize("wide", ["PositiveBigIntegerField", "BigIntegerField", "TextField"])
def test_e012_silent_on_wide_object_ids(tmp_path: Path, wide: str) -> None:
    assert _checks(tmp_path, object_id=wide) == []


def test_e012_silent_without_snowflake_keys(tmp_path: Path) -> None:
    assert _checks(tmp_path, default_auto_field="django.db.models.BigAutoField",
                   object_id="PositiveIntegerField") == []


#: The router E013 compares (a dotted path in SNOWFLAKE_SHARD_ROUTER names it).
SHARD_ROUTER: object = None


def test_e013_shard_router_layout_must_be_the_generators() -> None:
    """The README's Django sharding settings once omitted SNOWFLAKE_DB["LAYOUT"]: check was
    clean and the first create() raised. Now check names the setting and the value to give."""
    from django.conf import settings
    from django.test.utils import override_settings

    from snowflake_db import Layout
    from snowflake_db.django.checks import check_shard_router_layout
    from snowflake_db.django.conf import get_layout
    from snowflake_db.sharding import ShardRouter

    global SHARD_ROUTER  # noqa: PLW0603 - the module attribute the setting names
    sharded = {**get_layout().as_kwargs(), "sequence_bits": 8, "shard_bits": 4}
    SHARD_ROUTER = ShardRouter(["default"], layout=Layout(**sharded))
    path = f"{__name__}.SHARD_ROUTER"
    with override_settings(SNOWFLAKE_SHARD_ROUTER=path):
        (error,) = check_shard_router_layout()
    assert error.id == "snowflake_db.E013"
    assert "SNOWFLAKE_DB['LAYOUT']" in error.msg and "'shard_bits': 4" in error.msg
    assert "'sequence_bits': 8" in error.hint
    fixed = {**settings.SNOWFLAKE_DB, "LAYOUT": sharded}
    fixed.pop("EPOCH", None)
    with override_settings(SNOWFLAKE_SHARD_ROUTER=path, SNOWFLAKE_DB=fixed):
        assert check_shard_router_layout() == []
    with override_settings(SNOWFLAKE_SHARD_ROUTER="tests.django.nowhere.ROUTER"):
        (error,) = check_shard_router_layout()
    assert error.id == "snowflake_db.E013" and "nowhere" in error.msg
    assert check_shard_router_layout() == []  # no SNOWFLAKE_SHARD_ROUTER: nothing to compare
