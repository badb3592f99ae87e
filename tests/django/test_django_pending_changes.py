"""Which narrow columns the pending migrations widen (checks I010/E010, ``snowflake widen``):
only an ``AlterField`` of the column's own field, or of the key its foreign key points to, or
an app's own SQL. A pending migration that touches other fields of the app widens nothing: run
before ``snowflake widen``, ``makemigrations`` once made I010 promise a widening that ``migrate``
never did (found converting a django-oscar shop)."""

from __future__ import annotations

from django.db import migrations, models

from snowflake_db.django.checks import _database_operations, _PendingChanges
from snowflake_db.django.narrow_columns import NarrowColumn
from tests.django_project.shop.models import Item, Order


def _narrow(model: type[models.Model], name: str) -> NarrowColumn:
    field = model._meta.get_field(name)
    return NarrowColumn(model, field, field.column, "integer", f"{model._meta.label}.{name}")


def test_an_alter_field_of_the_key_widens_it_and_the_foreign_keys_to_it() -> None:
    pending = _PendingChanges(altered=frozenset({("shop", "order", "id")}))
    assert pending.fix(_narrow(Order, "id")) == ["shop"]
    assert pending.fix(_narrow(Item, "order")) == ["shop"]
    assert pending.fix(_narrow(Item, "id")) == []


def test_a_pending_migration_of_other_fields_widens_nothing() -> None:
    pending = _PendingChanges(altered=frozenset({("shop", "item", "quantity"),
                                                 ("shop", "order", "customer")}))
    assert pending.fix(_narrow(Order, "id")) == []
    assert pending.fix(_narrow(Item, "order")) == []


def test_an_apps_own_sql_is_trusted_to_widen_its_columns() -> None:
    pending = _PendingChanges(own_sql=frozenset({"shop"}))
    assert pending.fix(_narrow(Item, "order")) == ["shop"]
    assert _PendingChanges(own_sql=frozenset({"other"})).fix(_narrow(Item, "order")) == []


def test_only_the_database_side_of_a_separate_database_and_state_counts() -> None:
    on_state = migrations.AlterField("order", "id", models.BigIntegerField(primary_key=True))
    on_database = migrations.AlterField("item", "id", models.BigIntegerField(primary_key=True))
    added = migrations.AddField("item", "note", models.TextField(default=""))
    moved = migrations.SeparateDatabaseAndState(state_operations=[on_state],
                                                database_operations=[on_database])
    assert list(_database_operations([added, moved])) == [added, on_database]
