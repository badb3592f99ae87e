"""Public order numbers: a keyed, reversible, checkable code for every Snowflake ID.

The number a person sees is computed from the key the database keeps, so nothing new is stored
and a lookup by number is a primary-key lookup::

    codec = PublicIdCodec(key, namespace="orders")     # or codec_for("orders")
    codec.encode(order.id)           # e.g. '1QR8N4X3SRY9QH7D' (16 symbols; group=4 for display)
    codec.decode("1qr8-n4x3-sry9-qh7d")                # -> order.id, or PublicIdError

What it hides: the ID is enciphered whole with FF1 (NIST SP 800-38G) over AES under a secret key,
with the namespace and key version as the tweak. Without the key, a number tells nothing about
when the order was made, which worker made it, its sequence, or, from two numbers, how many
orders came between: FF1 is a pseudorandom permutation, so numbers of different IDs look like
independent random values. The domain, 2**70, is far above SP 800-38G's minimum of one million
(NIST's 2025 draft revision keeps FF1 and drops FF3, which was broken).
Unlike multiplicative "Optimus" codes, known (ID, number) pairs do not give up the key.

What it is not: an authenticator. 7 zero bits appended to the 63-bit ID (70 bits, 14 symbols)
are the only redundancy: a number made with another key or namespace, or guessed at random, is
refused with probability 127/128 (the check symbol and the version symbol refuse most random
text before that), so about 1 guess in 128 decodes to *some* ID. Never treat a decodable number
as proof of anything: a lookup still needs the usual permission check. It does not hide that
two numbers are equal (equal IDs give equal numbers), and the version symbol is in clear.

Key rotation changes the number of every ID: a number printed under version 1 keeps decoding
while version 1 is configured, but new pages show the version-2 number. The check symbol catches
a person's typing mistakes (every single-symbol substitution, every transposition); see
:mod:`._symbols`. Plain, unkeyed base32/base62 forms are in :mod:`.plain`.

``cryptography`` (the ``public-ids`` extra) is needed only to build a codec.
"""

from __future__ import annotations

from ..errors import PublicIdError, PublicIdKeyError, PublicIdKeysNotConfiguredError
from .codec import LENGTH, MAX_VERSION, REDUNDANCY_BITS, PublicIdCodec
from .keys import (
    ENV_VAR,
    codec_for,
    configure_public_ids,
    current_keys,
    format_keys,
    generate_key,
    parse_keys,
)
from .plain import from_base32, from_base62, to_base32, to_base62

__all__ = [
    "ENV_VAR",
    "LENGTH",
    "MAX_VERSION",
    "REDUNDANCY_BITS",
    "PublicIdCodec",
    "PublicIdError",
    "PublicIdKeyError",
    "PublicIdKeysNotConfiguredError",
    "codec_for",
    "configure_public_ids",
    "current_keys",
    "format_keys",
    "from_base32",
    "from_base62",
    "generate_key",
    "parse_keys",
    "to_base32",
    "to_base62",
]
