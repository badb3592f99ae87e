"""``snowflake-db doctor``: the worker tables' health in one report (writes nothing).

The recorded layout against the given one, when the layout runs out, this host's clock skew
against the control database, the worker IDs by state and, with ``--partitioned-table``, how far
ahead the time partitions reach. Exit status 0 when nothing is wrong (warnings allowed), 1 with
the problems listed (or one line when the database cannot be read), 2 for a mistake in the
command line (as every command: see :mod:`snowflake_db.cli`). The report itself is
:mod:`snowflake_db.worker._health`'s, shared with ``manage.py snowflake doctor``.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ..errors import AllocatorUnavailableError, ShardingError
from .ids import add_layout_options, layout_from_args
from .urls import resolve_url
from .workers import _add_table_options, _allocator, _explain_missing_tables, fail

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = subparsers.add_parser(
        "doctor",
        help="report the worker tables' health: layout, its end date, clock skew, free "
        "worker IDs, partitions ahead",
        description="Read the control database and report: the layout the worker tables "
        "record against the one given (the layout options), the date the layout's time bits "
        "run out, this host's clock skew against the database, worker IDs by state, and how "
        "far ahead time-partitioned tables reach. Writes nothing. Exit status 0: no problem; "
        "1: problems (listed); 2: a mistake in the command line.",
    )
    _add_table_options(doctor)
    doctor.add_argument(
        "--partitioned-table",
        action="append",
        default=[],
        metavar="TABLE",
        help="a table partitioned by time on its ID (PostgreSQL); repeat for more",
    )
    doctor.add_argument(
        "--partitions-url",
        default=None,
        metavar="URL",
        help="the database holding the partitioned tables (default: the control database)",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_layout_options(doctor)
    doctor.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from ..worker import _health as health

    layout = layout_from_args(args)
    partitions_url = (
        resolve_url(args.partitions_url, "--partitions-url ") if args.partitions_url else None
    )
    allocator = _allocator(args)
    try:
        reader = _PartitionReader(partitions_url or allocator.url)
        try:
            report = health.doctor(
                allocator,
                layout,
                partitioned_tables=args.partitioned_table,
                read_partitions=reader,
            )
        finally:
            reader.close()
    except AllocatorUnavailableError as error:
        return fail("doctor", _explain_missing_tables(allocator, error))
    finally:
        allocator.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 1 if report.problems() else 0


class _PartitionReader:
    """Range partitions of a table, read from the catalog over one engine made on first use."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self._engine: Engine | None = None

    def __call__(self, table: str) -> list[tuple[str, int, int]]:
        from sqlalchemy import create_engine

        from ..sharding.partitioning import partition_bounds

        if self.url.get_backend_name() != "postgresql":
            raise ShardingError(
                f"partitioning by time is PostgreSQL's; {self.url.get_backend_name()} has none "
                "(give --partitions-url for the PostgreSQL database holding the table)"
            )
        if self._engine is None:
            self._engine = create_engine(self.url)
        with self._engine.connect() as connection:
            return partition_bounds(connection, table)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
