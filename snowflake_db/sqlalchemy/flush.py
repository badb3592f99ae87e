"""ORM objects get their Snowflake key at flush, before the unit of work groups its INSERTs.

The unit of work sends the INSERTs of objects whose primary keys it already knows as one plain
executemany. Objects whose key is left to a column default go through "insertmanyvalues"
instead: one large multi-row statement per batch, which psycopg parses again every time (its
query cache skips long statements), about a quarter slower on PostgreSQL
(``benchmarks/bench_insert.py``). A mapper's ``before_insert`` event runs before that grouping,
so setting the key there puts Snowflake tables on the fast path. The IDs are those the column
default would give at the INSERT: same generator (table binding, engine binding, process
generator), same fixed shard. A ``shard_for`` default is left to the INSERT, where it sees every
column's final value.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapper

from .generators import snowflake_default_of

__all__ = ["install_flush_hook"]


def install_flush_hook() -> None:
    """Watch every mapper as it is configured (idempotent; ``snowflake_db.sqlalchemy`` calls it
    on import, which the column helpers guarantee happens before any model is configured)."""
    if not event.contains(Mapper, "mapper_configured", _on_mapper_configured):
        event.listen(Mapper, "mapper_configured", _on_mapper_configured)


def _on_mapper_configured(mapper: Mapper[Any], class_: type) -> None:
    if len(mapper.primary_key) != 1:
        return
    column = mapper.primary_key[0]
    default = snowflake_default_of(column)
    if default is None or default.shard_for is not None:
        return
    key = mapper.get_property_by_column(column).key
    table = column.table

    def assign_key(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
        if target.__dict__.get(key) is None:
            setattr(target, key, default.id_for(table=table, engine=connection))

    # Per mapper, not propagated: each subclass mapper is configured, and checked, on its own.
    event.listen(mapper, "before_insert", assign_key)
