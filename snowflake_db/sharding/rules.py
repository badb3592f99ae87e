"""Which fields of a row decide its shard: the per-table rule the framework glue shares.

Standard library and snowflake_db core only, like :mod:`snowflake_db.sharding.routing`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import InvalidArgumentError, InvalidArgumentTypeError, ShardingError
from ..generator import SnowflakeGenerator
from .routing import ShardRouter


class ShardRule:
    """Which fields of a row decide its shard, shared by the SQLAlchemy and Django glue.

    ``id_fields`` hold Snowflake IDs of this router (the shard is read from the ID);
    ``key_fields`` hold shard keys (the shard is ``shard_for_key``). The first non-null field
    wins, ``id_fields`` before ``key_fields``. In the shop: customers ``key_fields=("id",)``;
    orders ``id_fields=("id",), key_fields=("customer_id",)``; order items
    ``id_fields=("id", "order_id")``. Queries that pin any of these fields hit one shard.
    """

    __slots__ = ("id_fields", "key_fields")

    def __init__(self, *, id_fields: Sequence[str] = (), key_fields: Sequence[str] = ()) -> None:
        if isinstance(id_fields, str) or isinstance(key_fields, str):
            raise InvalidArgumentTypeError("id_fields and key_fields are sequences of field names")
        self.id_fields = tuple(id_fields)
        self.key_fields = tuple(key_fields)
        if not self.id_fields and not self.key_fields:
            raise InvalidArgumentError("a ShardRule needs at least one id or key field")

    @property
    def fields(self) -> tuple[str, ...]:
        return self.id_fields + self.key_fields

    def check(self, router: ShardRouter) -> ShardRule:
        """Reject rules whose fields could disagree: without shard bits nothing co-locates."""
        if not router.embedded and len(self.fields) > 1:
            raise ShardingError(
                f"{self!r} routes by several fields, which only agree when IDs embed their "
                "shard: use a layout with shard_bits > 0, or route by a single field"
            )
        return self

    def shard_of_field(self, router: ShardRouter, field: str, value: object) -> int:
        """The shard implied by ``field == value``."""
        if field in self.id_fields:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentTypeError(
                    f"{field} holds a Snowflake ID (an int), got {type(value).__name__} {value!r}"
                )
            return router.shard_of_id(value)
        if field in self.key_fields:
            return router.shard_for_key(value)  # type: ignore[arg-type]
        raise InvalidArgumentError(f"{field!r} is not a routing field of {self!r}")

    def shard_of(self, router: ShardRouter, values: Mapping[str, object]) -> int | None:
        """The shard of a row given some of its field values; ``None`` if none is known."""
        for field in self.fields:
            value = values.get(field)
            if value is not None:
                return self.shard_of_field(router, field, value)
        return None

    def new_pk(
        self,
        router: ShardRouter,
        pk_field: str,
        values: Mapping[str, object],
        generator: SnowflakeGenerator | None = None,
    ) -> int:
        """A new primary key for a row, on the shard its other fields imply.

        A primary key that is an ID field embeds the shard of the row's other fields (or a mixed
        one); a primary key that is a key field is a plain new ID, placed by its own hash.
        """
        if pk_field not in self.id_fields:
            return router.checked_generator(generator).next_id()
        others = {name: value for name, value in values.items() if name != pk_field}
        shard = self.shard_of(router, others) if router.embedded else None
        if shard is None:
            return router.new_id(generator=generator)
        return router.new_id(shard=shard, generator=generator)

    def __repr__(self) -> str:
        return f"ShardRule(id_fields={self.id_fields!r}, key_fields={self.key_fields!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardRule):
            return NotImplemented
        return (self.id_fields, self.key_fields) == (other.id_fields, other.key_fields)

    __hash__ = None  # type: ignore[assignment]
