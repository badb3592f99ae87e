"""Optional: give ORM objects their Snowflake ID when they are constructed, not at flush.

By default an object gets its ID at flush, like any column default. Some code needs ``obj.id``
earlier (to build a URL, a message key or a child row before the session flushes); the ``init``
mapper event runs before ``__init__`` and can set it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.orm import Mapper
from sqlalchemy.sql.schema import CallableColumnDefault

from ..errors import InvalidArgumentError
from .generators import snowflake_default_of

__all__ = ["assign_ids_on_init", "stop_assigning_ids_on_init"]

_listeners: dict[tuple[type, str], Callable[..., None]] = {}


def _id_for(cls: type, key: str, values: dict[str, Any]) -> int:
    mapper: Mapper[Any] = inspect(cls)
    column = mapper.columns[key]
    snowflake = snowflake_default_of(column)
    if snowflake is not None:
        return snowflake.id_for(table=column.table, values=values)
    default = column.default
    if not isinstance(default, CallableColumnDefault):
        raise InvalidArgumentError(
            f"{cls.__name__}.{key} has no callable default to issue an ID from; use "
            "snowflake_mapped_column() or default=snowflake_default"
        )
    function: Any = getattr(default.arg, "__wrapped__", default.arg)
    value = function()
    if not isinstance(value, int):
        raise InvalidArgumentError(f"the default of {cls.__name__}.{key} returned {value!r}")
    return value


def assign_ids_on_init(cls: type, key: str = "id") -> None:
    """Set ``obj.<key>`` from the column's Snowflake default whenever ``cls(...)`` (or a
    subclass) is constructed without one. Call it on a mapped class or a declarative base."""
    if (cls, key) in _listeners:
        return

    def on_init(target: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get(key) is None and target.__dict__.get(key) is None:
            setattr(target, key, _id_for(type(target), key, kwargs))

    event.listen(cls, "init", on_init, propagate=True)
    _listeners[(cls, key)] = on_init


def stop_assigning_ids_on_init(cls: type, key: str = "id") -> None:
    """Undo :func:`assign_ids_on_init` for ``cls``."""
    listener = _listeners.pop((cls, key), None)
    if listener is not None:
        event.remove(cls, "init", listener)
