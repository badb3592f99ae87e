"""Numbers a person gets wrong, for the public-number tests of every integration.

A number made with another key or namespace is refused 127 times in 128 (seven bits of keyed
redundancy), so a test that needs a refused foreign number takes the first of a run of IDs
that is refused, never one ID and a 1-in-128 chance of a decode that succeeds.
"""

from __future__ import annotations

from snowflake_db.errors import PublicIdError
from snowflake_db.public_ids import PublicIdCodec


def mistyped(number: str) -> str:
    """``number`` with its second symbol replaced: what a person might type."""
    return number[0] + ("1" if number[1] != "1" else "2") + number[2:]


def foreign_number(maker: PublicIdCodec, reader: PublicIdCodec, near: int) -> str:
    """A number ``maker`` gives an ID at or after ``near`` that ``reader`` refuses."""
    for snowflake_id in range(near, near + 64):
        number = maker.encode(snowflake_id)
        try:
            reader.decode(number)
        except PublicIdError:
            return number
    raise AssertionError(f"64 numbers in a row from {maker!r} decode with {reader!r}")
