"""Which database column types hold every Snowflake key exactly: the one table behind the
narrow-column checks of both frameworks (SQLAlchemy's ``narrow_snowflake_columns``, Django's
``snowflake_db.E010`` and its MySQL/MariaDB write guard).

Keys are up to 2**63 - 1, 19 decimal digits. A column holds them when it is a 64-bit integer
(:data:`WIDE_INTEGER_TYPES`), an exact decimal of at least 19 digits and no fraction, or text of
at least 19 characters; never a float. SQLite stores every integer in 64 bits whatever the
declared type, so there the type's affinity decides
(https://www.sqlite.org/datatype3.html#determination_of_column_affinity): a type naming
``INT`` holds them, a ``REAL``/``FLOA``/``DOUB`` one turns them into doubles, and text, numeric
and blob affinities keep them exactly.
"""

from __future__ import annotations

__all__ = ["KEY_DIGITS", "WIDE_INTEGER_TYPES", "holds_snowflake_keys"]

#: Decimal digits of the largest Snowflake key, 2**63 - 1.
KEY_DIGITS = 19

_BIGINT = frozenset({"bigint"})
#: The integer types (lower case, first word as the database or the dialect names them) that
#: hold 64 bits, per backend (SQLAlchemy's dialect name or Django's vendor).
WIDE_INTEGER_TYPES: dict[str, frozenset[str]] = {
    "postgresql": frozenset({"bigint", "int8", "bigserial", "serial8"}),
    "mysql": _BIGINT,
    "mariadb": _BIGINT,
}
#: Exact decimal types, and text types (``character varying`` reads as ``character``).
_DECIMAL_TYPES = frozenset({"numeric", "decimal"})
_TEXT_TYPES = frozenset(
    {"char", "character", "varchar", "nchar", "nvarchar", "text", "tinytext", "mediumtext",
     "longtext", "string", "clob"}
)


def holds_snowflake_keys(
    backend: str,
    declared: str,
    *,
    precision: int | None = None,
    scale: int | None = None,
    length: int | None = None,
) -> bool:
    """True if a column of type ``declared`` (``BIGINT``, ``integer``, ``NUMERIC(20, 0)``...)
    on ``backend`` holds every key exactly. ``precision`` and ``scale`` of a decimal type and
    ``length`` of a text type come from the database (``None``: unbounded)."""
    text = declared.strip().lower()
    if backend == "sqlite":
        if "int" in text:
            return True
        return not any(part in text for part in ("real", "floa", "doub"))
    first = text.split("(", 1)[0].split()[0] if text else ""
    if first in WIDE_INTEGER_TYPES.get(backend, _BIGINT):
        return True
    if first in _DECIMAL_TYPES:
        return not scale and (precision is None or precision >= KEY_DIGITS)
    if first in _TEXT_TYPES:
        return length is None or length >= KEY_DIGITS
    return False
