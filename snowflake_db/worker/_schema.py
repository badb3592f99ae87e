"""The worker tables, defined once for SQLAlchemy, Alembic and Django to mirror.

All three tables live in one *control* database (not in every shard). Every time value is a
``BIGINT`` of Unix milliseconds: lease times (``*_at_ms``) come from the **database clock**, the
high-water mark from the **holder's clock**. Integers avoid time-zone and precision differences
between PostgreSQL, MariaDB/MySQL and SQLite, so one set of statements serves all three.

``snowflake_worker_registrations`` (:data:`DEFAULT_REGISTRATIONS_TABLE`) — one row per acquisition

=================  ==================  ===========================================================
column             type                meaning
=================  ==================  ===========================================================
``id``             BIGINT PK, auto     generated key; ``id & max_worker_id`` is the preferred slot
                                       (INTEGER PRIMARY KEY AUTOINCREMENT on SQLite)
``hostname``       VARCHAR(255)        host of the acquiring process
``pid``            INTEGER             its process ID
``started_at_ms``  BIGINT              database time of the registration
``worker_id``      INTEGER NULL        the slot it obtained (NULL while claiming, or if none)
=================  ==================  ===========================================================

``snowflake_worker_slots`` (:data:`DEFAULT_SLOTS_TABLE`) — one row per worker ID ever used

===================  =================  ===========================================================
column               type               meaning
===================  =================  ===========================================================
``worker_id``        INTEGER PK         the slot (not auto-increment)
``lease_token``      VARCHAR(32) NULL   random per lease; NULL = free. Renewals match on it, so
                                        repeated auto-increment values can never confuse holders
``registration_id``  BIGINT NULL        the holder's (or last holder's) registration row
``hostname``         VARCHAR(255) NULL  holder's host
``pid``              INTEGER NULL       holder's process ID
``label``            VARCHAR(255) NULL  label of a permanent reservation (server-side functions)
``acquired_at_ms``   BIGINT NULL        database time of the claim
``renewed_at_ms``    BIGINT NULL        database time of the last renewal
``expires_at_ms``    BIGINT NULL        database time the lease ends; NULL with a token set means
                                        a permanent reservation (never expires, never reaped)
``high_water_ms``    BIGINT NOT NULL    largest timestamp (holder's clock, Unix ms) the holder may
                     DEFAULT 0          issue; the next holder issues only above it
===================  =================  ===========================================================

``snowflake_worker_layout`` (:func:`layout_table_name` of the slots table) — the layout served

==================  =================  ==========================================================
column              type               meaning
==================  =================  ==========================================================
``id``              INTEGER PK         always :data:`LAYOUT_RECORD_ID` (1): one row, so the first
                                       INSERT wins and every later one fails on the key
``layout``          VARCHAR(1000)      ``Layout.as_kwargs()`` as canonical JSON (sorted keys)
``recorded_at_ms``  BIGINT             database time of the recording
``hostname``        VARCHAR(255) NULL  host of the process that recorded it
``pid``             INTEGER NULL       its process ID
==================  =================  ==========================================================

Every process using the tables must use the recorded layout
(:mod:`snowflake_db.worker._layout_record`): two layouts sharing one slots table can issue the
same 64-bit value from different slots. Tables without the row adopt the layout of the first
process that leases from them.

A slot is claimable when ``lease_token IS NULL OR expires_at_ms < <database now>``. Slot rows are
never deleted (not even by ``snowflake-db workers reap``): the row carries the high-water mark that
makes reusing the worker ID safe. Mirrors of this schema (Alembic operation, Django model) must keep
the column names, types, nullability and the ``high_water_ms`` default.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, text

from ..errors import InvalidArgumentError

#: Default name of the table with one row per worker slot.
DEFAULT_SLOTS_TABLE = "snowflake_worker_slots"
#: Default name of the auto-increment registrations table.
DEFAULT_REGISTRATIONS_TABLE = "snowflake_worker_registrations"
#: Name of the layout table that goes with the default slots table (see layout_table_name).
DEFAULT_LAYOUT_TABLE = "snowflake_worker_layout"
#: The key of the layout table's one row.
LAYOUT_RECORD_ID = 1
#: Length of the recorded layout's JSON text.
LAYOUT_TEXT_LENGTH = 1000

#: Length of the random lease token (hex characters).
TOKEN_LENGTH = 32
#: Length of host names and labels.
NAME_LENGTH = 255

# Portable identifiers: short enough for PostgreSQL's 63-byte limit, no quoting surprises.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class WorkerTables(NamedTuple):
    """The slots, registrations and layout :class:`~sqlalchemy.Table` objects of one metadata."""

    slots: Table
    registrations: Table
    layout: Table


def validate_identifier(name: str, what: str = "table name") -> str:
    """Return ``name`` if it is a plain SQL identifier (letters, digits, ``_``; max 63)."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise InvalidArgumentError(
            f"{what} {name!r} is not a plain identifier: use 1 to 63 letters, digits or "
            "underscores, not starting with a digit"
        )
    return name


def layout_table_name(slots_table: str) -> str:
    """The layout table of a slots table: ``_slots`` becomes ``_layout``, else ``_layout`` is
    appended (``snowflake_worker_slots`` -> ``snowflake_worker_layout``).

    Derived rather than configured, so tables given their own names (to keep two services with
    different layouts apart) always get their own layout record too.
    """
    validate_identifier(slots_table)
    stem = slots_table[: -len("_slots")] if slots_table.endswith("_slots") else slots_table
    name = f"{stem}_layout"
    if len(name) > 63:
        raise InvalidArgumentError(
            f"slots table name {slots_table!r} is too long: its layout table {name!r} would "
            "exceed 63 characters; use a slots table name of at most 56 characters"
        )
    return name


def worker_tables(
    metadata: MetaData,
    *,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
    schema: str | None = None,
) -> WorkerTables:
    """Define (or return the existing) worker tables in ``metadata``.

    Add them to your application's metadata so Alembic autogenerate sees them, or let
    :class:`~snowflake_db.worker.TableWorkerAllocator` create them (``create_tables=True``).
    """
    validate_identifier(slots_table)
    validate_identifier(registrations_table)
    if schema is not None:
        validate_identifier(schema, "schema name")
    if slots_table == registrations_table:
        raise InvalidArgumentError(
            f"slots_table and registrations_table must differ (both are {slots_table!r})"
        )
    layout_table = layout_table_name(slots_table)
    if layout_table == registrations_table:
        raise InvalidArgumentError(
            f"registrations_table {registrations_table!r} is the name of the layout table that "
            f"goes with slots_table {slots_table!r}; choose another name"
        )

    def key(name: str) -> str:
        return f"{schema}.{name}" if schema else name

    if key(slots_table) in metadata.tables:
        return WorkerTables(
            metadata.tables[key(slots_table)],
            metadata.tables[key(registrations_table)],
            metadata.tables[key(layout_table)],
        )
    registrations = Table(
        registrations_table,
        metadata,
        # BIGINT everywhere; SQLite only auto-increments an INTEGER PRIMARY KEY, and AUTOINCREMENT
        # there never reuses a key (https://www.sqlite.org/autoinc.html).
        Column(
            "id",
            BigInteger().with_variant(Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        Column("hostname", String(NAME_LENGTH), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("started_at_ms", BigInteger, nullable=False),
        Column("worker_id", Integer, nullable=True),
        schema=schema,
        sqlite_autoincrement=True,
    )
    slots = Table(
        slots_table,
        metadata,
        Column("worker_id", Integer, primary_key=True, autoincrement=False),
        Column("lease_token", String(TOKEN_LENGTH), nullable=True),
        Column("registration_id", BigInteger, nullable=True),
        Column("hostname", String(NAME_LENGTH), nullable=True),
        Column("pid", Integer, nullable=True),
        Column("label", String(NAME_LENGTH), nullable=True),
        Column("acquired_at_ms", BigInteger, nullable=True),
        Column("renewed_at_ms", BigInteger, nullable=True),
        Column("expires_at_ms", BigInteger, nullable=True),
        Column("high_water_ms", BigInteger, nullable=False, server_default=text("0")),
        schema=schema,
    )
    layout = Table(
        layout_table,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("layout", String(LAYOUT_TEXT_LENGTH), nullable=False),
        Column("recorded_at_ms", BigInteger, nullable=False),
        Column("hostname", String(NAME_LENGTH), nullable=True),
        Column("pid", Integer, nullable=True),
        schema=schema,
    )
    return WorkerTables(slots, registrations, layout)
