"""Worker IDs leased from a database table.

Needs SQLAlchemy: ``pip install 'snowflake-db[sqlalchemy]'``.

``TableWorkerAllocator(url_or_engine)`` gives each process its own worker ID from a table in a
shared control database, with leases, fencing, a per-slot high-water mark and fork handling;
``worker_tables(metadata)`` adds its tables to your own metadata.

The modules behind it, one per concept (all private; this package's names are the API):
``_allocator`` (the facade), ``_table_lease`` (a held slot) and ``_renewer`` (its one renewer:
schedule, heartbeat, callers' renewals, timing), ``_claims`` (how a slot is claimed),
``_store`` (the SQL, the rows, the database clock), ``_schema`` (the tables), ``_engine`` (URL,
private engine, statement bounds, retry), ``_process_hooks`` (fork and exit hooks, the SQLite
fork gate), ``_layout_record`` (the layout the tables serve), ``_clock_skew`` and ``_health``.
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

from ._allocator import DEFAULT_MAX_FLOOR_WAIT_MS, TableWorkerAllocator
from ._renewer import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from ._schema import (
    DEFAULT_REGISTRATIONS_TABLE,
    DEFAULT_SLOTS_TABLE,
    WorkerTables,
    worker_tables,
)
from ._store import SlotRow
from ._table_lease import TableLease

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
