"""SQLite: one ``executemany`` (SQLite has no bulk protocol; the rows stay in-process)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from .table import BulkTable

__all__ = ["insert_rows"]


def _value(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, dt.datetime):
        return value.isoformat(" ")
    return value


def insert_rows(dbapi_connection: Any, table: BulkTable, rows: Sequence[Sequence[Any]]) -> None:
    name = table.name.replace('"', '""')
    relation = f'"{table.schema}"."{name}"' if table.schema else f'"{name}"'
    columns = ", ".join('"' + column.replace('"', '""') + '"' for column in table.columns)
    marks = ", ".join(["?"] * len(table.columns))
    cursor = dbapi_connection.cursor()
    try:
        cursor.executemany(
            f"INSERT INTO {relation} ({columns}) VALUES ({marks})",
            [[_value(value) for value in row] for row in rows],
        )
    finally:
        cursor.close()
