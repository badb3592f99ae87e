"""Django migration operation for order tables sharded by a distributed engine.

``CreateShardedOrders(engine, shards)`` creates ``orders``/``order_items`` partitioned by
``customer_id``: over postgres_fdw shard servers (``"postgresql-fdw"``, the migration's database
is the coordinator), as local hash partitions (``"postgresql-local"``, ``shards`` is their
number) or over MariaDB backends behind Spider tables (``"spider"``). Reversing it drops
everything it made, on the shards too. The statements are :mod:`snowflake_db.sharding.ddl`'s in
:mod:`snowflake_db.sharding.ddl_steps`' order.

Like ``RunSQL`` with ``hints``, it runs only on an alias whose vendor fits the engine and that
the routers allow, so the worker tables' control database is left alone. Shards are reached with
the connection's own DB-API driver and each shard's credentials (``ShardServer`` or a dict of its
fields; prefer ``password_env`` to a password written in the migration). Statements carrying
passwords run on the raw DB-API cursor, which Django's query logging never sees, and
``sqlmigrate`` prints them redacted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

from django.db.migrations.operations.base import Operation

from ..sharding.ddl import OrderTables, ShardServer
from ..sharding.ddl_steps import ENGINE_VENDORS, Step, create_steps, drop_steps

__all__ = ["CreateShardedOrders"]


def _server(value: ShardServer | Mapping[str, Any]) -> ShardServer:
    return value if isinstance(value, ShardServer) else ShardServer(**value)


class CreateShardedOrders(Operation):
    """``orders``/``order_items`` sharded by ``customer_id`` on ``engine``; reversible."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, engine: str, shards: Sequence[ShardServer | Mapping[str, Any]] | int, *,
                 orders: str = "orders", items: str = "order_items",
                 server_prefix: str = "sfdb_shard", role: str = "CURRENT_USER",
                 hints: dict[str, Any] | None = None) -> None:
        self.engine = engine
        self.shards: list[ShardServer] | int = (
            shards if isinstance(shards, int) else [_server(s) for s in shards]
        )
        self.tables = OrderTables(orders, items, server_prefix)
        self.role = role
        self.hints = hints or {}
        # Validate now, not mid-migrate; the drop carries no password, so loading the migration
        # (every manage.py command does) never needs a password_env variable set.
        drop_steps(engine, self.shards, self.tables, role=role)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        shards = self.shards if isinstance(self.shards, int) else [
            s.as_dict() for s in self.shards
        ]
        keywords: dict[str, Any] = {
            "orders": self.tables.orders, "items": self.tables.items,
            "server_prefix": self.tables.server_prefix, "role": self.role,
        }
        if self.hints:
            keywords["hints"] = self.hints
        return self.__class__.__qualname__, [self.engine, shards], keywords

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        count = self.shards if isinstance(self.shards, int) else len(self.shards)
        return (f"Create {self.tables.orders} and {self.tables.items} sharded by customer_id "
                f"({self.engine}, {count} shards)")

    def _applies(self, app_label: str, schema_editor: Any) -> bool:
        connection = schema_editor.connection
        if connection.vendor != ENGINE_VENDORS[self.engine]:
            return False
        from django.db import router

        return bool(router.allow_migrate(connection.alias, app_label, **self.hints))

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if self._applies(app_label, schema_editor):
            self._run(schema_editor, create_steps(self.engine, self.shards, self.tables,
                                                  role=self.role))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if self._applies(app_label, schema_editor):
            self._run(schema_editor, drop_steps(self.engine, self.shards, self.tables,
                                                role=self.role))

    def _run(self, schema_editor: Any, steps: list[Step]) -> None:
        if getattr(schema_editor, "collect_sql", False):  # sqlmigrate: print, run nothing
            for target, group in groupby(steps, key=lambda step: step.target):
                if target is not None:
                    schema_editor.collected_sql.append(f"-- on shard {target}:")
                schema_editor.collected_sql += [f"{step.shown};" for step in group]
            return
        servers = [] if isinstance(self.shards, int) else self.shards
        connection = schema_editor.connection
        for target, group in groupby(steps, key=lambda step: step.target):
            if target is None:
                for step in group:
                    if step.secret:
                        connection.ensure_connection()
                        with connection.connection.cursor() as cursor:
                            cursor.execute(step.sql)
                    else:
                        schema_editor.execute(step.sql, params=None)
                continue
            _run_on_shard(connection, servers[target], [step.sql for step in group])


def _run_on_shard(connection: Any, server: ShardServer, statements: list[str]) -> None:
    """Run ``statements`` in one transaction on ``server`` with the connection's driver."""
    database = connection.Database
    if connection.vendor == "postgresql":
        shard = database.connect(host=server.host, port=server.port, dbname=server.dbname,
                                 user=server.user, password=server.secret(), connect_timeout=10)
    else:
        shard = database.connect(host=server.host, port=server.port, database=server.dbname,
                                 user=server.user, password=server.secret(), connect_timeout=10)
    try:
        cursor = shard.cursor()
        for statement in statements:
            cursor.execute(statement)
        cursor.close()
        shard.commit()
    finally:
        shard.close()
