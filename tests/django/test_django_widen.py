"""Converting a shop whose migrations build keys from ``DEFAULT_AUTO_FIELD`` at run time (as
django-oscar's do), with a model moved between apps by ``SeparateDatabaseAndState``:
``makemigrations`` finds nothing, ``migrate`` refuses with E010 naming the columns and the step,
and ``manage.py snowflake widen`` widens them (``follow_scenario``). On PostgreSQL it drops and
recreates the views and the materialized view that use them; MariaDB's views read the new type
by themselves; on SQLite every integer column holds 64 bits already and nothing is widened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.django.scenario_support import django_database, run_step
from tests.plugins.databases import create_database, drop_database

#: Every key the generator makes today is far above a serial value.
SNOWFLAKE_MIN = 2**53

#: The keys widened with their foreign keys, and the dependent views PostgreSQL recreates.
WIDENED = {
    "shopx_category.id": True, "shopx_line.id": False, "oldapp_product.id": True,
    "oldapp_review.id": False,
}
VIEWS = "; dropped and recreated materialized view public.shopx_product_category, view " \
    "public.shopx_sold"


def _steps(backend: str, tmp_path: Path) -> list[dict[str, Any]]:
    from tests.django.conftest import BACKEND_ALIASES, _require

    _require(BACKEND_ALIASES[backend])
    scratch = create_database(backend, tmp_path)
    try:
        database = django_database(scratch.url)
        return [
            run_step("tests.django.follow_scenario", step, tmp_path, "FOLLOW_DATABASE", database)
            for step in ("legacy", "move", "convert")
        ]
    finally:
        drop_database(scratch)


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_widen_converts_a_shop_with_views_and_a_model_moved_between_apps(
    backend: str, tmp_path: Path
) -> None:
    legacy, moved, converted = _steps(backend, tmp_path)
    narrow, wide = {"postgresql": ("integer", "bigint"), "mariadb": ("int", "bigint"),
                    "sqlite": ("integer", "integer")}[backend]

    # The move, as Django's SeparateDatabaseAndState makes it: state only, the table kept.
    assert moved["migrate"][0] and "Applying oldapp.0002_move_product... OK" in \
        moved["migrate"][1]
    assert moved["makemigrations"] == [True, "No changes detected\n"]
    assert moved["product_model"] == "shopx.Product"
    before = moved["state"]
    assert before["counts"] == [legacy["counts"][0], *(n + 1 for n in legacy["counts"][1:])]
    assert before["types"] == dict.fromkeys(legacy["types"], narrow) == legacy["types"]

    assert converted["makemigrations"] == [True, "No changes detected\n"]
    refused, said = converted["migrate_before"]
    if backend == "sqlite":
        assert refused and "snowflake_db.E010" not in said, said
        for step in ("dry_run", "widen", "widen_again"):
            assert converted[step] == [True, "every Snowflake column on 'default' is 64-bit: "
                                       "SQLite's integer columns all hold 64 bits\n"], step
    else:
        assert not refused and "snowflake_db.E010" in said
        for key in ("oldapp_product.id", "oldapp_review.product_id", "shopx_line.product_id",
                    "oldapp_product_categories.product_id"):  # the moved model's, with its FKs
            assert f"column {key} on database 'default' is {narrow}" in said, key
        assert "manage.py snowflake widen --database default" in said
        lines = [f"{key} ({narrow}) -> 64-bit{VIEWS if views and backend == 'postgresql' else ''}"
                 for key, views in WIDENED.items()]
        assert converted["dry_run"] == [True, "".join(f"would widen {x}\n" for x in lines)]
        assert converted["widen"] == [True, "".join(f"widened {x}\n" for x in lines)]
        assert converted["widen_again"][1].startswith("every Snowflake column on 'default' is "
                                                      "64-bit (or a pending migration widens it)")
    migrated, output = converted["migrate"]
    assert migrated, output
    if backend != "sqlite":  # the through key, after migrate
        assert f"widened oldapp_product_categories.id ({narrow})" in output
    assert converted["check"] == [True, "System check identified no issues (0 silenced).\n"]

    after = converted["after_widen"]
    assert after["types"] == dict.fromkeys(legacy["types"], wide)  # the views' columns too
    # Nothing lost: every row, link, foreign key constraint and view row is what it was.
    for key in ("counts", "links", "reviews", "categories", "in_view", "sold", "indexes",
                "foreign_keys"):
        assert after[key] == before[key], key
    assert len(after["foreign_keys"]) == 4
    assert after["indexes"] == (["shopx_pc_key"] if backend == "postgresql" else [])

    # New rows get Snowflake keys and link with old ones through the moved model's relations.
    new, category = converted["new_product"], converted["new_category"]
    assert new > SNOWFLAKE_MIN and category > SNOWFLAKE_MIN
    later = converted["after_new_rows"]
    assert later["counts"] == [before["counts"][0] + 1, before["counts"][1] + 1,
                               before["counts"][2] + 2, before["counts"][3] + 1]
    assert [new, 10] in later["links"] and [new, 5] in later["reviews"]
    first, first_category = before["categories"][0]
    assert [new, first_category] in later["categories"] and [first, category] in \
        later["categories"]
    assert [new, first_category, "c0"] in later["in_view"]
    assert [first, category, "cnew"] in later["in_view"]
    assert [new, 10, 1] in later["sold"] and [first, 21, 2] in later["sold"]
