"""Crockford base32 symbols, the forgiving reading people need, and the check symbol.

Crockford's alphabet (https://www.crockford.com/base32.html) leaves out I, L, O and U; reading
is case-insensitive, takes I and L for 1 and O for 0, and skips hyphens and spaces. The symbols
sort in ASCII order of their values, so fixed-length texts sort like their numbers.

The check symbol is a weighted sum over GF(32) (the field of 32 elements, modulus
x^5 + x^2 + 1), not Crockford's mod-37 symbol: it stays inside the 32-symbol alphabet (no
``* ~ $ = U`` in URLs and on invoices) and catches as much. Symbol ``j`` of a 16-symbol word
weighs ``alpha**(15 - j)``; a word is valid when the weighted sum is 0. The weights are 16
distinct non-zero elements (alpha has order 31), so changing one symbol changes the sum by
``delta * weight != 0``, and swapping two different symbols at any distance by
``(a ^ b) * (w_i ^ w_j) != 0``: every single substitution and every transposition is caught.
"""

from __future__ import annotations

from ..errors import InvalidArgumentTypeError, PublicIdError

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
VALID = frozenset(ALPHABET)

#: Reading: lower case to upper, I and L to 1, O to 0; hyphens and spaces dropped.
_NORMALIZE: dict[int, str | None] = {ord(c): c.upper() for c in ALPHABET.lower() if c.isalpha()}
_NORMALIZE.update({ord(c): "1" for c in "IiLl"})
_NORMALIZE.update({ord(c): "0" for c in "Oo"})
_NORMALIZE.update({ord("-"): None, ord(" "): None})

#: Crockford symbol -> the digit ``int(text, 32)`` reads as the same value.
TO_INT_DIGITS = str.maketrans(ALPHABET, "0123456789ABCDEFGHIJKLMNOPQRSTUV")

#: Every 10-bit value as its two symbols: encoding takes one lookup per pair.
PAIRS = tuple(a + b for a in ALPHABET for b in ALPHABET)

#: Texts longer than this are refused before any work (they cannot be an ID's number).
MAX_INPUT = 64

_MODULUS = 0b100101  # x^5 + x^2 + 1, primitive: alpha = x generates all 31 non-zero elements


def gf32_mul(a: int, b: int) -> int:
    """Product in GF(32): carry-less multiplication reduced by the modulus."""
    product = 0
    while b:
        if b & 1:
            product ^= a
        b >>= 1
        a <<= 1
        if a & 0b100000:
            a ^= _MODULUS
    return product


def gf32_power(exponent: int) -> int:
    """``alpha ** exponent`` (alpha = 2, that is x)."""
    value = 1
    for _ in range(exponent):
        value = gf32_mul(value, 2)
    return value


def _pair_tables(symbols: int) -> tuple[tuple[int, ...], ...]:
    """For each pair position of a ``symbols``-long word, the weighted sum of every pair."""
    tables = []
    for pair in range(symbols // 2):
        high = gf32_power(symbols - 1 - 2 * pair)
        low = gf32_power(symbols - 2 - 2 * pair)
        tables.append(tuple(gf32_mul(p >> 5, high) ^ gf32_mul(p & 31, low) for p in range(1024)))
    return tuple(tables)


_T = _pair_tables(16)


def syndrome16(word: int) -> int:
    """The weighted GF(32) sum of the 16 symbols of an 80-bit word: 0 for a valid word, and
    for a word whose last symbol is 0, the check symbol that makes it valid."""
    return (
        _T[0][word >> 70] ^ _T[1][(word >> 60) & 1023] ^ _T[2][(word >> 50) & 1023]
        ^ _T[3][(word >> 40) & 1023] ^ _T[4][(word >> 30) & 1023] ^ _T[5][(word >> 20) & 1023]
        ^ _T[6][(word >> 10) & 1023] ^ _T[7][word & 1023]
    )


def encode80(word: int) -> str:
    """The 16 symbols of an 80-bit word."""
    return (
        PAIRS[word >> 70] + PAIRS[(word >> 60) & 1023] + PAIRS[(word >> 50) & 1023]
        + PAIRS[(word >> 40) & 1023] + PAIRS[(word >> 30) & 1023] + PAIRS[(word >> 20) & 1023]
        + PAIRS[(word >> 10) & 1023] + PAIRS[word & 1023]
    )


def shown(text: str) -> str:
    """``text`` as an error message quotes it: cut short, so a huge input stays out of logs."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def read(text: object, length: int, what: str) -> int:
    """The value of a Crockford text of exactly ``length`` symbols, read forgivingly.

    Refuses, with :class:`PublicIdError` naming the reason, a text of another length or with a
    symbol outside the alphabet. ``what`` names the form in messages ("public ID", ...).
    """
    if not isinstance(text, str):
        raise InvalidArgumentTypeError(f"a {what} must be a str, got {type(text).__name__}")
    if len(text) > MAX_INPUT:
        raise PublicIdError(
            f"{what} {shown(text)} has {len(text)} characters; a {what} has {length} symbols "
            "(hyphens and spaces aside)",
            reason="length",
            text=text,
        )
    symbols = text.strip().translate(_NORMALIZE)
    if len(symbols) != length:
        raise PublicIdError(
            f"{what} {shown(text)} has {len(symbols)} symbols without hyphens and spaces; a "
            f"{what} has exactly {length}",
            reason="length",
            text=text,
        )
    if not VALID.issuperset(symbols):
        position, bad = next((i, c) for i, c in enumerate(symbols) if c not in VALID)
        raise PublicIdError(
            f"{what} {shown(text)} has {bad!r} at symbol {position + 1}, which is not a "
            "Crockford base32 symbol (0-9 and A-Z without U; I and L read as 1, O as 0)",
            reason="symbol",
            text=text,
        )
    return int(symbols.translate(TO_INT_DIGITS), 32)


def group(text: str, size: int | None) -> str:
    """``text`` with a hyphen after every ``size`` symbols (``None``: unchanged)."""
    if size is None:
        return text
    return "-".join(text[i : i + size] for i in range(0, len(text), size))
