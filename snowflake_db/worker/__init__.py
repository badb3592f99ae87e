"""Worker IDs leased from a database table.

Needs SQLAlchemy: ``pip install 'snowflake-db[sqlalchemy]'``.

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

from .allocator import DEFAULT_MAX_FLOOR_WAIT_MS, TableWorkerAllocator
from .lease import TableLease
from .rows import SlotRow
from .schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    WorkerTables,
    worker_tables,
)
from .timing import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, MIN_LEASE_SECONDS

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_FLOOR_WAIT_MS",
    "DEFAULT_REGISTRATIONS_TABLE",
    "DEFAULT_SLOTS_TABLE",
    "MAX_LEASE_SECONDS",
    "MIN_LEASE_SECONDS",
    "SlotRow",
    "TableLease",
    "TableWorkerAllocator",
    "WorkerTables",
    "worker_tables",
]
