"""FF1 against NIST's published samples, and the codec's fast path against the literal FF1.

The samples are NIST's "FF1 examples" for SP 800-38G (AES-128/192/256, radix 10 and 36):
https://csrc.nist.gov/CSRC/media/Projects/Cryptographic-Standards-and-Guidelines/documents/examples/FF1samples.pdf
"""

from __future__ import annotations

import random

import pytest

from snowflake_db.public_ids import PublicIdCodec
from snowflake_db.public_ids._ff1 import FF1, byte_length, header_block
from snowflake_db.public_ids._symbols import ALPHABET, gf32_mul, gf32_power, syndrome16
from snowflake_db.public_ids.codec import tweak

KEY_256 = "2B7E151628AED2A6ABF7158809CF4F3CEF4359D8D580AA4F7F036D6F04FC6A94"
KEYS = {128: KEY_256[:32], 192: KEY_256[:48], 256: KEY_256}
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
TWEAK_10 = "39383736353433323130"
TWEAK_11 = "3737373770717273373737"

# (sample, AES key bits, radix, tweak, plaintext, ciphertext)
NIST_SAMPLES = [
    (1, 128, 10, "", "0123456789", "2433477484"),
    (2, 128, 10, TWEAK_10, "0123456789", "6124200773"),
    (3, 128, 36, TWEAK_11, "0123456789abcdefghi", "a9tv40mll9kdu509eum"),
    (4, 192, 10, "", "0123456789", "2830668132"),
    (5, 192, 10, TWEAK_10, "0123456789", "2496655549"),
    (6, 192, 36, TWEAK_11, "0123456789abcdefghi", "xbj3kv35jrawxv32ysr"),
    (7, 256, 10, "", "0123456789", "6657667009"),
    (8, 256, 10, TWEAK_10, "0123456789", "1001623463"),
    (9, 256, 36, TWEAK_11, "0123456789abcdefghi", "xs8a0azh2avyalyzuwd"),
]


@pytest.mark.parametrize(
    "sample", NIST_SAMPLES, ids=[f"sample-{s[0]}-aes{s[1]}-radix{s[2]}" for s in NIST_SAMPLES]
)
def test_nist_ff1_samples(sample: tuple[int, int, int, str, str, str]) -> None:
    _, bits, radix, tweak_hex, plaintext, ciphertext = sample
    cipher = FF1(bytes.fromhex(KEYS[bits]), radix)
    numerals = [DIGITS.index(c) for c in plaintext]
    encrypted = cipher.encrypt(numerals, bytes.fromhex(tweak_hex))
    assert "".join(DIGITS[x] for x in encrypted) == ciphertext
    assert cipher.decrypt(encrypted, bytes.fromhex(tweak_hex)) == numerals


def test_ff1_parameters_of_the_codec() -> None:
    # radix 32, 14 numerals: b = 5 bytes, so d = 12 and a 10-byte tweak makes Q one block.
    assert byte_length(32, 7) == 5
    assert byte_length(10, 5) == 3  # NIST sample 1: v = 5, b = ceil(ceil(5 * 3.32) / 8)
    assert header_block(32, 14, 10) == bytes.fromhex("0102010000200a070000000e0000000a")
    assert len(tweak(1, "orders")) == 10


@pytest.mark.parametrize(
    ("key", "versions", "namespace"),
    [
        (bytes(range(16)), (1,), "orders"),
        (bytes(range(24)), (0,), "invoices"),
        (bytes(range(32)), (31,), "a namespace with ünïcode and spaces"),
    ],
)
def test_fast_path_equals_the_literal_ff1(key: bytes, versions: tuple[int], namespace: str) -> None:
    version = versions[0]
    codec = PublicIdCodec({version: key}, namespace=namespace)
    reference = FF1(key, 32)
    the_tweak = tweak(version, namespace)
    rng = random.Random(version)
    ids = [0, 1, 2**63 - 1] + [rng.getrandbits(63) for _ in range(300)]
    for snowflake_id in ids:
        plain = snowflake_id << 7  # the ID's 63 bits, then 7 zero bits: 70 bits
        numerals = [(plain >> (5 * (13 - k))) & 31 for k in range(14)]
        expected = "".join(ALPHABET[x] for x in reference.encrypt(numerals, the_tweak))
        text = codec.encode(snowflake_id)
        assert text[0] == ALPHABET[version]
        assert text[1:15] == expected
        assert codec.decode(text) == snowflake_id


def test_fast_decode_equals_the_literal_ff1_on_foreign_numbers() -> None:
    # Decoding a number of another key still inverts FF1 exactly; only the redundancy refuses.
    key = bytes(range(16))
    codec = PublicIdCodec(key, namespace="orders")
    reference = FF1(key, 32)
    rng = random.Random(3)
    accepted = 0
    for _ in range(300):
        numerals = [rng.randrange(32) for _ in range(14)]
        plain = 0
        for x in reference.decrypt(numerals, tweak(1, "orders")):
            plain = plain * 32 + x
        word = (1 << 75) | (sum(x << (5 * (13 - k)) for k, x in enumerate(numerals)) << 5)
        text = _with_check(word)
        if plain & 127:
            with pytest.raises(ValueError, match="is not a number of namespace 'orders'"):
                codec.decode(text)
        else:
            accepted += 1
            assert codec.decode(text) == plain >> 7
    assert accepted < 10


def _with_check(word: int) -> str:
    word |= syndrome16(word)
    return "".join(ALPHABET[(word >> (5 * (15 - k))) & 31] for k in range(16))


def test_gf32_alpha_is_primitive_so_all_16_weights_differ() -> None:
    powers = [gf32_power(k) for k in range(31)]
    assert sorted(powers) == list(range(1, 32))  # alpha generates every non-zero element
    assert gf32_power(31) == 1
    for a in range(32):  # a field: every non-zero element has an inverse
        assert a == 0 or any(gf32_mul(a, b) == 1 for b in range(1, 32))


def test_check_symbol_catches_every_single_error_on_random_words() -> None:
    # Exhaustive over positions and symbols, on random 75-bit payloads (not only codec output).
    rng = random.Random(37)
    for _ in range(50):
        word = rng.getrandbits(75) << 5
        word |= syndrome16(word)
        assert syndrome16(word) == 0
        symbols = [(word >> (5 * (15 - k))) & 31 for k in range(16)]
        for position in range(16):
            for value in range(32):
                if value != symbols[position]:
                    assert syndrome16(word ^ ((value ^ symbols[position]) << (5 * (15 - position))))
        for first in range(15):
            second = first + 1
            if symbols[first] != symbols[second]:
                swapped = symbols[:]
                swapped[first], swapped[second] = swapped[second], swapped[first]
                assert syndrome16(sum(s << (5 * (15 - k)) for k, s in enumerate(swapped)))
