"""Pydantic type for Snowflake IDs: JSON strings on the wire, Python ints in the model.

IDs exceed 2**53, the largest integer a JavaScript number holds exactly, so a browser silently
rounds them. ``SnowflakeIdStr`` keeps an ``int`` in Python (and in ``model_dump()``), writes a
string in JSON (``model_dump_json()``, FastAPI responses), and accepts either an int or a
decimal string on input, checked against the layout's range.

    class OrderOut(BaseModel):
        id: SnowflakeIdStr
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from .errors import InvalidIdError
from .layout import DEFAULT_LAYOUT, Layout

__all__ = ["SnowflakeIdStr", "parse_snowflake_id", "snowflake_id_type"]

_MAX_DIGITS = 20


def parse_snowflake_id(value: Any, layout: Layout = DEFAULT_LAYOUT) -> int:
    """An int from an int or a decimal string, within ``[0, layout.max_id]``."""
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii() or not text.isdigit() or len(text) > _MAX_DIGITS:
            raise InvalidIdError(
                f"a Snowflake ID must be a string of decimal digits, got {value!r}"
            )
        value = int(text)
    # check_id rejects bools, floats and out-of-range ints with a message naming the limit
    return layout.check_id(value)


def _json_schema(layout: Layout) -> dict[str, Any]:
    return {
        "type": "string",
        "pattern": r"^[0-9]{1,19}$",
        "description": f"Snowflake ID (64-bit integer, 0..{layout.max_id}) as a string",
        "examples": ["7262318491041271808"],
    }


def snowflake_id_type(layout: Layout = DEFAULT_LAYOUT) -> Any:
    """``Annotated[int, ...]`` for IDs of ``layout``: string in JSON, int in Python."""
    return Annotated[
        int,
        BeforeValidator(lambda value: parse_snowflake_id(value, layout)),
        PlainSerializer(str, return_type=str, when_used="json"),
        WithJsonSchema(_json_schema(layout)),
    ]


SnowflakeIdStr = Annotated[
    int,
    BeforeValidator(parse_snowflake_id),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema(_json_schema(DEFAULT_LAYOUT)),
]
"""An ``int`` Snowflake ID (default layout) that is a string in JSON."""
