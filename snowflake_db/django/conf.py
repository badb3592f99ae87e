"""The ``SNOWFLAKE_DB`` settings dict, validated once and cached until settings change.

All keys are optional::

    SNOWFLAKE_DB = {
        "WORKER_SOURCE": "table",       # "env" (default), "static", "table" or "manual"
        "WORKER_ID": 7,                 # for "static"
        "CONTROL_DATABASE": "default",  # alias holding the worker tables ("table")
        "LEASE_SECONDS": 60,            # lease length for "table"
        "LAYOUT": {"worker_bits": 10},  # snowflake_db.Layout keyword arguments, or a Layout
        "EPOCH": "2020-01-01",          # ISO date/datetime (UTC if naive) or Unix milliseconds
        "ALLOCATOR_OPTIONS": {},        # more TableWorkerAllocator keyword arguments
        "GENERATOR_OPTIONS": {},        # more SnowflakeGenerator keyword arguments
        "ENGINE_URL": None,             # SQLAlchemy URL overriding the one built from DATABASES
        "PUBLIC_ID_KEYS": None,         # "1:<base64>,2:<base64>", bytes or {version: bytes}
        "KEY_COLUMNS": [],              # "app_label.Model.field": plain integers holding keys
        "NOT_KEY_COLUMNS": [],          # "app_label.Model.field": never holds a Snowflake key
        "AUTO_FIELD_DATABASE_KEYS": False,  # True: raw INSERTs without the key get one
    }

``PUBLIC_ID_KEYS`` are the keys of public numbers (:mod:`snowflake_db.public_ids`); unset, the
``SNOWFLAKE_DB_PUBLIC_ID_KEYS`` environment variable is read. Read them from the environment or
a secrets store in ``settings.py``; never write a key into code.

``KEY_COLUMNS`` and ``NOT_KEY_COLUMNS`` correct what the checks guess about plain integer fields
(:mod:`.key_columns`): the first declares fields that receive Snowflake keys although their name
does not say so, the second fields that a name or a ``GenericForeignKey`` would flag but that
never receive one.

``AUTO_FIELD_DATABASE_KEYS`` gives every ``SnowflakeAutoField`` key on PostgreSQL and MariaDB
the key function for the ``INSERT`` statements that leave the key out, as ``BigAutoField``'s
identity does (:mod:`.auto_field_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..errors import SnowflakeError
from ..layout import Layout, to_unix_ms

SETTING_NAME = "SNOWFLAKE_DB"
WORKER_SOURCES = ("env", "static", "table", "manual")
KNOWN_KEYS = frozenset(
    {
        "WORKER_SOURCE",
        "WORKER_ID",
        "CONTROL_DATABASE",
        "LEASE_SECONDS",
        "LAYOUT",
        "EPOCH",
        "ALLOCATOR_OPTIONS",
        "GENERATOR_OPTIONS",
        "ENGINE_URL",
        "PUBLIC_ID_KEYS",
        "KEY_COLUMNS",
        "NOT_KEY_COLUMNS",
        "AUTO_FIELD_DATABASE_KEYS",
    }
)


@dataclass(frozen=True)
class SnowflakeSettings:
    """``SNOWFLAKE_DB`` after validation."""

    worker_source: str = "env"
    worker_id: int | None = None
    control_database: str = "default"
    lease_seconds: float | None = None
    layout: Layout = field(default_factory=Layout)
    allocator_options: dict[str, Any] = field(default_factory=dict)
    generator_options: dict[str, Any] = field(default_factory=dict)
    engine_url: str | None = None
    #: ``{version: key}``, or ``None``: the environment variable's keys
    public_id_keys: dict[int, bytes] | None = None
    #: ``app_label.modelname.field`` (model name lower case) of ``KEY_COLUMNS``
    key_columns: frozenset[str] = frozenset()
    #: the same for ``NOT_KEY_COLUMNS``
    not_key_columns: frozenset[str] = frozenset()
    #: ``AUTO_FIELD_DATABASE_KEYS``: database keys for inserts without one, after each migrate
    auto_field_database_keys: bool = False


def _fail(message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"settings.{SETTING_NAME}: {message}")


def _epoch_ms(value: object) -> int:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise _fail(f"EPOCH={value!r} is not an ISO date or datetime") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return to_unix_ms(value, "EPOCH")  # type: ignore[arg-type]
    except SnowflakeError as error:
        raise _fail(str(error)) from None


def _options(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise _fail(f"{key} must be a dict, got {type(value).__name__}")
    return dict(value)


def _public_id_keys(value: object) -> dict[int, bytes] | None:
    """``PUBLIC_ID_KEYS`` checked by the codec's own parser (messages never show a key)."""
    if value is None:
        return None
    from ..public_ids import PublicIdKeyError, format_keys, parse_keys

    try:
        if isinstance(value, str):
            return parse_keys(value, source=f"settings.{SETTING_NAME}['PUBLIC_ID_KEYS']")
        if isinstance(value, bytes | bytearray):
            value = {1: bytes(value)}
        if not isinstance(value, dict):
            raise PublicIdKeyError(
                "must be the text form '1:<base64>,...', bytes or a {version: bytes} dict, "
                f"got {type(value).__name__}"
            )
        return parse_keys(format_keys(value))
    except PublicIdKeyError as error:
        raise _fail(f"PUBLIC_ID_KEYS: {error}") from None


def _field_paths(raw: dict[str, Any], key: str) -> frozenset[str]:
    """``["shop.OrderDiscount.offer_id", ...]`` as ``{"shop.orderdiscount.offer_id", ...}``."""
    value = raw.get(key) or []
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise _fail(f"{key} must be a list of 'app_label.Model.field' strings, got {value!r}")
    paths: set[str] = set()
    for item in value:
        parts = item.split(".") if isinstance(item, str) else []
        if len(parts) != 3 or not all(parts):
            raise _fail(f"{key}: {item!r} is not 'app_label.Model.field'")
        paths.add(f"{parts[0]}.{parts[1].lower()}.{parts[2]}")
    return frozenset(paths)


def _flag(raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise _fail(f"{key} must be True or False, got {value!r}")
    return value


def _declared_columns(raw: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    key_columns = _field_paths(raw, "KEY_COLUMNS")
    not_key_columns = _field_paths(raw, "NOT_KEY_COLUMNS")
    if key_columns & not_key_columns:
        raise _fail(
            f"{', '.join(sorted(key_columns & not_key_columns))} in both KEY_COLUMNS and "
            "NOT_KEY_COLUMNS"
        )
    return key_columns, not_key_columns


def parse(raw: object) -> SnowflakeSettings:
    """Validate a ``SNOWFLAKE_DB`` value; raise ``ImproperlyConfigured`` naming the bad key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(f"must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise _fail(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN_KEYS))}")
    source = raw.get("WORKER_SOURCE", "env")
    if source not in WORKER_SOURCES:
        raise _fail(f"WORKER_SOURCE={source!r} must be one of {', '.join(WORKER_SOURCES)}")

    layout_value = raw.get("LAYOUT")
    layout_kwargs: dict[str, Any]
    if isinstance(layout_value, Layout):
        layout_kwargs = layout_value.as_kwargs()
    elif layout_value is None or isinstance(layout_value, dict):
        layout_kwargs = dict(layout_value or {})
    else:
        raise _fail(f"LAYOUT must be a dict of Layout arguments or a Layout, got {layout_value!r}")
    if "EPOCH" in raw:
        if "epoch_ms" in layout_kwargs:
            raise _fail("give the epoch once: EPOCH or LAYOUT['epoch_ms'], not both")
        layout_kwargs["epoch_ms"] = _epoch_ms(raw["EPOCH"])
    try:
        layout = Layout(**layout_kwargs)
    except TypeError as error:
        raise _fail(f"LAYOUT: {error}") from None
    except SnowflakeError as error:
        raise _fail(f"LAYOUT: {error}") from None

    worker_id = raw.get("WORKER_ID")
    if source == "static":
        if worker_id is None:
            raise _fail("WORKER_SOURCE='static' needs WORKER_ID (an int unique to this process)")
        try:
            layout.check_worker_id(worker_id)
        except SnowflakeError as error:
            raise _fail(f"WORKER_ID: {error}") from None
    elif worker_id is not None:
        raise _fail(f"WORKER_ID is only used with WORKER_SOURCE='static', not {source!r}")

    alias = raw.get("CONTROL_DATABASE", "default")
    if not isinstance(alias, str) or not alias:
        raise _fail(f"CONTROL_DATABASE must be a database alias, got {alias!r}")
    lease = raw.get("LEASE_SECONDS")
    if lease is not None and (
        isinstance(lease, bool) or not isinstance(lease, int | float) or lease <= 0
    ):
        raise _fail(f"LEASE_SECONDS must be a positive number of seconds, got {lease!r}")
    engine_url = raw.get("ENGINE_URL")
    if engine_url is not None and not isinstance(engine_url, str):
        raise _fail(f"ENGINE_URL must be a SQLAlchemy URL string, got {engine_url!r}")
    key_columns, not_key_columns = _declared_columns(raw)
    return SnowflakeSettings(
        worker_source=source,
        worker_id=worker_id,
        control_database=alias,
        lease_seconds=lease,
        layout=layout,
        allocator_options=_options(raw, "ALLOCATOR_OPTIONS"),
        generator_options=_options(raw, "GENERATOR_OPTIONS"),
        engine_url=engine_url,
        public_id_keys=_public_id_keys(raw.get("PUBLIC_ID_KEYS")),
        key_columns=key_columns,
        not_key_columns=not_key_columns,
        auto_field_database_keys=_flag(raw, "AUTO_FIELD_DATABASE_KEYS"),
    )


_cached: SnowflakeSettings | None = None


def get_settings() -> SnowflakeSettings:
    """The validated ``SNOWFLAKE_DB`` settings (cached; cleared when the setting changes)."""
    global _cached  # noqa: PLW0603 - a cache of settings, as Django's own apps keep
    if _cached is None:
        _cached = parse(getattr(django_settings, SETTING_NAME, None))
    return _cached


def get_layout() -> Layout:
    """The layout IDs are made and decoded with."""
    return get_settings().layout


#: What runs when a setting changes: (the settings it follows, the reaction).
_reactions: list[tuple[frozenset[str], Callable[[str, Any], None]]] = []


def when_changed(settings: Iterable[str], reaction: Callable[[str, Any], None]) -> None:
    """Call ``reaction(setting, value)`` whenever one of ``settings`` changes
    (``override_settings`` in tests): the library's one ``setting_changed`` receiver runs it,
    after this module's own cache was cleared."""
    _reactions.append((frozenset(settings), reaction))


@receiver(setting_changed)
def _setting_changed(*, setting: str, value: Any = None, **kwargs: Any) -> None:
    """The one ``setting_changed`` receiver of ``snowflake_db.django``."""
    global _cached  # noqa: PLW0603
    if setting == SETTING_NAME:
        _cached = None
    for settings, reaction in _reactions:
        if setting in settings:
            reaction(setting, value)
