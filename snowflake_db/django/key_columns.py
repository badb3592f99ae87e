"""Plain integer fields that receive Snowflake keys without being relations, found from models.

A foreign key says which model's keys it holds; many apps keep a key in a plain integer field
instead (django-oscar's ``OrderDiscount.offer_id``, an unmanaged model over a view, a
``GenericForeignKey``'s object ID). Such a field narrower than 64 bits loses writes ("integer
out of range", or 2147483647 on MariaDB without strict mode) and, since Django 5.0, answers a
lookup with a larger value by an empty result. The checks (``snowflake_db.E012``, ``E014``)
report the fields this module finds:

* a ``GenericForeignKey``'s object ID, while any model has Snowflake keys;
* a field named ``<name>_id`` or ``<name>_pk`` where ``<name>`` is a Snowflake-keyed model's
  name or the end of it (``offer_id`` for ``ConditionalOffer``, ``product_id`` for
  ``Product``);
* any field listed in ``SNOWFLAKE_DB["KEY_COLUMNS"]``;

less those listed in ``SNOWFLAKE_DB["NOT_KEY_COLUMNS"]``. Names and lists are the only evidence
read here: a key kept under another name is found only once declared.
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.exceptions import FieldDoesNotExist

from .conf import get_settings
from .fields import is_snowflake_field

__all__ = ["KeyField", "field_kind", "field_path", "generic_object_id_fields",
           "is_installed_package", "narrow_key_fields"]

#: Django field types whose column has fewer than 64 bits on PostgreSQL and MySQL/MariaDB.
NARROW_INTEGER_TYPES = frozenset(
    {"IntegerField", "PositiveIntegerField", "SmallIntegerField", "PositiveSmallIntegerField",
     "AutoField", "SmallAutoField"}
)

#: This library's own app (the worker tables).
OWN_APP_LABEL = "snowflake_db"

_KEY_NAME = re.compile(r"^(?P<name>[a-z0-9_]+?)_(?:id|pk)$")


@dataclass(frozen=True)
class KeyField:
    """A plain integer field narrower than 64 bits that receives Snowflake keys."""

    model: Any
    field: Any
    #: why it is taken to hold Snowflake keys, e.g. "its name says it holds offer.Offer keys"
    evidence: str

    @property
    def path(self) -> str:
        return field_path(self.model, self.field)


def field_path(model: Any, field: Any) -> str:
    """``app_label.Model.field``, the form of ``KEY_COLUMNS`` and ``NOT_KEY_COLUMNS``."""
    return f"{model._meta.app_label}.{model._meta.object_name}.{field.name}"


def field_kind(field: Any) -> str:
    """The field's type with its article, for messages: "an IntegerField", "a SmallIntegerField"."""
    kind = str(field.get_internal_type())
    return f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind}"


def _setting_key(model: Any, field: Any) -> str:
    return f"{model._meta.app_label}.{model._meta.model_name}.{field.name}"


@cache
def _installed_roots() -> tuple[Path, ...]:
    """Where Django itself and apps installed as packages (not the project's own) live."""
    roots = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    roots.add(Path(django.__file__).resolve().parent)
    return tuple(roots)


def is_installed_package(app_config: Any) -> bool:
    """An app the project cannot edit: installed as a package (site-packages, Django's own), or
    outside ``settings.BASE_DIR`` where the project sets one."""
    path = Path(app_config.path).resolve()
    if any(path.is_relative_to(root) for root in _installed_roots()):
        return True
    base_dir = getattr(settings, "BASE_DIR", None)
    return base_dir is not None and not path.is_relative_to(Path(base_dir).resolve())


def snowflake_keyed_models() -> list[Any]:
    return [model for model in apps.get_models() if is_snowflake_field(model._meta.pk)]


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _named_after(field: Any, keyed: Iterable[Any]) -> Any | None:
    """The Snowflake-keyed model a field's name says it holds keys of, if any."""
    match = _KEY_NAME.match(field.name)
    if match is None:
        return None
    name = match["name"]
    for model in keyed:
        snake = _snake(model._meta.object_name)
        if name in (model._meta.model_name, snake) or snake.endswith(f"_{name}"):
            return model
    return None


def generic_object_id_fields(model: Any) -> Iterator[tuple[Any, Any]]:
    """(GenericForeignKey, its object ID field) pairs of a model."""
    for private in model._meta.private_fields:
        fk_name = getattr(private, "fk_field", None)
        if fk_name is None or not hasattr(private, "ct_field"):
            continue  # not a GenericForeignKey
        try:
            yield private, model._meta.get_field(fk_name)
        except FieldDoesNotExist:
            continue  # contenttypes' own check reports it


def is_narrow_integer(field: Any) -> bool:
    return bool(field.get_internal_type() in NARROW_INTEGER_TYPES)


def narrow_key_fields(models: Iterable[Any] | None = None) -> list[KeyField]:
    """Plain narrow integer fields (not relations, not a ``GenericForeignKey``'s object ID)
    that receive Snowflake keys by name (primary keys excepted) or by ``KEY_COLUMNS``, less
    ``NOT_KEY_COLUMNS``."""
    conf = get_settings()
    keyed = snowflake_keyed_models()
    found: list[KeyField] = []
    for model in models if models is not None else apps.get_models():
        if model._meta.app_label == OWN_APP_LABEL:
            continue  # the worker tables: their integers are worker IDs, never keys
        generic_ids = {field.name for _, field in generic_object_id_fields(model)}
        for field in model._meta.local_concrete_fields:
            if (
                field.is_relation
                or field.name in generic_ids
                or not is_narrow_integer(field)
                or _setting_key(model, field) in conf.not_key_columns
            ):
                continue
            if _setting_key(model, field) in conf.key_columns:
                # a primary key too: an unmanaged model's over a view of Snowflake-keyed rows
                found.append(KeyField(model, field, "SNOWFLAKE_DB['KEY_COLUMNS'] lists it"))
                continue
            target = _named_after(field, keyed) if keyed and not field.primary_key else None
            if target is not None:
                found.append(KeyField(
                    model, field,
                    f"its name says it holds keys of {target._meta.label}, which are 64-bit "
                    "Snowflake IDs",
                ))
    return found


def narrow_generic_object_ids(models: Iterable[Any] | None = None) -> list[tuple[Any, Any, Any]]:
    """(model, GenericForeignKey, object ID field) whose object ID is narrower than 64 bits,
    while any model has Snowflake keys, less ``NOT_KEY_COLUMNS``."""
    if not snowflake_keyed_models():
        return []
    return [
        (model, generic, object_id)
        for model in (models if models is not None else apps.get_models())
        for generic, object_id in generic_object_id_fields(model)
        if is_narrow_integer(object_id) and not is_declared_not_key(model, object_id)
    ]


def key_field_instances() -> tuple[list[Any], list[Any]]:
    """The narrow fields the checks report, whose lookups raise: the plain integer fields
    (E014) and the generic relations' object IDs (E012)."""
    return [found.field for found in narrow_key_fields()], [
        object_id for _, _, object_id in narrow_generic_object_ids()
    ]


def unknown_declared_fields() -> list[str]:
    """Entries of ``KEY_COLUMNS``/``NOT_KEY_COLUMNS`` that name no field of an installed model."""
    conf = get_settings()
    known = {
        _setting_key(model, field)
        for model in apps.get_models()
        for field in model._meta.get_fields()
        if getattr(field, "concrete", False)
    }
    return sorted((conf.key_columns | conf.not_key_columns) - known)


def is_declared_not_key(model: Any, field: Any) -> bool:
    return _setting_key(model, field) in get_settings().not_key_columns
