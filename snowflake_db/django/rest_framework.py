"""Django REST framework: Snowflake IDs as JSON strings, accepted back as strings or integers.

JavaScript clients lose precision above 2**53 - 1, so IDs travel as strings. Mix
:class:`SnowflakeModelSerializerMixin` into a ``ModelSerializer`` to get this for the Snowflake
primary key, ``SnowflakeField`` columns and every relation (``ForeignKey``, ``OneToOne``,
``ManyToMany``, reverse relations) whose target has a Snowflake primary key; or use
:class:`SnowflakeIdField` / :class:`SnowflakePrimaryKeyRelatedField` by hand.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ..layout import USABLE_BITS
from .fields import SnowflakeAutoField, SnowflakeField, is_snowflake_field

__all__ = [
    "SnowflakeIdField",
    "SnowflakeModelSerializerMixin",
    "SnowflakePrimaryKeyRelatedField",
]

_MAX_ID = 2**USABLE_BITS - 1


class SnowflakeIdField(serializers.IntegerField):
    """An integer rendered as a string; input may be a string of digits or an int.

    Floats are refused: a JSON number that big has already lost its low digits.
    """

    default_error_messages = {
        "invalid": "A Snowflake ID must be an integer or a string of digits.",
        "precision": "A Snowflake ID must not be sent as a floating-point number; send a string.",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", _MAX_ID)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, float):
            self.fail("precision")
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, str):
            data = data.strip()
            if not data.isdecimal() or not data.isascii():
                self.fail("invalid")
        value: int = super().to_internal_value(data)
        return value

    def to_representation(self, value: Any) -> str:
        return str(int(value))


class SnowflakePrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """``PrimaryKeyRelatedField`` whose primary keys are Snowflake IDs (as strings)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pk_field", SnowflakeIdField())
        super().__init__(**kwargs)


class SnowflakeModelSerializerMixin:
    """For ``ModelSerializer``: Snowflake fields and relations to Snowflake keys as strings."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        SnowflakeAutoField: SnowflakeIdField,
        SnowflakeField: SnowflakeIdField,
    }

    def build_relational_field(
        self, field_name: str, relation_info: Any
    ) -> tuple[type[Any], dict[str, Any]]:
        field_class, field_kwargs = super().build_relational_field(
            field_name, relation_info
        )
        target = relation_info.related_model._meta.pk
        if (
            is_snowflake_field(target)
            and issubclass(field_class, serializers.PrimaryKeyRelatedField)
            and "pk_field" not in field_kwargs
        ):
            field_kwargs["pk_field"] = SnowflakeIdField()
        return field_class, field_kwargs
