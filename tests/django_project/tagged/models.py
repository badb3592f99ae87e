"""django-taggit on Snowflake-keyed models, through the through model snowflake_db ships.

Its migration is what ``makemigrations`` wrote: taggit's tables come from taggit's migrations,
which the test databases run before this app's.
"""

from __future__ import annotations

from django.db import models
from taggit.managers import TaggableManager

from snowflake_db.django.taggit import SnowflakeTaggedItemBase


class TaggedItem(SnowflakeTaggedItemBase):
    pass


class Product(models.Model):
    name = models.CharField(max_length=50)
    tags = TaggableManager(through=TaggedItem)


class Article(models.Model):
    title = models.CharField(max_length=50)
    tags = TaggableManager(through=TaggedItem)


class Discount(models.Model):
    """django-oscar's ``OrderDiscount`` shape: a product's key in a plain 32-bit integer field
    (check E014 reports it; its lookups raise beyond the column's range)."""

    product_id = models.PositiveIntegerField(null=True)
    amount = models.IntegerField(default=0)
