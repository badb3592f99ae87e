"""DDL of ``orders`` and ``order_items`` sharded by a distributed engine, as SQL strings.

Three engines, each with its drop (reverse) statements (:mod:`.ddl_steps` orders them into
migration steps):

* ``"postgresql-fdw"`` -- a coordinator table ``PARTITION BY HASH (customer_id)`` whose
  partitions are postgres_fdw foreign tables, one per shard server
  (:func:`postgres_shard_sql` runs on shard ``i``, :func:`postgres_coordinator_sql` and
  :func:`postgres_user_mappings_secret_sql` on the coordinator).
* ``"postgresql-local"`` -- the same partitioned tables with local partitions on one server
  (:func:`postgres_local_sql`).
* ``"spider"`` -- MariaDB backend tables (:func:`spider_backend_sql` on backend ``i``),
  ``CREATE SERVER`` entries (:func:`spider_servers_secret_sql`) and the Spider tables
  ``PARTITION BY KEY (customer_id)`` on the front server (:func:`spider_tables_sql`).

Placement: shard or backend ``i`` owns ``REMAINDER i`` of ``MODULUS n`` (PostgreSQL) and
partition ``p<i>`` (Spider): the target :class:`~snowflake_db.sharding.ShardRouter` names with
``logical_shards=n`` and ``engine=ROUTER_ENGINES[engine]`` (``postgres_hash_partition`` /
``mariadb_key_partition``). Both tables are partitioned by ``customer_id``, so a customer's
orders and their items live on one backend.

Statements that carry a password (user mappings, MariaDB ``CREATE SERVER``) come only from the
``*_secret*`` functions; callers run them without logging them and print ``redacted=True``
copies. Standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._validate import require_int
from ..errors import InvalidArgumentError, UnknownShardError
from .engines import MARIADB_MAX_PARTITIONS, POSTGRES_MAX_MODULUS

#: The ShardRouter engine that places rows as each DDL engine does.
ROUTER_ENGINES = {
    "postgresql-fdw": "postgresql-hash",
    "postgresql-local": "postgresql-hash",
    "spider": "mariadb-key",
}
#: Identifier limits: PostgreSQL's NAMEDATALEN - 1, MariaDB's NAME_CHAR_LEN.
POSTGRES_MAX_IDENTIFIER = 63
MARIADB_MAX_IDENTIFIER = 64
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REDACTED = "********"


def check_identifier(name: object, *, limit: int = POSTGRES_MAX_IDENTIFIER,
                     what: str = "identifier") -> str:
    """``name`` if it is a plain identifier (letters, digits, ``_``) of at most ``limit``
    characters: such names need no quoting rules beyond the engine's quote character."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise InvalidArgumentError(
            f"{what} {name!r} is not a plain identifier (a letter or _, then letters, digits, _)"
        )
    if len(name) > limit:
        raise InvalidArgumentError(
            f"{what} {name!r} has {len(name)} characters, above the limit {limit}"
        )
    return name


def _literal(value: str, *, backslashes: bool) -> str:
    """A SQL string literal. PostgreSQL (standard_conforming_strings, on since 9.1) only doubles
    quotes; MariaDB also reads backslashes as escapes unless NO_BACKSLASH_ESCAPES is set."""
    if "\x00" in value:
        raise InvalidArgumentError("a connection option contains a NUL character")
    if backslashes:
        value = value.replace("\\", "\\\\")
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class ShardServer:
    """Where one shard (or Spider backend) lives. The password never appears in ``repr``;
    ``password_env`` names an environment variable read when the DDL is built instead, so a
    migration file needs no secret."""

    host: str
    port: int
    dbname: str
    user: str
    password: str = field(default="", repr=False)
    password_env: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host or "\x00" in self.host:
            raise InvalidArgumentError(f"host {self.host!r} must be a non-empty string")
        require_int("port", self.port, minimum=1, maximum=65535)
        check_identifier(self.dbname, limit=MARIADB_MAX_IDENTIFIER, what="dbname")
        if not isinstance(self.user, str) or not self.user:
            raise InvalidArgumentError(f"user {self.user!r} must be a non-empty string")
        if self.password and self.password_env:
            raise InvalidArgumentError("give password or password_env, not both")

    def secret(self) -> str:
        """The password: given, or read from ``password_env`` now."""
        if self.password_env is None:
            return self.password
        try:
            return os.environ[self.password_env]
        except KeyError:
            raise InvalidArgumentError(
                f"the environment variable {self.password_env!r} (password of "
                f"{self.user}@{self.host}:{self.port}/{self.dbname}) is not set"
            ) from None

    def as_dict(self) -> dict[str, object]:
        """The fields for a migration file: ``password_env`` rather than a plain password when
        there is one."""
        values: dict[str, object] = {"host": self.host, "port": self.port,
                                     "dbname": self.dbname, "user": self.user}
        if self.password_env:
            values["password_env"] = self.password_env
        elif self.password:
            values["password"] = self.password
        return values


@dataclass(frozen=True)
class OrderTables:
    """The names: ``orders``, ``order_items`` and their partitions ``<table>_p<i>``."""

    orders: str = "orders"
    items: str = "order_items"
    server_prefix: str = "sfdb_shard"

    def check(self, count: int, limit: int) -> None:
        for what, name in (("orders", self.orders), ("items", self.items),
                           ("server_prefix", self.server_prefix)):
            check_identifier(name, limit=limit, what=what)
        last = count - 1
        for name in (partition_name(self.orders, last), partition_name(self.items, last),
                     server_name(self.server_prefix, last)):
            check_identifier(name, limit=limit, what="derived name")


def partition_name(table: str, index: int) -> str:
    return f"{table}_p{index}"


def server_name(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def _count(value: object, maximum: int, what: str) -> int:
    return require_int(what, value, minimum=1, maximum=maximum)


def _index(index: object, count: int) -> int:
    return require_int("shard index", index, minimum=0, maximum=count - 1,
                       error=UnknownShardError, limit_note=f"{count} shards")


# -- PostgreSQL --------------------------------------------------------------------------------

_PG_ORDERS = "id bigint NOT NULL, customer_id bigint NOT NULL, total_cents bigint NOT NULL"
_PG_ITEMS = (
    "id bigint NOT NULL, order_id bigint NOT NULL, customer_id bigint NOT NULL, "
    "sku varchar(32) NOT NULL, quantity integer NOT NULL, price_cents bigint NOT NULL"
)


def _pg_tables(tables: OrderTables, modulus: int, remainders: Sequence[int]) -> list[str]:
    """Partitioned tables with keys and the partitions of ``remainders`` (all local)."""
    o, i = f'"{tables.orders}"', f'"{tables.items}"'
    statements = [
        f"CREATE TABLE {o} ({_PG_ORDERS}, PRIMARY KEY (customer_id, id)) "
        "PARTITION BY HASH (customer_id)",
        f"CREATE TABLE {i} ({_PG_ITEMS}, PRIMARY KEY (customer_id, id), "
        f"FOREIGN KEY (customer_id, order_id) REFERENCES {o} (customer_id, id) "
        "ON DELETE CASCADE) PARTITION BY HASH (customer_id)",
    ]
    for table in (tables.orders, tables.items):
        statements += [
            f'CREATE TABLE "{partition_name(table, r)}" PARTITION OF "{table}" '
            f"FOR VALUES WITH (MODULUS {modulus}, REMAINDER {r})"
            for r in remainders
        ]
    statements += [
        f'CREATE INDEX "{tables.orders}_id_idx" ON {o} (id)',
        f'CREATE INDEX "{tables.items}_order_id_idx" ON {i} (order_id)',
    ]
    return statements


def postgres_local_sql(partitions: int, tables: OrderTables | None = None) -> list[str]:
    """``orders``/``order_items`` hash-partitioned by ``customer_id`` on one server.

    The primary keys are ``(customer_id, id)``: PostgreSQL requires every unique key of a
    partitioned table to contain the partition key. Snowflake ``id``\\ s are unique anyway; the
    ``id`` index serves look-ups by ID.
    """
    tables = tables or OrderTables()
    modulus = _count(partitions, POSTGRES_MAX_MODULUS, "partitions")
    tables.check(modulus, POSTGRES_MAX_IDENTIFIER)
    return _pg_tables(tables, modulus, range(modulus))


def postgres_shard_sql(index: int, shards: int, tables: OrderTables | None = None) -> list[str]:
    """The tables on shard server ``index``: hash-partitioned like the coordinator's, with only
    the partition of ``REMAINDER index`` attached.

    A foreign partition's ``UPDATE`` is sent to the shard as is, so on a plain remote table a
    change of ``customer_id`` would keep the row where it is, on the wrong shard. Here the
    shard's own partitioning refuses it ("no partition of relation ... found for row").
    """
    tables = tables or OrderTables()
    modulus = _count(shards, POSTGRES_MAX_MODULUS, "shards")
    tables.check(modulus, POSTGRES_MAX_IDENTIFIER)
    return _pg_tables(tables, modulus, [_index(index, modulus)])


def postgres_coordinator_sql(servers: Sequence[ShardServer],
                             tables: OrderTables | None = None) -> list[str]:
    """postgres_fdw, one ``CREATE SERVER`` per shard, and the partitioned tables whose
    partition ``i`` is a foreign table on shard ``i`` (run :func:`postgres_user_mappings_secret_sql`
    too).

    No primary key or unique index on the parents: PostgreSQL cannot build one over foreign
    partitions ("cannot create unique index on partitioned table": it "contains partitions that
    are foreign tables", whose rows it cannot index). Keys stay unique by construction --
    Snowflake IDs never repeat, each customer lives on one shard -- and each shard enforces
    ``PRIMARY KEY (customer_id, id)``.
    """
    tables = tables or OrderTables()
    modulus = _count(len(servers), POSTGRES_MAX_MODULUS, "shards")
    tables.check(modulus, POSTGRES_MAX_IDENTIFIER)
    statements = ["CREATE EXTENSION IF NOT EXISTS postgres_fdw"]
    for index, server in enumerate(servers):
        options = ", ".join(
            f"{key} {_literal(str(value), backslashes=False)}"
            for key, value in (("host", server.host), ("port", server.port),
                               ("dbname", server.dbname))
        )
        statements.append(
            f'CREATE SERVER "{server_name(tables.server_prefix, index)}" '
            f"FOREIGN DATA WRAPPER postgres_fdw OPTIONS ({options})"
        )
    for table, columns in ((tables.orders, _PG_ORDERS), (tables.items, _PG_ITEMS)):
        statements.append(f'CREATE TABLE "{table}" ({columns}) PARTITION BY HASH (customer_id)')
        statements += [
            f'CREATE FOREIGN TABLE "{partition_name(table, r)}" PARTITION OF "{table}" '
            f"FOR VALUES WITH (MODULUS {modulus}, REMAINDER {r}) "
            f'SERVER "{server_name(tables.server_prefix, r)}" '
            f"OPTIONS (schema_name 'public', table_name '{table}')"
            for r in range(modulus)
        ]
    return statements


def _shown_secret(server: ShardServer) -> str:
    """What a redacted statement shows for the password: a mask, or nothing without one."""
    return _REDACTED if server.password or server.password_env else ""


def _role(role: str) -> str:
    if role.upper() in ("CURRENT_USER", "PUBLIC", "SESSION_USER", "CURRENT_ROLE"):
        return role.upper()
    return f'"{check_identifier(role, what="role")}"'


def postgres_user_mappings_secret_sql(
    servers: Sequence[ShardServer], tables: OrderTables | None = None, *,
    role: str = "CURRENT_USER", redacted: bool = False,
) -> list[str]:
    """``CREATE USER MAPPING`` of ``role`` for each shard server: carries the passwords (run
    it unlogged; ``redacted=True`` for a copy to print)."""
    tables = tables or OrderTables()
    statements = []
    for index, server in enumerate(servers):
        options = [f"user {_literal(server.user, backslashes=False)}"]
        secret = _shown_secret(server) if redacted else server.secret()
        if secret:
            options.append(f"password {_literal(secret, backslashes=False)}")
        statements.append(
            f"CREATE USER MAPPING FOR {_role(role)} SERVER "
            f'"{server_name(tables.server_prefix, index)}" OPTIONS ({", ".join(options)})'
        )
    return statements


def postgres_drop_sql(tables: OrderTables | None = None) -> list[str]:
    """Drop both partitioned tables and their partitions (local, shard or foreign ones)."""
    tables = tables or OrderTables()
    tables.check(1, POSTGRES_MAX_IDENTIFIER)
    return [f'DROP TABLE "{tables.items}"', f'DROP TABLE "{tables.orders}"']


def postgres_coordinator_drop_sql(shards: int, tables: OrderTables | None = None, *,
                                  role: str = "CURRENT_USER") -> list[str]:
    """The reverse of :func:`postgres_coordinator_sql` and the user mappings. postgres_fdw
    goes too unless another foreign server still uses it."""
    tables = tables or OrderTables()
    count = _count(shards, POSTGRES_MAX_MODULUS, "shards")
    tables.check(count, POSTGRES_MAX_IDENTIFIER)
    statements = postgres_drop_sql(tables)
    for index in range(count):
        name = server_name(tables.server_prefix, index)
        statements += [f'DROP USER MAPPING FOR {_role(role)} SERVER "{name}"',
                       f'DROP SERVER "{name}"']
    statements.append(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_foreign_server s "
        "JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw WHERE w.fdwname = 'postgres_fdw') "
        "THEN DROP EXTENSION IF EXISTS postgres_fdw; END IF; END $$"
    )
    return statements


# -- MariaDB Spider ----------------------------------------------------------------------------

_MY_ORDERS = "id BIGINT NOT NULL, customer_id BIGINT NOT NULL, total_cents BIGINT NOT NULL"
_MY_ITEMS = (
    "id BIGINT NOT NULL, order_id BIGINT NOT NULL, customer_id BIGINT NOT NULL, "
    "sku VARCHAR(32) NOT NULL, quantity INT NOT NULL, price_cents BIGINT NOT NULL"
)


def spider_backend_sql(tables: OrderTables | None = None) -> list[str]:
    """The InnoDB tables on one backend: plain tables keyed by ``id``, items referencing
    their order (co-located, so the foreign key never crosses backends)."""
    tables = tables or OrderTables()
    tables.check(1, MARIADB_MAX_IDENTIFIER)
    o, i = f"`{tables.orders}`", f"`{tables.items}`"
    return [
        f"CREATE TABLE {o} ({_MY_ORDERS}, PRIMARY KEY (id), KEY (customer_id)) ENGINE=InnoDB",
        f"CREATE TABLE {i} ({_MY_ITEMS}, PRIMARY KEY (id), KEY (customer_id), "
        f"FOREIGN KEY (order_id) REFERENCES {o} (id) ON DELETE CASCADE) ENGINE=InnoDB",
    ]


def spider_backend_drop_sql(tables: OrderTables | None = None) -> list[str]:
    tables = tables or OrderTables()
    tables.check(1, MARIADB_MAX_IDENTIFIER)
    return [f"DROP TABLE `{tables.items}`", f"DROP TABLE `{tables.orders}`"]


def spider_servers_secret_sql(backends: Sequence[ShardServer], tables: OrderTables | None = None,
                              *, redacted: bool = False) -> list[str]:
    """One ``CREATE SERVER`` per backend (the Spider partitions link to them by name); carries
    the passwords (run it unlogged; ``redacted=True`` for a copy to print)."""
    tables = tables or OrderTables()
    count = _count(len(backends), MARIADB_MAX_PARTITIONS, "backends")
    tables.check(count, MARIADB_MAX_IDENTIFIER)
    statements = []
    for index, backend in enumerate(backends):
        secret = _shown_secret(backend) if redacted else backend.secret()
        options = ", ".join(
            f"{key} {_literal(value, backslashes=True)}"
            for key, value in (("HOST", backend.host), ("DATABASE", backend.dbname),
                               ("USER", backend.user), ("PASSWORD", secret))
        )
        statements.append(
            f"CREATE SERVER `{server_name(tables.server_prefix, index)}` FOREIGN DATA WRAPPER "
            f"mysql OPTIONS ({options}, PORT {backend.port})"
        )
    return statements


def spider_tables_sql(backends: int, tables: OrderTables | None = None) -> list[str]:
    """The Spider tables ``PARTITION BY KEY (customer_id)``, partition ``p<i>`` on backend
    ``i``'s server entry.

    Their keys are ``(id, customer_id)``: MariaDB requires every unique key of a partitioned
    table to contain the partitioning columns; each backend keys ``id`` alone.
    """
    tables = tables or OrderTables()
    count = _count(backends, MARIADB_MAX_PARTITIONS, "backends")
    tables.check(count, MARIADB_MAX_IDENTIFIER)
    statements = []
    for table, columns in ((tables.orders, _MY_ORDERS), (tables.items, _MY_ITEMS)):
        partitions = ", ".join(
            f"PARTITION p{index} COMMENT = 'srv \"{server_name(tables.server_prefix, index)}\"'"
            for index in range(count)
        )
        statements.append(
            f"CREATE TABLE `{table}` ({columns}, PRIMARY KEY (id, customer_id), "
            f"KEY (customer_id)) ENGINE=SPIDER COMMENT = 'wrapper \"mysql\", table \"{table}\"' "
            f"PARTITION BY KEY (customer_id) ({partitions})"
        )
    return statements


def spider_drop_sql(backends: int, tables: OrderTables | None = None) -> list[str]:
    """The reverse of :func:`spider_tables_sql` and :func:`spider_servers_secret_sql` (the
    backends' tables are :func:`spider_backend_drop_sql`'s)."""
    tables = tables or OrderTables()
    count = _count(backends, MARIADB_MAX_PARTITIONS, "backends")
    tables.check(count, MARIADB_MAX_IDENTIFIER)
    return [f"DROP TABLE `{tables.items}`", f"DROP TABLE `{tables.orders}`"] + [
        f"DROP SERVER `{server_name(tables.server_prefix, index)}`" for index in range(count)
    ]

