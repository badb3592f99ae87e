"""Public numbers on SQLAlchemy models: ``public_id = public_id_property("orders")``.

A hybrid attribute (https://docs.sqlalchemy.org/en/20/orm/extensions/hybrid.html): on an
instance it is the public number of the primary key (``None`` before flush); on the class it
compares like the key, decoding the text first, so
``select(Order).where(Order.public_id == text)`` is ``WHERE orders.id = <key>`` and uses the
primary-key index. A text that is no number of the namespace matches no row (``false()``), as
a missing key would; decode it yourself (``codec_for("orders").decode(text)``) to learn why.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import false, inspect, true
from sqlalchemy.ext.hybrid import Comparator, hybrid_property
from sqlalchemy.sql import operators

from .._validate import require_int
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, PublicIdError

__all__ = ["PublicIdComparator", "public_id_property"]


def _codec(namespace: str) -> Any:
    from ..public_ids import codec_for

    return codec_for(namespace)


def _key_attribute(cls: type[Any], attribute: str | None) -> str:
    """``attribute``, or the name of the mapped class's single primary-key attribute."""
    if attribute is not None:
        return attribute
    mapper = inspect(cls)
    if len(mapper.primary_key) != 1:
        raise InvalidArgumentError(
            f"{cls.__name__} has {len(mapper.primary_key)} primary-key columns; name the "
            "Snowflake key: public_id_property(namespace, attribute='id')"
        )
    return str(mapper.get_property_by_column(mapper.primary_key[0]).key)


class PublicIdComparator(Comparator[Any]):
    """Compares the key column with decoded public numbers: ``==``, ``!=``, ``in_``."""

    def __init__(self, key: Any, namespace: str) -> None:
        super().__init__(key)
        self.namespace = namespace

    def _key(self, text: object) -> int | None:
        if not isinstance(text, str):
            raise InvalidArgumentTypeError(
                f"a public number is a string, got {type(text).__name__} {text!r}"
            )
        try:
            return int(_codec(self.namespace).decode(text))
        except PublicIdError:
            return None

    def operate(self, op: Any, *other: Any, **kwargs: Any) -> Any:
        if op in (operators.eq, operators.ne):
            key = self._key(other[0])
            if key is None:  # no row has a refused number (and every row differs from it)
                return false() if op is operators.eq else true()
            return op(self.expression, key)
        if op in (operators.in_op, operators.not_in_op):
            keys = [k for k in map(self._key, other[0]) if k is not None]
            return op(self.expression, keys)
        raise InvalidArgumentError(
            f"public numbers compare with ==, != and in_() only, not {op.__name__}: they are "
            "not ordered like the keys"
        )


def public_id_property(
    namespace: str, *, attribute: str | None = None, group: int | None = None
) -> hybrid_property[str | None]:
    """A hybrid attribute: the public number of the key ``attribute`` (default: the single
    primary key) in ``namespace``; ``group=4`` hyphenates it for display."""
    if not isinstance(namespace, str) or not namespace:
        raise InvalidArgumentError(
            f"a public number namespace must be a non-empty string, got {namespace!r}"
        )

    if group is not None:
        require_int("group", group, minimum=1, maximum=16)  # symbols per hyphen group

    def public_id(self: Any) -> str | None:
        key = getattr(self, _key_attribute(type(self), attribute))
        return None if key is None else str(_codec(namespace).encode(key, group=group))

    def comparator(cls: Any) -> PublicIdComparator:
        return PublicIdComparator(getattr(cls, _key_attribute(cls, attribute)), namespace)

    return hybrid_property(public_id).comparator(comparator)
