"""SQLAlchemy: bulk loads of Core rows or ORM objects, in the caller's transaction.

``bulk_load(connection_or_session, table_or_class, rows_or_objects)`` fills missing keys from
the key column's own Snowflake default (its bound generator, fixed shard) with one
``next_ids`` call, sends the rows by the fastest safe path of the backend
(:func:`snowflake_db.bulk.load_rows`) inside a savepoint, and returns the keys in row order.
ORM objects get their key set on them; they stay transient (not added to the session), as
with ``Session.bulk_save_objects``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from sqlalchemy import Table, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.orm.exc import UnmappedColumnError

from ..bulk.load import load_rows
from ..bulk.table import BulkTable, ColumnRows, fill_key_column, rows_as_lists
from ..errors import BulkLoadError
from .generators import snowflake_default_of

__all__ = ["bulk_load", "bulk_load_with_children"]

_MISSING = object()


@dataclass
class _Batch:
    """One table's rows, ready to send: lists in column order, and the objects they came from."""

    table: Table
    spec: BulkTable
    rows: ColumnRows
    objects: list[Any] | None
    key_attr: str | None


def _table_and_mapper(target: Table | type | Mapper[Any]) -> tuple[Table, Mapper[Any] | None]:
    if isinstance(target, Table):
        return target, None
    mapper = target if isinstance(target, Mapper) else inspect(target, raiseerr=False)
    if not isinstance(mapper, Mapper):
        raise BulkLoadError(f"expected a Table, a mapped class or a Mapper, got {target!r}")
    table = mapper.local_table
    if mapper.inherits is not None and mapper.inherits.local_table is not table:
        raise BulkLoadError(
            f"{mapper.class_.__name__} uses joined-table inheritance: its rows span "
            f"{len(mapper.tables)} tables, which a bulk load cannot write together"
        )
    if not isinstance(table, Table):
        raise BulkLoadError(f"{mapper.class_.__name__} is not mapped to a Table")
    return table, mapper


def _key_column(table: Table) -> str | None:
    keys = list(table.primary_key.columns)
    if len(keys) == 1 and snowflake_default_of(keys[0]) is not None:
        return str(keys[0].name)
    return None


def _python_default(column: Any) -> Any:
    default = column.default
    if default is None:
        return _MISSING
    if default.is_scalar:
        return default.arg
    if default.is_callable:
        return default.arg(None)  # SQLAlchemy wraps zero-argument callables to take a context
    return _MISSING


def _attr_of(mapper: Mapper[Any], column: Any) -> str | None:
    try:
        return str(mapper.get_property_by_column(column).key)
    except UnmappedColumnError:
        return None


def _object_rows(
    table: Table, mapper: Mapper[Any], objects: list[Any], key: str | None, always: str | None
) -> tuple[BulkTable, list[list[Any]], str | None]:
    pairs = []
    for column in table.columns:
        attr = _attr_of(mapper, column)
        if attr is not None:
            pairs.append((str(column.name), attr, column))
    chosen: list[tuple[str, str, Any]] = []
    for name, attr, column in pairs:
        present = name in (key, always) or any(attr in obj.__dict__ for obj in objects)
        if present or _python_default(column) is not _MISSING:
            chosen.append((name, attr, column))
    rows = []
    for obj in objects:
        state = obj.__dict__
        row = []
        for name, attr, column in chosen:
            value = state.get(attr, _MISSING)
            if value is _MISSING:
                value = None if name in (key, always) else _python_default(column)
                value = None if value is _MISSING else value
            row.append(value)
        rows.append(row)
    spec = BulkTable(table.name, tuple(name for name, _, _ in chosen), key, table.schema)
    key_attr = next((attr for name, attr, _ in chosen if name == key), None)
    return spec, rows, key_attr


def _columns(
    spec: BulkTable, rows: Sequence[Mapping[str, Any] | Sequence[Any]], optional: set[str]
) -> ColumnRows:
    """The rows as columns, read a column at a time when every row has the same shape (the
    common case); otherwise row by row, which names the first row that differs."""
    try:
        if isinstance(rows[0], Mapping):
            if len(set(map(len, rows))) == 1:
                absent = optional - set(rows[0])  # in no row, since all have the same keys
                return ColumnRows([
                    [None] * len(rows) if name in absent
                    else list(map(itemgetter(name), rows))
                    for name in spec.columns
                ])
        else:
            return ColumnRows([list(column) for column in zip(*rows, strict=True)])
    except (KeyError, ValueError, TypeError):
        pass
    lists = rows_as_lists(spec, rows, optional)
    return ColumnRows([list(column) for column in zip(*lists, strict=True)])


def _dict_rows(
    table: Table,
    rows: Sequence[Mapping[str, Any] | Sequence[Any]],
    key: str | None,
    always: str | None,
) -> tuple[BulkTable, ColumnRows]:
    first = rows[0]
    if isinstance(first, Mapping):
        given = set(first)
        names = [c.name for c in table.columns if c.name in given or c.name in (key, always)]
        unknown = given - {c.name for c in table.columns}
        if unknown:
            raise BulkLoadError(f"{table.name} has no column(s) {sorted(unknown)}")
    else:
        names = [c.name for c in table.columns]
    spec = BulkTable(table.name, tuple(names), key if key in names else None, table.schema)
    optional = {name for name in (key, always) if name is not None}
    return spec, _columns(spec, rows, optional)


def _prepare(
    target: Table | type | Mapper[Any], rows: Iterable[Any], always: str | None = None
) -> _Batch:
    table, mapper = _table_and_mapper(target)
    items = list(rows)
    key = _key_column(table)
    if not items:
        return _Batch(table, BulkTable(table.name, ("_",), None), ColumnRows([]), None, None)
    if isinstance(items[0], Mapping | Sequence) and not isinstance(items[0], str | bytes):
        spec, lists = _dict_rows(table, items, key, always)
        return _Batch(table, spec, lists, None, None)
    if mapper is None:
        mapper = inspect(type(items[0]), raiseerr=False)
        if not isinstance(mapper, Mapper) or mapper.local_table is not table:
            raise BulkLoadError(f"objects of {type(items[0]).__name__} are not rows of {table}")
    for obj in items:
        if not isinstance(obj, mapper.class_):
            raise BulkLoadError(
                f"a bulk load of {mapper.class_.__name__} got a {type(obj).__name__}"
            )
    spec, row_lists, key_attr = _object_rows(table, mapper, items, key, always)
    columns = ColumnRows([list(column) for column in zip(*row_lists, strict=True)])
    return _Batch(table, spec, columns, items, key_attr)


def _fill_keys(batch: _Batch, connection: Connection) -> None:
    index = batch.spec.key_index
    if index is None:
        return
    default = snowflake_default_of(batch.table.columns[batch.spec.columns[index]])
    assert default is not None
    column = batch.rows.column(index)
    if default.shard_for is None:
        fill_key_column(column, lambda n: default.ids_for(n, table=batch.table,
                                                          engine=connection))
        return
    names = batch.spec.columns
    for number, row in enumerate(batch.rows):  # a shard_for default needs each row's values
        if row[index] is None:
            column[number] = default.id_for(
                table=batch.table, engine=connection, values=dict(zip(names, row, strict=True))
            )


def _connection(target: Connection | Session, table: Table) -> Connection:
    if isinstance(target, Session):
        return target.connection(bind_arguments={"clause": table})
    if isinstance(target, Connection):
        return target
    raise BulkLoadError(f"expected a Connection or a Session, got {type(target).__name__}")


def _send(connection: Connection, batches: list[_Batch], mariadb_method: str) -> None:
    """All batches in one savepoint of the caller's transaction: all rows or none."""
    dbapi = connection.connection.dbapi_connection
    vendor = connection.dialect.name
    if vendor == "sqlite" and dbapi is not None and not dbapi.in_transaction:
        # pysqlite opens no transaction for SAVEPOINT; releasing the outermost one would
        # commit. BEGIN first keeps the rows in the caller's transaction.
        connection.exec_driver_sql("BEGIN")
    base_error = connection.dialect.loaded_dbapi.Error
    with connection.begin_nested():
        for batch in batches:
            if not batch.rows:
                continue
            try:
                load_rows(dbapi, vendor, batch.spec, batch.rows, mariadb_method=mariadb_method)
            except base_error as error:
                # As SQLAlchemy reports driver errors: IntegrityError for a duplicate key, ...
                raise DBAPIError.instance(
                    f"bulk load into {batch.spec.label}", None, error, base_error,
                    dialect=connection.dialect,
                ) from error


def _give_keys(batch: _Batch) -> list[Any]:
    index = batch.spec.key_index
    if index is None:
        return []
    keys = list(batch.rows.column(index))
    if batch.objects is not None and batch.key_attr is not None:
        for obj, key in zip(batch.objects, keys, strict=True):
            setattr(obj, batch.key_attr, key)
    return keys


def bulk_load(
    target: Connection | Session,
    table: Table | type | Mapper[Any],
    rows: Iterable[Any],
    *,
    mariadb_method: str = "auto",
) -> list[Any]:
    """Load ``rows`` (dicts or tuples of a Core ``Table``, or ORM objects of a mapped class)
    and return their keys in order.

    Rows without a key get one from the key column's Snowflake default (one ``next_ids``
    call). PostgreSQL: COPY (psycopg 3). MariaDB: ``LOAD DATA LOCAL INFILE`` when the server
    and the connection (``local_infile=True``) allow it, else multi-row INSERTs;
    ``mariadb_method="load_data"`` requires the former, ``"insert"`` the latter. SQLite:
    executemany. Runs in a savepoint of the caller's transaction (commit as usual); any
    failure, a duplicate key included, leaves none of the rows.
    """
    batch = _prepare(table, rows)
    connection = _connection(target, batch.table)
    _fill_keys(batch, connection)
    _send(connection, [batch], mariadb_method)
    return _give_keys(batch)


def bulk_load_with_children(
    target: Connection | Session,
    parents: Table | type | Mapper[Any],
    children: Table | type | Mapper[Any],
    families: Iterable[tuple[Any, Iterable[Any]]],
    *,
    parent_column: str,
    mariadb_method: str = "auto",
) -> list[Any]:
    """Orders and their items in one pass: ``families`` is ``(parent, [children])`` pairs
    (dicts or ORM objects). Every key is made before anything is sent, each child's
    ``parent_column`` (its foreign key column) gets its parent's key, then the parents and
    the children go in one savepoint: two COPY streams on PostgreSQL, nothing read back.
    Returns the parents' keys; ORM objects get their keys and foreign keys once loaded. For
    sharded orders, call it once per shard with that shard's connection and families.
    """
    pairs = [(parent, list(kids)) for parent, kids in families]
    parent_batch = _prepare(parents, [parent for parent, _ in pairs])
    child_batch = _prepare(children, [kid for _, kids in pairs for kid in kids], parent_column)
    index = parent_batch.spec.key_index
    if index is None:
        raise BulkLoadError(f"{parent_batch.table.name} has no single Snowflake key column")
    connection = _connection(target, parent_batch.table)
    _fill_keys(parent_batch, connection)
    parent_keys = parent_batch.rows.column(index)
    link = child_batch.spec.columns.index(parent_column) if child_batch.rows else 0
    if child_batch.rows:
        child_batch.rows.column(link)[:] = chain.from_iterable(
            repeat(key, len(kids)) for (_, kids), key in zip(pairs, parent_keys, strict=True)
        )
    _fill_keys(child_batch, connection)
    _send(connection, [parent_batch, child_batch], mariadb_method)
    if child_batch.objects:
        attr = _attr_for(children, parent_column)
        for obj, parent_key in zip(child_batch.objects, child_batch.rows.column(link), strict=True):
            setattr(obj, attr, parent_key)
    _give_keys(child_batch)
    return _give_keys(parent_batch)


def _attr_for(target: Table | type | Mapper[Any], column: str) -> str:
    table, mapper = _table_and_mapper(target)
    if mapper is None:
        return column
    return _attr_of(mapper, table.columns[column]) or column
