"""Process-wide public-ID keys: the text form, the environment variable, configure and cache."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from snowflake_db import NotConfiguredError
from snowflake_db.public_ids import (
    ENV_VAR,
    PublicIdCodec,
    PublicIdError,
    PublicIdKeyError,
    PublicIdKeysNotConfiguredError,
    codec_for,
    configure_public_ids,
    current_keys,
    format_keys,
    generate_key,
    parse_keys,
)

KEY_1 = bytes(range(32))
KEY_2 = bytes(range(16))
TEXT = format_keys({1: KEY_1, 2: KEY_2})


@pytest.fixture(autouse=True)
def _no_process_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV_VAR, raising=False)
    configure_public_ids(None)
    yield
    configure_public_ids(None)


def test_text_form_round_trips() -> None:
    b64 = base64.urlsafe_b64encode(KEY_1).decode().rstrip("=")
    assert TEXT.startswith(f"1:{b64},2:")
    assert parse_keys(TEXT) == {1: KEY_1, 2: KEY_2}
    assert parse_keys(" 2:" + TEXT.split(",2:")[1] + " , 1:" + b64 + "= ,") == {1: KEY_1, 2: KEY_2}


def test_generate_key_gives_a_fresh_256_bit_key_in_the_text_form() -> None:
    first, second = generate_key(), generate_key(version=2)
    assert first.startswith("1:") and second.startswith("2:")
    keys = parse_keys(f"{first},{second}")
    assert [len(k) for k in keys.values()] == [32, 32]
    assert keys[1] != keys[2]
    with pytest.raises(PublicIdKeyError, match="version=32 exceeds the maximum 31"):
        generate_key(version=32)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty; expected '<version>:<base64 key>' entries joined by commas"),
        (" , ", "is empty"),
        ("AAAAAAAAAAAAAAAAAAAAAA", "entry 1 is not '<version>:<base64 key>'"),
        ("1:AAAAAAAAAAAAAAAAAAAAAA,x:AAAA", "entry 2 is not '<version>:<base64 key>'"),
        ("1:AAAAAAAAAAAAAAAAAAAAAA,1:AAAAAAAAAAAAAAAAAAAAAA", "key version 1 is given twice"),
        ("3:not base64!!", "key version 3 is not URL-safe base64"),
        ("3:AAAA+AAAAAAAAAAAAAAAAA", "key version 3 is not URL-safe base64"),
        ("4:AAAAAAAAAAAAAAAAAAAA", "key version 4 has 15 bytes; an AES key has 16, 24 or 32"),
        ("40:AAAAAAAAAAAAAAAAAAAAAA", "version=40 exceeds the maximum 31"),
    ],
)
def test_bad_text_is_refused_without_showing_key_bytes(text: str, message: str) -> None:
    with pytest.raises(PublicIdKeyError, match=message) as caught:
        parse_keys(text)
    assert "AAAAAAAA" not in str(caught.value)


def test_nothing_configured_says_how_to_configure() -> None:
    with pytest.raises(PublicIdKeysNotConfiguredError) as caught:
        codec_for("orders")
    message = str(caught.value)
    assert ENV_VAR in message and "generate_key()" in message
    assert "configure_public_ids" in message
    assert isinstance(caught.value, NotConfiguredError)
    assert isinstance(caught.value, PublicIdKeyError)
    with pytest.raises(PublicIdKeysNotConfiguredError):
        current_keys()


def test_environment_variable_is_read_and_its_errors_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, TEXT)
    codec = codec_for("orders")
    assert codec.versions == (1, 2)
    assert codec_for("orders") is codec  # cached
    assert codec_for("invoices") is not codec
    expected = PublicIdCodec({1: KEY_1, 2: KEY_2}, namespace="orders")
    assert codec.encode(10**18) == expected.encode(10**18)
    monkeypatch.setenv(ENV_VAR, "1:short")
    with pytest.raises(PublicIdKeyError, match=f"environment variable {ENV_VAR}: key version 1"):
        codec_for("orders")


def test_rotation_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, format_keys({1: KEY_1}))
    printed = codec_for("orders").encode(123_456_789)
    monkeypatch.setenv(ENV_VAR, TEXT)  # version 2 added: the cache follows the variable
    rotated = codec_for("orders")
    assert rotated.current_version == 2
    assert rotated.decode(printed) == 123_456_789
    assert rotated.encode(123_456_789)[0] == "2"
    monkeypatch.setenv(ENV_VAR, format_keys({2: KEY_2}))  # version 1 retired
    with pytest.raises(PublicIdError, match="key version 1, which is not configured"):
        codec_for("orders").decode(printed)


def test_configure_wins_over_the_environment_and_none_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, format_keys({5: KEY_2}))
    configure_public_ids(KEY_1)
    assert codec_for("orders").versions == (1,)
    assert current_keys() == {1: KEY_1}
    configure_public_ids({3: KEY_1, 7: KEY_2})
    assert codec_for("orders").versions == (3, 7)
    configure_public_ids(TEXT)
    assert codec_for("orders").versions == (1, 2)
    configure_public_ids(None)
    assert codec_for("orders").versions == (5,)


def test_configure_checks_keys_at_once() -> None:
    with pytest.raises(PublicIdKeyError, match="has 8 bytes"):
        configure_public_ids(bytes(8))
    with pytest.raises(PublicIdKeyError, match="entry 1 is not"):
        configure_public_ids("no colon")
    with pytest.raises(PublicIdKeysNotConfiguredError):  # a refused configuration sets nothing
        codec_for("orders")
