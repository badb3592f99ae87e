"""SnowflakeAutoField keeps AutoField's contract on every backend: ``pk is None`` until the row is
inserted, explicit keys update, multi-table inheritance, Django's unsaved-object guards,
``full_clean``, ``bulk_create`` conflicts, fixtures without keys, and bad keys refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core import serializers
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from snowflake_db.errors import InvalidIdError
from tests.django.conftest import backends
from tests.django_project.shop.models import Customer, Item, Order, Place, Restaurant, Sku, Tag


def _statements(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"].split()[0].upper() for query in queries.captured_queries]


def test_explicit_key_of_an_existing_row_updates_it(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    with CaptureQueriesContext(connections[backend]) as queries:
        Customer(pk=customer.pk, name="grace").save()
    assert _statements(queries) == ["UPDATE"]  # as with AutoField: no INSERT, no error
    assert list(Customer.objects.values_list("pk", "name")) == [(customer.pk, "grace")]


def test_explicit_new_key_is_inserted_as_given(backend: str) -> None:
    Customer(pk=123_456_789_012, name="imported").save()
    assert Customer.objects.get().pk == 123_456_789_012


def test_multi_table_inheritance_onto_an_existing_parent(backend: str) -> None:
    place = Place.objects.create(name="corner")
    restaurant = Restaurant(place_ptr_id=place.pk, name="corner", serves_pizza=True)
    restaurant.save()
    assert restaurant.pk == place.pk
    assert Place.objects.count() == 1 and Restaurant.objects.count() == 1  # no second Place
    assert Restaurant.objects.get().serves_pizza

    # Both rows of a new child share one new key; save() is one INSERT per table.
    with CaptureQueriesContext(connections[backend]) as queries:
        other = Restaurant.objects.create(name="harbour")
    assert _statements(queries).count("INSERT") == 2 and "UPDATE" not in _statements(queries)
    assert Place.objects.get(pk=other.pk).name == "harbour"


def test_copying_an_inherited_instance(backend: str) -> None:
    """Django's documented idiom: clear pk and id, mark as adding, save."""
    original = Restaurant.objects.create(name="first", serves_pizza=True)
    copy = Restaurant.objects.get(pk=original.pk)
    copy.pk = None
    copy.id = None
    copy._state.adding = True
    copy.save()
    assert copy.pk is not None and copy.pk != original.pk
    assert Place.objects.count() == 2 and Restaurant.objects.count() == 2


def test_unsaved_objects_trip_djangos_data_loss_guards(backend: str) -> None:
    unsaved = Customer(name="ada")
    with pytest.raises(ValueError, match="unsaved related object 'customer'"):
        Order(customer=unsaved).save()
    with pytest.raises(ValueError, match="must be saved"):
        list(Order.objects.filter(customer=unsaved))
    with pytest.raises(ValueError, match="attribute is set to None"):
        unsaved.delete()
    with pytest.raises(TypeError, match="without primary key"):
        hash(unsaved)
    assert Customer.objects.count() == 0 and Order.objects.count() == 0


def test_full_clean_of_a_new_object_makes_no_query(backend: str) -> None:
    with CaptureQueriesContext(connections[backend]) as queries:
        Customer(name="ada").full_clean()
    assert queries.captured_queries == []


def test_bulk_create_ignore_conflicts_claims_no_key_that_may_not_exist(backend: str) -> None:
    Sku.objects.create(code="a", quantity=1)
    given = Sku(pk=987_654_321, code="given")
    objects = [Sku(code="a", quantity=2), Sku(code="b", quantity=3), given]
    Sku.objects.bulk_create(objects, ignore_conflicts=True)
    # As with AutoField: Django cannot tell which rows were written, so no key is claimed and
    # the objects stay unsaved (adding, no database)...
    assert [(obj.pk, obj._state.adding, obj._state.db) for obj in objects[:2]] == [
        (None, True, None), (None, True, None)
    ]
    # ...but a key the caller gave stays, and the object is marked saved, as with AutoField.
    assert (given.pk, given._state.adding, given._state.db) == (987_654_321, False, backend)
    assert sorted(Sku.objects.values_list("code", "quantity")) == [("a", 1), ("b", 3), ("given", 0)]
    # The kept state is an ordinary one again: a later save() marks the object saved.
    objects[1].code = "b2"
    objects[1].save()
    assert (objects[1]._state.adding, objects[1]._state.db) == (False, backend)
    assert Sku.objects.get(pk=objects[1].pk).code == "b2"


@pytest.mark.parametrize("batch_size", [None, 1])
def test_bulk_create_update_conflicts_gives_each_object_its_rows_key(
    backend: str, batch_size: int | None
) -> None:
    """As BigAutoField does where the backend returns rows (PostgreSQL, SQLite, MariaDB): the
    key of the row updated, or of the row inserted."""
    existing = Sku.objects.create(code="a", quantity=1)
    objects = [Sku(code="a", quantity=5), Sku(code="b", quantity=6), Sku(code="c", quantity=7)]
    connection = connections[backend]
    with_target = connection.features.supports_update_conflicts_with_target
    Sku.objects.bulk_create(
        objects, update_conflicts=True, update_fields=["quantity"],
        unique_fields=["code"] if with_target else None, batch_size=batch_size,
    )
    rows = dict(Sku.objects.values_list("code", "pk"))
    assert rows["a"] == existing.pk  # the updated row keeps its old key
    assert connection.features.can_return_rows_from_bulk_insert  # on every backend tested here
    assert [obj.pk for obj in objects] == [rows["a"], rows["b"], rows["c"]]
    assert all(not obj._state.adding and obj._state.db == backend for obj in objects)
    assert dict(Sku.objects.values_list("code", "quantity")) == {"a": 5, "b": 6, "c": 7}
    # The objects are the rows: saving one updates it, no second row.
    objects[0].quantity = 9
    objects[0].save()
    assert Sku.objects.get(code="a").quantity == 9 and Sku.objects.count() == 3


def test_bulk_create_without_conflicts_fills_every_key_without_reading_back(backend: str) -> None:
    objects = [Sku(code=f"c{i}") for i in range(500)]
    with CaptureQueriesContext(connections[backend]) as queries:
        Sku.objects.bulk_create(objects)
    assert all("RETURNING" not in query["sql"].upper() for query in queries.captured_queries)
    keys = [obj.pk for obj in objects]
    assert None not in keys and len(set(keys)) == 500
    assert set(Sku.objects.values_list("pk", flat=True)) == set(keys)
    assert not any(obj._state.adding for obj in objects)
    # Saved objects given to bulk_create(ignore_conflicts=True) again keep their keys.
    Sku.objects.bulk_create(objects[:3], ignore_conflicts=True)
    assert [obj.pk for obj in objects[:3]] == keys[:3]


def test_many_to_many_rows_get_keys(backend: str) -> None:
    order = Order.objects.create(customer=Customer.objects.create(name="ada"))
    item = Item.objects.create(order=order, sku="x")
    tags = [Tag.objects.create(name=name) for name in ("red", "blue")]
    item.tags.add(*tags)
    item.tags.add(*tags)  # the same rows again: ignored
    through = Item.tags.through.objects.all()
    assert through.count() == 2 and all(row.pk > 2**32 for row in through)


def test_fixtures_and_deserialisation_without_keys(backend: str, tmp_path: Path) -> None:
    fixture = tmp_path / "customers.json"
    fixture.write_text(json.dumps([
        {"model": "shop.customer", "fields": {"name": "no key 1"}},
        {"model": "shop.customer", "fields": {"name": "no key 2"}},
    ]))
    call_command("loaddata", str(fixture), database=backend, verbosity=0)
    keys = list(Customer.objects.order_by("name").values_list("pk", flat=True))
    assert len(keys) == 2 and all(key > 2**32 for key in keys)

    (deserialized,) = serializers.deserialize(
        "json", json.dumps([{"model": "shop.customer", "fields": {"name": "later"}}])
    )
    assert deserialized.object.pk is None  # an unsaved object, as Django expects
    deserialized.save()
    assert deserialized.object.pk is not None
    assert Customer.objects.get(pk=deserialized.object.pk).name == "later"
    text = serializers.serialize("json", [Customer(name="unsaved")])
    assert json.loads(text)[0].get("pk") is None


def test_failed_insert_leaves_no_key_and_is_retried_by_save(backend: str) -> None:
    Sku.objects.create(code="dup")
    sku = Sku(code="dup")
    with pytest.raises(IntegrityError), transaction.atomic(using=backend):
        sku.save()
    assert sku.pk is None  # as with AutoField: the key of the failed INSERT is taken back
    sku.code = "unique"
    with CaptureQueriesContext(connections[backend]) as queries:
        sku.save()
    assert _statements(queries) == ["INSERT"]  # a new object again: no UPDATE probe
    assert Sku.objects.get(code="unique").pk == sku.pk
    saved_key = sku.pk
    with pytest.raises(IntegrityError), transaction.atomic(using=backend):
        sku.save(force_insert=True)  # a second row under the same key: refused
    assert sku.pk == saved_key  # a key the row has is never taken back


def test_insert_that_fails_before_reaching_the_database_leaves_no_key(backend: str) -> None:
    """Django's own case (expressions.tests.test_object_update_unsaved_objects): an F()
    expression is refused while the INSERT is built, after pre_save() made the key."""
    sku = Sku(code=F("code"))
    with pytest.raises(ValueError, match="F\\(\\) expressions can only be used to update"):
        sku.save()
    assert sku.pk is None


def test_failed_insert_of_a_multi_table_parent_leaves_no_key(backend: str) -> None:
    restaurant = Restaurant(name=None)  # the Place row (name NOT NULL) fails
    with pytest.raises(IntegrityError), transaction.atomic(using=backend):
        restaurant.save()
    assert restaurant.pk is None and restaurant.id is None
    restaurant.name = "fixed"
    restaurant.save()
    assert Restaurant.objects.get(pk=restaurant.pk).name == "fixed"


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (2**63, "does not fit a 64-bit BIGINT"),
        (-(2**63) - 1, "does not fit a 64-bit BIGINT"),
        ("12ab", "'12ab' is not an integer key"),
        (1.5, "1.5 is not an integer key"),
        (True, "True is not an integer key"),
    ],
)
def test_bad_explicit_keys_are_refused_naming_model_field_and_value(
    backend: str, key: object, fragment: str
) -> None:
    with pytest.raises(InvalidIdError, match=r"shop\.Customer\.id") as raised, transaction.atomic(
        using=backend
    ):
        Customer(pk=key, name="bad").save(force_insert=True)
    assert fragment in str(raised.value)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(InvalidIdError, match=r"shop\.Customer\.id"), transaction.atomic(
        using=backend
    ):
        Customer.objects.bulk_create([Customer(pk=key, name="bad")])
    assert Customer.objects.count() == 0


def test_validation_of_a_key_from_user_input(backend: str) -> None:
    with pytest.raises(ValidationError):
        Customer(pk="not a number", name="x").full_clean()


def test_ignore_conflicts_twice_with_the_same_objects(backend: str) -> None:
    """Django's own test: objects whose rows were ignored stay without a key every time."""
    Sku.objects.bulk_create([Sku(code="a"), Sku(code="b")])
    conflicting = [Sku(code="a"), Sku(code="b")]
    Sku.objects.bulk_create(conflicting[:1], ignore_conflicts=True)
    Sku.objects.bulk_create(conflicting, ignore_conflicts=True)
    assert [obj.pk for obj in conflicting] == [None, None]
    new = Sku(code="c")
    Sku.objects.bulk_create([*conflicting, new], ignore_conflicts=True)
    assert new.pk is None and Sku.objects.count() == 3


def test_update_can_set_the_key_column(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    Customer.objects.filter(pk=customer.pk).update(id=customer.pk + 1)
    assert Customer.objects.get().pk == customer.pk + 1


def test_a_failed_conflict_bulk_create_does_not_unset_a_later_save(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    first = Order(customer=customer)
    with pytest.raises(ValueError, match="unsaved related object"):
        Order.objects.bulk_create(
            [first, Order(customer=Customer(name="unsaved"))], ignore_conflicts=True
        )
    key = first.pk  # given by the failed bulk_create (an AutoField's would still be None)
    first.save()
    assert first.pk is not None and first.pk == key
    assert Order.objects.get().pk == key


def test_an_explicit_key_given_as_text_is_an_int_after_save(backend: str) -> None:
    """As an AutoField's after the database returns it (Django 6.1's test of the same name)."""
    customer = Customer.objects.create(pk="123456789", name="ada")
    assert customer.pk == 123_456_789 and type(customer.pk) is int
    assert Customer.objects.get(pk=123_456_789).name == "ada"


@backends("mariadb")
def test_zero_key_is_refused_on_mysql_as_for_an_autofield(backend: str) -> None:
    """MySQL reads 0 in an AutoField as "make one" (Django's test_zero_as_autoval)."""
    with pytest.raises(ValueError, match="does not accept 0 as a value for AutoField"), (
        transaction.atomic(using=backend)
    ):
        Customer.objects.bulk_create([Customer(name="valid"), Customer(pk=0, name="zero")])
    assert not Customer.objects.exists()


def test_many_to_many_tables_of_apps_with_their_own_auto_field(backend: str) -> None:
    """contrib.auth declares AutoField for its models (AppConfig.default_auto_field): the
    through tables of User.groups and User.user_permissions must take database keys."""
    from django.contrib.auth.models import Group, Permission, User

    user = User.objects.create(username="ada")
    group = Group.objects.create(name="staff")
    permission = Permission.objects.first()
    assert permission is not None
    user.groups.add(group)
    user.user_permissions.add(permission)
    group.permissions.add(permission)
    assert list(user.groups.all()) == [group]
    assert list(user.user_permissions.all()) == [permission]
