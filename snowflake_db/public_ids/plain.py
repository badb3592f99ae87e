"""Unkeyed, fixed-length text forms of a Snowflake ID, for IDs whose time may be seen.

They hide nothing (anyone decodes them; the time, worker and sequence are in plain view) but are
shorter than the decimal form, safe in URLs and, being fixed-length over alphabets in ASCII
order, sort exactly like the IDs: by time. Use :class:`~.codec.PublicIdCodec` when the ID must
not be readable.

- base32: 13 Crockford symbols, read forgivingly (any case, I/L as 1, O as 0, hyphens and
  spaces skipped): for people.
- base62: 11 symbols ``0-9A-Za-z``, case-sensitive and read strictly: for machines and URLs.
"""

from __future__ import annotations

from .._validate import require_int
from ..errors import InvalidArgumentTypeError, InvalidIdError, PublicIdError
from ._symbols import ALPHABET, read, shown

MAX_ID = 2**63 - 1
BASE32_LENGTH = 13
BASE62_LENGTH = 11
BASE62_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE62_VALUES = {symbol: value for value, symbol in enumerate(BASE62_ALPHABET)}


def _check_id(id: object) -> int:
    return require_int("id", id, minimum=0, maximum=MAX_ID, error=InvalidIdError,
                       limit_note="a Snowflake ID fits in 63 bits")


def _check_range(value: int, text: str, form: str) -> int:
    if value > MAX_ID:
        raise PublicIdError(
            f"{form} {shown(text)} stands for {value}, above the largest Snowflake ID "
            f"{MAX_ID} (2**63 - 1)",
            reason="range",
            text=text,
        )
    return value


def to_base32(id: int) -> str:
    """The 13-symbol Crockford base32 form of a Snowflake ID."""
    value = _check_id(id)
    symbols = []
    for _ in range(BASE32_LENGTH):
        value, digit = divmod(value, 32)
        symbols.append(ALPHABET[digit])
    return "".join(reversed(symbols))


def from_base32(text: str) -> int:
    """The Snowflake ID of a 13-symbol base32 form; :class:`PublicIdError` if refused."""
    return _check_range(read(text, BASE32_LENGTH, "base32 ID"), text, "base32 ID")


def to_base62(id: int) -> str:
    """The 11-symbol base62 form of a Snowflake ID."""
    value = _check_id(id)
    symbols = []
    for _ in range(BASE62_LENGTH):
        value, digit = divmod(value, 62)
        symbols.append(BASE62_ALPHABET[digit])
    return "".join(reversed(symbols))


def from_base62(text: str) -> int:
    """The Snowflake ID of an 11-symbol base62 form (case-sensitive, no separators)."""
    if not isinstance(text, str):
        raise InvalidArgumentTypeError(f"a base62 ID must be a str, got {type(text).__name__}")
    if len(text) != BASE62_LENGTH:
        raise PublicIdError(
            f"base62 ID {shown(text)} has {len(text)} characters; a base62 ID has exactly "
            f"{BASE62_LENGTH}",
            reason="length",
            text=text,
        )
    value = 0
    for position, symbol in enumerate(text, 1):
        digit = _BASE62_VALUES.get(symbol)
        if digit is None:
            raise PublicIdError(
                f"base62 ID {shown(text)} has {symbol!r} at position {position}, which is not "
                "a base62 symbol (0-9, A-Z, a-z)",
                reason="symbol",
                text=text,
            )
        value = value * 62 + digit
    return _check_range(value, text, "base62 ID")
