"""``SNOWFLAKE_DB["PUBLIC_ID_KEYS"]`` to the process-wide public-ID keys, at start and when the
setting changes (``override_settings`` in tests)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf import SETTING_NAME, SnowflakeSettings, parse, when_changed


def apply_public_id_keys(conf: SnowflakeSettings) -> None:
    """Configure the keys of ``PUBLIC_ID_KEYS``; without it, leave the process's keys alone
    (``configure_public_ids()`` made elsewhere, else the environment variable)."""
    if conf.public_id_keys is not None:
        from ...public_ids import configure_public_ids

        configure_public_ids(conf.public_id_keys)


def _reconfigure(setting: str, value: Any) -> None:
    try:
        keys = parse(value).public_id_keys
    except ImproperlyConfigured:
        keys = None  # reported by check E001 and by get_settings()
    from ...public_ids import configure_public_ids

    configure_public_ids(keys)


when_changed((SETTING_NAME,), _reconfigure)
