"""The database clock in SQL: :class:`db_now_ms`, the server's time in Unix milliseconds.

The one dialect-specific piece of the allocator's statements, compiled per dialect. Lease times
are always judged by it, never by a process's clock (clocks of processes may be skewed, the
database's is one for all of them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

__all__ = ["db_now_ms"]


class db_now_ms(FunctionElement[int]):  # noqa: N801 - reads like the SQL function it renders
    """The database server's current time in Unix milliseconds (BIGINT)."""

    type = BigInteger()
    name = "db_now_ms"
    inherit_cache = True


@compiles(db_now_ms, "postgresql")
def _now_postgresql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
    # https://www.postgresql.org/docs/current/functions-datetime.html#FUNCTIONS-DATETIME-CURRENT
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


@compiles(db_now_ms, "mysql")
@compiles(db_now_ms, "mariadb")
def _now_mysql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    # UTC_TIMESTAMP does not depend on the session time zone (UNIX_TIMESTAMP(NOW()) does, and is
    # ambiguous in a DST fall-back hour); TIMESTAMPDIFF of two DATETIMEs is plain arithmetic.
    return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"


@compiles(db_now_ms, "sqlite")
def _now_sqlite(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    # julianday('now') has millisecond precision and is stable within one statement.
    # https://www.sqlite.org/lang_datefunc.html
    return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


@compiles(db_now_ms)
def _now_other(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000 AS BIGINT)"
