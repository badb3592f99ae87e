"""Converting a project built with 32-bit ``AutoField`` keys, filled with rows, to Snowflake keys
by the README's path: ``makemigrations`` then a plain ``migrate`` (system checks on).

Each step runs in its own process (``convert_scenario``) on a fresh database per backend. The
shop has a foreign key, an auto-created many-to-many table, a ``through=`` model and generic
relations; a many-to-many field added after the switch gets its table under Snowflake keys.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.django.scenario_support import django_database, run_step
from tests.plugins.databases import create_database, drop_database

#: What MariaDB's INSERT IGNORE makes of an out-of-range key in a 32-bit column.
CLAMPED = 2**31 - 1
SNOWFLAKE_MIN = 2**53  # every key the generator makes today is far above a serial value


def _steps(backend: str, tmp_path: Path, *steps: str) -> list[dict[str, Any]]:
    from tests.django.conftest import BACKEND_ALIASES, _require

    _require(BACKEND_ALIASES[backend])
    scratch = create_database(backend, tmp_path)
    try:
        database = django_database(scratch.url)
        return [
            run_step("tests.django.convert_scenario", step, tmp_path, "CONVERT_DATABASE", database)
            for step in steps
        ]
    finally:
        drop_database(scratch)


def _is_snowflake(key: int) -> bool:
    return SNOWFLAKE_MIN < key < 2**63


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_autofield_project_converts_with_makemigrations_and_a_plain_migrate(
    backend: str, tmp_path: Path
) -> None:
    legacy, converted, later = _steps(backend, tmp_path, "legacy", "convert", "later")

    made, made_output = converted["makemigrations"]
    assert made and "Alter field id on order" in made_output
    migrated, migrate_output = converted["migrate"]
    assert migrated, migrate_output  # not blocked by snowflake_db.E010
    assert "snowflake_db.E010" not in migrate_output
    if backend != "sqlite":
        # The checks before migrating say once, as information, what migrate widens (every
        # key and foreign key of the app), without a warning or an error about its own work;
        # the auto-created many-to-many key (which Django never alters) is widened after it.
        assert migrate_output.count("(snowflake_db.") == 1, migrate_output
        assert "(snowflake_db.I010) `migrate` widens 11 " in migrate_output, migrate_output
        assert "WARNINGS:" not in migrate_output and "ERRORS:" not in migrate_output
        [info] = [line for line in migrate_output.splitlines() if "snowflake_db.I010" in line]
        groups = dict(re.findall(r"by ([^:;]+): ([^;]+)", info))
        assert groups["snowflake_db after migrating (auto-created many-to-many keys)"] == (
            "shop_order_products.id"
        )
        named = {name for names in groups.values() for name in names.split(", ")}
        assert named == set(converted["types"]) - {"shop_note.content_type_id"}, info
        assert "widened shop_order_products.id" in migrate_output
    for step in (converted, later):
        assert step["check"] == [True, "System check identified no issues (0 silenced).\n"]
        assert step["makemigrations_check"][0] is True
    if backend != "sqlite":
        wide = {name: kind for name, kind in converted["types"].items()
                if name != "shop_note.content_type_id"}
        assert set(wide.values()) == {"BigIntegerField"}, wide

    # Old rows keep their keys; new rows get Snowflake keys.
    assert converted["old_orders"] == legacy["orders"]
    assert converted["old_products"] == [1, 2, 3]
    new_keys = [converted["customer"], converted["order"], *converted["new_products"]]
    assert all(_is_snowflake(key) for key in new_keys)

    # Many-to-many rows, old and new mixed on both sides: every link there, none clamped.
    order, (p_new1, p_new2) = converted["order"], converted["new_products"]
    old_o1, old_o2 = legacy["orders"]
    p1, p2, p3 = converted["old_products"]
    expected_links = sorted(
        legacy["products"]
        + [[order, p1], [order, p_new1], [order, p_new2], [old_o1, p_new1], [old_o1, p_new2]]
        + [[order, p2]]
    )
    assert converted["products"] == expected_links
    through_keys = [key for (key,) in converted["through_keys"]]
    assert through_keys[:3] == [key for (key,) in legacy["through_keys"]]
    assert len(through_keys) == len(expected_links)
    assert all(_is_snowflake(key) for key in through_keys[3:]) and CLAMPED not in through_keys
    assert converted["gifts"] == sorted(legacy["gifts"] + [[order, p1], [old_o2, p_new1]])
    # Generic relations reach old and new rows.
    assert converted["note_targets"] == sorted(
        [["Order", old_o1], ["Order", order], ["Customer", converted["customer"]]]
    )

    # A many-to-many table made after the switch: Snowflake keys from its first row.
    later_order, (later_p1, later_p2) = later["order"], later["new_products"]
    assert later["coupons"] == sorted(
        [[later_order, p1], [later_order, later_p2], [old_o2, later_p1], [old_o2, p3]]
    )
    assert all(_is_snowflake(key) for key in later["coupon_keys"])


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_converted_code_before_migrate_fails_loudly_and_writes_nothing(
    backend: str, tmp_path: Path
) -> None:
    """Deployed before `migrate`: every write of a Snowflake key into the 32-bit tables fails.
    On MariaDB, where add() and ignore_conflicts use INSERT IGNORE (which clamps the key and
    drops the next row even in strict mode), snowflake_db refuses the write itself."""
    legacy, premature = _steps(backend, tmp_path, "legacy", "premature")
    error = "NarrowColumnError" if backend == "mariadb" else "DataError"
    assert premature["create"] == error
    assert premature["add"] == error
    assert premature["bulk_ignore"] == error
    assert premature["product_keys"] == [1, 2, 3]
    assert premature["through_keys"] == [key for (key,) in legacy["through_keys"]]
    ok, output = premature["check"]
    assert not ok and "snowflake_db.E010" in output
    assert "shop_order_products.id" in output and "makemigrations" in output
