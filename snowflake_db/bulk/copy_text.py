"""PostgreSQL ``COPY`` text format made a column at a time, for columns of plain values.

psycopg's ``Copy.write_row`` formats one row per Python call (about 1.5 µs a row here); a
column of ints, strs, datetimes or decimals can instead be formatted by ``map`` over the
column and joined, and the block sent with ``Copy.write``. Any column holding another type
(dicts for JSON, bytes, psycopg wrappers, subclasses such as ``IntEnum``) sends the whole
load back to ``write_row``: only these exact types take this path, each written as
PostgreSQL reads it back (https://www.postgresql.org/docs/current/sql-copy.html, "Text
Format": backslash, newline, carriage return and tab escaped, ``\\N`` for NULL).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["text_block"]

#: Joins a column of str to escape it in one pass; a lone surrogate, which no str that
#: PostgreSQL can store (UTF-8) contains.
_SEPARATOR = "\udfff"
_NULL = "\\N"


def _escape_all(values: list[str]) -> list[str] | None:
    joined = _SEPARATOR.join(values)
    if "\\" in joined or "\t" in joined or "\n" in joined or "\r" in joined:
        joined = (
            joined.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    out = joined.split(_SEPARATOR)
    return out if len(out) == len(values) else None


def _bool(value: bool) -> str:
    return "t" if value else "f"


_FORMATS: dict[type, Callable[[Any], str]] = {
    int: int.__repr__,
    float: float.__repr__,  # 'nan', 'inf' and '-inf' are read as NaN and the infinities
    decimal.Decimal: decimal.Decimal.__str__,
    dt.datetime: dt.datetime.isoformat,
    dt.date: dt.date.isoformat,
    dt.time: dt.time.isoformat,
    bool: _bool,
}


def _column(values: list[Any] | tuple[Any, ...]) -> list[str] | None:
    """One column's fields, or None if it holds a type this module does not format."""
    types = set(map(type, values))
    has_null = type(None) in types
    types.discard(type(None))
    if len(types) > 1:
        return None
    kind = types.pop() if types else type(None)
    present = [value for value in values if value is not None] if has_null else list(values)
    if kind is str:
        fields = _escape_all(present)
        if fields is None:
            return None
    elif kind is type(None):
        fields = []
    else:
        format_value = _FORMATS.get(kind)
        if format_value is None:
            return None
        fields = list(map(format_value, present))
    if not has_null:
        return fields
    given = iter(fields)
    return [_NULL if value is None else next(given) for value in values]


def text_block(columns: Sequence[Sequence[Any]]) -> str | None:
    """The rows (given as columns) in COPY text format, or None if a column needs
    psycopg's own adaptation."""
    fields = []
    for values in columns:
        formatted = _column(values if isinstance(values, list | tuple) else list(values))
        if formatted is None:
            return None
        fields.append(formatted)
    if not fields or not fields[0]:
        return ""
    return "\n".join(map("\t".join, zip(*fields, strict=True))) + "\n"
