"""Process-wide public-ID keys: from settings (``configure_public_ids``) or the environment.

Keys never live in code. The text form, used by the environment variable, Django settings and
the CLI, is ``<version>:<key>`` entries joined by commas, each key URL-safe base64 of 16, 24 or
32 bytes (padding optional)::

    SNOWFLAKE_DB_PUBLIC_ID_KEYS="1:q8Zl0...,2:Vb3xN..."

New numbers use the highest version; older versions keep decoding while they are listed.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import threading
from collections.abc import Mapping

from .._validate import require_int
from ..errors import PublicIdKeyError, PublicIdKeysNotConfiguredError
from ._ff1 import AES_KEY_LENGTHS
from .codec import MAKE_A_KEY, MAX_VERSION, PublicIdCodec, key_length_error, normalize_keys

ENV_VAR = "SNOWFLAKE_DB_PUBLIC_ID_KEYS"

_lock = threading.Lock()
_configured: dict[int, bytes] | None = None
_generation = 0
#: namespace -> (the key source it was built from, codec)
_codecs: dict[str, tuple[object, PublicIdCodec]] = {}


def parse_keys(text: str, *, source: str = "public-ID keys") -> dict[int, bytes]:
    """``{version: key}`` from the text form ``"1:<base64>,2:<base64>"``.

    Messages name ``source`` (e.g. the environment variable), versions and lengths, never a
    key's bytes.
    """
    if not isinstance(text, str):
        raise PublicIdKeyError(f"{source} must be a str, got {type(text).__name__}")
    keys: dict[int, bytes] = {}
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    if not entries:
        raise PublicIdKeyError(
            f"{source} is empty; expected '<version>:<base64 key>' entries joined by commas, "
            "e.g. the output of `snowflake-db public new-key`"
        )
    for position, entry in enumerate(entries, 1):
        version_text, colon, key_text = entry.partition(":")
        if not colon or not version_text.strip().isdigit():
            raise PublicIdKeyError(
                f"{source}: entry {position} is not '<version>:<base64 key>' (a version number "
                "0-31, a colon, then the key)"
            )
        version = int(version_text)
        if version in keys:
            raise PublicIdKeyError(f"{source}: key version {version} is given twice")
        key_text = key_text.strip()
        try:
            key = base64.urlsafe_b64decode(key_text + "=" * (-len(key_text) % 4))
        except (binascii.Error, ValueError):
            raise PublicIdKeyError(
                f"{source}: key version {version} is not URL-safe base64"
            ) from None
        if base64.urlsafe_b64encode(key).rstrip(b"=") != key_text.rstrip("=").encode():
            raise PublicIdKeyError(f"{source}: key version {version} is not URL-safe base64")
        if len(key) not in AES_KEY_LENGTHS:
            raise key_length_error(f"{source}: key version {version}", len(key))
        keys[version] = key
    return normalize_keys(keys)


def format_keys(keys: Mapping[int, bytes]) -> str:
    """The text form of ``{version: key}`` (what :func:`parse_keys` reads back)."""
    return ",".join(
        f"{version}:{base64.urlsafe_b64encode(key).decode().rstrip('=')}"
        for version, key in sorted(normalize_keys(keys).items())
    )


def generate_key(version: int = 1) -> str:
    """A new random 256-bit key in the text form, ``"<version>:<base64>"``.

    To rotate, append the new entry with a higher version to the setting: new numbers then use
    it, and numbers of the old version keep decoding until that entry is removed.
    """
    require_int("version", version, minimum=0, maximum=MAX_VERSION, error=PublicIdKeyError)
    return format_keys({version: secrets.token_bytes(32)})


def configure_public_ids(keys: bytes | Mapping[int, bytes] | str | None) -> None:
    """Set the process-wide keys: bytes (version 1), ``{version: key}``, or the text form.

    ``None`` forgets them, so :func:`codec_for` reads the environment variable again. The
    keys are checked now: a bad key fails at start-up, not at the first order.
    """
    global _configured, _generation  # noqa: PLW0603
    parsed = None if keys is None else (
        parse_keys(keys) if isinstance(keys, str) else normalize_keys(keys)
    )
    with _lock:
        _configured = parsed
        _generation += 1
        _codecs.clear()


def current_keys() -> dict[int, bytes]:
    """The process-wide keys: configured ones, else the environment variable's, else a
    :class:`PublicIdKeysNotConfiguredError` saying how to configure them."""
    configured = _configured
    if configured is not None:
        return dict(configured)
    text = os.environ.get(ENV_VAR)
    if text is None:
        raise PublicIdKeysNotConfiguredError(_NOT_CONFIGURED)
    return parse_keys(text, source=f"environment variable {ENV_VAR}")


def codec_for(namespace: str) -> PublicIdCodec:
    """The codec of ``namespace`` under the process-wide keys (built once, then cached)."""
    configured = _configured
    source: object = _generation if configured is not None else os.environ.get(ENV_VAR)
    cached = _codecs.get(namespace)
    if cached is not None and cached[0] == source:
        return cached[1]
    if configured is None and source is None:
        raise PublicIdKeysNotConfiguredError(_NOT_CONFIGURED)
    keys = configured if configured is not None else current_keys()
    codec = PublicIdCodec(keys, namespace=namespace)
    with _lock:
        if source == (_generation if _configured is not None else os.environ.get(ENV_VAR)):
            _codecs[namespace] = (source, codec)
    return codec


_NOT_CONFIGURED = (
    "no public-ID keys are configured: set the environment variable "
    f"{ENV_VAR}='1:<key>' ({MAKE_A_KEY}), or call "
    "snowflake_db.public_ids.configure_public_ids(...) at start-up (Django: the "
    "SNOWFLAKE_DB setting); keep keys out of code"
)
