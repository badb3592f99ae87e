"""Django REST framework fields for public numbers (see :mod:`snowflake_db.public_ids`).

``PublicIdField(namespace="orders")`` shows a key as its public number and takes a public
number back as the key: ``number = PublicIdField(namespace="orders", source="pk",
read_only=True)``. ``PublicIdRelatedField`` does the same for a relation: clients name an order
by its public number, never by its key. A refused number is a validation error (HTTP 400) with
the codec's reason.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ...errors import PublicIdError

__all__ = ["PublicIdField", "PublicIdRelatedField"]


def _codec(namespace: str) -> Any:
    from ...public_ids import codec_for

    return codec_for(namespace)


class PublicIdField(serializers.Field):  # type: ignore[type-arg]
    """A Snowflake key as the public number of ``namespace``; ``group`` hyphenates output."""

    default_error_messages = {
        "invalid": "Not a public number: {reason}",
        "type": "A public number must be a string.",
    }

    def __init__(self, *, namespace: str, group: int | None = None, **kwargs: Any) -> None:
        self.namespace = namespace
        self.group = group
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> str:
        return str(_codec(self.namespace).encode(int(value), group=self.group))

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str):
            self.fail("type")
        try:
            return int(_codec(self.namespace).decode(data))
        except PublicIdError as error:
            self.fail("invalid", reason=str(error))
            raise  # unreachable: fail() raises


class PublicIdRelatedField(serializers.RelatedField):  # type: ignore[type-arg]
    """A related object named by the public number of its key in ``namespace``."""

    default_error_messages = {
        "invalid": "Not a public number: {reason}",
        "type": "A public number must be a string.",
        "does_not_exist": "No object with public number {value!r}.",
    }

    def __init__(self, *, namespace: str, group: int | None = None, **kwargs: Any) -> None:
        self.namespace = namespace
        self.group = group
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> str:
        return str(_codec(self.namespace).encode(int(value.pk), group=self.group))

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("type")
        try:
            key = _codec(self.namespace).decode(data)
        except PublicIdError as error:
            self.fail("invalid", reason=str(error))
        try:
            return self.get_queryset().get(pk=key)
        except self.get_queryset().model.DoesNotExist:
            self.fail("does_not_exist", value=data)
