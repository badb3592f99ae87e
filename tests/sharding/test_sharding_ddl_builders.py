"""The sharded-orders DDL builders without a server: validation, passwords, step order.

The statements themselves run on real servers in tests/sharding/test_sharding_ddl.py.
"""

from __future__ import annotations

import pytest

from snowflake_db.errors import InvalidArgumentError, UnknownShardError
from snowflake_db.sharding import ddl as d
from snowflake_db.sharding.ddl_steps import create_steps, drop_steps
from snowflake_db.sharding.engines import MARIADB_MAX_PARTITIONS

SECRET = "s3cr'et\\pw"  # a quote and a backslash: both must survive the SQL literal


def test_builders_refuse_bad_names_and_counts_naming_the_value_and_limit() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'orders; DROP' is not a plain identifier"):
        d.postgres_local_sql(4, d.OrderTables(orders="orders; DROP"))
    with pytest.raises(InvalidArgumentError, match=r"has 64 characters, above the limit 63"):
        d.postgres_local_sql(4, d.OrderTables(orders="o" * 64))
    with pytest.raises(InvalidArgumentError, match=r"derived name 'o{60}_p10' .* limit 63"):
        d.postgres_local_sql(11, d.OrderTables(orders="o" * 60))
    with pytest.raises(InvalidArgumentError, match=r"partitions=0 is below the minimum 1"):
        d.postgres_local_sql(0)
    too_many = MARIADB_MAX_PARTITIONS + 1
    with pytest.raises(InvalidArgumentError,
                       match=rf"backends={too_many} exceeds the maximum {MARIADB_MAX_PARTITIONS}"):
        d.spider_tables_sql(MARIADB_MAX_PARTITIONS + 1)
    with pytest.raises(UnknownShardError, match=r"shard index=3 exceeds the maximum 2 \(3 shards"):
        d.postgres_shard_sql(3, 3)
    with pytest.raises(InvalidArgumentError, match=r"port=0 is below the minimum 1"):
        d.ShardServer("h", 0, "db", "u")
    with pytest.raises(InvalidArgumentError, match=r"unknown engine 'citus'"):
        create_steps("citus", 3)
    with pytest.raises(InvalidArgumentError, match=r"'SFDB_NOT_SET_ANYWHERE' .* is not set"):
        d.ShardServer("h", 1, "db", "u", password_env="SFDB_NOT_SET_ANYWHERE").secret()


def test_passwords_stay_out_of_reprs_and_shown_statements() -> None:
    server = d.ShardServer("127.0.0.1", 5432, "shop", "app", password=SECRET)
    assert SECRET not in repr(server)
    for engine in ("postgresql-fdw", "spider"):
        steps = create_steps(engine, [server, server])
        secret = [step for step in steps if step.secret]
        assert len(secret) == 2 and all(SECRET not in step.shown for step in secret)
        assert all(SECRET not in repr(step) for step in steps)
        assert not any(SECRET in step.shown for step in steps)
    assert d.spider_servers_secret_sql([server])[0].count("'s3cr''et\\\\pw'") == 1
    no_password = d.ShardServer("127.0.0.1", 5432, "shop", "app")
    shown = d.postgres_user_mappings_secret_sql([no_password], redacted=True)[0]
    assert "password" not in shown
    assert d.postgres_user_mappings_secret_sql([server])[0].count("'s3cr''et\\pw'") == 1


def test_drop_steps_undo_create_steps_in_reverse_order() -> None:
    servers = [d.ShardServer("127.0.0.1", 5432, f"s{i}", "app") for i in range(2)]
    steps = drop_steps("postgresql-fdw", servers)
    assert [s.target for s in steps][:1] == [None] and [s.target for s in steps][-2:] == [1, 1]
    assert d.ROUTER_ENGINES == {"postgresql-fdw": "postgresql-hash",
                                "postgresql-local": "postgresql-hash", "spider": "mariadb-key"}


def test_a_django_migration_loads_without_its_password_variable_set() -> None:
    # manage.py loads every migration for every command; only running this one needs the secret.
    from snowflake_db.django.sharded_orders import CreateShardedOrders

    server = d.ShardServer("127.0.0.1", 5432, "shop", "app", password_env="SFDB_NOT_SET_ANYWHERE")
    operation = CreateShardedOrders("postgresql-fdw", [server, server.as_dict()])
    assert operation.deconstruct()[1][1][1] == server.as_dict()
    with pytest.raises(InvalidArgumentError, match="SFDB_NOT_SET_ANYWHERE"):
        create_steps("postgresql-fdw", operation.shards)
    with pytest.raises(InvalidArgumentError, match="unknown engine 'vitess'"):
        CreateShardedOrders("vitess", [server])
