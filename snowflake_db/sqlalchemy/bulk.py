"""Opt-in fast path for multi-row INSERTs: Snowflake keys in bulk instead of row by row.

SQLAlchemy evaluates a Python column default once per row, through several calls, for every
``conn.execute(table.insert(), rows)``; on PostgreSQL that costs about as much as the INSERT's
extra parameter. :func:`assign_ids_in_bulk` registers a ``before_execute`` listener that fills the
key of every row with one ``next_ids(n)`` call before SQLAlchemy looks at the defaults, so it
has nothing left to evaluate. IDs, generators, layouts and shards are the same as the per-row
default would give; the caller's row dictionaries are copied, never changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Column, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.dml import Insert

from ..errors import GeneratorClosedError
from ..process import get_generator, snowflake_default
from .generators import SnowflakeDefault, _plain_default, snowflake_id_default

__all__ = ["assign_ids_in_bulk", "stop_assigning_ids_in_bulk"]

#: Stands for ``default=snowflake_default``: the process-wide generator, whatever is bound.
_PROCESS_DEFAULT = SnowflakeDefault(get_generator)


def assign_ids_in_bulk(target: Engine | type[Engine]) -> None:
    """Fill Snowflake keys of multi-row INSERTs on ``target`` (an engine, or ``Engine`` for all).

    Applies to executemany INSERTs (two rows or more, as dictionaries) into a table whose
    single-column primary key has the library's default (the column helpers, or a
    :class:`SnowflakeDefault` without ``shard_for``) and whose rows do not carry the key already.
    Every other statement runs exactly as before.
    """
    if not event.contains(target, "before_execute", _fill_keys):
        event.listen(target, "before_execute", _fill_keys, retval=True)


def stop_assigning_ids_in_bulk(target: Engine | type[Engine]) -> None:
    if event.contains(target, "before_execute", _fill_keys):
        event.remove(target, "before_execute", _fill_keys)


def _fill_keys(
    connection: Connection,
    statement: Any,
    multiparams: Sequence[Any],
    params: Mapping[str, Any],
    execution_options: Mapping[str, Any],
) -> tuple[Any, Sequence[Any], Mapping[str, Any]]:
    if not isinstance(statement, Insert) or len(multiparams) < 2:
        return statement, multiparams, params
    column = _snowflake_key(statement)
    if column is None or not all(isinstance(row, Mapping) for row in multiparams):
        return statement, multiparams, params
    key = column.key
    if any(key in row for row in multiparams):
        return statement, multiparams, params
    ids = _next_ids(column.default.arg, statement, connection, len(multiparams))  # type: ignore[union-attr]
    return statement, [{**row, key: i} for row, i in zip(multiparams, ids, strict=True)], params


def _snowflake_key(statement: Insert) -> Column[Any] | None:
    """The table's Snowflake primary-key column, if the statement leaves it to its default."""
    # Explicit .values()/.from_select() decide the columns themselves: leave those alone.
    if statement._values or statement._multi_values or statement.select is not None:
        return None
    table = statement.table
    primary_key = getattr(table, "primary_key", None)
    if primary_key is None or len(primary_key.columns) != 1:
        return None
    column: Column[Any] = next(iter(primary_key.columns))
    arg = getattr(column.default, "arg", None)
    # SQLAlchemy wraps a zero-argument default (``default=snowflake_default``) in a function
    # taking the context, keeping the original as ``__wrapped__``.
    if arg is snowflake_id_default or getattr(arg, "__wrapped__", None) is snowflake_default:
        return column
    if isinstance(arg, SnowflakeDefault) and arg._shard_for is None:
        return column
    return None


def _next_ids(arg: Any, statement: Insert, connection: Connection, count: int) -> list[int]:
    if isinstance(arg, SnowflakeDefault):
        default = arg
    elif arg is snowflake_id_default:
        default = _plain_default  # bound generators first, as the per-row default does
    else:
        default = _PROCESS_DEFAULT  # plain snowflake_default: always the process generator
    for _ in range(2):
        generator = default.generator(table=statement.table, engine=connection)
        try:
            ids = generator.next_ids(count)
            break
        except GeneratorClosedError:
            continue  # configure() replaced the process generator meanwhile: use the new one
    else:
        raise GeneratorClosedError("the Snowflake generator was replaced twice during one INSERT")
    shard = default._shard
    if shard is None:
        return ids
    generator.layout.check_shard(shard)
    return [snowflake_id | shard for snowflake_id in ids]
