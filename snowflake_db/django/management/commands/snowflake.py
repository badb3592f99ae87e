"""``manage.py snowflake``: decode IDs, list, reap and check worker leases, report health.

::

    manage.py snowflake decode 912113250819136652 [--json]
    manage.py snowflake leases [--json]      # every worker slot on the control database
    manage.py snowflake reap [--dry-run]     # free leases the database clock says expired
    manage.py snowflake check                # lease a worker ID and release it (probes)
    manage.py snowflake doctor [--json]      # layout, its end, clock skew, slots, partitions
    manage.py snowflake widen [--dry-run]    # keys migrations left narrow (check E010)

Leases are read and reaped by :class:`snowflake_db.worker.TableWorkerAllocator` itself,
judged by the database clock, with the tables and options of ``SNOWFLAKE_DB`` (its layout and
``ALLOCATOR_OPTIONS``). ``check`` and ``doctor`` print what ``snowflake-db workers check`` and
``snowflake-db doctor`` print (both come from :mod:`snowflake_db.worker._health`); they fail
(exit status 1) when the lease cannot be taken or a problem is found. Slot rows are never
deleted: they carry the high-water marks that make reusing a worker ID safe.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ....clock import wall_clock
from ....errors import SnowflakeError
from ...conf import get_settings
from ...worker import control_allocator


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


class Command(BaseCommand):
    help = "Decode Snowflake IDs, list worker leases, reap expired leases."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        decode = sub.add_parser("decode", help="decode IDs with the SNOWFLAKE_DB layout")
        decode.add_argument("ids", nargs="+")
        decode.add_argument("--json", action="store_true")
        leases = sub.add_parser("leases", help="list worker slots on the control database")
        leases.add_argument("--json", action="store_true")
        leases.add_argument("--database", help="alias (default: CONTROL_DATABASE)")
        reap = sub.add_parser("reap", help="free leases that expired by the database clock")
        reap.add_argument("--dry-run", action="store_true")
        reap.add_argument("--database", help="alias (default: CONTROL_DATABASE)")
        check_help = "lease a worker ID with the SNOWFLAKE_DB layout and release it"
        check = sub.add_parser("check", help=check_help)
        check.add_argument("--database", help="alias (default: CONTROL_DATABASE)")
        doctor_help = "layout recorded vs. configured, its end, clock skew, slots, partitions"
        doctor = sub.add_parser("doctor", help=doctor_help)
        doctor.add_argument("--database", help="alias (default: CONTROL_DATABASE)")
        doctor.add_argument(
            "--partitioned-table",
            action="append",
            default=[],
            help="a PostgreSQL table partitioned by time on its ID; repeat for more",
        )
        doctor.add_argument(
            "--partitions-database", help="alias holding those tables (default: default)"
        )
        doctor.add_argument("--json", action="store_true")
        widen_help = ("widen the keys that check snowflake_db.E010 reports (migrations that "
                      "follow DEFAULT_AUTO_FIELD leave them narrow), with their foreign keys")
        widen = sub.add_parser("widen", help=widen_help)
        widen.add_argument("--database", default="default", help="alias (default: default)")
        widen.add_argument("--dry-run", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "decode":
            self._decode(options["ids"], as_json=options["json"])
        elif action == "leases":
            self._leases(options.get("database"), as_json=options["json"])
        elif action == "check":
            self._check(options.get("database"))
        elif action == "doctor":
            self._doctor(
                options.get("database"),
                tables=options["partitioned_table"],
                partitions_alias=options.get("partitions_database") or "default",
                as_json=options["json"],
            )
        elif action == "widen":
            self._widen(options["database"], dry_run=options["dry_run"])
        else:
            self._reap(options.get("database"), dry_run=options["dry_run"])

    def _widen(self, alias: str, *, dry_run: bool) -> None:
        from ...checks import unfixed_narrow_columns
        from ...widening import widen_columns

        columns = unfixed_narrow_columns(connections[alias])
        if not columns:
            self.stdout.write(f"every Snowflake column on {alias!r} is 64-bit (or a pending "
                              "migration widens it)")
            return
        widen_columns(alias, columns, dry_run=dry_run, stdout=self.stdout)

    def _decode(self, raw_ids: list[str], *, as_json: bool) -> None:
        """What ``snowflake-db parse`` prints (one formatter), with the SNOWFLAKE_DB layout."""
        from ....cli.decoded import decode_ids, json_text, suspicions, table_lines

        layout = get_settings().layout
        try:
            rows = decode_ids(layout, raw_ids)
        except ValueError as error:  # includes SnowflakeError's InvalidIdError
            raise CommandError(f"cannot decode: {error}") from None
        self.stdout.write(json_text(rows) if as_json else "\n".join(table_lines(rows)))
        for warning in suspicions(layout, rows, wall_clock()):
            self.stderr.write(f"warning: {warning} (see SNOWFLAKE_DB's LAYOUT and EPOCH)")

    def _allocator(self, alias: str | None) -> Any:
        try:
            return control_allocator(alias)
        except (SnowflakeError, ImportError, NotImplementedError) as error:
            raise CommandError(str(error)) from None

    def _leases(self, alias: str | None, *, as_json: bool) -> None:
        allocator = self._allocator(alias)
        try:
            slots = allocator.workers()
        except SnowflakeError as error:
            raise CommandError(str(error)) from None
        finally:
            allocator.close()
        if as_json:
            self.stdout.write(
                json.dumps(
                    [
                        {
                            "worker_id": slot.worker_id,
                            "state": slot.state,
                            "hostname": slot.hostname,
                            "pid": slot.pid,
                            "label": slot.label,
                            "acquired_at_ms": slot.acquired_at_ms,
                            "renewed_at_ms": slot.renewed_at_ms,
                            "expires_at_ms": slot.expires_at_ms,
                            "high_water_ms": slot.high_water_ms,
                            "db_now_ms": slot.db_now_ms,
                        }
                        for slot in slots
                    ]
                )
            )
            return
        if not slots:
            self.stdout.write("no worker slots yet")
            return
        self.stdout.write(
            f"{'worker':>6}  {'state':<8}  {'holder':<32}  {'expires (UTC)':<29}  high-water"
        )
        for slot in slots:
            holder = f"{slot.hostname or '-'}:{slot.pid}" if slot.pid is not None else "-"
            if slot.label:
                holder = slot.label
            self.stdout.write(
                f"{slot.worker_id:>6}  {slot.state:<8}  {holder[:32]:<32}  "
                f"{_when(slot.expires_at_ms):<29}  {_when(slot.high_water_ms or None)}"
            )

    def _reap(self, alias: str | None, *, dry_run: bool) -> None:
        allocator = self._allocator(alias)
        try:
            if dry_run:
                expired = [s.worker_id for s in allocator.workers() if s.state == "expired"]
                self.stdout.write(
                    f"would reap {len(expired)} expired lease(s): "
                    f"{', '.join(map(str, expired)) or '-'}"
                )
                return
            reaped = allocator.reap()
        except SnowflakeError as error:
            raise CommandError(str(error)) from None
        finally:
            allocator.close()
        self.stdout.write(
            f"reaped {len(reaped)} expired lease(s): {', '.join(map(str, reaped)) or '-'}"
        )

    def _check(self, alias: str | None) -> None:
        from ....worker import _health as health

        allocator = self._allocator(alias)
        try:
            result = health.check(allocator, get_settings().layout)
        finally:
            allocator.close()
        if not result.ok:
            raise CommandError(result.message)
        self.stdout.write(result.message)

    def _doctor(
        self, alias: str | None, *, tables: list[str], partitions_alias: str, as_json: bool
    ) -> None:
        from ....sharding.partitioning import partition_bounds
        from ....worker import _health as health

        if partitions_alias not in connections:
            raise CommandError(
                f"--partitions-database {partitions_alias!r} is not a database alias"
            )

        def read_partitions(table: str) -> list[tuple[str, int, int]]:
            connection = connections[partitions_alias]
            if connection.vendor != "postgresql":
                raise CommandError(
                    f"partitioning by time is PostgreSQL's; alias {partitions_alias!r} is "
                    f"{connection.vendor} (give --partitions-database)"
                )
            return partition_bounds(connection, table)

        allocator = self._allocator(alias)
        try:
            report = health.doctor(
                allocator,
                get_settings().layout,
                partitioned_tables=tables,
                read_partitions=read_partitions,
            )
        except SnowflakeError as error:
            raise CommandError(str(error)) from None
        finally:
            allocator.close()
        if as_json:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self.stdout.write("\n".join(report.lines()))
        problems = report.problems()
        if problems:
            raise CommandError(f"{len(problems)} problem(s): {problems[0]}")
