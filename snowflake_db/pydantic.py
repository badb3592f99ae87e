"""Pydantic type for Snowflake IDs: JSON strings on the wire, Python ints in the model.

IDs exceed 2**53, the largest integer a JavaScript number holds exactly, so a browser silently
rounds them. ``SnowflakeIdStr`` keeps an ``int`` in Python (and in ``model_dump()``), writes a
string in JSON (``model_dump_json()``, FastAPI responses), and accepts either an int or a
decimal string on input, checked against the layout's range.

    class OrderOut(BaseModel):
        id: SnowflakeIdStr

``public_id_type("orders")`` is the same for public numbers (:mod:`snowflake_db.public_ids`):
the key in Python, its public number in JSON, and text decoded back to the key.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, ValidationInfo, WithJsonSchema

from .errors import InvalidArgumentError, InvalidIdError
from .layout import DEFAULT_LAYOUT, Layout

__all__ = ["SnowflakeIdStr", "parse_snowflake_id", "public_id_type", "snowflake_id_type"]

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


# -- public numbers ------------------------------------------------------------------------

_MAX_KEY = 2**63 - 1


def _codec(namespace: str) -> Any:
    from .public_ids import codec_for

    return codec_for(namespace)


def public_id_type(
    namespace: str, *, group: int | None = None, accept_keys: bool = True
) -> Any:
    """``Annotated[int, ...]``: a key of ``namespace`` that is its public number in JSON.

    Text (a path parameter, a JSON string) is decoded to the key; a refused number is a
    validation error (FastAPI: 422) with the codec's reason. An ``int`` is taken as the key
    itself only from Python (an ORM object, ``model_validate``) and only with
    ``accept_keys=True``: give input models ``accept_keys=False`` when clients must never name
    rows by their key (FastAPI validates JSON bodies as Python objects).
    """
    if not isinstance(namespace, str) or not namespace:
        raise InvalidArgumentError(
            f"a public number namespace must be a non-empty string, got {namespace!r}"
        )

    def validate(value: Any, info: ValidationInfo) -> int:
        if isinstance(value, str):
            return int(_codec(namespace).decode(value))  # PublicIdError is a ValueError
        if (
            accept_keys and info.mode == "python" and isinstance(value, int)
            and not isinstance(value, bool) and 0 <= value <= _MAX_KEY
        ):
            return value
        raise ValueError(f"a public number of {namespace!r} is a string, got {value!r}")

    def serialize(key: int) -> str:
        return str(_codec(namespace).encode(key, group=group))

    return Annotated[
        int,
        BeforeValidator(validate),
        PlainSerializer(serialize, return_type=str, when_used="json"),
        WithJsonSchema({
            "type": "string",
            "pattern": "^[0-9A-Za-z][0-9A-Za-z -]*$",
            "description": f"public number ({namespace}): 16 Crockford base32 symbols",
        }),
    ]
