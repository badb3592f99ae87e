"""SnowflakeAutoField / SnowflakeField on every backend: the key assigned at insert, one INSERT per
save, bulk_create, 64-bit columns, multiple databases, and MariaDB's lastrowid."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.models import BigAutoField
from django.test.utils import CaptureQueriesContext

import snowflake_db
from snowflake_db import snowflake_default
from snowflake_db.django import SnowflakeAutoField, SnowflakeField
from snowflake_db.django.fields import EagerSnowflakeAutoField
from snowflake_db.django.narrow_columns import require_wide_columns
from tests.django.conftest import backends
from tests.django_project.routers import use_alias
from tests.django_project.shop.models import Customer, Invoice, Item, Order, Tag
from tests.plugins.databases import unavailable

LAYOUT = snowflake_db.Layout()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_pk_is_assigned_at_insert_and_decodes_to_now(backend: str) -> None:
    before = _now_ms()
    customer = Customer(name="ada")
    assert customer.pk is None  # like AutoField: unsaved objects have no key
    customer.save()
    assert isinstance(customer.pk, int)
    decoded = LAYOUT.decode(customer.pk)
    assert decoded.worker_id == 1
    assert before - 5 <= decoded.timestamp_ms <= _now_ms() + 5
    assert Customer.objects.create(name="b").pk > customer.pk
    assert isinstance(Customer._meta.pk, SnowflakeAutoField)  # from DEFAULT_AUTO_FIELD
    assert isinstance(Item._meta.pk, SnowflakeAutoField)  # explicit primary_key=True


def test_save_is_one_insert_and_reads_nothing_back(backend: str) -> None:
    # MySQL/MariaDB: the column-width guard's one query per process and database (tested on
    # its own) runs now, not inside the first save of this process (pytest -n: any test).
    require_wide_columns(connections[backend])
    customer = Customer(name="ada")
    with CaptureQueriesContext(connections[backend]) as queries:
        customer.save()
    assert len(queries.captured_queries) == 1, queries.captured_queries
    sql = queries.captured_queries[0]["sql"]
    assert sql.upper().startswith("INSERT")
    assert "RETURNING" not in sql.upper()  # nothing is read back: the value is known
    assert str(customer.pk) in sql
    expected = customer.pk
    assert Customer.objects.get(pk=expected).name == "ada"

    order = Order(customer=customer, total_cents=5)
    with CaptureQueriesContext(connections[backend]) as queries:
        order.save()
    assert len(queries.captured_queries) == 1
    assert Order.objects.get().customer_id == expected


def test_create_and_copy_with_pk_none(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    original = customer.pk
    customer.pk = None  # Django's documented way to copy an instance
    customer._state.adding = True
    with CaptureQueriesContext(connections[backend]) as queries:
        customer.save()
    assert len(queries.captured_queries) == 1
    assert customer.pk is not None and customer.pk > original
    assert Customer.objects.count() == 2


def test_bulk_create_10000_distinct_pks(backend: str) -> None:
    customers = [Customer(name=f"c{i}") for i in range(10_000)]
    created = Customer.objects.bulk_create(customers, batch_size=2_000)
    pks = [customer.pk for customer in created]
    assert all(isinstance(pk, int) for pk in pks)
    assert len(set(pks)) == 10_000
    assert pks == sorted(pks)
    stored = set(Customer.objects.values_list("pk", flat=True))
    assert stored == set(pks)
    # Objects whose pk was cleared get one from bulk_create too.
    extra = Customer(name="late")
    extra.pk = None
    Customer.objects.bulk_create([extra])
    assert extra.pk is not None and Customer.objects.filter(pk=extra.pk).exists()


def test_relations_and_snowflake_field(backend: str) -> None:
    customer = Customer.objects.create(name="ada")
    order = Order.objects.create(customer=customer)
    item = Item.objects.create(order=order, sku="x")
    tag = Tag.objects.create(name="red")
    item.tags.add(tag)
    assert list(customer.orders.all()) == [order]
    assert list(Item.objects.filter(tags=tag)) == [item]
    invoice = Invoice(order=order)
    number = invoice.number
    assert isinstance(number, int) and number > 2**53
    invoice.save()
    assert isinstance(invoice.pk, int) and invoice.pk < 2**31  # BigAutoField: from the database
    assert Invoice.objects.get(number=number).pk == invoice.pk


def _column_types(alias: str, table: str) -> dict[str, str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f'PRAGMA table_info("{table}")')
            return {row[1]: row[2].lower() for row in cursor.fetchall()}
        schema = "current_schema()" if connection.vendor == "postgresql" else "DATABASE()"
        cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = {schema} AND table_name = %s",
            [table],
        )
        return {name: kind.lower() for name, kind in cursor.fetchall()}


def test_primary_and_foreign_keys_are_bigint(backend: str) -> None:
    vendor = connections[backend].vendor
    expected_pk = "integer" if vendor == "sqlite" else "bigint"  # SQLite: 64-bit rowid alias
    assert _column_types(backend, "shop_customer")["id"] == expected_pk
    order = _column_types(backend, "shop_order")
    assert order["id"] == expected_pk
    assert order["customer_id"] == "bigint"
    assert _column_types(backend, "shop_item")["order_id"] == "bigint"
    through = _column_types(backend, "shop_item_tags")
    assert through["item_id"] == "bigint" and through["tag_id"] == "bigint"
    assert _column_types(backend, "shop_invoice")["number"] == "bigint"


def test_primary_key_has_no_identity_or_auto_increment(backend: str) -> None:
    connection = connections[backend]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT is_identity, column_default FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = 'shop_order' "
                "AND column_name = 'id'"
            )
            assert cursor.fetchone() == ("NO", None)
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT extra FROM information_schema.columns WHERE table_schema = DATABASE() "
                "AND table_name = 'shop_order' AND column_name = 'id'"
            )
            assert "auto_increment" not in cursor.fetchone()[0].lower()
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'shop_order'")
            assert "AUTOINCREMENT" not in cursor.fetchone()[0].upper()


def test_using_sends_rows_to_the_named_database(backend: str) -> None:
    # Every alias of this test is the same backend; a second alias is covered below.
    customer = Customer(name="ada")
    customer.save(using=backend)
    assert Customer.objects.using(backend).filter(pk=customer.pk).exists()


def _available(*aliases: str) -> list[str]:
    from django.conf import settings

    return [alias for alias in aliases if alias in settings.DATABASES]


@pytest.mark.django_db(databases=_available("default", "postgresql", "mariadb"))
def test_multiple_databases_with_using() -> None:
    aliases = _available("default", "postgresql", "mariadb")
    if len(aliases) < 2:
        unavailable("needs a second database server")
    pks = {}
    for alias in aliases:
        customer = Customer(name=alias)
        customer.save(using=alias)
        Order.objects.using(alias).create(customer=customer)
        created = Customer.objects.using(alias).bulk_create(
            [Customer(name=f"{alias}{i}") for i in range(50)]
        )
        pks[alias] = {customer.pk, *(c.pk for c in created)}
    for alias in aliases:
        with use_alias(alias):
            stored = set(Customer.objects.values_list("pk", flat=True))
        assert stored == pks[alias]
    everything = [pk for group in pks.values() for pk in group]
    assert len(everything) == len(set(everything))


@backends("mariadb")
def test_mariadb_never_reads_the_pk_back_through_lastrowid(backend: str) -> None:
    """Django's MySQL backend reads an AutoField through cursor.lastrowid when it cannot use
    RETURNING (MySQL; MariaDB < 10.5). For a column without AUTO_INCREMENT that value is 0:
    the field therefore sets db_returning = False, so Django reads nothing back at all."""
    connection = connections[backend]
    # The hazard, shown on the real table: lastrowid after inserting an explicit ID is 0.
    snowflake = snowflake_default()
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO shop_customer (id, name) VALUES (%s, 'raw')", [snowflake])
        assert cursor.lastrowid == 0
    assert Customer._meta.pk not in Customer._meta.db_returning_fields
    # Force the MySQL path (no RETURNING), as on MySQL 8: the pk still is the Python value.
    features = connection.features
    saved = features.__dict__.get("can_return_columns_from_insert")
    features.__dict__["can_return_columns_from_insert"] = False
    try:
        customer = Customer(name="ada")
        customer.save()
        expected = customer.pk
        created = Customer.objects.bulk_create([Customer(name=f"b{i}") for i in range(3)])
    finally:
        if saved is None:
            features.__dict__.pop("can_return_columns_from_insert", None)
        else:
            features.__dict__["can_return_columns_from_insert"] = saved
    assert customer.pk == expected
    stored = set(Customer.objects.values_list("pk", flat=True))
    assert {expected, snowflake, *(c.pk for c in created)} == stored
    assert all(pk > 2**53 for pk in stored)


def test_deconstruct_emits_only_the_fields_own_arguments() -> None:
    field = SnowflakeAutoField(primary_key=True)
    _name, path, args, kwargs = field.deconstruct()
    assert path == "snowflake_db.django.fields.SnowflakeAutoField"
    assert args == [] and kwargs == {"primary_key": True}
    assert not field.has_default() and field.editable  # editable, as BigAutoField
    rebuilt = SnowflakeAutoField(*args, **kwargs)
    assert not rebuilt.has_default() and rebuilt.editable

    eager = EagerSnowflakeAutoField(primary_key=True)
    _name, path, args, kwargs = eager.deconstruct()
    assert path == "snowflake_db.django.fields.EagerSnowflakeAutoField"
    assert kwargs == {"primary_key": True}  # the injected default is not frozen
    assert EagerSnowflakeAutoField(**kwargs).default is snowflake_default

    number = SnowflakeField()
    assert number.deconstruct()[3] == {}
    assert number.unique and not number.editable and number.default is snowflake_default
    custom = SnowflakeField(unique=False, editable=True, null=True)
    kwargs = custom.deconstruct()[3]
    assert kwargs == {"unique": False, "editable": True, "null": True}
    rebuilt_custom = SnowflakeField(**kwargs)
    assert not rebuilt_custom.unique and rebuilt_custom.editable

    assert issubclass(SnowflakeAutoField, BigAutoField)


def test_model_form_excludes_ids_and_saves_with_one_insert(backend: str) -> None:
    from django import forms

    class OrderForm(forms.ModelForm):
        class Meta:
            model = Order
            fields = "__all__"

    class InvoiceForm(forms.ModelForm):
        class Meta:
            model = Invoice
            fields = "__all__"

    customer = Customer.objects.create(name="ada")
    form = OrderForm(data={"customer": str(customer.pk), "total_cents": "7", "note": "",
                           "created_by_pid": "0"})
    assert "id" not in form.fields
    assert form.is_valid(), form.errors
    with CaptureQueriesContext(connections[backend]) as queries:
        order = form.save()
    assert [q["sql"].split()[0].upper() for q in queries.captured_queries] == ["INSERT"]
    assert Order.objects.get(pk=order.pk).customer == customer
    assert "number" not in InvoiceForm().fields  # SnowflakeField is not editable


def test_the_key_is_editable_as_big_auto_fields_is(backend: str) -> None:
    """model_to_dict() keeps the key, a ModelForm naming "id" leaves it out (no FieldError),
    and the admin renders inline rows' hidden keys (it does so for Options.auto_field)."""
    from django import forms
    from django.contrib.admin.helpers import InlineAdminForm
    from django.forms.models import inlineformset_factory, model_to_dict

    customer = Customer.objects.create(name="ada")
    order = Order.objects.create(customer=customer, total_cents=5)
    assert model_to_dict(order)["id"] == order.pk
    assert Customer._meta.auto_field is Customer._meta.pk

    class CustomerForm(forms.ModelForm):
        class Meta:
            model = Customer
            fields = ["id", "name"]

    assert list(CustomerForm().fields) == ["name"]

    formset = inlineformset_factory(Customer, Order, fields=["note"], extra=0)(instance=customer)
    form = formset.forms[0]
    inline = InlineAdminForm(formset, form, [(None, {"fields": ["note"]})], {}, order)
    assert inline.needs_explicit_pk_field()
    assert f'value="{order.pk}"' in str(inline.pk_field().field)
    # The inline's POST, hidden key included, updates the row: no second order.
    prefix = formset.prefix
    data = {
        f"{prefix}-TOTAL_FORMS": "1", f"{prefix}-INITIAL_FORMS": "1",
        f"{prefix}-0-id": str(order.pk), f"{prefix}-0-customer": str(customer.pk),
        f"{prefix}-0-note": "edited",
    }
    bound = inlineformset_factory(Customer, Order, fields=["note"], extra=0)(
        data, instance=customer
    )
    assert bound.is_valid(), bound.errors
    bound.save()
    assert list(Order.objects.values_list("pk", "note")) == [(order.pk, "edited")]


def test_dumpdata_and_loaddata_keep_the_ids(backend: str, tmp_path: Path) -> None:
    """loaddata also runs the backend's sequence reset, which must cope with a column that has
    no sequence (PostgreSQL's pg_get_serial_sequence returns NULL for it)."""
    customers = Customer.objects.bulk_create([Customer(name=f"c{i}") for i in range(5)])
    fixture = tmp_path / "customers.json"
    call_command("dumpdata", "shop.customer", output=str(fixture), database=backend, verbosity=0)
    Customer.objects.all().delete()
    call_command("loaddata", str(fixture), database=backend, verbosity=0)
    assert sorted(Customer.objects.values_list("pk", flat=True)) == [c.pk for c in customers]
    assert Customer.objects.create(name="after").pk > customers[-1].pk
