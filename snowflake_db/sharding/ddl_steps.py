"""What a sharded-orders migration runs where, in which order, from :mod:`.ddl`'s statements.

The Alembic and Django operations both execute these :class:`Step` lists: ``target`` ``None``
on the migration's own connection (the coordinator or the Spider front), ``i`` on shard or
backend ``i``, and ``secret`` steps (passwords) unlogged. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError
from .ddl import (
    OrderTables,
    ShardServer,
    postgres_coordinator_drop_sql,
    postgres_coordinator_sql,
    postgres_drop_sql,
    postgres_local_sql,
    postgres_shard_sql,
    postgres_user_mappings_secret_sql,
    spider_backend_drop_sql,
    spider_backend_sql,
    spider_drop_sql,
    spider_servers_secret_sql,
    spider_tables_sql,
)

#: The database each engine's migration connection must be.
ENGINE_VENDORS = {"postgresql-fdw": "postgresql", "postgresql-local": "postgresql",
                  "spider": "mysql"}


@dataclass(frozen=True)
class Step:
    """One statement and where it runs: ``target`` ``None`` is the migration's own database
    (coordinator or Spider front), ``i`` is shard/backend ``i``. ``shown`` is what may be
    logged or printed: the statement, or its redacted copy when ``secret``."""

    target: int | None
    sql: str = field(repr=False)
    shown: str
    secret: bool = False


def _steps(target: int | None, statements: Sequence[str]) -> list[Step]:
    return [Step(target, sql, sql) for sql in statements]


def _secret_steps(statements: Sequence[str], shown: Sequence[str]) -> list[Step]:
    return [Step(None, sql, copy, True) for sql, copy in zip(statements, shown, strict=True)]


def _servers(engine: str, shards: Sequence[ShardServer] | int) -> Sequence[ShardServer]:
    if engine not in ENGINE_VENDORS:
        raise InvalidArgumentError(
            f"unknown engine {engine!r}; expected one of {', '.join(ENGINE_VENDORS)}"
        )
    if engine == "postgresql-local":
        if not isinstance(shards, int) or isinstance(shards, bool):
            raise InvalidArgumentError(
                f"engine 'postgresql-local' takes the number of partitions, got {shards!r}"
            )
        return []
    if isinstance(shards, int) or not all(isinstance(s, ShardServer) for s in shards):
        raise InvalidArgumentError(f"engine {engine!r} takes a list of ShardServer, got {shards!r}")
    return shards


def create_steps(engine: str, shards: Sequence[ShardServer] | int,
                 tables: OrderTables | None = None, *, role: str = "CURRENT_USER") -> list[Step]:
    """Everything that creates ``engine``'s tables, in order: shards first, so the coordinator's
    foreign tables and Spider's links point at tables that exist."""
    tables = tables or OrderTables()
    servers = _servers(engine, shards)
    if engine == "postgresql-local":
        assert isinstance(shards, int)
        return _steps(None, postgres_local_sql(shards, tables))
    if engine == "postgresql-fdw":
        steps = [step for i in range(len(servers))
                 for step in _steps(i, postgres_shard_sql(i, len(servers), tables))]
        steps += _steps(None, postgres_coordinator_sql(servers, tables))
        return steps + _secret_steps(
            postgres_user_mappings_secret_sql(servers, tables, role=role),
            postgres_user_mappings_secret_sql(servers, tables, role=role, redacted=True),
        )
    steps = [step for i in range(len(servers)) for step in _steps(i, spider_backend_sql(tables))]
    steps += _secret_steps(spider_servers_secret_sql(servers, tables),
                           spider_servers_secret_sql(servers, tables, redacted=True))
    return steps + _steps(None, spider_tables_sql(len(servers), tables))


def drop_steps(engine: str, shards: Sequence[ShardServer] | int,
               tables: OrderTables | None = None, *, role: str = "CURRENT_USER") -> list[Step]:
    """The reverse of :func:`create_steps`: the coordinator's (front's) objects, then the
    shards' tables."""
    tables = tables or OrderTables()
    servers = _servers(engine, shards)
    if engine == "postgresql-local":
        return _steps(None, postgres_drop_sql(tables))
    if engine == "postgresql-fdw":
        steps = _steps(None, postgres_coordinator_drop_sql(len(servers), tables, role=role))
        shard_drop = postgres_drop_sql(tables)
    else:
        steps = _steps(None, spider_drop_sql(len(servers), tables))
        shard_drop = spider_backend_drop_sql(tables)
    return steps + [step for i in range(len(servers)) for step in _steps(i, shard_drop)]
