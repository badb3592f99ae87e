"""An existing shop schema with 32-bit auto-increment keys (test_alembic_convert_existing.py):
customers (a customer may be referred by another), products, orders (foreign key to
customers), an association table order_products (composite key of two foreign keys, one named
with ON DELETE CASCADE, one unnamed) and favourites, an association table with its own integer
surrogate key. Also the models the application switches to, with the library's column
helpers."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Identity,
    Integer,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from snowflake_db.sqlalchemy import (
    snowflake_fk_column,
    snowflake_fk_mapped_column,
    snowflake_mapped_column,
)

#: Every table, children after parents, with its columns in key order.
TABLES = {
    "customers": ("id", "name", "referred_by"),
    "products": ("id", "title"),
    "orders": ("id", "customer_id", "note"),
    "order_products": ("order_id", "product_id"),
    "favourites": ("id", "customer_id", "product_id"),
}

#: Columns that hold a customer, product or order key once converted.
KEY_COLUMNS = [
    ("customers", "id"),
    ("customers", "referred_by"),
    ("favourites", "customer_id"),
    ("favourites", "product_id"),
    ("order_products", "order_id"),
    ("order_products", "product_id"),
    ("orders", "customer_id"),
    ("orders", "id"),
    ("products", "id"),
]

OLD_SCHEMA = """
def key():
    if VARIANT == "identity":
        return sa.Column("id", sa.Integer, sa.Identity(), primary_key=True)
    return sa.Column("id", sa.Integer, primary_key=True)

op.create_table(
    "customers",
    key(),
    sa.Column("name", sa.String(40), nullable=False),
    sa.Column("referred_by", sa.Integer, sa.ForeignKey("customers.id"), nullable=True),
)
op.create_table("products", key(), sa.Column("title", sa.String(40), nullable=False))
op.create_table(
    "orders",
    key(),
    sa.Column("customer_id", sa.Integer, sa.ForeignKey("customers.id"), nullable=False),
    sa.Column("note", sa.String(40), nullable=True),
)
op.create_table(
    "order_products",
    sa.Column("order_id", sa.Integer,
              sa.ForeignKey("orders.id", name="fk_op_order", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("product_id", sa.Integer, sa.ForeignKey("products.id"), primary_key=True),
)
op.create_table(
    "favourites",
    key(),
    sa.Column("customer_id", sa.Integer, sa.ForeignKey("customers.id"), nullable=False),
    sa.Column("product_id", sa.Integer, sa.ForeignKey("products.id"), nullable=False),
    sa.UniqueConstraint("customer_id", "product_id", name="uq_favourite"),
)
"""

DROP_OLD_SCHEMA = "\n".join(f"op.drop_table({name!r})" for name in reversed(TABLES))


def old_schema(variant: str) -> str:
    """The first revision's ``upgrade()``: ``variant`` is ``"identity"`` or ``"serial"``."""
    return f"VARIANT = {variant!r}\n{OLD_SCHEMA}"


def fill_old_schema(conn: Connection) -> None:
    """Rows written as the old application did: keys left to the database."""
    conn.execute(
        text("INSERT INTO customers (name) VALUES (:name)"),
        [{"name": f"customer {i}"} for i in range(30)],
    )
    conn.execute(text("UPDATE customers SET referred_by = id - 1 WHERE id > 20"))
    conn.execute(
        text("INSERT INTO products (title) VALUES (:title)"),
        [{"title": f"product {i}"} for i in range(20)],
    )
    conn.execute(
        text("INSERT INTO orders (customer_id, note) VALUES (:customer, :note)"),
        [{"customer": 1 + i % 30, "note": f"order {i}"} for i in range(60)],
    )
    links = {(1 + i, 1 + (i * k) % 20) for i in range(60) for k in (1, 7)}
    conn.execute(
        text("INSERT INTO order_products (order_id, product_id) VALUES (:o, :p)"),
        [{"o": o, "p": p} for o, p in sorted(links)],
    )
    pairs = {(1 + i % 30, 1 + (i * 3) % 20) for i in range(40)}
    conn.execute(
        text("INSERT INTO favourites (customer_id, product_id) VALUES (:c, :p)"),
        [{"c": c, "p": p} for c, p in sorted(pairs)],
    )


def snapshot(conn: Connection) -> dict[str, set[tuple[Any, ...]]]:
    """Every row of every table."""
    return {
        table: {tuple(row) for row in conn.execute(text(f"SELECT {', '.join(cols)} FROM {table}"))}
        for table, cols in TABLES.items()
    }


def new_models(variant: str) -> dict[str, Any]:
    """The application's models after the switch: the three keys and every column holding one
    made with the column helpers; favourites keeps its own auto-increment key."""

    class Base(DeclarativeBase):
        pass

    order_products = Table(
        "order_products",
        Base.metadata,
        snowflake_fk_column(
            "orders.id", "order_id", primary_key=True, constraint_name="fk_op_order",
            ondelete="CASCADE",
        ),
        snowflake_fk_column("products.id", "product_id", primary_key=True),
    )

    class Customer(Base):
        __tablename__ = "customers"
        id: Mapped[int] = snowflake_mapped_column()
        name: Mapped[str] = mapped_column(String(40))
        referred_by: Mapped[int | None] = snowflake_fk_mapped_column("customers.id")

    class Product(Base):
        __tablename__ = "products"
        id: Mapped[int] = snowflake_mapped_column()
        title: Mapped[str] = mapped_column(String(40))

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = snowflake_mapped_column()
        customer_id: Mapped[int] = snowflake_fk_mapped_column("customers.id", nullable=False)
        note: Mapped[str | None] = mapped_column(String(40))
        customer = relationship(Customer)
        products = relationship(Product, secondary=order_products)

    favourite_key = (Identity(),) if variant == "identity" else ()

    class Favourite(Base):
        __tablename__ = "favourites"
        __table_args__ = (UniqueConstraint("customer_id", "product_id", name="uq_favourite"),)
        id: Mapped[int] = mapped_column(Integer, *favourite_key, primary_key=True)
        customer_id: Mapped[int] = snowflake_fk_mapped_column("customers.id", nullable=False)
        product_id: Mapped[int] = snowflake_fk_mapped_column("products.id", nullable=False)

    return {
        "metadata": Base.metadata,
        "Customer": Customer,
        "Product": Product,
        "Order": Order,
        "Favourite": Favourite,
        "order_products": order_products,
    }

