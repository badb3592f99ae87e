"""Pydantic type for public numbers: the key in Python, its public number in JSON.

``OrderNumber = public_id_type("orders")`` is an ``int`` (the Snowflake key) inside the model
and in ``model_dump()``; ``model_dump_json()`` and FastAPI responses write its public number,
and input text is decoded back to the key, so path parameters and bodies take the number a
customer sees. A refused number is a validation error (FastAPI: 422) with the codec's reason.
An ``int`` is accepted as the key itself only from Python (an ORM object, ``model_validate``)
and only with ``accept_keys=True``: use ``accept_keys=False`` for input models when clients
must never name rows by their key (FastAPI validates JSON bodies as Python objects).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, ValidationInfo, WithJsonSchema

from .errors import InvalidArgumentError

__all__ = ["public_id_type"]

_MAX_KEY = 2**63 - 1


def _codec(namespace: str) -> Any:
    from .public_ids import codec_for

    return codec_for(namespace)


def public_id_type(
    namespace: str, *, group: int | None = None, accept_keys: bool = True
) -> Any:
    """``Annotated[int, ...]``: a key of ``namespace`` that is its public number in JSON."""
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
