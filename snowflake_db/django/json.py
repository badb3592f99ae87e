"""``SnowflakeJSONEncoder``: Django's JSON encoder, with integers JavaScript cannot hold as strings.

JavaScript numbers are doubles: integers above 2**53 - 1 (every current Snowflake ID) lose
precision in ``JSON.parse``. Use it wherever Django takes an encoder: ``JsonResponse(data,
encoder=SnowflakeJSONEncoder)``, ``serializers.serialize("json", qs, cls=SnowflakeJSONEncoder)``,
``JSONField(encoder=SnowflakeJSONEncoder)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

__all__ = ["MAX_SAFE_INTEGER", "SnowflakeJSONEncoder", "stringify_big_ints"]

#: ``Number.MAX_SAFE_INTEGER`` in JavaScript.
MAX_SAFE_INTEGER = 2**53 - 1


def stringify_big_ints(value: Any) -> Any:
    """A copy of ``value`` with every int outside JavaScript's safe range replaced by its string."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value) if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else value
    if isinstance(value, dict):
        return {key: stringify_big_ints(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [stringify_big_ints(item) for item in value]
    return value


class SnowflakeJSONEncoder(DjangoJSONEncoder):
    """``DjangoJSONEncoder`` that writes integers beyond ±(2**53 - 1) as strings.

    ``JSONEncoder.default`` is never called for ints, so the value is converted before encoding
    (``encode`` and ``json.dump`` both go through ``iterencode``).
    """

    def iterencode(self, o: Any, _one_shot: bool = False) -> Iterator[str]:
        chunks: Iterator[str] = super().iterencode(stringify_big_ints(o), _one_shot)
        return chunks

    def default(self, o: Any) -> Any:
        return stringify_big_ints(super().default(o))
