"""Decoded IDs as ``snowflake-db parse`` and ``manage.py snowflake decode`` print them.

One formatter, so both commands show the same columns, the same times and the same JSON (IDs as
strings: JavaScript loses digits above 2**53), and warn alike about an ID that looks decoded with
the wrong layout or epoch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ..errors import InvalidIdError
from ..layout import Layout

__all__ = ["decode_ids", "json_text", "parse_id", "suspicions", "table_lines"]

#: An ID this far ahead of the local clock is taken as decoded with the wrong layout.
FUTURE_SLACK_MS = 60_000


def parse_id(text: str) -> int:
    """A decimal ID as typed; :class:`InvalidIdError` names anything else."""
    stripped = text.strip()
    if not stripped.lstrip("-").isdigit():
        raise InvalidIdError(f"{text!r} is not a decimal integer ID")
    return int(stripped)


def decode_ids(layout: Layout, texts: Iterable[str]) -> list[dict[str, Any]]:
    """One row per ID: ``id`` (a string), ``timestamp_ms``, ``datetime`` (ISO 8601, UTC),
    ``worker_id``, ``sequence``, ``shard``, and ``datacenter_id``/``machine_id`` when the layout
    splits the worker bits. The layout's errors name a negative or oversized ID."""
    rows = []
    for text in texts:
        part = layout.decode(parse_id(text))
        row: dict[str, Any] = {
            "id": str(part.id),
            "timestamp_ms": part.timestamp_ms,
            "datetime": part.datetime.isoformat(),
            "worker_id": part.worker_id,
            "sequence": part.sequence,
            "shard": part.shard,
        }
        if part.datacenter_id is not None:
            row["datacenter_id"] = part.datacenter_id
            row["machine_id"] = part.machine_id
        rows.append(row)
    return rows


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A header and one line per row, columns aligned."""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return lines


def json_text(rows: list[dict[str, Any]]) -> str:
    """A JSON list of the rows, however many."""
    return json.dumps(rows, indent=2)


def suspicions(layout: Layout, rows: list[dict[str, Any]], now_ms: int) -> list[str]:
    """Why a decoded ID looks made with another layout or epoch: in the future, or at the
    epoch itself (no time part; a Twitter ID decodes to 2032 with the default layout)."""
    found = []
    for row in rows:
        if row["timestamp_ms"] > now_ms + FUTURE_SLACK_MS:
            why = f"decodes to {_iso(row['timestamp_ms'])}, in the future"
        elif int(row["id"]) >> layout.time_shift == 0:
            why = f"decodes to the epoch itself ({layout.epoch.isoformat()}: no time part)"
        else:
            continue
        found.append(f"ID {row['id']} {why}: wrong layout or epoch?")
    return found


def _iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
