"""Which values a column cannot hold exactly, found before (or instead of) a vague driver error.

Checks that run on every row are limited to the columns where a database would silently
change a value: time zones (a naive ``datetime`` in a ``timestamptz`` column is read in the
session's zone). Everything else the database or driver refuses loudly by itself; when it does,
:func:`diagnose` finds the row, column and value to name.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from collections.abc import Sequence
from typing import Any

from ..errors import UnrepresentableValueError
from .table import BulkTable

__all__ = ["TEMPORAL_KINDS", "check_temporal", "diagnose", "kind_of", "problem", "refusal"]

#: Kinds of column, by the catalog's type name, that the checks below distinguish.
_KINDS = {
    # PostgreSQL pg_type.typname
    "text": "text", "varchar": "text", "bpchar": "text", "name": "text", "citext": "text",
    "json": "json", "jsonb": "jsonb",
    "timestamptz": "timestamptz", "timestamp": "timestamp",
    "int2": "int16", "int4": "int32", "int8": "int64",
    "float4": "float", "float8": "float", "numeric": "decimal", "bytea": "bytes",
    # MariaDB information_schema.COLUMNS.DATA_TYPE
    "char": "text", "tinytext": "text", "mediumtext": "text", "longtext": "text",
    "enum": "text", "set": "text",
    "binary": "bytes", "varbinary": "bytes", "blob": "bytes", "tinyblob": "bytes",
    "mediumblob": "bytes", "longblob": "bytes",
    "datetime": "timestamp",
    "tinyint": "int8", "smallint": "int16", "mediumint": "int24", "int": "int32",
    "bigint": "int64", "double": "float", "float": "float", "decimal": "decimal",
}
TEMPORAL_KINDS = frozenset({"timestamptz", "timestamp"})
_INT_BITS = {"int8": 8, "int16": 16, "int24": 24, "int32": 32, "int64": 64}


def kind_of(type_name: str) -> str:
    """The kind of a column from its catalog type name (``"other"`` when unchecked)."""
    return _KINDS.get(type_name.lower(), "other")


def refusal(
    table: BulkTable, column: int, row: int, value: object, reason: str
) -> UnrepresentableValueError:
    name = table.columns[column]
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return UnrepresentableValueError(
        f"{table.label}.{name}, row {row}: {shown} {reason}; nothing was loaded",
        column=name, row=row, value=value,
    )


def problem(kind: str, value: Any, vendor: str) -> str | None:
    """Why ``value`` cannot go exactly into a column of ``kind`` on ``vendor``, else None."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if kind == "timestamptz" and value.utcoffset() is None:
            return (
                "is a naive datetime for a column with time zone (it would be read in the "
                "session's zone); give an aware datetime"
            )
        if kind == "timestamp" and vendor == "postgresql" and value.utcoffset() is not None:
            return (
                "is an aware datetime for a column without time zone (its offset would be "
                "dropped); give a naive datetime or use timestamptz"
            )
        return None
    if isinstance(value, str):
        if "\x00" in value and (vendor == "postgresql" or kind == "json"):
            return "contains NUL (\\x00), which PostgreSQL text and JSON cannot store"
        return _surrogate(value)
    if vendor == "postgresql" and kind in ("json", "jsonb") and "\\u0000" in _json(value):
        return "contains NUL (\\x00), which PostgreSQL JSON cannot store"
    if kind in ("json", "jsonb") and isinstance(value, dict | list):
        return _surrogate(_json(value, ascii_only=False))
    if isinstance(value, float | decimal.Decimal) and vendor != "postgresql":
        finite = math.isfinite(value) if isinstance(value, float) else value.is_finite()
        if not finite:
            return f"is not a finite number, which {vendor} cannot store"
    if isinstance(value, int) and not isinstance(value, bool) and kind in _INT_BITS:
        bits = _INT_BITS[kind]
        if not -(2 ** (bits - 1)) <= value < 2 ** bits:
            return f"does not fit a {bits}-bit integer column"
    return None


def _json(value: Any, *, ascii_only: bool = True) -> str:
    try:
        return json.dumps(value, ensure_ascii=ascii_only)
    except (TypeError, ValueError):
        return ""


def _surrogate(text: str) -> str | None:
    """Why ``text`` cannot be sent as UTF-8 (a lone surrogate, e.g. from ``surrogateescape``
    decoding), else None; every database here stores text as UTF-8."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (
            f"contains the lone surrogate {text[error.start]!r} at index {error.start}, which "
            "UTF-8 (the database's encoding) cannot hold"
        )
    return None


def check_temporal(
    table: BulkTable,
    kinds: Sequence[str],
    rows: Sequence[Sequence[Any]],
    vendor: str,
    first_row: int = 0,
) -> None:
    """Refuse naive/aware mix-ups in time columns before anything is sent (the only silent
    change a COPY or LOAD DATA would make); costs one pass over those columns only.
    ``first_row`` numbers the rows of a block within the whole load."""
    for column, kind in enumerate(kinds):
        if kind not in TEMPORAL_KINDS:
            continue
        read = getattr(rows, "column", None)  # ColumnRows: the column as it is
        values = read(column) if read is not None else [row[column] for row in rows]
        given = list(filter(None, values))  # the common case, checked at C speed
        if set(map(type, given)) == {dt.datetime}:
            offsets = list(map(dt.datetime.utcoffset, given))
            all_naive = offsets.count(None) == len(offsets)
            if kind == "timestamptz" and None not in offsets:
                continue
            if kind == "timestamp" and (vendor != "postgresql" or all_naive):
                continue
        for number, value in enumerate(values):
            if isinstance(value, dt.datetime):
                reason = problem(kind, value, vendor)
                if reason is not None:
                    raise refusal(table, column, first_row + number, value, reason)


def diagnose(
    table: BulkTable, kinds: Sequence[str], rows: Sequence[Sequence[Any]], vendor: str
) -> UnrepresentableValueError | None:
    """After the driver or server refused the load: the first value :func:`problem` names."""
    for number, row in enumerate(rows):
        for column, kind in enumerate(kinds):
            reason = problem(kind, row[column], vendor)
            if reason is not None:
                return refusal(table, column, number, row[column], reason)
    return None
