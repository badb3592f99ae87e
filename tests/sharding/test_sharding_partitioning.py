"""PostgreSQL native partitioning by embedded shard and by time, on a real server."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError, ProgrammingError

from snowflake_db import InvalidArgumentError, Layout, SnowflakeGenerator
from snowflake_db.sharding import ShardingError, ShardRouter
from snowflake_db.sharding import partitioning as p
from tests.plugins.databases import ScratchDatabase

LAYOUT = Layout(sequence_bits=8, shard_bits=4)
COLUMNS = "id bigint NOT NULL, customer_id bigint NOT NULL, total_cents integer NOT NULL"


def test_shard_ddl_text() -> None:
    statements = p.create_shard_partitioned_table_sql("orders", COLUMNS, LAYOUT)
    assert statements[0] == (
        f'CREATE TABLE "orders" ({COLUMNS}) PARTITION BY LIST (("id" & 15))'
    )
    assert len(statements) == 17
    assert statements[1] == (
        'CREATE TABLE "orders_s00" PARTITION OF "orders" (PRIMARY KEY ("id")) FOR VALUES IN (0)'
    )
    with pytest.raises(ShardingError, match="shard_bits"):
        p.shard_expression(Layout())
    with pytest.raises(InvalidArgumentError, match="plain identifier"):
        p.create_shard_partitioned_table_sql('orders"; DROP TABLE x; --', COLUMNS, LAYOUT)


def test_time_ddl_bounds_meet_exactly() -> None:
    start = datetime(2026, 11, 17, tzinfo=UTC)
    statements = p.create_time_partitioned_table_sql(
        "orders", COLUMNS + ", PRIMARY KEY (id)", LAYOUT, start=start, periods=2
    )
    nov = datetime(2026, 11, 1, tzinfo=UTC)
    dec = datetime(2026, 12, 1, tzinfo=UTC)
    jan = datetime(2027, 1, 1, tzinfo=UTC)
    assert statements[1].endswith(
        f"FOR VALUES FROM ({LAYOUT.min_id_for_time(nov)}) TO ({LAYOUT.min_id_for_time(dec)})"
    )
    assert '"orders_p202611"' in statements[1]
    assert statements[2].endswith(
        f"FOR VALUES FROM ({LAYOUT.min_id_for_time(dec)}) TO ({LAYOUT.min_id_for_time(jan)})"
    )
    assert p.period_start(datetime(2026, 11, 19, 5, tzinfo=UTC), "week") == datetime(
        2026, 11, 16, tzinfo=UTC
    )


def test_rows_land_in_their_shard_partition(postgres_db: ScratchDatabase) -> None:
    engine = create_engine(postgres_db.url)
    router = ShardRouter([f"orders_s{i:02d}" for i in range(16)], layout=LAYOUT)
    generator = SnowflakeGenerator(3, layout=LAYOUT)
    try:
        with engine.begin() as connection:
            p.execute(connection, p.create_shard_partitioned_table_sql("orders", COLUMNS, LAYOUT))
            rows = []
            for customer in range(300):
                order_id = router.new_id(key=customer, generator=generator)
                rows.append((order_id, customer))
                connection.exec_driver_sql(
                    "INSERT INTO orders (id, customer_id, total_cents) VALUES (%s, %s, 1)",
                    (order_id, customer),
                )
            placed = dict(connection.exec_driver_sql(
                "SELECT id, tableoid::regclass::text FROM orders").all())
        assert len(placed) == 300
        for order_id, customer in rows:
            assert placed[order_id] == f"orders_s{router.shard_for_key(customer):02d}"
            assert placed[order_id] == router.target_for_id(order_id)
        assert len(set(placed.values())) == 16
        # An ID is unique in its partition, so in the table (the partitions split the ID space).
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO orders VALUES (%s, 1, 1)", (rows[0][0],)
            )
        # Pruning: a lookup by ID with the shard expression scans one partition.
        with engine.connect() as connection:
            order_id = rows[0][0]
            plan = "\n".join(r[0] for r in connection.exec_driver_sql(
                f"EXPLAIN SELECT * FROM orders WHERE id = {order_id} "
                f"AND {p.shard_expression(LAYOUT)} = {order_id & 15}"))
        assert set(re.findall(r" on (orders_s\d+)", plan)) == {f"orders_s{order_id & 15:02d}"}
    finally:
        engine.dispose()


def test_time_partitions_and_adding_the_next_one(postgres_db: ScratchDatabase) -> None:
    engine = create_engine(postgres_db.url)
    start = datetime(2026, 10, 5, tzinfo=UTC)

    def id_at(year: int, month: int, day: int) -> int:
        when = datetime(year, month, day, 12, tzinfo=UTC)
        return LAYOUT.encode(timestamp_ms=int(when.timestamp() * 1000), worker_id=1, sequence=0)

    try:
        with engine.begin() as connection:
            p.execute(connection, p.create_time_partitioned_table_sql(
                "orders", COLUMNS + ", PRIMARY KEY (id)", LAYOUT, start=start, periods=2))
            connection.exec_driver_sql(
                "INSERT INTO orders VALUES (%s, 1, 1), (%s, 2, 2)",
                (id_at(2026, 10, 31), id_at(2026, 11, 1)),
            )
            where = dict(connection.exec_driver_sql(
                "SELECT id, tableoid::regclass::text FROM orders").all())
            assert where == {id_at(2026, 10, 31): "orders_p202610",
                             id_at(2026, 11, 1): "orders_p202611"}
            bounds = p.partition_bounds(connection, "orders")
            assert [b[0] for b in bounds] == ["orders_p202610", "orders_p202611"]
            assert bounds[0][2] == bounds[1][1]  # adjacent: no gap, no overlap
        with pytest.raises(Exception, match="no partition"), engine.begin() as connection:
            connection.exec_driver_sql("INSERT INTO orders VALUES (%s, 3, 3)",
                                       (id_at(2026, 12, 2),))
        with engine.begin() as connection:
            ddl = p.add_next_time_partition(connection, "orders", LAYOUT)
            assert '"orders_p202612"' in ddl
            connection.exec_driver_sql("INSERT INTO orders VALUES (%s, 3, 3)",
                                       (id_at(2026, 12, 2),))
            placed = connection.exec_driver_sql(
                "SELECT tableoid::regclass::text FROM orders WHERE customer_id = 3").scalar()
            assert placed == "orders_p202612"
            added = p.ensure_time_partitions(
                connection, "orders", LAYOUT, until=datetime(2027, 2, 10, tzinfo=UTC))
            assert len(added) == 2
            names = [b[0] for b in p.partition_bounds(connection, "orders")]
            assert names[-1] == "orders_p202702"
        # The same functions on a plain DB-API connection (as Django's connection is).
        raw = engine.raw_connection()
        try:
            p.add_next_time_partition(raw.driver_connection, "orders", LAYOUT)
            raw.driver_connection.commit()
        finally:
            raw.close()
        with engine.connect() as connection:
            assert p.partition_bounds(connection, "orders")[-1][0] == "orders_p202703"
        with pytest.raises(ProgrammingError), engine.begin() as connection:
            p.execute(connection, p.time_partition_sql(
                "orders", LAYOUT, datetime(2026, 11, 9, tzinfo=UTC), "month"))  # overlaps
    finally:
        engine.dispose()
