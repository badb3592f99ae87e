"""MariaDB/MySQL: ``LOAD DATA LOCAL INFILE`` where the server and the client allow it, else
large multi-row INSERTs.

``LOAD DATA LOCAL`` cannot stop the client mid-file, so the server treats every duplicate key
and every truncated or clamped value as a *warning* and goes on (the MariaDB and MySQL manuals:
with ``LOCAL``, errors act as with ``IGNORE``; checked here on MariaDB 10.11: a duplicate key
skipped the row, a too-long string was cut, an out-of-range int clamped, the statement
"succeeded"). So a load counts the rows the server took and its warnings, and raises
:class:`~snowflake_db.errors.BulkLoadRejectedError` unless every row went in unchanged; the
framework helpers run each load in a savepoint, so the rows already taken are rolled back.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import BulkLoadError, BulkLoadRejectedError, LocalInfileRefusedError
from .table import BulkTable
from .values import check_temporal, kind_of, problem, refusal

__all__ = ["METHODS", "insert_rows", "load_data_rows", "load_rows", "local_infile_refusal"]

METHODS = ("auto", "load_data", "insert")
_CLIENT_LOCAL_FILES = 1 << 7  # CLIENT_LOCAL_FILES capability flag of the protocol handshake
_CHUNK_ROWS = 20_000
_UTC = "+00:00"


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _relation(table: BulkTable) -> str:
    return f"{quote(table.schema)}.{quote(table.name)}" if table.schema else quote(table.name)


def column_kinds(dbapi_connection: Any, table: BulkTable) -> list[str]:
    with dbapi_connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s",
            (table.schema, table.name),
        )
        found = {str(name): str(data_type) for name, data_type in cursor.fetchall()}
    missing = [column for column in table.columns if column not in found]
    if missing:
        raise BulkLoadError(f"table {table.label} has no column(s) {missing}")
    # TIMESTAMP holds an instant (kept as UTC, shown in the session's zone): a zoned column,
    # as PostgreSQL's timestamptz, unlike DATETIME (a wall time).
    return [
        "timestamptz" if found[column].lower() == "timestamp" else kind_of(found[column])
        for column in table.columns
    ]


@contextmanager
def _session_at_utc(dbapi_connection: Any, kinds: list[str]) -> Iterator[None]:
    """With a TIMESTAMP column, the session's time zone at UTC for the load, then back.

    The server reads the wall times it is sent in the session's ``time_zone``; aware
    datetimes are sent as UTC wall times (naive ones are refused for such a column), so any
    other session zone would shift every value by its offset.
    """
    if "timestamptz" not in kinds:
        yield
        return
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SELECT @@session.time_zone")
        zone = str(cursor.fetchone()[0])
        if zone != _UTC:
            cursor.execute("SET time_zone = %s", (_UTC,))
    try:
        yield
    finally:
        if zone != _UTC:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET time_zone = %s", (zone,))


def local_infile_refusal(dbapi_connection: Any) -> str | None:
    """Why ``LOAD DATA LOCAL INFILE`` cannot run on this connection, or None if it can."""
    client_flag = getattr(dbapi_connection, "client_flag", None)
    # PyMySQL also keeps the option itself; with the flag alone it fails mid-protocol.
    if (
        client_flag is not None and not client_flag & _CLIENT_LOCAL_FILES
    ) or not getattr(dbapi_connection, "_local_infile", True):
        return (
            "the client connection was opened without local files: pass local_infile=True to "
            "the driver (SQLAlchemy connect_args={'local_infile': True}; Django "
            "DATABASES[...]['OPTIONS']['local_infile'] = True)"
        )
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SELECT @@local_infile")
        row = cursor.fetchone()
    if not row or not int(row[0]):
        return "the server refuses local files (SET GLOBAL local_infile = 1, or local_infile=ON)"
    return None


def _utc_naive(value: dt.datetime) -> dt.datetime:
    if value.utcoffset() is None:
        return value
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def _escape(text: str) -> str:
    if "\\" in text or "\t" in text or "\n" in text or "\x00" in text:
        text = (
            text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\x00", "\\0")
        )
    return text


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _field(value: Any, binary: bool) -> str | None:
    """One value as a LOAD DATA field (escaped text, ``\\N`` for NULL), or None if it has no
    exact text form. ``binary`` columns get hex, turned back by ``UNHEX`` on the server."""
    kind = type(value)
    if value is None:
        return "\\N"
    if binary:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value).hex()
        if kind is str:
            return str(value).encode().hex()
        return None
    if kind is int:
        return str(value)
    if kind is str:
        return _escape(value)
    if kind is bool:
        return "1" if value else "0"
    if kind is dt.datetime:
        return _utc_naive(value).isoformat(" ")
    if kind is float:
        return repr(value)
    if kind is decimal.Decimal:
        return format(value, "f")
    if isinstance(value, dict | list):
        return _escape(_json_text(value))
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | int | str):
        return _escape(str(value))
    return None


def _insert_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return _utc_naive(value)
    if isinstance(value, dict | list):
        return _json_text(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _check(table: BulkTable, kinds: list[str], rows: Sequence[Sequence[Any]]) -> None:
    check_temporal(table, kinds, rows, "mariadb")
    for column, kind in enumerate(kinds):
        if kind not in ("float", "decimal", "other"):
            continue
        for number, row in enumerate(rows):
            value = row[column]
            if isinstance(value, float | decimal.Decimal):
                reason = problem(kind, value, "mariadb")
                if reason is not None:
                    raise refusal(table, column, number, value, reason)


#: Joins a text column for escaping in one pass: a lone surrogate, which no str that can be
#: written as UTF-8 contains (such a value fails the encoding, and is then reported).
_SEPARATOR = "\udfff"


def _text_column(values: list[str]) -> list[str] | None:
    """Escape a whole column of str at once (four ``replace`` calls on one string instead of
    a Python call per value); None if a value holds the separator."""
    joined = _SEPARATOR.join(values)
    if "\\" in joined or "\t" in joined or "\n" in joined or "\x00" in joined:
        joined = _escape(joined)
    out = joined.split(_SEPARATOR)
    return out if len(out) == len(values) else None


def _column_fields(values: list[Any], binary: bool) -> list[str | None]:
    """A column's LOAD DATA fields; ``None`` marks a value with no exact text form. Columns of
    plain ints or strs go at C speed, others value by value."""
    types = set(map(type, values))
    if not binary and types <= {int}:
        return list(map(str, values))
    if not binary and types <= {str}:
        escaped = _text_column(values)
        if escaped is not None:
            return list(escaped)
    return [_field(value, binary) for value in values]


def _write_file(
    table: BulkTable, kinds: list[str], rows: Sequence[Sequence[Any]], path: str
) -> None:
    binary = [kind == "bytes" for kind in kinds]
    read = getattr(rows, "column", None)  # ColumnRows: the columns as they are
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        for start in range(0, len(rows), _CHUNK_ROWS):
            end = start + _CHUNK_ROWS
            if read is not None:
                columns = [read(index)[start:end] for index in range(len(kinds))]
            else:
                columns = [list(column) for column in zip(*rows[start:end], strict=True)]
            fields = [
                _column_fields(values, flag) for values, flag in zip(columns, binary, strict=True)
            ]
            for index, column in enumerate(fields):
                if None in column:
                    number = column.index(None)
                    raise refusal(
                        table, index, start + number, columns[index][number],
                        "has no exact form for this column (LOAD DATA)",
                    )
            out.write("\n".join(map("\t".join, zip(*fields, strict=True))))
            out.write("\n")


def _warnings(cursor: Any) -> list[tuple[str, int, str]]:
    cursor.execute("SHOW WARNINGS LIMIT 20")
    return [(str(level), int(code), str(message)) for level, code, message in cursor.fetchall()]


def load_data_rows(dbapi_connection: Any, table: BulkTable, rows: Sequence[Sequence[Any]]) -> None:
    """One ``LOAD DATA LOCAL INFILE`` from a private temporary file, checked row for row."""
    kinds = column_kinds(dbapi_connection, table)
    _check(table, kinds, rows)
    with _session_at_utc(dbapi_connection, kinds):
        _load_file(dbapi_connection, table, kinds, rows)


def _load_file(
    dbapi_connection: Any, table: BulkTable, kinds: list[str], rows: Sequence[Sequence[Any]]
) -> None:
    targets = []
    setters = []
    for position, (column, kind) in enumerate(zip(table.columns, kinds, strict=True)):
        if kind == "bytes":
            targets.append(f"@sfdb_v{position}")
            setters.append(f"{quote(column)} = UNHEX(@sfdb_v{position})")
        else:
            targets.append(quote(column))
    handle, path = tempfile.mkstemp(prefix="sfdb_bulk_", suffix=".tsv")
    os.close(handle)
    try:
        _write_file(table, kinds, rows, path)
        statement = (
            f"LOAD DATA LOCAL INFILE %s INTO TABLE {_relation(table)} CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
            f"({', '.join(targets)})" + (f" SET {', '.join(setters)}" if setters else "")
        )
        with dbapi_connection.cursor() as cursor:
            cursor.execute(statement, (path,))
            loaded = cursor.rowcount
            warnings = int(getattr(cursor, "warning_count", 0) or 0)
            if loaded != len(rows) or warnings:
                found = _warnings(cursor)
                shown = "; ".join(f"{code} {message}" for _, code, message in found[:5])
                raise BulkLoadRejectedError(
                    f"LOAD DATA into {table.label} took {loaded} of {len(rows)} rows with "
                    f"{warnings} warning(s) (with LOCAL the server skips duplicate keys and "
                    f"cuts or clamps values instead of failing): {shown}",
                    found,
                )
    finally:
        os.unlink(path)


def insert_rows(dbapi_connection: Any, table: BulkTable, rows: Sequence[Sequence[Any]]) -> None:
    """Multi-row INSERTs as large as the server's ``max_allowed_packet`` allows (the driver's
    executemany joins the rows into statements of up to ``max_stmt_length`` bytes)."""
    kinds = column_kinds(dbapi_connection, table)
    _check(table, kinds, rows)
    columns = ", ".join(quote(column) for column in table.columns)
    marks = ", ".join(["%s"] * len(table.columns))
    statement = f"INSERT INTO {_relation(table)} ({columns}) VALUES ({marks})"
    convert: Callable[[Any], Any] = _insert_value
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
        if hasattr(cursor, "max_stmt_length"):
            cursor.max_stmt_length = max(1 << 16, min(packet - (1 << 12), 1 << 24))
        with _session_at_utc(dbapi_connection, kinds):
            cursor.executemany(statement, [[convert(value) for value in row] for row in rows])


def load_rows(
    dbapi_connection: Any, table: BulkTable, rows: Sequence[Sequence[Any]], method: str = "auto"
) -> str:
    """Load by ``method`` (``"auto"``, ``"load_data"``, ``"insert"``); returns the one used."""
    if method not in METHODS:
        raise BulkLoadError(f"method={method!r}: choose one of {METHODS}")
    if method != "insert":
        refused = local_infile_refusal(dbapi_connection)
        if refused is None:
            load_data_rows(dbapi_connection, table, rows)
            return "load_data"
        if method == "load_data":
            raise LocalInfileRefusedError(
                f"LOAD DATA LOCAL INFILE into {table.label} is not possible: {refused}; "
                "or load with method='insert' (multi-row INSERTs)"
            )
    insert_rows(dbapi_connection, table, rows)
    return "insert"
