"""Install and drop a key function (and MariaDB's trigger) on a SQLAlchemy ``Connection``.

Backend-neutral: the connection's dialect picks :mod:`._postgres` or :mod:`._mariadb`. Both run
in the caller's transaction; note MariaDB commits implicitly before and after DDL, so there the
slot reservation is committed with the function (a re-run finds it by its label).
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from ..errors import InvalidArgumentError
from ..generator import DEFAULT_ROLLBACK_TOLERANCE_MS
from ..layout import DEFAULT_LAYOUT, Layout
from ..worker._schema import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE
from . import _mariadb, _postgres
from ._slots import floor_id, release_slot, reserve_slot, tick_end_ms
from ._spec import FunctionSpec, SlotPlace, backend_of

#: The function's name unless told otherwise.
DEFAULT_FUNCTION_NAME = "snowflake_next_id"
#: How long the function waits for the next tick when one is used up, in ms.
DEFAULT_MAX_WAIT_MS = 1000


def install_key_function(
    conn: Connection,
    *,
    name: str = DEFAULT_FUNCTION_NAME,
    schema: str | None = None,
    layout: Layout | None = None,
    label: str | None = None,
    control_url: str | None = None,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
    slots_schema: str | None = None,
    rollback_tolerance_ms: int = DEFAULT_ROLLBACK_TOLERANCE_MS,
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
) -> int:
    """Create the function ``name()`` issuing keys of ``layout``; return its worker ID.

    PostgreSQL gets a PL/pgSQL function, MariaDB a stored function (use it through
    :func:`install_key_trigger`). Its worker ID is a slot reserved forever under ``label``
    (default ``<backend>-function:<database>@<server>:<schema>.<name>``, the server's own
    identity: databases of one name on two servers get two slots) in the worker tables of this
    database, or of the control database at ``control_url``; a second call with the same label
    finds that reservation again. ``layout`` (default the default layout) must be the one the
    worker tables record, else :class:`~snowflake_db.errors.LayoutMismatchError`.
    """
    backend = backend_of(conn.dialect.name, "install_key_function")
    spec = FunctionSpec(name, schema, backend)
    layout = layout or DEFAULT_LAYOUT
    place = SlotPlace(label, control_url, slots_table, registrations_table, slots_schema)
    worker_id, high_water_ms = reserve_slot(conn, place, _label(conn, spec, place), layout)
    builder = _postgres.create_function_sql if backend == "postgresql" else (
        _mariadb.create_function_sql
    )
    start_after = floor_id(layout, worker_id, high_water_ms)
    for statement in builder(
        spec,
        layout=layout,
        worker_id=worker_id,
        start_after=start_after,
        rollback_tolerance_ms=rollback_tolerance_ms,
        max_wait_ms=max_wait_ms,
    ):
        conn.execute(text(statement))
    if backend == "mariadb":  # sequences kept from an earlier install only move forward
        _mariadb.move_forward(conn, spec, layout, start_after)
    return worker_id


def drop_key_function(
    conn: Connection,
    *,
    name: str = DEFAULT_FUNCTION_NAME,
    schema: str | None = None,
    layout: Layout | None = None,
    label: str | None = None,
    control_url: str | None = None,
    slots_table: str = DEFAULT_SLOTS_TABLE,
    registrations_table: str = DEFAULT_REGISTRATIONS_TABLE,
    slots_schema: str | None = None,
    release_worker: bool = True,
) -> int | None:
    """Drop ``name()`` and its state sequence (drop defaults and triggers using it first).

    With ``release_worker`` its reserved slot is freed, the slot's high-water mark raised past
    the function's last ID so a later holder never repeats it; returns the worker ID freed
    (``None`` if nothing was reserved under the label or ``release_worker`` is false).
    """
    backend = backend_of(conn.dialect.name, "drop_key_function")
    spec = FunctionSpec(name, schema, backend)
    layout = layout or DEFAULT_LAYOUT
    if backend == "postgresql":
        last_id = _postgres.last_issued_id(conn, spec)
        statements = _postgres.drop_function_sql(spec)
    else:
        last_id = _mariadb.last_issued_id(conn, spec, layout)
        statements = _mariadb.drop_function_sql(spec, _mariadb.state_sequences(conn, spec))
    for statement in statements:
        conn.execute(text(statement))
    if not release_worker:
        return None
    place = SlotPlace(label, control_url, slots_table, registrations_table, slots_schema)
    issued_until_ms = None if last_id is None else tick_end_ms(layout, last_id)
    return release_slot(conn, place, _label(conn, spec, place), issued_until_ms)


def key_default_sql(
    dialect_name: str, name: str = DEFAULT_FUNCTION_NAME, schema: str | None = None
) -> str:
    """The column default calling the function: ``"snowflake_next_id()"`` on PostgreSQL.

    MariaDB refuses a stored function in ``DEFAULT`` (error 1901): there the key comes from
    :func:`install_key_trigger`, and this raises :class:`~snowflake_db.errors.InvalidArgumentError`
    saying so.
    """
    backend = backend_of(dialect_name, "key_default_sql")
    if backend == "mariadb":
        raise InvalidArgumentError(
            f"MariaDB refuses a stored function such as {name}() in a column DEFAULT: give the "
            "table a BEFORE INSERT trigger instead (install_key_trigger, "
            "op.create_snowflake_key_trigger)"
        )
    return FunctionSpec(name, schema, backend).call_sql


def install_key_trigger(
    conn: Connection,
    table: str,
    column: str = "id",
    *,
    name: str = DEFAULT_FUNCTION_NAME,
    schema: str | None = None,
    table_schema: str | None = None,
    trigger: str | None = None,
    zero_default: bool = True,
) -> str:
    """MariaDB: a ``BEFORE INSERT`` trigger on ``table`` filling a NULL or 0 ``column`` from
    ``name()``; a key the ``INSERT`` gives is kept. Returns the trigger's name (default
    ``<table>_<column>_snowflake_key``, cut past 63 characters to end with a hash).

    With ``zero_default`` the column also gets ``DEFAULT 0``: in strict mode MariaDB refuses an
    ``INSERT ... SELECT`` that leaves out a key without a default before the trigger can run;
    and with it the ``CHECK`` of :func:`key_check_name`, which refuses the placeholder 0 should
    the trigger ever be missing (``IF NOT EXISTS``: a model may have made it already).

    ``table_schema`` is the table's database; the trigger lives there too and calls the
    function in ``schema``, by default the connection's current database (a trigger would
    otherwise look for it in its own).
    """
    _mariadb_only(conn, "install_key_trigger")
    if table_schema is not None and schema is None:
        # A trigger runs in its table's database: name the function's database, this one
        schema = conn.scalar(text("SELECT DATABASE()"))
        if schema is None:
            raise InvalidArgumentError(
                f"install_key_trigger: table_schema={table_schema!r} but the connection has no "
                f"current database to find {name}() in: give schema= (the function's database)"
            )
    spec = FunctionSpec(name, schema, "mariadb")
    trigger = trigger or _mariadb.trigger_name(table, column)
    for statement in _mariadb.create_trigger_sql(
        spec,
        table=table,
        column=column,
        trigger=trigger,
        table_schema=table_schema,
        zero_default=zero_default,
    ):
        conn.execute(text(statement))
    return trigger


def drop_key_trigger(
    conn: Connection,
    table: str,
    column: str = "id",
    *,
    table_schema: str | None = None,
    trigger: str | None = None,
    zero_default: bool = True,
) -> None:
    """MariaDB: drop :func:`install_key_trigger`'s trigger (and the column's ``DEFAULT 0``)."""
    _mariadb_only(conn, "drop_key_trigger")
    spec = FunctionSpec(DEFAULT_FUNCTION_NAME, None, "mariadb")
    for statement in _mariadb.drop_trigger_sql(
        spec,
        table=table,
        column=column,
        trigger=trigger or _mariadb.trigger_name(table, column),
        table_schema=table_schema,
        zero_default=zero_default,
    ):
        conn.execute(text(statement))


def key_check_name(table: str, column: str = "id") -> str:
    """MariaDB: the name of the ``CHECK (column <> 0)`` that comes with the trigger's
    ``DEFAULT 0`` placeholder, ``<table>_<column>_key_trigger_missing``. MariaDB checks it after
    ``BEFORE INSERT`` triggers, so it refuses only a row the trigger did not give a key: its
    error names it when the trigger is missing (never installed, dropped, or the table made
    again without it). Any names (the constraint's own is quoted where it is used)."""
    return _mariadb.check_name(table, column)


def _mariadb_only(conn: Connection, what: str) -> None:
    if backend_of(conn.dialect.name, what) != "mariadb":
        raise InvalidArgumentError(
            f"{what} is for MariaDB, which refuses a stored function in DEFAULT; on "
            f"{conn.dialect.name} use the function as the column's default "
            "(key_default_sql, server_default)"
        )


#: The server's identity for a label: PostgreSQL's system identifier (made by initdb, kept by
#: physical copies of the cluster), MariaDB's server_uid (derived from the host's hardware
#: address, data directory and port; before 10.6.19, which added it, those three themselves).
_SERVER_IDENTITY_SQL = {
    "postgresql": "SELECT system_identifier::text FROM pg_control_system()",
    "mariadb": (
        "SELECT COALESCE((SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES "
        "WHERE VARIABLE_NAME = 'SERVER_UID'), CONCAT(@@hostname, ':', @@port, ':', @@datadir))"
    ),
}


def server_identity(conn: Connection, backend: str) -> str:
    """The identity of the server ``conn`` is on, for :meth:`FunctionSpec.default_label`."""
    return str(conn.scalar(text(_SERVER_IDENTITY_SQL[backend])))


def _label(conn: Connection, spec: FunctionSpec, place: SlotPlace) -> str:
    if place.label is not None:
        return place.label
    database = conn.engine.url.database
    if spec.backend == "mariadb" and not database:
        database = conn.scalar(text("SELECT DATABASE()"))
    return spec.default_label(database, server_identity(conn, spec.backend))
