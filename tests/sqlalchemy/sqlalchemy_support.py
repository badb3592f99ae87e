"""Models shared by the SQLAlchemy insert tests (sync and async): an ORM order with items, and
Core tables made with the column helpers or with the bare one-liner default."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from snowflake_db.sqlalchemy import (
    snowflake_column,
    snowflake_default,
    snowflake_fk_column,
    snowflake_fk_mapped_column,
    snowflake_mapped_column,
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = snowflake_mapped_column()
    customer: Mapped[str] = mapped_column(String(50))
    items: Mapped[list[Item]] = relationship(back_populates="order")


class Item(Base):
    __tablename__ = "order_items"
    id: Mapped[int] = snowflake_mapped_column()
    order_id: Mapped[int] = snowflake_fk_mapped_column("orders.id")
    sku: Mapped[str] = mapped_column(String(20))
    order: Mapped[Order] = relationship(back_populates="items")


core = MetaData()
events = Table(
    "events",
    core,
    snowflake_column("id"),
    Column("n", Integer, nullable=False),
)
plain = Table(  # the one-liner the README promises, without the helper
    "plain",
    core,
    Column("id", BigInteger, primary_key=True, default=snowflake_default, autoincrement=False),
    Column("n", Integer),
)
event_refs = Table(
    "event_refs", core, snowflake_column("id"), snowflake_fk_column("events.id", "event_id")
)
