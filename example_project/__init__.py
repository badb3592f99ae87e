"""The demo shop: orders sharded over N databases, worker IDs from a control database.

``python -m example_project`` runs the Django shop, ``python -m example_project.sqlalchemy_shop``
the same flow with SQLAlchemy's ``ShardedSession``. With no arguments both use SQLite files in
``example_project/var/``; ``--control-url URL --shard-url URL [--shard-url URL ...]`` (or the
``SHOP_CONTROL_URL`` / ``SHOP_SHARD_URLS`` environment variables) use PostgreSQL or MariaDB.
"""
