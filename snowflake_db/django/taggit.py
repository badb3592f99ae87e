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
"""

from __future__ import annotations

from django.db import models

from ..errors import MissingExtraError

try:
    from taggit.models import CommonGenericTaggedItemBase, TaggedItemBase
except ImportError as error:
    raise MissingExtraError(__name__, package="django-taggit", extra="taggit") from error

__all__ = ["GenericSnowflakeTaggedItemBase", "SnowflakeTaggedItemBase"]


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
