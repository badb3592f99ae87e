"""A customer, their orders and the orders' items share one shard database.

Customers are placed by the hash of their ID; an order's ID embeds its customer's shard; an
item's ID embeds its order's shard. So foreign keys never cross databases, and any of these
rows is found from its ID alone.
"""

from __future__ import annotations

from django.db import models

from snowflake_db.django import SnowflakeAutoField
from snowflake_db.django.public_ids import PublicId
from snowflake_db.django.sharding import ShardedManager, ShardedModelMixin
from snowflake_db.sharding import ShardRule


class Customer(ShardedModelMixin, models.Model):
    id = SnowflakeAutoField(primary_key=True)  # any new ID; placed by key_hash(id)
    name = models.CharField(max_length=100)

    snowflake_shard_rule = ShardRule(key_fields=("id",))
    objects = ShardedManager()


class Order(ShardedModelMixin, models.Model):
    # Filled on save/create/bulk_create with an ID embedding the customer's shard.
    id = models.BigIntegerField(primary_key=True, editable=False)
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    total_cents = models.IntegerField()

    snowflake_shard_rule = ShardRule(id_fields=("id",), key_fields=("customer",))
    objects = ShardedManager()

    # What customers see: derived from id, nothing stored (keys: SNOWFLAKE_DB_PUBLIC_ID_KEYS).
    public_id = PublicId(namespace="orders", group=4)


class OrderItem(ShardedModelMixin, models.Model):
    id = models.BigIntegerField(primary_key=True, editable=False)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="items")
    sku = models.CharField(max_length=32)
    quantity = models.IntegerField()
    price_cents = models.IntegerField()

    snowflake_shard_rule = ShardRule(id_fields=("id", "order"))
    objects = ShardedManager()
