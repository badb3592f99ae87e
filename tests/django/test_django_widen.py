"""Converting a shop whose migrations build keys from ``DEFAULT_AUTO_FIELD`` at run time (as
django-oscar's do): ``makemigrations`` finds nothing, ``migrate`` refuses with E010 naming the
columns and the step, and ``manage.py snowflake widen`` widens them, dropping and recreating the
PostgreSQL views and materialized views that use them (``follow_scenario``)."""

from __future__ import annotations

from pathlib import Path

from tests.django.scenario_support import django_database, run_step
from tests.plugins.databases import create_database, drop_database


def test_widen_converts_a_shop_with_a_materialized_view_on_postgresql(tmp_path: Path) -> None:
    from tests.django.conftest import _require

    _require("postgresql")
    scratch = create_database("postgresql", tmp_path)
    try:
        database = django_database(scratch.url)
        legacy, converted = (
            run_step("tests.django.follow_scenario", step, tmp_path, "FOLLOW_DATABASE", database)
            for step in ("legacy", "convert")
        )
    finally:
        drop_database(scratch)

    assert legacy["types"]["oldapp_product.id"] == "integer"
    assert converted["makemigrations"][0], converted["makemigrations"]  # "No changes detected"
    refused, said = converted["migrate_before"]
    assert not refused and "snowflake_db.E010" in said
    assert "column oldapp_product.id on database 'default' is integer" in said
    assert "manage.py snowflake widen --database default" in said

    listed = converted["dry_run"][1]
    assert "would widen oldapp_product.id (integer) -> 64-bit; dropped and recreated " \
        "materialized view public.shopx_product_category, view public.shopx_sold" in listed
    widened = converted["widen"][1]
    assert widened.count("\nwidened ") + widened.startswith("widened ") == 3, widened
    assert "materialized view public.shopx_product_category" in widened
    assert converted["widen_again"][1].startswith("every Snowflake column on 'default' is 64-bit")
    migrated, output = converted["migrate"]
    assert migrated, output
    assert "widened oldapp_product_categories.id" in output  # the through key, after migrate
    assert converted["check"] == [True, "System check identified no issues (0 silenced).\n"]

    after = converted["after_widen"]
    assert {column: after["types"][column] for column in legacy["types"]} == dict.fromkeys(
        legacy["types"], "bigint"
    )
    # Nothing lost: the rows, the links and both views' rows are what they were.
    for key in ("counts", "links", "materialized", "sold", "indexes"):
        assert after[key] == legacy[key], key
    assert after["indexes"] == ["shopx_pc_key"]

    new = converted["new_product"]
    assert new > 2**53
    later = converted["after_new_rows"]
    assert later["counts"] == [legacy["counts"][0], legacy["counts"][1] + 1,
                               legacy["counts"][2] + 2]
    assert [new, legacy["materialized"][0][1], "c0"] in later["materialized"]
    assert [new, 10, 1] in later["sold"]
