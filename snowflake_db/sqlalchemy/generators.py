"""Which generator a Snowflake column default uses: per table, per engine, or the process default.

A plain ``default=snowflake_default`` always uses the process-wide generator. A
:class:`SnowflakeDefault` is a *context-sensitive* default: SQLAlchemy passes it the execution
context of each row (`context_default_functions` in the SQLAlchemy docs), so it can pick a
generator bound to the row's table or to the engine executing the statement (each shard's engine
may carry its own layout), and can compute an embedded shard from the row's own values. It (and
the column helpers' default) also sees how many rows the INSERT has, so a multi-row INSERT takes
its IDs with one ``next_ids`` call instead of one generator call per row.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import GeneratorClosedError, InvalidArgumentError, InvalidArgumentTypeError
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
_Issued = TypeVar("_Issued", int, list[int])

#: The execution-context attribute holding a multi-row INSERT's IDs: ``{column: next ID}``.
#: The per-row defaults spell it out literally (``context._snowflake_db_batches``) for speed.
_BATCHES = "_snowflake_db_batches"

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


def _next_id(generator: SnowflakeGenerator) -> int:
    return generator.next_id()


def _current_table(context: ExecutionContext) -> TableClause | None:
    column = getattr(context, "current_column", None)
    # multi-VALUES inserts hand the default a per-row copy of the column
    column = getattr(column, "original", column)
    return getattr(column, "table", None)


class SnowflakeDefault:
    """A column default that issues an ID per row from the right generator.

    * ``SnowflakeDefault()`` uses the table's bound generator, else the engine's, else the
      process-wide one (``snowflake_default``). A multi-row INSERT takes its IDs in one
      ``next_ids`` call.
    * ``SnowflakeDefault(generator)`` always uses ``generator`` (or a factory returning one).
    * ``shard=3`` or ``shard_for=lambda row: ...`` embed a shard in the layout's shard bits;
      ``shard_for`` gets the row's values (the INSERT parameters, or the constructor's keyword
      arguments with :func:`~snowflake_db.sqlalchemy.assign_ids_on_init`).
    """

    __slots__ = ("_generator", "_shard", "_shard_for")

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

    def __call__(self, context: ExecutionContext) -> int:
        """Called by SQLAlchemy once per inserted row with the execution context.

        A multi-row INSERT takes all of its IDs with one ``next_ids`` call at its first row and
        hands them out from the execution context (see :func:`_id_for_new_row`), so each row
        costs a dictionary lookup instead of a generator call.
        """
        if self._shard_for is None:
            try:
                return context._snowflake_db_batches[context.current_column]()  # type: ignore[attr-defined, no-any-return]
            except (AttributeError, KeyError, StopIteration):
                pass
        return _id_for_new_row(self, context)

    @property
    def shard_for(self) -> ShardFunction | None:
        """The function computing each row's shard from its values, or ``None``."""
        return self._shard_for

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
        shard = self._shard
        if self._shard_for is not None:
            shard = self._shard_for(values if values is not None else {})
        if shard is None:
            # The instance's own ``next_id`` (the lock-free closure); the class attribute
            # ``SnowflakeGenerator.next_id`` is the locked slow path, five times slower.
            return self._issue(table, engine, _next_id)
        return self._issue(table, engine, lambda generator: generator.next_id_in_shard(shard))

    def ids_for(
        self,
        count: int,
        *,
        table: TableClause | str | None = None,
        engine: Engine | AsyncEngine | Connection | None = None,
    ) -> list[int]:
        """Issue ``count`` increasing IDs with one ``next_ids`` call (bulk loads, COPY).

        Not for a ``shard_for`` default: its shard depends on each row's values.
        """
        if self._shard_for is not None:
            raise InvalidArgumentError(
                "ids_for() cannot compute shard_for per row; call id_for(values=...) per row"
            )
        shard = self._shard

        def issue(generator: SnowflakeGenerator) -> list[int]:
            if shard is None:
                return generator.next_ids(count)
            generator.layout.check_shard(shard)
            return [snowflake_id | shard for snowflake_id in generator.next_ids(count)]

        return self._issue(table, engine, issue)

    def _issue(
        self,
        table: TableClause | str | None,
        engine: Engine | AsyncEngine | Connection | None,
        issue: Callable[[SnowflakeGenerator], _Issued],
    ) -> _Issued:
        generator = self.generator(table=table, engine=engine)
        try:
            return issue(generator)
        except GeneratorClosedError:
            # configure() replaced the process generator while this call was in flight: a
            # second lookup finds the new one (a closed generator bound by hand raises again).
            return issue(self.generator(table=table, engine=engine))

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
#: What a bare ``default=snowflake_default`` stands for: always the process-wide generator.
_process_default = SnowflakeDefault(get_generator)


def snowflake_default_of(column: Any) -> SnowflakeDefault | None:
    """The :class:`SnowflakeDefault` a column's Python default amounts to, if it is one.

    The column helpers' :func:`snowflake_id_default` is the unbound ``SnowflakeDefault()``; a bare
    ``default=snowflake_default`` (which SQLAlchemy wraps, keeping it as ``__wrapped__``) always
    uses the process-wide generator. Any other default gives ``None``.
    """
    arg = getattr(getattr(column, "default", None), "arg", None)
    if arg is snowflake_id_default:
        return _plain_default
    if isinstance(arg, SnowflakeDefault):
        return arg
    if getattr(arg, "__wrapped__", None) is snowflake_default:
        return _process_default
    return None


def snowflake_id_default(context: ExecutionContext) -> int:
    """The default the column helpers use: bindings first, then the process-wide generator.

    A plain function rather than a ``SnowflakeDefault`` instance, with the same per-statement
    batches: SQLAlchemy calls it for every row, and a function call is the cheapest call.
    """
    try:
        return context._snowflake_db_batches[context.current_column]()  # type: ignore[attr-defined, no-any-return]
    except (AttributeError, KeyError, StopIteration):
        return _id_for_new_row(_plain_default, context)


def _id_for_new_row(default: SnowflakeDefault, context: ExecutionContext) -> int:
    """The per-row default's slow path: start the statement's batch of IDs, or issue one ID.

    SQLAlchemy evaluates a column's default once for each parameter set of an executemany or
    insertmanyvalues INSERT (``context.compiled_parameters``), all in one call on one thread,
    before anything is sent. So the first row takes all of the statement's IDs at once and
    leaves the rest on the execution context, keyed by column (a table may have two Snowflake
    columns). Single rows, multi-VALUES inserts (which pass a copy of the column per row),
    ``shard_for`` defaults and a batch already used up get one ID each. Nothing outlives the
    statement: the next execution has a new context.
    """
    table = _current_table(context)
    engine = getattr(context, "root_connection", None)
    if default.shard_for is not None:
        values = context.get_current_parameters()  # type: ignore[attr-defined]
        return default.id_for(table=table, engine=engine, values=values)
    rows = len(getattr(context, "compiled_parameters", None) or ())
    column = getattr(context, "current_column", None)
    batches: dict[Any, Callable[[], int]] | None = getattr(context, _BATCHES, None)
    if rows < 2 or column is None or (batches is not None and column in batches):
        return default.id_for(table=table, engine=engine)
    if batches is None:
        batches = {}
        setattr(context, _BATCHES, batches)
    ids = default.ids_for(rows, table=table, engine=engine)
    next_in_batch = batches[column] = iter(ids).__next__
    return next_in_batch()
