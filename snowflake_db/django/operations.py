"""Django migration operations for PostgreSQL partitioned order tables.

``migrations.RunSQL`` would freeze the partitions' SQL at the time the migration is written;
these operations compute it from the layout when the migration runs, and skip databases that are
not PostgreSQL or that the routers keep the model off (like ``RunSQL`` with ``hints``). The DDL
is :mod:`snowflake_db.sharding.partitioning`'s. ``CreateShardedOrders`` (postgres_fdw shards,
Spider) lives in :mod:`snowflake_db.django.sharded_orders`; ``InstallKeyFunction`` and
``InstallKeyTrigger`` (keys from the database for raw SQL inserts) in
:mod:`snowflake_db.django.database_keys`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.migrations.operations.base import Operation

from ..layout import Layout
from ..sharding import partitioning
from .database_keys import InstallKeyFunction, InstallKeyTrigger
from .sharded_orders import CreateShardedOrders

__all__ = [
    "AddTimePartitions",
    "CreateShardPartitionedTable",
    "CreateShardedOrders",
    "CreateTimePartitionedTable",
    "InstallKeyFunction",
    "InstallKeyTrigger",
]


def _layout(layout: dict[str, Any] | Layout) -> Layout:
    return layout if isinstance(layout, Layout) else Layout(**layout)


def _layout_kwargs(layout: dict[str, Any] | Layout) -> dict[str, Any]:
    return dict(layout) if isinstance(layout, dict) else layout.as_kwargs()


class _PartitionOperation(Operation):
    """Runs only on PostgreSQL aliases the routers allow for ``hints`` (like ``RunSQL``)."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, *, hints: dict[str, Any] | None = None) -> None:
        self.hints = hints or {}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def _applies(self, app_label: str, schema_editor: Any) -> bool:
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return False
        from django.db import router

        return bool(router.allow_migrate(connection.alias, app_label, **self.hints))


class _CreatePartitionedTable(_PartitionOperation):
    """Creates ``table`` with ``columns_sql`` and its first partitions; reversed by dropping it."""

    def __init__(self, table: str, columns_sql: str, layout: dict[str, Any] | Layout, *,
                 column: str = "id", hints: dict[str, Any] | None = None) -> None:
        super().__init__(hints=hints)
        self.table, self.columns_sql, self.column = table, columns_sql, column
        self.layout = _layout_kwargs(layout)

    def _options(self) -> dict[str, Any]:
        """The keyword arguments of the subclass, for ``deconstruct``."""
        return {}

    def _statements(self) -> list[str]:
        raise NotImplementedError

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.table, self.columns_sql, self.layout],
                {**self._options(), "column": self.column,
                 **({"hints": self.hints} if self.hints else {})})

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if self._applies(app_label, schema_editor):
            for sql in self._statements():
                schema_editor.execute(sql)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if self._applies(app_label, schema_editor):
            schema_editor.execute(partitioning.drop_table_sql(self.table))


class CreateShardPartitionedTable(_CreatePartitionedTable):
    """``CREATE TABLE ... PARTITION BY LIST ((id & max_shard))`` and one partition per shard."""

    def _statements(self) -> list[str]:
        return partitioning.create_shard_partitioned_table_sql(
            self.table, self.columns_sql, _layout(self.layout), column=self.column
        )

    def describe(self) -> str:
        return f"Create {self.table} partitioned by its embedded shard"


class CreateTimePartitionedTable(_CreatePartitionedTable):
    """``CREATE TABLE ... PARTITION BY RANGE (id)`` with partitions from ``start``."""

    def __init__(self, table: str, columns_sql: str, layout: dict[str, Any] | Layout, *,
                 start: str, periods: int = 3, period: partitioning.Period = "month",
                 column: str = "id", hints: dict[str, Any] | None = None) -> None:
        super().__init__(table, columns_sql, layout, column=column, hints=hints)
        self.start, self.periods, self.period = start, periods, period

    def _options(self) -> dict[str, Any]:
        return {"start": self.start, "periods": self.periods, "period": self.period}

    def _statements(self) -> list[str]:
        start = datetime.fromisoformat(self.start)
        if start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        return partitioning.create_time_partitioned_table_sql(
            self.table, self.columns_sql, _layout(self.layout), start=start,
            periods=self.periods, period=self.period, column=self.column,
        )

    def describe(self) -> str:
        return f"Create {self.table} partitioned by ID ranges of one {self.period} each"


class AddTimePartitions(_PartitionOperation):
    """Add partitions until one covers ``days_ahead`` days from the time of migrating."""

    def __init__(self, table: str, layout: dict[str, Any] | Layout, *, days_ahead: int = 62,
                 period: partitioning.Period = "month",
                 hints: dict[str, Any] | None = None) -> None:
        super().__init__(hints=hints)
        self.table, self.days_ahead, self.period = table, days_ahead, period
        self.layout = _layout_kwargs(layout)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.table, self.layout],
                {"days_ahead": self.days_ahead, "period": self.period,
                 **({"hints": self.hints} if self.hints else {})})

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if self._applies(app_label, schema_editor):
            until = datetime.now(UTC) + timedelta(days=self.days_ahead)
            partitioning.ensure_time_partitions(
                schema_editor.connection, self.table, _layout(self.layout), until=until,
                period=self.period,
            )

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        pass  # partitions may already hold rows: dropping them is a deliberate, manual step

    def describe(self) -> str:
        return f"Add {self.period} partitions of {self.table} for {self.days_ahead} days ahead"
