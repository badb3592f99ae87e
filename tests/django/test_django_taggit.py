"""django-taggit on Snowflake-keyed models through snowflake_db.django.taggit's through model:
taggit's own behaviours on every backend, and no clamping on MariaDB in either sql_mode."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from taggit.models import Tag
from taggit.models import TaggedItem as TaggitItem

from tests.django.conftest import backends
from tests.django_project.tagged.models import Article, Product, TaggedItem

#: The largest value a 32-bit signed column holds (MariaDB without strict mode clamps to it).
INT32_MAX = 2**31 - 1


def _stored_object_ids(alias: str) -> list[int]:
    """The object IDs as the database holds them (read with SQL, not through the model)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT object_id FROM {TaggedItem._meta.db_table} ORDER BY object_id")
        return [int(row[0]) for row in cursor.fetchall()]


def test_tags_are_added_read_and_stored_with_the_full_key(backend: str) -> None:
    lamp = Product.objects.create(name="lamp")
    assert lamp.pk > 2**53  # far beyond 32 bits (and JavaScript's exact integers)
    lamp.tags.add("red", "metal")
    lamp.tags.add("red")  # already there: no second row
    assert sorted(lamp.tags.names()) == ["metal", "red"]
    assert sorted(Product.objects.get(pk=lamp.pk).tags.slugs()) == ["metal", "red"]
    assert _stored_object_ids(backend) == [lamp.pk, lamp.pk]
    lamp.tags.remove("metal")
    assert list(lamp.tags.names()) == ["red"]
    lamp.tags.set(["blue"])
    assert list(lamp.tags.names()) == ["blue"]
    lamp.tags.clear()
    assert list(lamp.tags.names()) == []


def test_filter_by_tag_most_common_and_similar_objects(backend: str) -> None:
    lamp, chair, desk = (Product.objects.create(name=name) for name in ("lamp", "chair", "desk"))
    lamp.tags.add("red", "metal", "light")
    chair.tags.add("red", "wood")
    desk.tags.add("red", "wood", "metal")
    news = Article.objects.create(title="news")
    news.tags.add("red")  # another model, same tag

    assert set(Product.objects.filter(tags__name__in=["wood"])) == {chair, desk}
    assert set(Product.objects.filter(tags__name="metal")) == {lamp, desk}
    assert set(Article.objects.filter(tags__name="red").values_list("title", flat=True)) == {
        "news"
    }
    common = {tag.name: tag.num_times for tag in Product.tags.most_common()}
    assert common == {"red": 3, "metal": 2, "wood": 2, "light": 1}
    assert {tag.name for tag in Product.tags.most_common(min_count=2)} == {"red", "metal", "wood"}
    # A generic through model spans models: the article shares one tag with the desk.
    similar = desk.tags.similar_objects()
    assert set(similar[:2]) == {lamp, chair} and similar[2:] == [news]
    assert [obj.similar_tags for obj in similar] == [2, 2, 1]
    assert lamp.tags.similar_objects()[0] == desk  # red and metal: 2 shared, chair only 1
    assert sorted(Tag.objects.filter(name__in=desk.tags.names()).values_list("name", flat=True)) \
        == ["metal", "red", "wood"]


@pytest.fixture(params=["STRICT_TRANS_TABLES", ""], ids=["strict", "non-strict"])
def mariadb_sql_mode(request: pytest.FixtureRequest, backend: str) -> Iterator[str]:
    """The MariaDB session in the sql_mode of the parameter, put back afterwards."""
    with connections[backend].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.sql_mode")
        (previous,) = cursor.fetchone()
        cursor.execute("SET SESSION sql_mode = %s", [request.param])
    yield request.param
    with connections[backend].cursor() as cursor:
        cursor.execute("SET SESSION sql_mode = %s", [previous])


@backends("mariadb")
def test_mariadb_never_clamps_object_ids(backend: str, mariadb_sql_mode: str) -> None:
    """taggit's own TaggedItem stores every key as 2147483647 without strict mode."""
    products = [Product.objects.create(name=f"p{index}") for index in range(3)]
    for product in products:
        product.tags.add("sale")
    assert _stored_object_ids(backend) == sorted(product.pk for product in products)
    assert min(_stored_object_ids(backend)) > INT32_MAX
    assert set(Product.objects.filter(tags__name="sale")) == set(products)
    assert [list(product.tags.names()) for product in products] == [["sale"]] * 3


def _tag_names() -> list[str]:
    return sorted(Tag.objects.values_list("name", flat=True))


def test_remove_orphaned_tags_keeps_the_tags_used_through_a_snowflake_model(backend: str) -> None:
    """taggit's remove_orphaned_tags deletes every tag that only a SnowflakeTaggedItemBase model
    uses, and the objects lose them (cascade); snowflake remove-orphaned-tags removes only the
    tags no row refers to, whichever model refers to them."""
    lamp = Product.objects.create(name="lamp")
    lamp.tags.add("red", "metal")
    Article.objects.create(title="news").tags.add("metal")
    Tag.objects.create(name="stale")
    # A tag used only through taggit's own TaggedItem (a model with small keys: a ContentType).
    kind = ContentType.objects.get_for_model(ContentType)
    TaggitItem.objects.create(tag=Tag.objects.create(name="legacy"), content_type=kind,
                              object_id=kind.pk)

    out = io.StringIO()
    call_command("snowflake", "remove-orphaned-tags", "--dry-run", stdout=out)
    assert out.getvalue() == "would remove 1 orphaned taggit.Tag: stale\n"
    assert _tag_names() == ["legacy", "metal", "red", "stale"]
    call_command("snowflake", "remove-orphaned-tags", stdout=out)
    assert out.getvalue().endswith("removed 1 orphaned taggit.Tag: stale\n")
    assert _tag_names() == ["legacy", "metal", "red"]
    assert sorted(lamp.tags.names()) == ["metal", "red"]

    # taggit's own command, for comparison: it deletes the tags in use and the rows using them.
    call_command("remove_orphaned_tags", stdout=io.StringIO())
    assert _tag_names() == ["legacy"]
    assert list(lamp.tags.names()) == [] and TaggedItem.objects.count() == 0


@backends("sqlite")  # its transaction.atomic() is on "default": the test router cannot move it
def test_taggits_deduplicate_tags_drops_the_rows_of_a_snowflake_model(backend: str) -> None:
    """What the docs warn of: taggit's deduplicate_tags merges only its own TaggedItem rows and
    deletes each duplicate tag, with the rows of every other through model (cascade)."""
    lamp, desk = (Product.objects.create(name=name) for name in ("lamp", "desk"))
    red, upper = Tag.objects.create(name="red", slug="red"), Tag.objects.create(name="Red",
                                                                                slug="red-2")
    TaggedItem.objects.create(tag=red, content_object=lamp)
    TaggedItem.objects.create(tag=upper, content_object=desk)
    with override_settings(TAGGIT_CASE_INSENSITIVE=True):
        call_command("deduplicate_tags", stdout=io.StringIO())
    assert _tag_names() == ["red"]
    assert list(lamp.tags.names()) == ["red"] and list(desk.tags.names()) == []


def test_without_django_taggit_the_import_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['taggit'] = None\n"
        "try:\n    import snowflake_db.django.taggit\n"
        "except Exception as error:\n    print(type(error).__name__, error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True, cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.startswith("MissingExtraError ")
    assert "django-taggit" in result.stdout and "snowflake-db[taggit]" in result.stdout
