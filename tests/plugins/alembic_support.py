"""Helpers shared by tests/alembic and tests/sharding: a throwaway Alembic project whose env.py
imports snowflake_db.alembic, hand-written revisions, and the models after a conversion."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Column, Integer, MetaData, String, Table

from snowflake_db.sqlalchemy import snowflake_column, snowflake_fk_column

from .databases import ScratchDatabase

ENV_PY = """
from alembic import context
from sqlalchemy import create_engine

import snowflake_db.alembic
from snowflake_db.alembic import include_object

config = context.config
url = config.get_main_option("sqlalchemy.url")
target_metadata = config.attributes.get("target_metadata")
if context.is_offline_mode():
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            include_object=include_object,
            compare_server_default=config.attributes.get("compare_server_default", False),
            process_revision_directives=snowflake_db.alembic.process_revision_directives,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
"""


def make_project(tmp_path: Path, db: ScratchDatabase, metadata: Any = None) -> Config:
    """An Alembic project in ``tmp_path`` whose env.py imports snowflake_db.alembic."""
    directory = tmp_path / "migrations"
    config = Config(str(tmp_path / "alembic.ini"))
    command.init(config, str(directory), template="generic")
    (directory / "env.py").write_text(ENV_PY)
    config = Config(str(tmp_path / "alembic.ini"))
    config.set_main_option("script_location", str(directory))
    config.set_main_option("sqlalchemy.url", db.url_string.replace("%", "%%"))
    config.attributes["target_metadata"] = metadata
    return config


def write_revision(
    config: Config, revision: str, down: str | None, up: str, down_body: str
) -> None:
    """Write a revision file by hand (the scenarios need data and hand-written operations)."""
    versions = Path(config.get_main_option("script_location") or "") / "versions"

    def body(code: str) -> str:
        return textwrap.indent(textwrap.dedent(code).strip(), "    ")

    source = "\n".join(
        [
            f'"""{revision}"""',
            "from alembic import op",
            "import sqlalchemy as sa",
            "import snowflake_db",
            "import snowflake_db.alembic",
            "",
            f"revision = {revision!r}",
            f"down_revision = {down!r}",
            "branch_labels = None",
            "depends_on = None",
            "",
            "",
            "def upgrade():",
            body(up),
            "",
            "",
            "def downgrade():",
            body(down_body),
            "",
        ]
    )
    (versions / f"{revision}.py").write_text(source)


INITIAL = """
op.create_table(
    "orders",
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer", sa.String(50), nullable=False),
    sqlite_autoincrement=True,
)
op.create_table(
    "order_items",
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("order_id", sa.Integer, nullable=False),
    sa.Column("note_of", sa.Integer, nullable=True, server_default="0"),
    sa.ForeignKeyConstraint(["order_id"], ["orders.id"], name="fk_items_order",
                            ondelete="CASCADE"),
)
op.create_table(
    "notes",
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("order_id", sa.Integer, sa.ForeignKey("orders.id", name="fk_notes_order"),
              nullable=True),
)
orders = sa.table("orders", sa.column("customer", sa.String))
op.bulk_insert(orders, [{"customer": f"c{i}"} for i in range(1, 21)])
items = sa.table("order_items", sa.column("order_id", sa.Integer))
op.bulk_insert(items, [{"order_id": 1 + i % 20} for i in range(40)])
op.execute("INSERT INTO notes (order_id) VALUES (3), (NULL)")
"""


def converted_models() -> MetaData:
    """The models an application writes after the conversion, with the column helpers."""
    metadata = MetaData()
    Table(
        "orders", metadata, snowflake_column("id"), Column("customer", String(50), nullable=False)
    )
    Table(
        "order_items",
        metadata,
        Column("id", Integer, primary_key=True),
        snowflake_fk_column(
            "orders.id",
            "order_id",
            nullable=False,
            constraint_name="fk_items_order",
            ondelete="CASCADE",
        ),
        Column("note_of", Integer, nullable=True, server_default="0"),
    )
    Table(
        "notes",
        metadata,
        Column("id", Integer, primary_key=True),
        snowflake_fk_column(
            "orders.id", "order_id", nullable=True, constraint_name="fk_notes_order"
        ),
    )
    return metadata


#: The downgrade of :data:`INITIAL`.
DROP_INITIAL = "op.drop_table('notes')\nop.drop_table('order_items')\nop.drop_table('orders')"


def project_with_orders(tmp_path: Path, db: ScratchDatabase) -> Config:
    """:func:`make_project` with revision ``r1``: serial-key orders, items and notes, with rows."""
    config = make_project(tmp_path, db)
    write_revision(config, "r1", None, INITIAL, DROP_INITIAL)
    return config
