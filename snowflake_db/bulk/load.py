"""One entry point for every backend: pick the loader by the connection's vendor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import BulkLoadError
from .table import BulkTable
from .values import diagnose

__all__ = ["VENDORS", "load_rows"]

VENDORS = ("postgresql", "mariadb", "mysql", "sqlite")


def load_rows(
    dbapi_connection: Any,
    vendor: str,
    table: BulkTable,
    rows: Sequence[Sequence[Any]],
    *,
    mariadb_method: str = "auto",
    beside_server: Callable[[], None] | None = None,
) -> str:
    """Write ``rows`` (lists in ``table.columns`` order, keys already filled) in the
    connection's open transaction; returns the method used (``"copy"``, ``"load_data"``,
    ``"insert"``, ``"executemany"``).

    ``beside_server`` is client work to do while the server stores the last rows sent: on
    PostgreSQL it runs once every row is written and before the COPY ends (the server is
    then still parsing and indexing what the socket holds); elsewhere after the load. An
    exception from it aborts the load and propagates unchanged.

    The caller owns the transaction and should wrap the load in a savepoint: on MariaDB a
    rejected ``LOAD DATA`` raises after the server kept some rows.
    """
    if not rows:
        if beside_server is not None:
            beside_server()
        return "none"
    if vendor == "postgresql":
        from .postgres import copy_rows

        if getattr(dbapi_connection, "pgconn", None) is None:  # psycopg 3 only
            raise BulkLoadError(
                f"a bulk load on PostgreSQL needs psycopg 3 (cursor.copy); got "
                f"{type(dbapi_connection).__module__}.{type(dbapi_connection).__name__}"
            )
        copy_rows(dbapi_connection, table, rows, beside_server=beside_server)
        return "copy"
    method = _load_elsewhere(dbapi_connection, vendor, table, rows, mariadb_method)
    if beside_server is not None:
        beside_server()
    return method


def _load_elsewhere(
    dbapi_connection: Any,
    vendor: str,
    table: BulkTable,
    rows: Sequence[Sequence[Any]],
    mariadb_method: str,
) -> str:
    try:
        if vendor in ("mariadb", "mysql"):
            from .mariadb import load_rows as load_mariadb

            return load_mariadb(dbapi_connection, table, rows, mariadb_method)
        if vendor == "sqlite":
            from .sqlite import insert_rows

            insert_rows(dbapi_connection, table, rows)
            return "executemany"
    except UnicodeEncodeError as error:  # a lone surrogate, met by the driver or the file
        found = diagnose(table, ["other"] * len(table.columns), rows, vendor)
        if found is not None:
            raise found from error
        raise
    raise BulkLoadError(f"no bulk loader for {vendor!r}; supported: {VENDORS}")
