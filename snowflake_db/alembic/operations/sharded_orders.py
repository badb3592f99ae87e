"""Sharded order tables on a distributed engine: ``op.create_sharded_orders(engine, shards)``
and ``op.drop_sharded_orders(engine, shards)``, each the other's reverse.

``engine`` is ``"postgresql-fdw"`` (shards: a list of
:class:`~snowflake_db.sharding.ddl.ShardServer`; the migration's database is the coordinator),
``"postgresql-local"`` (shards: the number of local hash partitions) or ``"spider"`` (shards:
the MariaDB backends; the migration's database holds the Spider tables). The statements are
:mod:`snowflake_db.sharding.ddl`'s, in :mod:`snowflake_db.sharding.ddl_steps`' order: the
operation connects to each shard itself (same driver as the migration's, the shard's
credentials), so it cannot run in offline ``--sql`` mode. Statements carrying passwords run on
the raw DB-API cursor, never through SQLAlchemy's or Alembic's statement logging. The worker
tables stay in the control database: these operations never create them on a shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from alembic.operations import Operations
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Connection

from ...errors import SnowflakeMigrationError
from ...sharding.ddl import OrderTables, ShardServer
from ...sharding.ddl_steps import ENGINE_VENDORS, Step, create_steps, drop_steps
from ._base import SnowflakeOp, operation


@dataclasses.dataclass(eq=False)
class _ShardedOrdersOp(SnowflakeOp):
    engine: str
    shards: Sequence[ShardServer] | int
    _: dataclasses.KW_ONLY
    orders: str = "orders"
    items: str = "order_items"
    server_prefix: str = "sfdb_shard"
    role: str = "CURRENT_USER"

    def tables(self) -> OrderTables:
        return OrderTables(self.orders, self.items, self.server_prefix)


@operation("create_sharded_orders")
@dataclasses.dataclass(eq=False)
class CreateShardedOrdersOp(_ShardedOrdersOp):
    """``orders``/``order_items`` partitioned by ``customer_id`` over the shards of ``engine``."""

    def reverse(self) -> DropShardedOrdersOp:
        return self.carry(DropShardedOrdersOp)


@operation("drop_sharded_orders")
@dataclasses.dataclass(eq=False)
class DropShardedOrdersOp(_ShardedOrdersOp):
    """Drop what ``create_sharded_orders`` made: tables, servers, user mappings, shard tables."""

    def reverse(self) -> CreateShardedOrdersOp:
        return self.carry(CreateShardedOrdersOp)


def _bind(operations: Operations, op: _ShardedOrdersOp) -> Connection:
    if operations.migration_context.as_sql:
        raise SnowflakeMigrationError(
            f"{op.op_name} connects to the shard servers and cannot run in offline --sql mode"
        )
    bind = operations.get_bind()
    vendor = ENGINE_VENDORS.get(op.engine)
    name = "mysql" if bind.dialect.name == "mariadb" else bind.dialect.name
    if vendor is not None and name != vendor:
        raise SnowflakeMigrationError(
            f"{op.op_name}(engine={op.engine!r}) runs on {vendor}, not {bind.dialect.name}"
        )
    return bind


def _shard_url(bind: Connection, server: ShardServer) -> URL:
    return URL.create(
        f"{bind.dialect.name}+{bind.dialect.driver}", username=server.user,
        password=server.secret() or None, host=server.host, port=server.port,
        database=server.dbname,
    )


def _run(operations: Operations, op: _ShardedOrdersOp, steps: list[Step]) -> None:
    bind = _bind(operations, op)
    servers = [] if isinstance(op.shards, int) else list(op.shards)
    for target, group in groupby(steps, key=lambda step: step.target):
        if target is None:
            for step in group:
                if step.secret:  # the raw cursor: nothing logs the password
                    cursor: Any = bind.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
                    try:
                        cursor.execute(step.sql)
                    finally:
                        cursor.close()
                else:
                    operations.execute(text(step.sql))
            continue
        engine = create_engine(_shard_url(bind, servers[target]))
        try:
            with engine.begin() as shard:
                for step in group:
                    shard.exec_driver_sql(step.sql)
        finally:
            engine.dispose()


@Operations.implementation_for(CreateShardedOrdersOp)
def _create_sharded_orders(operations: Operations, op: CreateShardedOrdersOp) -> None:
    _run(operations, op, create_steps(op.engine, op.shards, op.tables(), role=op.role))


@Operations.implementation_for(DropShardedOrdersOp)
def _drop_sharded_orders(operations: Operations, op: DropShardedOrdersOp) -> None:
    _run(operations, op, drop_steps(op.engine, op.shards, op.tables(), role=op.role))
