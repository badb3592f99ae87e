"""``snowflake-db workers list|reap|check``: inspect, tidy and probe the worker-ID lease table.

SQLAlchemy is imported only when a command runs, so ``snowflake-db --help`` works without it.
``check`` is for start-up and readiness probes: exit status 0 when a worker ID can be leased
with the given layout (it is released at once), 1 with a one-line reason when not, 2 for a
mistake in the command line. ``list`` and ``reap`` follow the same rule: 1 when the database
cannot be read (unreachable, no worker tables). Only ``check --create-tables`` may create a
SQLite file; the others refuse a missing one (status 2) instead of leaving an empty file behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from ..errors import AllocatorUnavailableError, CommandError
from ..process import URL_FORMS, WORKER_URL_ENV
from . import EXIT_FAILURE
from .ids import add_layout_options, layout_from_args
from .urls import require_sqlite_file, resolve_url

if TYPE_CHECKING:
    from ..worker import TableWorkerAllocator


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    workers = subparsers.add_parser(
        "workers",
        help="list, reap or check worker-ID leases in the database table",
        description="List, reap or check worker-ID leases in the control database's table. "
        "--url (or "
        f"${WORKER_URL_ENV}) takes {URL_FORMS}; postgres:// and mysql:// URLs, as platforms "
        "spell DATABASE_URL, use the installed driver.",
    )
    actions = workers.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="every worker slot: holder, host, pid, lease expiry, high-water mark, state"
    )
    _add_table_options(listing)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=_list)
    reap = actions.add_parser(
        "reap", help="clear leases the database clock says have expired (never live ones)"
    )
    _add_table_options(reap)
    reap.add_argument(
        "--prune-registrations",
        type=float,
        default=None,
        metavar="DAYS",
        help="also delete registration rows older than DAYS that no slot refers to",
    )
    reap.add_argument("--json", action="store_true", help="print JSON instead of text")
    reap.set_defaults(handler=_reap)
    check = actions.add_parser(
        "check",
        help="lease a worker ID with this layout and release it at once: exit 0 if that "
        "works, 1 with a one-line reason if not (start-up and readiness probes)",
    )
    _add_table_options(check)
    check.add_argument(
        "--create-tables",
        action="store_true",
        help="create missing worker tables, as an application's first lease would (default: "
        "report them missing)",
    )
    add_layout_options(check)
    check.set_defaults(handler=_check)


def _add_table_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=None,
        help=f"the control database: {URL_FORMS}; postgres:// and mysql:// use the installed "
        f"driver (psycopg or psycopg2, PyMySQL or mysqlclient); SQLAlchemy URLs with a driver "
        f"(postgresql+psycopg://) work too (default: ${WORKER_URL_ENV})",
    )
    parser.add_argument("--slots-table", default=None, metavar="NAME")
    parser.add_argument("--registrations-table", default=None, metavar="NAME")
    parser.add_argument("--schema", default=None, metavar="NAME")


def _allocator(
    args: argparse.Namespace, *, create_tables: bool = False
) -> TableWorkerAllocator:
    if args.url:
        url = resolve_url(args.url, "--url ")
    elif os.environ.get(WORKER_URL_ENV, "").strip():
        url = resolve_url(os.environ[WORKER_URL_ENV], f"{WORKER_URL_ENV}=")
    else:
        raise CommandError(f"give --url URL (or set {WORKER_URL_ENV})")
    if not create_tables:
        origin = "--url " if args.url else f"{WORKER_URL_ENV}="
        hint = " or pass --create-tables" if getattr(args, "action", "") == "check" else ""
        require_sqlite_file(url, origin, hint)
    try:
        from ..worker import DEFAULT_REGISTRATIONS_TABLE, DEFAULT_SLOTS_TABLE, TableWorkerAllocator
    except ImportError as error:
        raise CommandError(str(error)) from None
    try:
        return TableWorkerAllocator(
            url,
            slots_table=args.slots_table or DEFAULT_SLOTS_TABLE,
            registrations_table=args.registrations_table or DEFAULT_REGISTRATIONS_TABLE,
            schema=args.schema,
            create_tables=create_tables,
        )
    except ModuleNotFoundError as error:
        raise CommandError(str(error)) from None


def _explain_missing_tables(
    allocator: TableWorkerAllocator, error: AllocatorUnavailableError
) -> Exception:
    """A database without the worker tables: say where they come from (not an API option)."""
    from sqlalchemy import inspect

    from ..worker._engine import safe_url_text

    tables = allocator.store.tables
    try:
        with allocator._engine.connect() as connection:
            inspector = inspect(connection)
            missing = [t.name for t in tables if not inspector.has_table(t.name, t.schema)]
    except Exception:
        return error  # the database itself is the problem: the allocator's message says so
    if not missing:
        return error
    if missing == [tables.layout.name]:
        return CommandError(
            f"the worker tables in {safe_url_text(allocator.url)} have no layout table "
            f"({tables.layout.name}): they predate it; add it with a migration "
            "(manage.py migrate snowflake_db, or recreate them with "
            "op.create_snowflake_worker_tables()), or let the first application process "
            "(create_tables=True) create it"
        )
    return CommandError(
        f"no worker tables ({', '.join(missing)}) in {safe_url_text(allocator.url)}: no process "
        "has leased a worker ID there yet, or this is not the control database (check the URL, "
        "--schema, --slots-table); a migration (snowflake_db.alembic, the snowflake_db Django "
        "app) or the first process that leases a worker ID creates them"
    )


def fail(command: str, message: object) -> int:
    """The database let a well-formed command down: one line on stderr, exit status 1."""
    print(f"snowflake-db {command}: {' '.join(str(message).split())}", file=sys.stderr)
    return EXIT_FAILURE


def _list(args: argparse.Namespace) -> int:
    from ..worker import _health as health

    allocator = _allocator(args)
    try:
        rows = allocator.workers()
    except AllocatorUnavailableError as error:
        return fail("workers list", _explain_missing_tables(allocator, error))
    finally:
        allocator.close()
    records = health.slot_records(rows)
    if args.json:
        print(json.dumps(records, indent=2))
    else:
        print("\n".join(health.slot_table(records)))
    return 0


def _reap(args: argparse.Namespace) -> int:
    days = args.prune_registrations
    if days is not None and not days >= 0:
        raise CommandError(f"--prune-registrations must be a number of days >= 0, got {days}")
    allocator = _allocator(args)
    try:
        reaped = allocator.reap()
        pruned = None if days is None else allocator.prune_registrations(days * 86_400)
    except AllocatorUnavailableError as error:
        return fail("workers reap", _explain_missing_tables(allocator, error))
    finally:
        allocator.close()
    if args.json:
        print(json.dumps({"reaped": reaped, "pruned_registrations": pruned}))
        return 0
    if reaped:
        print(f"reaped {len(reaped)} expired lease(s): worker IDs {', '.join(map(str, reaped))}")
    else:
        print("no expired leases")
    if pruned is not None:
        print(f"pruned {pruned} registration row(s) older than {days:g} day(s)")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ..worker import _health as health

    layout = layout_from_args(args)
    allocator = _allocator(args, create_tables=args.create_tables)
    try:
        result = health.check(allocator, layout)
        message = result.message
        if isinstance(result.error, AllocatorUnavailableError):
            explained = _explain_missing_tables(allocator, result.error)
            if explained is not result.error:
                message = f"{explained}; or pass --create-tables"
    finally:
        allocator.close()
    if result.ok:
        print(message)
        return 0
    return fail("workers check", message)
