"""Column helpers: a Snowflake primary key is a plain ``BIGINT`` with a per-row Python default.

``autoincrement=False`` is the important part: without it SQLAlchemy and Alembic autogenerate
treat a lone integer primary key as auto-incrementing and emit ``BIGSERIAL`` (PostgreSQL),
``AUTO_INCREMENT`` (MySQL/MariaDB) or a rowid alias, which would fight the application's IDs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import BigInteger, Column, ForeignKey
from sqlalchemy.orm import MappedColumn, mapped_column
from sqlalchemy.sql.schema import SchemaItem

from ..errors import InvalidArgumentError
from .generators import SnowflakeDefault, snowflake_id_default
from .key_default import add_trigger_check, key_function_default

__all__ = [
    "SNOWFLAKE_INFO_KEY",
    "is_snowflake_column",
    "snowflake_column",
    "snowflake_fk_column",
    "snowflake_fk_mapped_column",
    "snowflake_mapped_column",
]

#: ``Column.info`` key set on columns made by these helpers (tools use it to find them).
SNOWFLAKE_INFO_KEY = "snowflake_db"


def _primary_key_kwargs(
    kwargs: dict[str, Any],
    default: SnowflakeDefault | Callable[..., int] | None,
    key_function: str | None = None,
    key_function_schema: str | None = None,
) -> dict[str, Any]:
    if kwargs.get("autoincrement", False) not in (False, None):
        raise InvalidArgumentError(
            f"autoincrement={kwargs['autoincrement']!r}: a Snowflake ID column must not be "
            "auto-incrementing (the application issues the IDs)"
        )
    if "type_" in kwargs:
        raise InvalidArgumentError("a Snowflake ID column is always BigInteger; drop type_=")
    kwargs["autoincrement"] = False
    kwargs.setdefault("primary_key", True)
    if key_function is not None:
        if kwargs.get("server_default") is not None:
            raise InvalidArgumentError(
                f"key_function={key_function!r} is the column's server default: drop "
                "server_default="
            )
        kwargs["server_default"] = key_function_default(key_function, key_function_schema)
    kwargs["default"] = snowflake_id_default if default is None else default
    info = dict(kwargs.get("info") or {})
    info[SNOWFLAKE_INFO_KEY] = "id"
    kwargs["info"] = info
    return kwargs


def snowflake_column(
    name: str | None = None,
    *args: SchemaItem,
    default: SnowflakeDefault | Callable[..., int] | None = None,
    key_function: str | None = None,
    key_function_schema: str | None = None,
    **kwargs: Any,
) -> Column[int]:
    """A Core ``Column``: ``BIGINT`` primary key, Snowflake default, no autoincrement.

    ``default`` defaults to :data:`snowflake_id_default` (bound generators, else the process
    one); pass ``SnowflakeDefault(generator, shard_for=...)`` for a table of its own. Extra
    keyword arguments go to ``Column`` (e.g. ``primary_key=False`` for a secondary ID column).

    ``key_function="snowflake_next_id"`` also gives the column the database key function as its
    server default, for rows inserted by raw SQL (:mod:`snowflake_db.sqlalchemy.key_default`:
    ``DEFAULT snowflake_next_id()`` on PostgreSQL, ``DEFAULT 0`` for the trigger on MariaDB);
    the application still issues the keys of its own inserts.
    """
    kw = _primary_key_kwargs(dict(kwargs), default, key_function, key_function_schema)
    column = Column(BigInteger(), *args, **kw) if name is None else Column(
        name, BigInteger(), *args, **kw
    )
    if key_function is not None:
        add_trigger_check(column)
    return column


def snowflake_mapped_column(
    *args: Any,
    default: SnowflakeDefault | Callable[..., int] | None = None,
    key_function: str | None = None,
    key_function_schema: str | None = None,
    **kwargs: Any,
) -> MappedColumn[int]:
    """The ORM form of :func:`snowflake_column`: ``id: Mapped[int] = snowflake_mapped_column()``.

    Positional arguments (a column name, constraints) go to ``mapped_column``;
    ``key_function`` as in :func:`snowflake_column`.
    """
    kw = _primary_key_kwargs(dict(kwargs), default, key_function, key_function_schema)
    mapped = _mapped_bigint(args, kw)
    if key_function is not None:
        add_trigger_check(mapped.column)
    return mapped


def _mapped_bigint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> MappedColumn[int]:
    if args and isinstance(args[0], str):
        return mapped_column(args[0], BigInteger(), *args[1:], **kwargs)
    return mapped_column(BigInteger(), *args, **kwargs)


def snowflake_fk_column(
    target: str | Column[Any],
    name: str | None = None,
    *args: SchemaItem,
    ondelete: str | None = None,
    onupdate: str | None = None,
    constraint_name: str | None = None,
    **kwargs: Any,
) -> Column[int]:
    """A ``BIGINT`` column with a foreign key to a Snowflake ID (``"orders.id"``).

    A foreign key column must be as wide as the ID it holds; ``Integer`` would overflow.
    ``constraint_name``, ``ondelete`` and ``onupdate`` go to the ``ForeignKey``.
    """
    info = dict(kwargs.pop("info", None) or {})
    info[SNOWFLAKE_INFO_KEY] = "fk"
    fk = ForeignKey(target, name=constraint_name, ondelete=ondelete, onupdate=onupdate)
    if name is None:
        return Column(BigInteger(), fk, *args, info=info, **kwargs)
    return Column(name, BigInteger(), fk, *args, info=info, **kwargs)


def snowflake_fk_mapped_column(
    target: str | Column[Any],
    *args: Any,
    ondelete: str | None = None,
    onupdate: str | None = None,
    constraint_name: str | None = None,
    **kwargs: Any,
) -> MappedColumn[int]:
    """The ORM form of :func:`snowflake_fk_column`:
    ``order_id: Mapped[int] = snowflake_fk_mapped_column("orders.id")``."""
    info = dict(kwargs.pop("info", None) or {})
    info[SNOWFLAKE_INFO_KEY] = "fk"
    fk = ForeignKey(target, name=constraint_name, ondelete=ondelete, onupdate=onupdate)
    return _mapped_bigint((*args, fk), {"info": info, **kwargs})


def is_snowflake_column(column: Column[Any]) -> bool:
    """True for a column made by :func:`snowflake_column` / :func:`snowflake_mapped_column`."""
    return column.info.get(SNOWFLAKE_INFO_KEY) == "id"
