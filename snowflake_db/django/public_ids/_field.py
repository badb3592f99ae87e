"""``PublicId``, the model field of a public number, its system checks, and the lookups that
decode a number into a comparison with the key (the package's docstring says how they behave).

The checks (:meth:`PublicId.check`) report at ``manage.py check`` what would otherwise fail at the
first number shown:

============================  =================================================================
``snowflake_db.W020``         no public-ID keys are configured (a warning: code may still call
                              ``configure_public_ids()`` after the checks have run)
``snowflake_db.E020``         the keys are invalid, or the codec cannot be built (the
                              ``public-ids`` extra is missing)
``snowflake_db.E021``         ``field=`` names no field of the model, or one that is no integer
============================  =================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import EmptyResultSet, FieldDoesNotExist, ImproperlyConfigured
from django.db import models
from django.db.models.expressions import Col
from django.db.models.lookups import Exact, In, Lookup

from ..._validate import require_int
from ...errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PublicIdError,
    PublicIdKeysNotConfiguredError,
    SnowflakeError,
)

if TYPE_CHECKING:
    from ...public_ids import PublicIdCodec

__all__ = ["PublicId"]


class _Refused:
    """The right-hand side of a lookup whose text is not a number of the namespace."""

    def __repr__(self) -> str:
        return "<refused public number>"


REFUSED = _Refused()


class _PublicIdDescriptor:
    """``instance.public_id``: the public number of the instance's key (``None`` unsaved)."""

    def __init__(self, field: PublicId) -> None:
        self.field = field

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return self.field.public_id_of(instance)

    def __set__(self, instance: Any, value: Any) -> None:
        # Model.full_clean() assigns every field its cleaned value: the same number.
        if value is None or value == self.__get__(instance):
            return
        raise AttributeError(
            f"{type(instance).__name__}.{self.field.name} is derived from the key "
            f"{self.field.target_name!r}; set that instead"
        )


class _PublicIdCol(Col):
    """The key column, typed as the public number: lookups decode, ``values()`` encodes."""

    def get_db_converters(self, connection: Any) -> list[Any]:
        field: PublicId = self.output_field  # type: ignore[assignment]
        converters: list[Any] = list(self.target.get_db_converters(connection))
        return [*converters, field.convert_from_db]


class PublicId(models.Field):  # type: ignore[type-arg]
    """The public number of a model's Snowflake key in one namespace; stores nothing.

    ``field`` names the key it encodes (default ``"pk"``); ``group`` hyphenates the number for
    display (``group=4``: ``ABCD-EFGH-...``); lookups accept either form. Keys come from
    ``SNOWFLAKE_DB["PUBLIC_ID_KEYS"]`` or the ``SNOWFLAKE_DB_PUBLIC_ID_KEYS`` variable;
    ``manage.py check`` reports them missing or unusable (:meth:`check`).
    """

    description = "Public number derived from a Snowflake key"

    def __init__(
        self, *, namespace: str, field: str = "pk", group: int | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise InvalidArgumentError(
                f"PublicId namespace must be a non-empty string, got {namespace!r}"
            )
        if group is not None:
            require_int("group", group, minimum=1, maximum=16)  # symbols per hyphen group
        self.namespace = namespace
        self.target_name = field
        self.group = group
        kwargs.update(editable=False, serialize=False, blank=True, null=True)
        super().__init__(**kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if path == f"{__name__}.PublicId":
            path = "snowflake_db.django.public_ids.PublicId"  # the import path, not the module's
        for injected in ("editable", "serialize", "blank", "null"):
            kwargs.pop(injected, None)
        kwargs.update(namespace=self.namespace)
        if self.target_name != "pk":
            kwargs["field"] = self.target_name
        if self.group is not None:
            kwargs["group"] = self.group
        return name, path, args, kwargs

    def contribute_to_class(self, cls: Any, name: str, private_only: bool = False) -> None:
        super().contribute_to_class(cls, name, private_only=True)
        setattr(cls, self.attname, _PublicIdDescriptor(self))
        setattr(cls, f"{self.attname}_field", self)

    def get_attname_column(self) -> tuple[str, None]:  # type: ignore[override]
        return self.get_attname(), None  # no column: nothing is stored

    def get_internal_type(self) -> str:
        return "BigIntegerField"  # compared like the key it stands for

    @property
    def target(self) -> models.Field:  # type: ignore[type-arg]
        meta = self.model._meta
        return meta.pk if self.target_name == "pk" else meta.get_field(self.target_name)  # type: ignore[return-value]

    def get_col(self, alias: str | None, output_field: Any = None) -> Col:
        return _PublicIdCol(alias, self.target, output_field=self)

    # -- system checks --------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's field checks, then the key this field encodes and the keys it encodes with
        (Django checks no private field: :func:`check_public_id_fields` calls this)."""
        return [*super().check(**kwargs), *self._check_target(), *self._check_keys()]

    def _check_target(self) -> list[checks.CheckMessage]:
        model = self.model._meta.label
        try:
            target = self.target
        except FieldDoesNotExist:
            return [checks.Error(
                f"field={self.target_name!r} names no field of {model}",
                hint="Name the model's Snowflake key field (or leave field out: the primary key).",
                obj=self, id="snowflake_db.E021",
            )]
        key = target.target_field if target.is_relation else target
        if not isinstance(key, models.IntegerField):
            return [checks.Error(
                f"field={self.target_name!r} names {model}.{target.name}, a "
                f"{type(target).__name__}: a public number encodes an integer key",
                hint="Name the model's Snowflake key field (a SnowflakeField or the primary key).",
                obj=self, id="snowflake_db.E021",
            )]
        return []

    def _check_keys(self) -> list[checks.CheckMessage]:
        from ...public_ids import ENV_VAR, codec_for
        from ..conf import get_settings

        try:
            get_settings()
        except ImproperlyConfigured:
            return []  # SNOWFLAKE_DB is invalid, PUBLIC_ID_KEYS perhaps: check E001 says so
        try:
            codec_for(self.namespace)
        except PublicIdKeysNotConfiguredError:
            return [checks.Warning(
                f"no public-ID keys are configured for namespace {self.namespace!r}: every "
                "number shown will raise PublicIdKeysNotConfiguredError",
                hint='Set SNOWFLAKE_DB["PUBLIC_ID_KEYS"] (read from a secret; the '
                f"snowflake_db.django app applies it) or the {ENV_VAR} environment variable; "
                "`snowflake-db public generate-key` makes a key.",
                obj=self, id="snowflake_db.W020",
            )]
        except SnowflakeError as error:
            return [checks.Error(
                f"cannot encode public numbers of namespace {self.namespace!r}: {error}",
                obj=self, id="snowflake_db.E020",
            )]
        return []

    # -- encoding -------------------------------------------------------------------------

    @property
    def codec(self) -> PublicIdCodec:
        from ...public_ids import codec_for

        return codec_for(self.namespace)

    def encode(self, key: int) -> str:
        """The public number of ``key``."""
        return self.codec.encode(key, group=self.group)

    def decode(self, text: str) -> int:
        """The key of a public number; ``PublicIdError`` says why a text is refused."""
        if not isinstance(text, str):
            raise InvalidArgumentTypeError(
                f"a public number is a string, got {type(text).__name__} {text!r}"
            )
        return self.codec.decode(text)

    def key_or_refused(self, text: Any) -> int | _Refused:
        """What a lookup compares the key with: the decoded key, or :data:`REFUSED`."""
        try:
            return self.decode(text)
        except PublicIdError:
            return REFUSED

    def public_id_of(self, instance: Any) -> str | None:
        key = getattr(instance, self.target.attname)
        return None if key is None else self.encode(key)

    def convert_from_db(self, value: Any, expression: Any, connection: Any) -> str | None:
        return None if value is None else self.encode(int(value))

    def to_python(self, value: Any) -> Any:
        return value


@checks.register(checks.Tags.models)
def check_public_id_fields(
    app_configs: Iterable[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run :meth:`PublicId.check` on every model's ``PublicId`` fields (as Django's
    contenttypes app does for its ``GenericForeignKey``, another private field)."""
    in_scope = (
        apps.get_models()
        if app_configs is None
        else [model for app_config in app_configs for model in app_config.get_models()]
    )
    return [
        message
        for model in in_scope
        for field in model._meta.private_fields
        if isinstance(field, PublicId) and field.model is model
        for message in field.check(**kwargs)
    ]


@PublicId.register_lookup
class PublicIdExact(Exact):
    """``public_id=text``: the key equals the decoded text; a refused text matches nothing."""

    def get_prep_lookup(self) -> Any:
        if hasattr(self.rhs, "resolve_expression"):
            return super().get_prep_lookup()
        field: PublicId = self.lhs.output_field
        return field.key_or_refused(self.rhs)

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        if self.rhs is REFUSED:
            raise EmptyResultSet  # Django's WHERE drops the branch: no row, no query error
        return super().as_sql(compiler, connection)


@PublicId.register_lookup
class PublicIdIExact(PublicIdExact):
    """``=public_id`` in the admin's ``search_fields`` (numbers are case-insensitive anyway)."""

    lookup_name = "iexact"

    def process_lhs(self, compiler: Any, connection: Any, lhs: Any = None) -> Any:
        # Not BuiltinLookup's: it would wrap the key column in the backend's iexact cast.
        return Lookup.process_lhs(self, compiler, connection, lhs)

    def get_rhs_op(self, connection: Any, rhs: str) -> str:
        return str(connection.operators["exact"] % rhs)


@PublicId.register_lookup
class PublicIdIn(In):
    """``public_id__in=[...]``: the keys of the texts that decode; refused texts are dropped."""

    def get_prep_lookup(self) -> Any:
        if not self.rhs_is_direct_value():
            return super().get_prep_lookup()
        field: PublicId = self.lhs.output_field
        keys = (field.key_or_refused(text) for text in self.rhs)
        return [key for key in keys if key is not REFUSED]
