"""A small shop: customers, orders and items with Snowflake primary keys.

``Customer`` and ``Order`` take the automatic primary key from ``DEFAULT_AUTO_FIELD``
(SnowflakeAutoField); ``Item`` declares it explicitly; ``Invoice`` keeps a ``BigAutoField`` and
carries a ``SnowflakeField`` with its ``PublicId``. The app has no migrations: the test databases
are created from the models, and the migration tests write migrations into temporary folders.
"""

from __future__ import annotations

from django.db import models

from snowflake_db.django import SnowflakeAutoField, SnowflakeField
from snowflake_db.django.public_ids import PublicId


class Customer(models.Model):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    total_cents = models.IntegerField(default=0)
    note = models.CharField(max_length=100, blank=True, default="")
    created_by_pid = models.IntegerField(default=0)

    # The public order number: derived from the key, no column.
    public_id = PublicId(namespace="orders")


class Item(models.Model):
    id = SnowflakeAutoField(primary_key=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="items")
    sku = models.CharField(max_length=20)
    tags = models.ManyToManyField("Tag", blank=True)


class Tag(models.Model):
    name = models.CharField(max_length=20)


class Invoice(models.Model):
    id = models.BigAutoField(primary_key=True)
    number = SnowflakeField()
    order = models.OneToOneField(Order, on_delete=models.CASCADE, null=True)
    public_number = PublicId(namespace="invoices", field="number", group=4)


class Place(models.Model):
    """Multi-table inheritance: ``Restaurant`` rows share their key with a ``Place`` row."""

    name = models.CharField(max_length=50)


class Restaurant(Place):
    serves_pizza = models.BooleanField(default=False)


class Sku(models.Model):
    """A unique code for ``bulk_create`` conflict handling."""

    code = models.CharField(max_length=20, unique=True)
    quantity = models.IntegerField(default=0)
