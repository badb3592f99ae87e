"""``PublicIdCodec``: a Snowflake ID <-> the 16-symbol public number a person sees.

The number is ``V CCCCCCCCCCCCCC K`` in Crockford base32: ``V`` the key version (in clear, so
the right key is picked), ``C...`` 14 symbols = 70 bits of FF1 ciphertext of the ID's 63 bits
followed by 7 zero bits, ``K`` the check symbol over the 15 before it (see :mod:`._symbols`).
No cycle-walking is needed: FF1 permutes all 2**70 values, the ID's 2**63 sit inside them, and a
decrypted value outside (low bits not zero) is refused, which is the keyed redundancy.

FF1 here runs with radix 32 on 14 numerals: ``u = v = 7``, ``b = 5``, ``d = 12``, and the tweak
has 10 bytes, so ``Q`` is one block and FF1's PRF of ``P || Q`` is ``AES(AES(P) xor Q)``.
``AES(P)`` is computed once per key, and the tweak and round number are folded into ten
constants, so a round costs one AES call on one block.
``tests/public_ids/test_public_ids_ff1.py`` checks this path against the literal algorithm in
:mod:`._ff1`, which passes NIST's sample vectors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from .._validate import require_int
from ..errors import InvalidIdError, PublicIdError, PublicIdKeyError
from ._ff1 import AES_KEY_LENGTHS, ROUNDS, aes_block_function, header_block
from ._symbols import encode80, group, read, shown, syndrome16

#: Where a user gets a key: the command first (it prints the text form the environment
#: variable takes), the function for code.
MAKE_A_KEY = (
    "make one with `snowflake-db public new-key` or snowflake_db.public_ids.generate_key()"
)


def key_length_error(label: str, length: int) -> PublicIdKeyError:
    """The error for a key of ``length`` bytes, ``label`` naming it (and where it came from)."""
    return PublicIdKeyError(
        f"{label} has {length} bytes; an AES key has 16, 24 or 32 bytes ({MAKE_A_KEY})"
    )

MAX_ID = 2**63 - 1
#: Zero bits appended to the ID before encryption: the keyed redundancy that refuses 127 of
#: 128 numbers made with another key or namespace.
REDUNDANCY_BITS = 7
LENGTH = 16
MAX_VERSION = 31

_HALF_BITS = 35
_HALF = (1 << _HALF_BITS) - 1
_CIPHER_BITS = 2 * _HALF_BITS
_CIPHER = (1 << _CIPHER_BITS) - 1
_REDUNDANCY = (1 << REDUNDANCY_BITS) - 1
_P = header_block(32, 14, 10)
_TWEAK_LABEL = b"snowflake_db public id\x00"
# Bound once: the rounds below are the hot path (big-endian is the default since Python 3.11).
_from_bytes = int.from_bytes
_to_bytes = int.to_bytes

Keys = bytes | Mapping[int, bytes]


def tweak(version: int, namespace: str) -> bytes:
    """FF1's tweak: the key version, then 9 bytes of SHA-256 of the namespace (fixed length,
    whatever the namespace, so ``Q`` stays one block)."""
    digest = hashlib.sha256(_TWEAK_LABEL + namespace.encode("utf-8")).digest()
    return bytes([version]) + digest[:9]


def normalize_keys(key: object) -> dict[int, bytes]:
    """``{version: key}`` from one key (version 1) or a mapping, every key checked."""
    if isinstance(key, bytes | bytearray | memoryview):
        key = {1: bytes(key)}
    if isinstance(key, str):
        raise PublicIdKeyError(
            "a public-ID key must be bytes or a {version: bytes} mapping, got a str; for the "
            "'1:<base64>,2:<base64>' text form use snowflake_db.public_ids.parse_keys() or "
            "configure_public_ids()"
        )
    if not isinstance(key, Mapping):
        raise PublicIdKeyError(
            "a public-ID key must be bytes of length 16, 24 or 32 or a {version: bytes} "
            f"mapping, got {type(key).__name__}"
        )
    if not key:
        raise PublicIdKeyError("the public-ID key mapping is empty; give at least one version")
    keys: dict[int, bytes] = {}
    for version, value in key.items():
        require_int(
            "public-ID key version", version, minimum=0, maximum=MAX_VERSION,
            error=PublicIdKeyError, limit_note="the version is one base32 symbol",
        )
        if not isinstance(value, bytes | bytearray | memoryview):
            raise PublicIdKeyError(
                f"public-ID key version {version} must be bytes, got {type(value).__name__}"
            )
        if len(value) not in AES_KEY_LENGTHS:
            raise key_length_error(f"public-ID key version {version}", len(value))
        keys[int(version)] = bytes(value)
    return keys


class _Version:
    """One key version's FF1 state: the AES block function and the ten round constants."""

    __slots__ = ("block", "constants", "reversed_constants")

    def __init__(self, key: bytes, version: int, namespace: str) -> None:
        self.block: Callable[[bytes], bytes] = aes_block_function(key)
        first = int.from_bytes(self.block(_P), "big")  # AES(P): the PRF's first CBC state
        folded = first ^ (int.from_bytes(tweak(version, namespace), "big") << 48)
        self.constants = tuple(folded ^ (i << 40) for i in range(ROUNDS))
        self.reversed_constants = self.constants[::-1]


class PublicIdCodec:
    """Encode Snowflake IDs as keyed, checkable public numbers of one namespace, and back.

    ``key``: 16/24/32 bytes (version 1) or ``{version: key}`` with versions 0-31; new numbers
    use the highest version, numbers of every configured version decode. ``namespace`` names
    what the numbers count ("orders", "invoices"): the same ID gives unrelated numbers in two
    namespaces, and each refuses the other's.
    """

    __slots__ = ("_current", "_current_version", "_versions", "namespace")

    def __init__(self, key: Keys, *, namespace: str) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise PublicIdKeyError(f"namespace must be a non-empty str, got {namespace!r}")
        keys = normalize_keys(key)
        self.namespace = namespace
        self._versions = {v: _Version(k, v, namespace) for v, k in keys.items()}
        self._current_version = max(keys)
        self._current = self._versions[self._current_version]

    @property
    def versions(self) -> tuple[int, ...]:
        """The key versions this codec decodes, lowest first."""
        return tuple(sorted(self._versions))

    @property
    def current_version(self) -> int:
        """The key version new numbers are made with (the highest)."""
        return self._current_version

    def __repr__(self) -> str:
        return (
            f"PublicIdCodec(namespace={self.namespace!r}, versions={self.versions}, "
            f"current_version={self._current_version})"
        )

    def encode(self, id: int, *, group: int | None = None) -> str:
        """The public number of Snowflake ID ``id``; ``group=4`` adds hyphens for display."""
        if type(id) is not int or not 0 <= id <= MAX_ID:
            id = require_int("id", id, minimum=0, maximum=MAX_ID, error=InvalidIdError,
                             limit_note="a Snowflake ID fits in 63 bits")
        state = self._current
        block = state.block
        left = id >> (_HALF_BITS - REDUNDANCY_BITS)
        right = (id << REDUNDANCY_BITS) & _HALF
        for constant in state.constants:
            y = _from_bytes(block(_to_bytes(constant ^ right, 16))) >> 32
            left, right = right, (left + y) & _HALF
        data = (self._current_version << 75) | (left << 40) | (right << 5)
        text = encode80(data | syndrome16(data))
        return text if group is None else _grouped(text, group)

    def decode(self, text: str) -> int:
        """The Snowflake ID of a public number; :class:`PublicIdError` says why one is refused."""
        word = read(text, LENGTH, "public ID")
        if syndrome16(word):
            raise PublicIdError(
                f"public ID {shown(text)} fails its check symbol: a symbol is mistyped or two "
                "are swapped",
                reason="check",
                text=text,
            )
        version = word >> 75
        state = self._versions.get(version)
        if state is None:
            configured = ", ".join(map(str, self.versions))
            raise PublicIdError(
                f"public ID {shown(text)} was made with key version {version}, which is not "
                f"configured (configured versions: {configured})",
                reason="version",
                text=text,
            )
        block = state.block
        cipher = (word >> 5) & _CIPHER
        left = cipher >> _HALF_BITS
        right = cipher & _HALF
        for constant in state.reversed_constants:
            y = _from_bytes(block(_to_bytes(constant ^ left, 16))) >> 32
            left, right = (right - y) & _HALF, left
        if right & _REDUNDANCY:
            raise PublicIdError(
                f"public ID {shown(text)} is not a number of namespace {self.namespace!r} "
                f"(key version {version}): made with another key or namespace, or never issued",
                reason="key",
                text=text,
            )
        return (left << (_HALF_BITS - REDUNDANCY_BITS)) | (right >> REDUNDANCY_BITS)


def _grouped(text: str, size: object) -> str:
    return group(text, require_int("group", size, minimum=1, maximum=LENGTH))
