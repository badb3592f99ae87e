"""The demo shop: orders sharded over N databases, worker IDs from a control database.

``python -m example_project`` runs the Django shop, ``python -m example_project.sqlalchemy_shop``
the same flow with SQLAlchemy's ``ShardedSession``. With no arguments both use SQLite files in
``example_project/var/``; ``--control-url URL --shard-url URL [--shard-url URL ...]`` (or the
``SHOP_CONTROL_URL`` / ``SHOP_SHARD_URLS`` environment variables) use PostgreSQL or MariaDB.
``python -m example_project.sqlalchemy_shop --engine postgresql-fdw|spider`` places the orders
through a distributed engine (``example_project.engine_shop``), on throwaway local servers
(``example_project.local_servers``) or on ``--coordinator-url`` and ``--shard-url`` servers.
"""
