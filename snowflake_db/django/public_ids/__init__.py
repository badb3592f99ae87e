"""Public numbers on Django models: ``public_id = PublicId(namespace="orders")``, in URLs, the
admin and Django REST framework.

The number is derived from the primary key by :mod:`snowflake_db.public_ids`, so nothing is
stored and no migration is made: ``order.public_id`` encodes ``order.pk``, and
``Order.objects.get(public_id=text)`` / ``filter(public_id=text)`` / ``public_id__in=[...]``
decode the text into a primary-key comparison. A text that is not a number of this namespace
(mistyped, another key or namespace) matches no row: ``get()`` raises ``DoesNotExist`` and
``filter()`` is empty, as for any key that is not there. Code that decodes a number itself
(``Order.public_id_field.decode(text)``) gets a ``PublicIdError`` that says why.

``PublicId`` is a private, column-less field like Django's ``CompositePrimaryKey``
(https://docs.djangoproject.com/en/stable/ref/models/fields/#compositeprimarykey): queries see
it, migrations, forms and serializers do not.

REST framework's fields are in :mod:`snowflake_db.django.public_ids.serializers`, imported on
its own because it needs djangorestframework.
"""

from __future__ import annotations

# One module per extension point: the field and its lookups, the URL converter, the admin mixin.
# `_settings` (SNOWFLAKE_DB["PUBLIC_ID_KEYS"] applied at start and when it changes) is imported
# by the app's ready() alone, so its receiver listens only where the app is installed.
from ._admin import PublicIdAdminMixin
from ._field import PublicId, PublicIdExact, PublicIdIExact, PublicIdIn
from ._urls import PublicIdConverter, public_id_converter

__all__ = [
    "PublicId",
    "PublicIdAdminMixin",
    "PublicIdConverter",
    "PublicIdExact",
    "PublicIdIExact",
    "PublicIdIn",
    "public_id_converter",
]
