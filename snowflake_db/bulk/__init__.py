"""Bulk loads with keys made in the application: COPY on PostgreSQL, ``LOAD DATA LOCAL
INFILE`` (or large multi-row INSERTs) on MariaDB, ``executemany`` on SQLite.

A sequence-keyed table cannot use COPY when the caller needs the keys back; a Snowflake table
can, because every key is made before the row is sent (:func:`fill_keys`, one ``next_ids``
call). This package is framework-free apart from the DB-API connection it is given;
``snowflake_db.sqlalchemy.bulk_load`` and ``snowflake_db.django.bulk.bulk_load`` wrap it in
the caller's transaction (a savepoint), so a failure leaves no rows. The core generator never
imports it.
"""

from __future__ import annotations

from .load import VENDORS, load_rows
from .table import BulkTable, fill_keys, rows_as_lists

__all__ = ["VENDORS", "BulkTable", "fill_keys", "load_rows", "rows_as_lists"]
