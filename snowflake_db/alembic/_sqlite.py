"""SQLite's half of converting a key: "move and copy" batch mode rebuilds the table and every
table referencing it (``ALTER TABLE`` cannot change a column's type there).

Dropping the old table with foreign keys enforced makes SQLite delete its rows first, which
fires ``ON DELETE CASCADE`` on the children (silently lost) or fails; so enforcement is switched
off for the rebuild, the rebuilt tables are checked with ``PRAGMA foreign_key_check``, and it is
switched back on. See https://www.sqlite.org/lang_altertable.html#otheralter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Integer, MetaData, Table, event
from sqlalchemy.types import TypeEngine

from ..errors import SnowflakeMigrationError

if TYPE_CHECKING:
    from alembic.operations import Operations
    from sqlalchemy.engine import Connection

    from ._target import Target

__all__ = ["sqlite_rebuild"]

#: Pool connection ``info`` key: this connection's foreign keys are to be switched back on.
_RESTORE = "snowflake_db_restore_foreign_keys"


def sqlite_rebuild(
    operations: Operations, target: Target, type_: TypeEngine[Any], *, autoincrement: bool
) -> None:
    bind = operations.get_bind()
    enforced = bool(bind.exec_driver_sql("PRAGMA foreign_keys").scalar())
    if enforced:
        _sqlite_foreign_keys_off(bind, target)
    _sqlite_rebuild_tables(operations, target, type_, autoincrement=autoincrement)
    if not enforced:
        return
    for table in dict.fromkeys([target.table] + [ref.table for ref in target.references]):
        broken = bind.exec_driver_sql(
            f"PRAGMA foreign_key_check({bind.dialect.identifier_preparer.quote(table)})"
        ).fetchall()
        if broken:
            raise SnowflakeMigrationError(
                f"after rebuilding {table} for {target.table}.{target.column}, "
                f"{len(broken)} row(s) break a foreign key (first: {tuple(broken[0])})"
            )
    bind.exec_driver_sql("PRAGMA foreign_keys=ON")
    if not bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # A no-op inside the migration's transaction: switch it back on when the connection
        # returns to its pool (rolled back by then), so the application gets it enforced.
        bind.connection.info[_RESTORE] = True
        if not event.contains(bind.engine.pool, "checkin", _restore_foreign_keys):
            event.listen(bind.engine.pool, "checkin", _restore_foreign_keys)


def _restore_foreign_keys(dbapi_connection: Any, connection_record: Any) -> None:
    if connection_record.info.pop(_RESTORE, False) and dbapi_connection is not None:
        dbapi_connection.execute("PRAGMA foreign_keys=ON")


def _sqlite_foreign_keys_off(bind: Connection, target: Target) -> None:
    """Rebuilding drops the old table; with foreign keys enforced, SQLite first deletes its rows,
    firing ON DELETE CASCADE (the children are lost) or failing. The pragma is a no-op
    inside a transaction, so refuse rather than rebuild with it on."""
    bind.exec_driver_sql("PRAGMA foreign_keys=OFF")
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise SnowflakeMigrationError(
            f"cannot rebuild {target.table} for {target.column} on SQLite with foreign keys "
            "enforced (PRAGMA foreign_keys=ON) inside a transaction that has already written: "
            "rebuilding the table would delete its children (ON DELETE CASCADE) or fail. Run "
            "this revision in an alembic upgrade of its own, use "
            "context.configure(transaction_per_migration=True), or execute "
            "'PRAGMA foreign_keys=OFF' on the connection in env.py before "
            "context.begin_transaction()"
        )


def _sqlite_rebuild_tables(
    operations: Operations, target: Target, type_: TypeEngine[Any], *, autoincrement: bool
) -> None:
    # sqlite_autoincrement would render AUTOINCREMENT, which SQLite allows only on a rowid
    # alias (INTEGER PRIMARY KEY): switch it off for the BIGINT table.
    bind = operations.get_bind()
    with operations.batch_alter_table(
        target.table,
        schema=target.schema,
        recreate="always",
        copy_from=_reflected(bind, target.table, target.schema),
        table_kwargs={"sqlite_autoincrement": False},
    ) as batch:
        batch.alter_column(
            target.column,
            type_=type_,
            existing_type=target.info["type"],
            existing_nullable=False,
            autoincrement=autoincrement,
        )
    widened: TypeEngine[Any] = BigInteger() if not autoincrement else Integer()
    for ref in target.references:
        with operations.batch_alter_table(
            ref.table,
            schema=ref.schema,
            recreate="always",
            copy_from=_reflected(bind, ref.table, ref.schema),
        ) as batch:
            batch.alter_column(
                ref.column,
                type_=widened,
                existing_type=ref.existing_type,
                existing_nullable=ref.nullable,
            )


def _reflected(bind: Connection, table: str, schema: str | None) -> Table:
    """The table as batch mode would reflect it, with the ``ON DELETE`` / ``ON UPDATE`` actions
    of foreign keys declared inline (``REFERENCES t (id) ON DELETE CASCADE``), which
    SQLAlchemy's SQLite reflection leaves out and the rebuild would silently drop."""
    reflected = Table(table, MetaData(), schema=schema, autoload_with=bind)
    preparer = bind.dialect.identifier_preparer
    prefix = f"{preparer.quote_schema(schema)}." if schema else ""
    actions: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}
    rows = bind.exec_driver_sql(f"PRAGMA {prefix}foreign_key_list({preparer.quote(table)})")
    grouped: dict[int, list[Any]] = {}
    for row in rows:  # id, seq, table, from, to, on_update, on_delete, match
        grouped.setdefault(row[0], []).append(row)
    for parts in grouped.values():
        parts.sort(key=lambda row: row[1])
        columns = tuple(row[3] for row in parts)
        actions[(parts[0][2], columns)] = (parts[0][6], parts[0][5])
    for constraint in reflected.foreign_key_constraints:
        key = (constraint.referred_table.name, tuple(constraint.column_keys))
        on_delete, on_update = actions.get(key, ("NO ACTION", "NO ACTION"))
        if constraint.ondelete is None and on_delete != "NO ACTION":
            constraint.ondelete = on_delete
        if constraint.onupdate is None and on_update != "NO ACTION":
            constraint.onupdate = on_update
    return reflected
