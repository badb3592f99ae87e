"""Database key functions: keys for rows that the application does not insert.

Rows written by ``psql``/``mariadb`` sessions, ETL jobs, other services or raw SQL get a key of
the application's :class:`~snowflake_db.Layout` from a function inside the database. Its worker
ID is a slot of the worker table reserved permanently, so it never collides with application
keys; every value is issued once across sessions, an exhausted tick is waited out (bounded), and
a clock behind the function's last ID beyond the tolerance is refused, as the Python generator
does. Application-made keys stay the default path; this is for everyone else.

* PostgreSQL: :func:`install_key_function` creates a PL/pgSQL function; use
  :func:`key_default_sql` (``"snowflake_next_id()"``) as the column's ``DEFAULT``.
* MariaDB: :func:`install_key_function` creates a stored function; MariaDB refuses it in
  ``DEFAULT``, so :func:`install_key_trigger` adds a ``BEFORE INSERT`` trigger filling a missing
  (NULL or 0) key.

Everything runs on a SQLAlchemy ``Connection`` (the Alembic operations
``op.create_snowflake_id_function`` / ``op.create_snowflake_key_trigger`` and the Django
migration operations are thin calls of these). The SQL lives in ``_postgres`` and ``_mariadb``,
the slot reservation in ``_slots``, names and labels in ``_spec``.
"""

from __future__ import annotations

from ._api import (
    DEFAULT_FUNCTION_NAME,
    DEFAULT_MAX_WAIT_MS,
    drop_key_function,
    drop_key_trigger,
    install_key_function,
    install_key_trigger,
    key_check_name,
    key_default_sql,
)
from ._spec import FunctionSpec

__all__ = [
    "DEFAULT_FUNCTION_NAME",
    "DEFAULT_MAX_WAIT_MS",
    "FunctionSpec",
    "drop_key_function",
    "drop_key_trigger",
    "install_key_function",
    "install_key_trigger",
    "key_check_name",
    "key_default_sql",
]
