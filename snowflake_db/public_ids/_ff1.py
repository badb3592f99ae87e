"""FF1 format-preserving encryption (NIST SP 800-38G, section 5.1, Algorithms 7 and 8) over AES.

:class:`FF1` follows the standard step by step for any radix and tweak. It is the reference:
the NIST sample vectors test it, and the codec's fast path (:mod:`.codec`, one radix and one
length) is tested against it. AES comes from ``cryptography``, imported here only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import InvalidArgumentError, MissingExtraError

AES_KEY_LENGTHS = (16, 24, 32)
ROUNDS = 10


def aes_block_function(key: bytes) -> Callable[[bytes], bytes]:
    """AES-encrypt 16-byte blocks under ``key``: one ECB encryptor, built once and reused
    (building a cipher costs far more than encrypting a block)."""
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        raise MissingExtraError(
            "snowflake_db.public_ids", package="cryptography", extra="public-ids"
        ) from None
    return Cipher(algorithms.AES(key), modes.ECB()).encryptor().update


def byte_length(radix: int, numerals: int) -> int:
    """FF1's ``b = ceil(ceil(v * log2(radix)) / 8)``, computed exactly on integers."""
    largest: int = radix**numerals - 1
    return (largest.bit_length() + 7) // 8


def header_block(radix: int, length: int, tweak_length: int) -> bytes:
    """FF1's ``P``: the first PRF block, fixed by radix, length and tweak length."""
    return (
        bytes([1, 2, 1]) + radix.to_bytes(3, "big") + bytes([10, (length // 2) % 256])
        + length.to_bytes(4, "big") + tweak_length.to_bytes(4, "big")
    )


class FF1:
    """FF1 under one AES key for one radix; ``encrypt``/``decrypt`` take lists of numerals."""

    def __init__(self, key: bytes, radix: int) -> None:
        if len(key) not in AES_KEY_LENGTHS:
            raise InvalidArgumentError(f"an AES key has 16, 24 or 32 bytes, got {len(key)}")
        if not 2 <= radix <= 2**16:
            raise InvalidArgumentError(f"radix={radix} is outside FF1's range 2..65536")
        self.radix = radix
        self._block = aes_block_function(bytes(key))

    def _prf(self, data: bytes) -> bytes:
        """CBC-MAC with a zero IV, FF1's PRF."""
        state = bytes(16)
        for start in range(0, len(data), 16):
            chunk = data[start : start + 16]
            state = self._block(bytes(x ^ y for x, y in zip(state, chunk, strict=True)))
        return state

    def _round(self, p: bytes, tweak: bytes, i: int, half: int, *, b: int, d: int) -> int:
        """Steps 6.i-6.iv: the round value ``y`` from the round number and one half."""
        q = tweak + bytes((-len(tweak) - b - 1) % 16) + bytes([i]) + half.to_bytes(b, "big")
        r = self._prf(p + q)
        s = r
        j = 1
        while len(s) < d:
            s += self._block(bytes(x ^ y for x, y in zip(r, j.to_bytes(16, "big"), strict=True)))
            j += 1
        return int.from_bytes(s[:d], "big")

    def _setup(self, numerals: Sequence[int], tweak: bytes) -> tuple[int, int, int, int, bytes]:
        n = len(numerals)
        if n < 2 or self.radix**n < 100:
            raise InvalidArgumentError(f"FF1 needs radix**n >= 100 and n >= 2, got n={n}")
        if any(not 0 <= x < self.radix for x in numerals):
            raise InvalidArgumentError(f"a numeral is outside 0..{self.radix - 1}")
        u = n // 2
        v = n - u
        b = byte_length(self.radix, v)
        d = 4 * ((b + 3) // 4) + 4
        return u, v, b, d, header_block(self.radix, n, len(tweak))

    def _num(self, numerals: Sequence[int]) -> int:
        value = 0
        for x in numerals:
            value = value * self.radix + x
        return value

    def _str(self, value: int, length: int) -> list[int]:
        out = [0] * length
        for k in range(length - 1, -1, -1):
            value, out[k] = divmod(value, self.radix)
        return out

    def encrypt(self, numerals: Sequence[int], tweak: bytes = b"") -> list[int]:
        """Algorithm 7."""
        u, v, b, d, p = self._setup(numerals, tweak)
        left, right = self._num(numerals[:u]), self._num(numerals[u:])
        for i in range(ROUNDS):
            m = u if i % 2 == 0 else v
            left, right = right, (left + self._round(p, tweak, i, right, b=b, d=d)) % self.radix**m
        return self._str(left, u) + self._str(right, v)

    def decrypt(self, numerals: Sequence[int], tweak: bytes = b"") -> list[int]:
        """Algorithm 8."""
        u, v, b, d, p = self._setup(numerals, tweak)
        left, right = self._num(numerals[:u]), self._num(numerals[u:])
        for i in reversed(range(ROUNDS)):
            m = u if i % 2 == 0 else v
            left, right = (right - self._round(p, tweak, i, left, b=b, d=d)) % self.radix**m, left
        return self._str(left, u) + self._str(right, v)
