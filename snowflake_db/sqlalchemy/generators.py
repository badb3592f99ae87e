"""Which generator a Snowflake column default uses: per table, per engine, or the process default.

A plain ``default=snowflake_default`` always uses the process-wide generator. A
:class:`SnowflakeDefault` is a *context-sensitive* default: SQLAlchemy passes it the execution
context of each row (`context_default_functions` in the SQLAlchemy docs), so it can pick a
generator bound to the row's table or to the engine executing the statement (each shard's engine
may carry its own layout), and can compute an embedded shard from the row's own values.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, InvalidArgumentTypeError
from ..generator import SnowflakeGenerator
from ..process import get_generator, snowflake_default

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.engine.interfaces import ExecutionContext
    from sqlalchemy.ext.asyncio import AsyncEngine
    from sqlalchemy.sql.expression import TableClause

__all__ = [
    "SnowflakeDefault",
    "bind_generator",
    "generator_for",
    "snowflake_id_default",
    "unbind_generator",
]

GeneratorSource = SnowflakeGenerator | Callable[[], SnowflakeGenerator]
"""A generator, or a zero-argument callable returning one (resolved at each use, so it can be
created lazily, e.g. after a fork)."""

ShardFunction = Callable[[Mapping[str, Any]], int]

_lock = threading.Lock()
_by_table: dict[str, GeneratorSource] = {}
_by_engine: weakref.WeakKeyDictionary[Engine, GeneratorSource] = weakref.WeakKeyDictionary()
#: False while nothing is bound: the per-row default then goes straight to the process generator.
_bound = False


def _note_bindings() -> None:
    global _bound  # noqa: PLW0603
    _bound = bool(_by_table) or len(_by_engine) > 0


def _table_key(table: TableClause | str) -> str:
    if isinstance(table, str):
        if not table:
            raise InvalidArgumentError("table name must not be empty")
        return table
    fullname = getattr(table, "fullname", None)
    if not isinstance(fullname, str):
        raise InvalidArgumentTypeError(
            f"table must be a Table or a table name, got {type(table).__name__} {table!r}"
        )
    return fullname


def _sync_engine(engine: Engine | AsyncEngine | Connection) -> Engine:
    sync = getattr(engine, "sync_engine", None)  # AsyncEngine
    if sync is not None:
        return sync  # type: ignore[no-any-return]
    nested = getattr(engine, "engine", None)  # Connection
    if nested is not None and nested is not engine:
        return nested  # type: ignore[no-any-return]
    return engine  # type: ignore[return-value]


def _check_source(generator: object) -> GeneratorSource:
    if isinstance(generator, SnowflakeGenerator) or callable(generator):
        return generator
    raise InvalidArgumentTypeError(
        "generator must be a SnowflakeGenerator or a zero-argument callable returning one, "
        f"got {type(generator).__name__} {generator!r}"
    )


def _resolve(source: GeneratorSource) -> SnowflakeGenerator:
    if isinstance(source, SnowflakeGenerator):
        return source
    generator = source()
    if not isinstance(generator, SnowflakeGenerator):
        raise InvalidArgumentTypeError(
            f"the generator factory {source!r} returned {type(generator).__name__}, "
            "not a SnowflakeGenerator"
        )
    return generator


def bind_generator(
    generator: GeneratorSource,
    *,
    table: TableClause | str | None = None,
    engine: Engine | AsyncEngine | None = None,
) -> None:
    """Make :class:`SnowflakeDefault` columns of ``table`` (or on ``engine``) use ``generator``.

    A table binding wins over an engine binding, which wins over the process-wide generator.
    Tables are matched by full name (``schema.name``), so one binding covers the same table in
    every database; engines are held weakly.
    """
    source = _check_source(generator)
    if (table is None) == (engine is None):
        raise InvalidArgumentError("pass exactly one of table= or engine=")
    with _lock:
        if table is not None:
            _by_table[_table_key(table)] = source
        else:
            assert engine is not None
            _by_engine[_sync_engine(engine)] = source
        _note_bindings()


def unbind_generator(
    *, table: TableClause | str | None = None, engine: Engine | AsyncEngine | None = None
) -> None:
    """Remove a binding made by :func:`bind_generator` (missing bindings are ignored)."""
    with _lock:
        if table is not None:
            _by_table.pop(_table_key(table), None)
        if engine is not None:
            _by_engine.pop(_sync_engine(engine), None)
        _note_bindings()


def generator_for(
    *,
    table: TableClause | str | None = None,
    engine: Engine | AsyncEngine | Connection | None = None,
) -> SnowflakeGenerator:
    """The generator a :class:`SnowflakeDefault` uses for ``table`` on ``engine``."""
    if not _bound:
        return get_generator()
    if table is not None and _by_table:
        source = _by_table.get(_table_key(table))
        if source is not None:
            return _resolve(source)
    if engine is not None:
        engine_source = _by_engine.get(_sync_engine(engine))
        if engine_source is not None:
            return _resolve(engine_source)
    return get_generator()


def _current_table(context: ExecutionContext) -> TableClause | None:
    column = getattr(context, "current_column", None)
    # multi-VALUES inserts hand the default a per-row copy of the column
    column = getattr(column, "original", column)
    return getattr(column, "table", None)


class SnowflakeDefault:
    """A column default that issues an ID per row from the right generator.

    * ``SnowflakeDefault()`` uses the table's bound generator, else the engine's, else the
      process-wide one (``snowflake_default``); with no bindings it costs the same as
      ``default=snowflake_default``.
    * ``SnowflakeDefault(generator)`` always uses ``generator`` (or a factory returning one).
    * ``shard=3`` or ``shard_for=lambda row: ...`` embed a shard in the layout's shard bits;
      ``shard_for`` gets the row's values (the INSERT parameters, or the constructor's keyword
      arguments with :func:`~snowflake_db.sqlalchemy.assign_ids_on_init`).
    """

    __slots__ = ("_generator", "_plain", "_shard", "_shard_for")

    def __init__(
        self,
        generator: GeneratorSource | None = None,
        *,
        shard: int | None = None,
        shard_for: ShardFunction | None = None,
    ) -> None:
        if shard is not None and shard_for is not None:
            raise InvalidArgumentError("pass at most one of shard= and shard_for=")
        if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int)):
            raise InvalidArgumentTypeError(f"shard must be an int, got {shard!r}")
        if shard_for is not None and not callable(shard_for):
            raise InvalidArgumentTypeError(f"shard_for must be callable, got {shard_for!r}")
        self._generator = None if generator is None else _check_source(generator)
        self._shard = shard
        self._shard_for = shard_for
        self._plain = generator is None and shard is None and shard_for is None

    def __call__(self, context: ExecutionContext) -> int:
        """Called by SQLAlchemy once per inserted row with the execution context."""
        if self._plain and not _bound:
            return snowflake_default()
        values: Mapping[str, Any] | None = None
        if self._shard_for is not None:
            values = context.get_current_parameters()  # type: ignore[attr-defined]
        return self.id_for(
            table=_current_table(context),
            engine=getattr(context, "root_connection", None),
            values=values,
        )

    def generator(
        self,
        *,
        table: TableClause | str | None = None,
        engine: Engine | AsyncEngine | Connection | None = None,
    ) -> SnowflakeGenerator:
        """The generator this default would use for ``table`` on ``engine``."""
        if self._generator is not None:
            return _resolve(self._generator)
        return generator_for(table=table, engine=engine)

    def id_for(
        self,
        *,
        table: TableClause | str | None = None,
        engine: Engine | AsyncEngine | Connection | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> int:
        """Issue an ID outside an INSERT (object construction, COPY, raw SQL)."""
        generator = self.generator(table=table, engine=engine)
        shard = self._shard
        if self._shard_for is not None:
            shard = self._shard_for(values if values is not None else {})
        if shard is None:
            return generator.next_id()
        return generator.next_id_in_shard(shard)

    def __repr__(self) -> str:
        parts = []
        if self._generator is not None:
            parts.append(repr(self._generator))
        if self._shard is not None:
            parts.append(f"shard={self._shard}")
        if self._shard_for is not None:
            parts.append(f"shard_for={self._shard_for!r}")
        return f"SnowflakeDefault({', '.join(parts)})"


_plain_default = SnowflakeDefault()


def snowflake_id_default(context: ExecutionContext) -> int:
    """The default the column helpers use: bindings first, then the process-wide generator.

    A plain function rather than a ``SnowflakeDefault`` instance: SQLAlchemy calls it for every
    row, and with nothing bound it is one check and the generator's own call.
    """
    if not _bound:
        return snowflake_default()
    return _plain_default(context)

