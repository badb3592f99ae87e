"""django-taggit on Snowflake-keyed models: a through model base with a 64-bit ``object_id``.

taggit's own ``TaggedItem`` stores the tagged object's key in an ``IntegerField``: a Snowflake
key fails with "integer out of range" on PostgreSQL, is clamped to 2147483647 by MariaDB
without strict mode, and since Django 5.0 a read such as ``tags.names()`` compares the key with
that field and returns nothing without a query. taggit lets a project supply its own through
model (https://django-taggit.readthedocs.io/en/latest/custom_tagging.html); subclass
:class:`SnowflakeTaggedItemBase` in one of your apps::

    class TaggedItem(SnowflakeTaggedItemBase):
        pass

    class Product(models.Model):
        tags = TaggableManager(through=TaggedItem)

then run ``makemigrations``. Needs the ``taggit`` extra and ``"taggit"`` in ``INSTALLED_APPS``.

taggit's ``remove_orphaned_tags`` command takes a tag as unused when taggit's own
``TaggedItem`` has no row for it (``Tag.objects.filter(taggit_taggeditem_items=None)``), so it
deletes the tags used only through such a model, and with them (``on_delete=CASCADE``) every
row of it: the objects lose those tags. :func:`orphaned_tags` is the query that looks at every
model referring to a tag (``manage.py snowflake remove-orphaned-tags``).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import models
from django.db.models import Exists, OuterRef

from ..errors import MissingExtraError

try:
    from taggit.models import CommonGenericTaggedItemBase, TagBase, TaggedItemBase
except ImportError as error:
    raise MissingExtraError(__name__, package="django-taggit", extra="taggit") from error

__all__ = ["GenericSnowflakeTaggedItemBase", "SnowflakeTaggedItemBase", "orphaned_tags"]


class GenericSnowflakeTaggedItemBase(CommonGenericTaggedItemBase):
    """taggit's ``GenericTaggedItemBase`` with a 64-bit ``object_id``: combine it with your own
    tag model's ``TaggedItemBase``-like base (a ``tag`` foreign key)."""

    object_id = models.PositiveBigIntegerField(verbose_name="object ID", db_index=True)
    natural_key_fields = ["object_id"]

    class Meta:
        abstract = True


class SnowflakeTaggedItemBase(GenericSnowflakeTaggedItemBase, TaggedItemBase):
    """taggit's ``TaggedItem`` (tags from ``taggit.Tag``, any tagged model) with a 64-bit
    ``object_id``, and the same index and uniqueness as taggit's."""

    class Meta:
        abstract = True
        indexes = [models.Index(fields=["content_type", "object_id"])]
        constraints = [
            models.UniqueConstraint(
                fields=("content_type", "object_id", "tag"),
                name="%(app_label)s_%(class)s_content_object_tag_uniq",
            )
        ]


def orphaned_tags() -> list[Any]:
    """One queryset per installed tag model (``taggit.Tag`` and every concrete ``TagBase``
    subclass): the tags that no row of any model refers to, through models of every kind
    included (taggit's, :class:`SnowflakeTaggedItemBase` subclasses, any other foreign key or
    many-to-many table pointing at a tag)."""
    found = []
    for tag_model in apps.get_models():
        if not issubclass(tag_model, TagBase):
            continue
        used = [
            Exists(relation.related_model._base_manager.filter(
                **{relation.field.name: OuterRef(relation.field.target_field.attname)}))
            for relation in tag_model._meta.get_fields(include_hidden=True)
            if relation.auto_created and not relation.concrete
            and (relation.one_to_many or relation.one_to_one)
        ]
        found.append(tag_model._base_manager.filter(*(~exists for exists in used)))
    return found
