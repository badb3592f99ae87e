"""The Django privates that the Snowflake fields tell their callers apart by are still there.

``snowflake_db/django/_django_callers.py`` lists them (``Model._save_table``,
``QuerySet._prepare_for_bulk_create``, ``QuerySet.bulk_create``,
``SQLInsertCompiler.pre_save_val``) with the locals the field reads from their frames and the
names their code must use. A Django release that renames, moves or rewrites one fails here,
naming the Django version, instead of leaving ``save()`` or ``bulk_create()`` quietly wrong.
"""

from __future__ import annotations

import django
import pytest
from django.db import models

from snowflake_db.django import _django_callers
from snowflake_db.django._django_callers import CALLERS, Caller, problems


def test_the_installed_django_has_every_private_the_fields_depend_on() -> None:
    found = problems()
    assert not found, (
        f"Django {django.get_version()} changed privates that snowflake_db.django tells its "
        f"callers apart by: {'; '.join(found)}. See snowflake_db/django/_django_callers.py"
    )


def test_the_code_objects_are_those_of_the_listed_functions() -> None:
    for name, caller in CALLERS.items():
        function = getattr(caller.owner, caller.name)
        assert getattr(_django_callers, name) is function.__code__, caller.label


def test_the_check_names_a_missing_function_a_missing_local_and_an_unused_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(CALLERS, "SAVE_TABLE", Caller(models.Model, "_saved_tables", (), ()))
    monkeypatch.setitem(
        CALLERS,
        "PREPARE_FOR_BULK_CREATE",
        Caller(models.QuerySet, "_prepare_for_bulk_create", ("objects",), ("pre_save",)),
    )
    assert problems() == [
        "django.db.models.base.Model._saved_tables is gone",
        "django.db.models.query.QuerySet._prepare_for_bulk_create has no local objects",
        "django.db.models.query.QuerySet._prepare_for_bulk_create no longer uses pre_save",
    ]


def test_a_missing_function_stops_the_import_with_the_django_version() -> None:
    with pytest.raises(ImportError) as caught:
        _django_callers._code(Caller(models.Model, "_saved_tables", (), ()))
    message = str(caught.value)
    assert f"Django {django.get_version()}" in message
    assert "django.db.models.base.Model._saved_tables" in message
