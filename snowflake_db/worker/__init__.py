"""Worker IDs leased from a database table (needs SQLAlchemy: ``pip install 'snowflake-db[sqlalchemy]'``).

``TableWorkerAllocator(url_or_engine)`` gives each process its own worker ID from a table in a
shared control database, with leases, fencing, a per-slot high-water mark and fork handling.
The table definitions live in :mod:`snowflake_db.worker.schema`.
"""

from __future__ import annotations

try:
    import sqlalchemy  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "snowflake_db.worker needs SQLAlchemy to lease worker IDs from a database table: "
        "pip install 'snowflake-db[sqlalchemy]' (plus a driver: 'snowflake-db[postgres]' or "
        "'snowflake-db[mysql]')",
        name=error.name,
    ) from error

from .schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    WorkerTables,
    worker_tables,
)

__all__ = [
    "DEFAULT_REGISTRATIONS_TABLE",
    "DEFAULT_SLOTS_TABLE",
    "WorkerTables",
    "worker_tables",
]
