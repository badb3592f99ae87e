"""The demo shop app: customers, orders and order items, sharded by customer."""
