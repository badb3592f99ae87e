"""PostgreSQL native partitioning of an orders table by embedded shard or by time.

* **By shard** -- ``PARTITION BY LIST ((id & max_shard))``, one partition per logical shard.
  PostgreSQL refuses a primary key on a table partitioned by an expression, so each partition
  gets ``PRIMARY KEY (id)``: the partitions split the ID space by its shard bits, so an ID that
  is unique in its partition is unique in the table.
* **By time** -- ``PARTITION BY RANGE (id)`` with bounds ``Layout.min_id_for_time(period start)``
  (upper bounds exclusive, so adjacent periods meet exactly); the primary key stays on the
  parent. :func:`add_next_time_partition` reads the highest bound from the catalog and adds the
  next period, for a scheduled job or a migration.

Functions return SQL strings (to review, or feed to Alembic/Django migrations) or execute them
on a connection: a SQLAlchemy ``Connection`` or any DB-API connection (Django's too).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ..errors import InvalidArgumentError, ShardingError
from ..layout import Layout

Period = Literal["day", "week", "month"]
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _quote(name: str) -> str:
    """Quote a (possibly schema-qualified) identifier; only plain identifiers are accepted."""
    parts = name.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.match(part) for part in parts):
        raise InvalidArgumentError(
            f"{name!r} is not a plain identifier (letters, digits, _; optionally schema.table)"
        )
    return ".".join(f'"{part}"' for part in parts)


def drop_table_sql(table: str) -> str:
    """``DROP TABLE`` of a partitioned table (its partitions go with it): the reverse of the
    ``create_*_partitioned_table_sql`` functions."""
    return f"DROP TABLE {_quote(table)}"


def _require_shard_bits(layout: Layout) -> None:
    if layout.shard_bits == 0:
        raise ShardingError(
            "partitioning by shard needs a layout with shard_bits > 0 (the shard is id & max_shard)"
        )


def shard_expression(layout: Layout, column: str = "id") -> str:
    """The SQL expression of an ID's embedded shard: ``(id & 15)`` for 4 shard bits."""
    _require_shard_bits(layout)
    return f"({_quote(column)} & {layout.max_shard})"


def shard_partition_name(table: str, shard: int) -> str:
    return f"{table}_s{shard:02d}"


def create_shard_partitioned_table_sql(
    table: str,
    columns_sql: str,
    layout: Layout,
    *,
    column: str = "id",
    shards: Sequence[int] | None = None,
) -> list[str]:
    """``CREATE TABLE`` of ``table`` partitioned by LIST on the shard bits, and its partitions.

    ``columns_sql`` is the column list without a primary key, e.g.
    ``"id bigint NOT NULL, customer_id bigint NOT NULL, total_cents integer NOT NULL"``.
    """
    statements = [
        f"CREATE TABLE {_quote(table)} ({columns_sql}) "
        f"PARTITION BY LIST ({shard_expression(layout, column)})"
    ]
    statements += shard_partitions_sql(table, layout, column=column, shards=shards)
    return statements


def shard_partitions_sql(
    table: str, layout: Layout, *, column: str = "id", shards: Sequence[int] | None = None
) -> list[str]:
    """One ``CREATE TABLE ... PARTITION OF ... FOR VALUES IN (s)`` per logical shard."""
    _require_shard_bits(layout)
    chosen = list(range(layout.max_shard + 1)) if shards is None else list(shards)
    for shard in chosen:
        layout.check_shard(shard)
    return [
        f"CREATE TABLE {_quote(shard_partition_name(table, shard))} PARTITION OF "
        f"{_quote(table)} (PRIMARY KEY ({_quote(column)})) FOR VALUES IN ({shard})"
        for shard in chosen
    ]


def period_start(moment: datetime, period: Period) -> datetime:
    """The UTC start of the day, ISO week (Monday) or month containing ``moment``."""
    if moment.tzinfo is None:
        raise InvalidArgumentError(f"{moment!r} is naive; pass an aware datetime")
    moment = moment.astimezone(UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise InvalidArgumentError(f"period={period!r}; expected 'day', 'week' or 'month'")


def next_period(start: datetime, period: Period) -> datetime:
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    if period == "month":
        return (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    raise InvalidArgumentError(f"period={period!r}; expected 'day', 'week' or 'month'")


def time_partition_name(table: str, start: datetime, period: Period) -> str:
    formats = {"day": "%Y%m%d", "week": "%Y%m%d", "month": "%Y%m"}
    return f"{table}_p{start.strftime(formats[period])}"


def time_partition_sql(table: str, layout: Layout, start: datetime, period: Period) -> str:
    """``CREATE TABLE`` of the partition holding the IDs of the period starting at ``start``."""
    begin = period_start(start, period)
    end = next_period(begin, period)
    low = layout.min_id_for_time(begin)
    high = layout.min_id_for_time(end) if end.timestamp() * 1000 <= layout.max_timestamp_ms \
        else layout.max_id + 1
    return (
        f"CREATE TABLE {_quote(time_partition_name(table, begin, period))} PARTITION OF "
        f"{_quote(table)} FOR VALUES FROM ({low}) TO ({high})"
    )


def create_time_partitioned_table_sql(
    table: str,
    columns_sql: str,
    layout: Layout,
    *,
    start: datetime,
    periods: int = 1,
    period: Period = "month",
    column: str = "id",
) -> list[str]:
    """``CREATE TABLE`` partitioned by RANGE on the ID, plus ``periods`` partitions from ``start``.

    ``columns_sql`` may declare ``PRIMARY KEY (id)``: the partition key is the column itself.
    """
    if periods < 1:
        raise InvalidArgumentError(f"periods={periods} is below the minimum 1")
    statements = [
        f"CREATE TABLE {_quote(table)} ({columns_sql}) PARTITION BY RANGE ({_quote(column)})"
    ]
    begin = period_start(start, period)
    for _ in range(periods):
        statements.append(time_partition_sql(table, layout, begin, period))
        begin = next_period(begin, period)
    return statements


# -- executing -----------------------------------------------------------------------------


def execute(connection: Any, statements: str | Sequence[str]) -> None:
    """Run DDL on a SQLAlchemy ``Connection`` or a DB-API connection (e.g. Django's)."""
    for statement in [statements] if isinstance(statements, str) else statements:
        if hasattr(connection, "exec_driver_sql"):
            connection.exec_driver_sql(statement)
        else:
            with connection.cursor() as cursor:
                cursor.execute(statement)


def _query(connection: Any, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if hasattr(connection, "exec_driver_sql"):
        return [tuple(row) for row in connection.exec_driver_sql(sql, params)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()]


_BOUND = re.compile(r"FOR VALUES FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


def partition_bounds(connection: Any, table: str) -> list[tuple[str, int, int]]:
    """``(partition, low, high)`` of each RANGE partition of ``table``, read from the catalog."""
    rows = _query(
        connection,
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
        (_quote(table),),
    )
    bounds = []
    for name, expression in rows:
        match = _BOUND.search(expression or "")
        if match:
            bounds.append((str(name), int(match.group(1)), int(match.group(2))))
    return sorted(bounds, key=lambda bound: bound[1])


def add_next_time_partition(
    connection: Any, table: str, layout: Layout, *, period: Period = "month"
) -> str:
    """Create the partition of the period after the highest existing one; return its DDL.

    With no partition yet, the period containing now is created. Run it ahead of time (a
    periodic job, or a migration): a row whose ID falls past the last partition is rejected.
    """
    bounds = partition_bounds(connection, table)
    if bounds:
        last_high = bounds[-1][2]
        tick = last_high >> layout.time_shift
        start = datetime.fromtimestamp(layout.tick_start_ms(tick) / 1000, tz=UTC)
    else:
        start = datetime.now(UTC)
    statement = time_partition_sql(table, layout, start, period)
    execute(connection, statement)
    return statement


def ensure_time_partitions(
    connection: Any, table: str, layout: Layout, *, until: datetime, period: Period = "month"
) -> list[str]:
    """Add partitions until one covers ``until`` (e.g. now + 2 months); return the DDL run."""
    done: list[str] = []
    target = layout.min_id_for_time(until)
    while True:
        bounds = partition_bounds(connection, table)
        if bounds and bounds[-1][2] > target:
            return done
        done.append(add_next_time_partition(connection, table, layout, period=period))
