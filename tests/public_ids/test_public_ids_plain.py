"""The unkeyed forms (base32, base62) and the layout whose IDs JavaScript holds exactly."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from snowflake_db import InvalidArgumentTypeError, InvalidIdError, Layout, SnowflakeGenerator
from snowflake_db.layout import DEFAULT_LAYOUT, JS_SAFE_LAYOUT
from snowflake_db.public_ids import (
    PublicIdError,
    from_base32,
    from_base62,
    to_base32,
    to_base62,
)

MAX_ID = 2**63 - 1


def _ids() -> list[int]:
    rng = random.Random(53)
    edges = [0, 1, 31, 32, 61, 62, 2**53 - 1, 2**53, MAX_ID - 1, MAX_ID]
    return edges + [rng.getrandbits(rng.randint(1, 63)) for _ in range(5_000)]


def test_base32_round_trip_fixed_length_and_known_values() -> None:
    for snowflake_id in _ids():
        text = to_base32(snowflake_id)
        assert len(text) == 13
        assert from_base32(text) == snowflake_id
    assert to_base32(0) == "0000000000000"
    assert to_base32(MAX_ID) == "7ZZZZZZZZZZZZ"
    assert to_base32(32) == "0000000000010"
    assert to_base32(1_234_567) == "0000000015NM7"  # Crockford's alphabet: no I, L, O, U


def test_base32_reads_forgivingly() -> None:
    text = to_base32(1_234_567_890_123)
    assert text == "000013XRZP16B"
    assert from_base32("ooo-ol3x-rzpi-6b") == 1_234_567_890_123
    assert from_base32(" OOO OI3X RZPL 6B ") == 1_234_567_890_123


def test_base62_round_trip_fixed_length_and_known_values() -> None:
    for snowflake_id in _ids():
        text = to_base62(snowflake_id)
        assert len(text) == 11
        assert from_base62(text) == snowflake_id
    assert to_base62(0) == "00000000000"
    assert to_base62(61) == "0000000000z"
    assert to_base62(62) == "00000000010"
    assert to_base62(MAX_ID) == "AzL8n0Y58m7"


def test_plain_forms_sort_like_the_ids() -> None:
    ids = sorted(_ids())
    assert sorted(ids, key=to_base32) == ids
    assert sorted(ids, key=to_base62) == ids


@pytest.mark.parametrize(
    ("call", "text", "reason", "message"),
    [
        (from_base32, "000000000001", "length", "has 12 symbols without hyphens and spaces; a "
         "base32 ID has exactly 13"),
        (from_base32, "80000000000000", "length", "has 14 symbols"),
        (from_base32, "000000000000U", "symbol", "'U' at symbol 13"),
        (from_base32, "8000000000000", "range", "stands for 9223372036854775808, above the "
         "largest Snowflake ID 9223372036854775807"),
        (from_base62, "0000000000", "length", "has 10 characters; a base62 ID has exactly 11"),
        (from_base62, "0000000000-", "symbol", "'-' at position 11, which is not a base62"),
        (from_base62, "AzL8n0Y58m8", "range", "stands for 9223372036854775808"),
        (from_base62, "zzzzzzzzzzz", "range", "above the largest Snowflake ID"),
    ],
)
def test_refused_texts_say_why(call: object, text: str, reason: str, message: str) -> None:
    with pytest.raises(PublicIdError, match=message) as caught:
        call(text)  # type: ignore[operator]
    assert caught.value.reason == reason
    assert caught.value.text == text


@pytest.mark.parametrize("encode", [to_base32, to_base62])
def test_encoders_refuse_what_is_not_an_id(encode: object) -> None:
    with pytest.raises(InvalidIdError, match="id=-1 is below the minimum 0"):
        encode(-1)  # type: ignore[operator]
    with pytest.raises(InvalidIdError, match="exceeds the maximum 9223372036854775807"):
        encode(2**63)  # type: ignore[operator]
    with pytest.raises(InvalidArgumentTypeError, match="got bool"):
        encode(True)  # type: ignore[operator]


@pytest.mark.parametrize("decode", [from_base32, from_base62])
def test_decoders_refuse_a_non_string(decode: object) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="must be a str, got bytes"):
        decode(b"00000000000")  # type: ignore[operator]


def test_plain_forms_need_no_cryptography_and_the_codec_says_what_to_install() -> None:
    script = (
        "import sys; sys.modules['cryptography'] = None\n"  # as if it were not installed
        "from snowflake_db.public_ids import PublicIdCodec, from_base32, to_base32\n"
        "assert from_base32(to_base32(12345)) == 12345\n"
        "try:\n"
        "    PublicIdCodec(bytes(16), namespace='orders')\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == (
        "MissingExtraError snowflake_db.public_ids needs cryptography, which is not installed: "
        "pip install 'snowflake-db[public-ids]'"
    )


# -- the JavaScript-safe layout ---------------------------------------------------------------


def test_js_safe_layout_stays_below_2_53_with_its_stated_limits() -> None:
    layout = JS_SAFE_LAYOUT
    assert layout.max_id == 2**53 - 1 < 2**53  # Number.MAX_SAFE_INTEGER
    assert layout.encode(
        timestamp_ms=layout.max_timestamp_ms, worker_id=layout.max_worker_id,
        sequence=layout.max_sequence,
    ) == 2**53 - 1
    assert (layout.max_worker_id, layout.max_sequence, layout.tick_ms) == (255, 15, 1)
    assert layout.max_ids_per_second == 16_000
    assert layout.exhausted_at.date().isoformat() == "2089-09-06"
    assert layout.epoch == DEFAULT_LAYOUT.epoch
    assert Layout(time_bits=41, worker_bits=8, sequence_bits=4) == JS_SAFE_LAYOUT


def test_js_safe_layout_generates_ids_a_float_holds_exactly() -> None:
    generator = SnowflakeGenerator(255, layout=JS_SAFE_LAYOUT)
    ids = generator.next_ids(2_000) + [generator.next_id() for _ in range(100)]
    assert ids == sorted(set(ids))
    assert all(0 < i < 2**53 and int(float(i)) == i for i in ids)
    assert {JS_SAFE_LAYOUT.decode(i).worker_id for i in ids} == {255}
