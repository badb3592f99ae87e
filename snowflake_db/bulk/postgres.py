"""PostgreSQL: rows streamed with ``COPY ... FROM STDIN`` through psycopg 3.

Text format. Columns of plain values (ints, strs, datetimes, decimals, ...) are formatted a
column at a time (:mod:`.copy_text`); any other column, with each column's type given to
psycopg (``Copy.set_types``), goes through ``Copy.write_row``, which adapts Python values as
the column expects (dicts for ``jsonb``, ``bytes`` for ``bytea``).
Measured here, text and binary COPY load the same rows at the same speed (within noise, about
0.4M rows/s; again on 2026-11-25 with bench_bulk's orders and items from buffers made in
advance: 174 ms text, 190 ms binary per 40,000 rows, all of it server time); binary was
rejected because it converts no type on the server: an ``int`` above
2**31 sent to an ``integer`` column arrives wrapped to a negative number, silently, and a
``float`` for a ``numeric`` column is refused. In text format the server parses each value and
refuses what does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .copy_text import text_block
from .table import BulkTable, ChunkedRows, ColumnRows
from .values import check_temporal, diagnose, kind_of

__all__ = ["column_types", "copy_rows", "quote"]

#: Rows per block sent. Small enough that the server starts parsing, inserting and indexing
#: while the next block is formatted (the client and the server then work side by side on a
#: two-core machine); large enough that per-block costs stay negligible. The first block is
#: smaller: until it arrives the server has nothing to do.
_CHUNK_ROWS = 2_000
_FIRST_BLOCK_ROWS = 250


def _blocks(count: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each block of ``count`` rows."""
    start, end = 0, min(count, _FIRST_BLOCK_ROWS)
    while start < count:
        yield start, end
        start, end = end, min(count, end + _CHUNK_ROWS)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _relation(table: BulkTable) -> str:
    return f"{quote(table.schema)}.{quote(table.name)}" if table.schema else quote(table.name)


def column_types(dbapi_connection: Any, table: BulkTable) -> list[tuple[int, str]]:
    """``(type OID, type name)`` of each of ``table.columns``, from the catalog."""
    from ..errors import BulkLoadError

    with dbapi_connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname, a.atttypid::int, t.typname FROM pg_attribute a "
            "JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (_relation(table),),
        )
        found = {name: (oid, type_name) for name, oid, type_name in cursor.fetchall()}
    missing = [column for column in table.columns if column not in found]
    if missing:
        raise BulkLoadError(f"table {table.label} has no column(s) {missing}")
    return [found[column] for column in table.columns]


def copy_rows(
    dbapi_connection: Any,
    table: BulkTable,
    rows: Sequence[Sequence[Any]],
    *,
    beside_server: Callable[[], None] | None = None,
) -> None:
    """Send ``rows`` by one ``COPY`` in the connection's current transaction.

    A refused value (NUL in text, a number too large for its column) aborts the whole COPY;
    the error then names the row, column and value where they can be found.
    ``beside_server`` runs once every row is written, before the COPY ends: the socket then
    holds rows the server has yet to store (measured with bench_bulk's rounds: 6 ms of them
    after 10,000 orders, 20-40 ms after 30,000 items), time the client would spend waiting.
    """
    types = column_types(dbapi_connection, table)
    kinds = [kind_of(type_name) for _, type_name in types]
    chunked = rows if isinstance(rows, ChunkedRows) else None
    if chunked is None:
        check_temporal(table, kinds, rows, "postgresql")
    columns = ", ".join(quote(column) for column in table.columns)
    statement = f"COPY {_relation(table)} ({columns}) FROM STDIN"
    read = getattr(rows, "column", None)  # ColumnRows: the columns as they are
    beside_failed = False
    try:
        with dbapi_connection.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types([oid for oid, _ in types])
            write_row = copy.write_row
            for start, end in _blocks(len(rows)):
                block_columns: list[list[Any]]
                if chunked is not None:  # made now, while the server stores the last block
                    block_columns = chunked.chunk(start, end)
                    check_temporal(
                        table, kinds, ColumnRows(block_columns), "postgresql", first_row=start
                    )
                elif read is not None:
                    block_columns = [read(index)[start:end] for index in range(len(types))]
                else:
                    block_columns = list(map(list, zip(*rows[start:end], strict=True)))
                block = text_block(block_columns)
                if block is not None:
                    copy.write(block)
                    continue
                for row in zip(*block_columns, strict=True):  # a column psycopg must adapt
                    write_row(row)  # (JSON, bytes, ...)
            if beside_server is not None:
                beside_failed = True
                beside_server()
                beside_failed = False
    except Exception as error:
        if beside_failed:  # not a value of these rows: nothing to diagnose
            raise
        sent = rows if chunked is None else chunked.made()  # never make more rows to report
        found = diagnose(table, kinds, sent, "postgresql")
        if found is not None:
            raise found from error
        raise
