"""PublicIdCodec: round trips, separation of keys and namespaces, refusal rates, error messages.

No database: the codec is pure computation. Refusal rates are measured on fixed keys and seeded
IDs, so a run is reproducible; the thresholds are the issue's (>= 99%).
"""

from __future__ import annotations

import itertools
import random
import threading

import pytest

from snowflake_db import InvalidArgumentTypeError, InvalidIdError, SnowflakeError
from snowflake_db.public_ids import LENGTH, PublicIdCodec, PublicIdError, PublicIdKeyError
from snowflake_db.public_ids._symbols import ALPHABET

KEY = bytes(range(32))
OTHER_KEY = bytes(range(100, 132))
MAX_ID = 2**63 - 1


def _ids(count: int, seed: int = 21) -> list[int]:
    rng = random.Random(seed)
    edges = [0, 1, 2, 127, 128, 2**35 - 1, 2**35, 2**53 - 1, 2**53, MAX_ID - 1, MAX_ID]
    return edges + [rng.getrandbits(63) for _ in range(count - len(edges))]


@pytest.fixture(scope="module")
def orders() -> PublicIdCodec:
    return PublicIdCodec(KEY, namespace="orders")


def test_round_trip_on_many_ids_including_both_ends(orders: PublicIdCodec) -> None:
    ids = _ids(20_000)
    texts = [orders.encode(i) for i in ids]
    assert [orders.decode(t) for t in texts] == ids
    assert {len(t) for t in texts} == {LENGTH}
    assert set("".join(texts)) <= set(ALPHABET)
    assert len(set(texts)) == len(ids)  # a permutation: distinct IDs, distinct numbers


def test_same_key_and_namespace_give_the_same_number() -> None:
    a = PublicIdCodec(KEY, namespace="orders")
    b = PublicIdCodec(bytearray(KEY), namespace="orders")
    assert [a.encode(i) for i in _ids(50)] == [b.encode(i) for i in _ids(50)]


def test_numbers_of_neighbouring_ids_share_nothing_visible(orders: PublicIdCodec) -> None:
    # Consecutive Snowflake IDs (same time and worker) must not give numbers that share a
    # prefix or sort in ID order: that would leak time and volume.
    base = 1_234_567_890_123_456_789
    texts = [orders.encode(base + k)[1:15] for k in range(2_000)]  # drop version and check
    shared = sum(a[:2] == b[:2] for a, b in itertools.pairwise(texts))
    assert shared < 20  # 2 symbols equal by chance: 1/1024 per pair, about 2 expected
    ascending = sum(a < b for a, b in itertools.pairwise(texts))
    assert 800 < ascending < 1200


def test_reading_is_forgiving(orders: PublicIdCodec) -> None:
    for snowflake_id in _ids(200):
        text = orders.encode(snowflake_id)
        grouped = orders.encode(snowflake_id, group=4)
        assert grouped == "-".join(text[i : i + 4] for i in range(0, 16, 4))
        messy = " " + grouped.lower().replace("1", "l").replace("0", "o").replace("-", " - ") + "\n"
        assert orders.decode(grouped) == orders.decode(messy) == snowflake_id
        assert orders.decode(text.replace("1", "I").replace("0", "O")) == snowflake_id


def test_namespaces_give_unrelated_numbers_and_refuse_each_other(orders: PublicIdCodec) -> None:
    invoices = PublicIdCodec(KEY, namespace="invoices")
    ids = _ids(10_000, seed=5)
    numbers = [invoices.encode(i) for i in ids]
    assert sum(n == orders.encode(i) for n, i in zip(numbers, ids, strict=True)) == 0
    refused = _refused(orders, numbers)
    assert refused / len(numbers) >= 0.99, refused


def test_another_key_is_refused_at_least_99_percent(orders: PublicIdCodec) -> None:
    stranger = PublicIdCodec(OTHER_KEY, namespace="orders")
    numbers = [stranger.encode(i) for i in _ids(10_000, seed=6)]
    refused = _refused(orders, numbers)
    assert refused / len(numbers) >= 0.99, refused
    # 7 redundancy bits: 1 in 128 gets through, decoding to an unrelated ID (never an error).
    assert refused < len(numbers)


def test_random_text_of_the_right_length_is_refused(orders: PublicIdCodec) -> None:
    rng = random.Random(7)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(LENGTH)) for _ in range(10_000)]
    reasons: dict[str, int] = {}
    for text in texts:
        try:
            orders.decode(text)
        except PublicIdError as error:
            reasons[error.reason] = reasons.get(error.reason, 0) + 1
    assert sum(reasons.values()) / len(texts) >= 0.99
    assert reasons["check"] > 9_500  # the check symbol alone refuses 31 in 32


def _refused(codec: PublicIdCodec, texts: list[str]) -> int:
    refused = 0
    for text in texts:
        try:
            codec.decode(text)
        except PublicIdError as error:
            assert error.reason == "key", error
            refused += 1
    return refused


def test_every_substitution_and_every_transposition_is_refused(orders: PublicIdCodec) -> None:
    for snowflake_id in _ids(40, seed=8):
        text = orders.encode(snowflake_id)
        for position in range(LENGTH):
            for symbol in ALPHABET:
                if symbol != text[position]:
                    wrong = text[:position] + symbol + text[position + 1 :]
                    _assert_check_fails(orders, wrong)
        for first in range(LENGTH):
            for second in range(first + 1, LENGTH):
                if text[first] != text[second]:
                    swapped = list(text)
                    swapped[first], swapped[second] = swapped[second], swapped[first]
                    _assert_check_fails(orders, "".join(swapped))


def _assert_check_fails(codec: PublicIdCodec, text: str) -> None:
    with pytest.raises(PublicIdError, match="fails its check symbol") as caught:
        codec.decode(text)
    assert caught.value.reason == "check"


def test_key_rotation() -> None:
    old = PublicIdCodec(KEY, namespace="orders")
    rotated = PublicIdCodec({1: KEY, 2: OTHER_KEY}, namespace="orders")
    assert (rotated.versions, rotated.current_version) == ((1, 2), 2)
    ids = _ids(500, seed=9)
    for snowflake_id in ids:
        printed = old.encode(snowflake_id)
        assert printed[0] == "1"
        assert rotated.decode(printed) == snowflake_id  # old numbers still decode
        fresh = rotated.encode(snowflake_id)
        assert fresh[0] == "2" and fresh != printed
        assert rotated.decode(fresh) == snowflake_id
    with pytest.raises(PublicIdError, match=r"key version 2, which is not configured "
                       r"\(configured versions: 1\)") as caught:
        old.decode(rotated.encode(ids[0]))
    assert caught.value.reason == "version"
    retired = PublicIdCodec({2: OTHER_KEY}, namespace="orders")
    with pytest.raises(PublicIdError, match="key version 1, which is not configured"):
        retired.decode(old.encode(ids[0]))


def test_versions_take_part_in_the_tweak() -> None:
    # The same key under two versions still gives unrelated numbers.
    one = PublicIdCodec({1: KEY}, namespace="orders")
    three = PublicIdCodec({3: KEY}, namespace="orders")
    assert one.encode(42)[1:15] != three.encode(42)[1:15]


@pytest.mark.parametrize(
    ("text", "reason", "message"),
    [
        ("1QR8N4X3SRY9QH7", "length", "has 15 symbols without hyphens and spaces; a public ID "
         "has exactly 16"),
        ("1QR8N4X3SRY9QH7DD", "length", "has 17 symbols"),
        ("", "length", "has 0 symbols"),
        ("X" * 500, "length", "has 500 characters"),
        ("1QR8N4X3SRY9QH7U", "symbol", "'U' at symbol 16, which is not a Crockford base32"),
        ("1QR8N4X3SR#9QH7D", "symbol", "'#' at symbol 11"),
    ],
)
def test_refusals_say_why(orders: PublicIdCodec, text: str, reason: str, message: str) -> None:
    with pytest.raises(PublicIdError, match=message) as caught:
        orders.decode(text)
    assert caught.value.reason == reason
    assert isinstance(caught.value, SnowflakeError) and isinstance(caught.value, ValueError)


def test_a_long_refused_text_is_cut_short_in_the_message(orders: PublicIdCodec) -> None:
    with pytest.raises(PublicIdError) as caught:
        orders.decode("A" * 60)
    assert "A" * 41 not in str(caught.value)


def test_wrong_key_refusal_names_the_namespace(orders: PublicIdCodec) -> None:
    stranger = PublicIdCodec(OTHER_KEY, namespace="orders")
    for snowflake_id in _ids(200, seed=10):
        try:
            orders.decode(stranger.encode(snowflake_id))
        except PublicIdError as error:
            assert "is not a number of namespace 'orders' (key version 1)" in str(error)
            return
    pytest.fail("no number of another key was refused")


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, InvalidIdError, "id=-1 is below the minimum 0"),
        (2**63, InvalidIdError, "id=9223372036854775808 exceeds the maximum 9223372036854775807"),
        (True, InvalidArgumentTypeError, "id must be an int, got bool"),
        ("12", InvalidArgumentTypeError, "id must be an int, got str"),
        (1.0, InvalidArgumentTypeError, "id must be an int, got float"),
    ],
)
def test_encode_refuses_what_is_not_an_id(
    orders: PublicIdCodec, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        orders.encode(value)  # type: ignore[arg-type]


def test_decode_refuses_a_non_string(orders: PublicIdCodec) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="must be a str, got int"):
        orders.decode(12345)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (bytes(20), "public-ID key version 1 has 20 bytes; an AES key has 16, 24 or 32 bytes"),
        ({2: bytes(15)}, "key version 2 has 15 bytes"),
        ({32: bytes(16)}, "public-ID key version=32 exceeds the maximum 31"),
        ({-1: bytes(16)}, "public-ID key version=-1 is below the minimum 0"),
        ({}, "mapping is empty"),
        ("1:abc", "got a str; for the '1:<base64>,2:<base64>' text form use"),
        (12, "got int"),
        ({1: "k" * 16}, "key version 1 must be bytes, got str"),
    ],
)
def test_bad_keys_are_refused_naming_length_and_limits(key: object, message: str) -> None:
    with pytest.raises(PublicIdKeyError, match=message) as caught:
        PublicIdCodec(key, namespace="orders")  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)


def test_every_aes_key_length_works() -> None:
    for length in (16, 24, 32):
        codec = PublicIdCodec(bytes(range(length)), namespace="orders")
        assert codec.decode(codec.encode(MAX_ID)) == MAX_ID


def test_namespace_is_required_and_non_empty() -> None:
    with pytest.raises(PublicIdKeyError, match="namespace must be a non-empty str"):
        PublicIdCodec(KEY, namespace="")


def test_group_is_checked(orders: PublicIdCodec) -> None:
    assert orders.encode(7, group=16) == orders.encode(7)
    assert orders.encode(7, group=5).count("-") == 3
    with pytest.raises(InvalidArgumentTypeError):
        orders.encode(7, group="4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group=0 is below the minimum 1"):
        orders.encode(7, group=0)


def test_repr_shows_no_key_material(orders: PublicIdCodec) -> None:
    assert repr(orders) == "PublicIdCodec(namespace='orders', versions=(1,), current_version=1)"


def test_one_codec_shared_by_threads(orders: PublicIdCodec) -> None:
    # One AES encryptor per key serves every thread (Django and FastAPI share the cached codec).
    failures: list[str] = []

    def work(seed: int) -> None:
        try:
            for snowflake_id in _ids(3_000, seed=seed):
                assert orders.decode(orders.encode(snowflake_id)) == snowflake_id
        except Exception as error:  # reported by the main thread
            failures.append(repr(error))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
