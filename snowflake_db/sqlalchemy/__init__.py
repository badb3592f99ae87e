"""SQLAlchemy integration: Snowflake ``BIGINT`` primary keys issued in the application.

``Column(BigInteger, primary_key=True, default=snowflake_default, autoincrement=False)`` is all
it takes; the helpers here spell that out, add foreign-key columns of the right width, per-table
and per-engine generators, and an optional ID-at-construction hook. Their default issues the
keys of a multi-row INSERT with one ``next_ids`` call, and importing this package lets the ORM
set the keys of new objects at flush so that it can send their INSERTs as one executemany
(:mod:`snowflake_db.sqlalchemy.flush`). ``bulk_load`` and ``bulk_load_with_children`` send
many rows by the backend's bulk protocol (:mod:`snowflake_db.sqlalchemy.bulk`). Sharded tables:
:mod:`snowflake_db.sqlalchemy.sharding` (imported on its own: it loads SQLAlchemy's horizontal
sharding extension). ``snowflake_column(key_function="snowflake_next_id")`` adds the database
key function as the server default for rows inserted by raw SQL
(:mod:`snowflake_db.sqlalchemy.key_default`, :mod:`snowflake_db.key_functions`).
"""

from ..process import snowflake_default
from .bulk import bulk_load, bulk_load_with_children
from .checks import NarrowColumn, narrow_snowflake_columns, require_wide_snowflake_columns
from .columns import (
    SNOWFLAKE_INFO_KEY,
    is_snowflake_column,
    snowflake_column,
    snowflake_fk_column,
    snowflake_fk_mapped_column,
    snowflake_mapped_column,
)
from .events import assign_ids_on_init, stop_assigning_ids_on_init
from .flush import install_flush_hook
from .generators import (
    SnowflakeDefault,
    bind_generator,
    generator_for,
    snowflake_id_default,
    unbind_generator,
)
from .key_default import KeyFunctionDefault, key_function_default
from .urls import engine_url

__all__ = [
    "SNOWFLAKE_INFO_KEY",
    "KeyFunctionDefault",
    "NarrowColumn",
    "SnowflakeDefault",
    "assign_ids_on_init",
    "bind_generator",
    "bulk_load",
    "bulk_load_with_children",
    "engine_url",
    "generator_for",
    "is_snowflake_column",
    "key_function_default",
    "narrow_snowflake_columns",
    "require_wide_snowflake_columns",
    "snowflake_column",
    "snowflake_default",
    "snowflake_fk_column",
    "snowflake_fk_mapped_column",
    "snowflake_id_default",
    "snowflake_mapped_column",
    "stop_assigning_ids_on_init",
    "unbind_generator",
]

install_flush_hook()
