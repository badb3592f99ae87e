"""``manage.py snowflake``: decode IDs, list, reap and check worker leases, report health.

::

    manage.py snowflake decode 912113250819136652 [--json]
    manage.py snowflake workers list [--json]     # every worker slot on the control database
    manage.py snowflake workers reap [--dry-run]  # free leases the database clock says expired
    manage.py snowflake workers check             # lease a worker ID and release it (probes)
    manage.py snowflake doctor [--json]      # layout, its end, clock skew, slots, partitions
    manage.py snowflake widen [--dry-run]    # keys migrations left narrow (check E010)
    manage.py snowflake remove-orphaned-tags [--dry-run]   # django-taggit, any through model
    manage.py snowflake shards init|show|plan|move ...      # the shard map, online shard moves

Leases are read and reaped by :class:`snowflake_db.worker.TableWorkerAllocator` itself,
judged by the database clock, with the tables and options of ``SNOWFLAKE_DB`` (its layout and
``ALLOCATOR_OPTIONS``). The ``workers`` verbs are those of ``snowflake-db workers``, with the
same JSON and table (:mod:`snowflake_db.worker._health`); ``leases``, ``reap`` and ``check``
are their older spellings, kept as aliases. ``check`` and ``doctor`` print what
``snowflake-db workers check`` and ``snowflake-db doctor`` print; they fail (exit status 1)
when the lease cannot be taken or a problem is found. Slot rows are never deleted: they carry
the high-water marks that make reusing a worker ID safe.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ....clock import wall_clock
from ....errors import SnowflakeError
from ....metrics import SlotState
from ...conf import get_settings
from ...worker import control_allocator


class Command(BaseCommand):
    help = "Decode Snowflake IDs, list worker leases, reap expired leases."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        decode = sub.add_parser("decode", help="decode IDs with the SNOWFLAKE_DB layout")
        decode.add_argument("ids", nargs="+")
        decode.add_argument("--json", action="store_true")
        workers = sub.add_parser("workers", help="list, reap or check worker-ID leases")
        verbs = workers.add_subparsers(dest="workers_action", required=True)
        for parsers, aliased in ((verbs, False), (sub, True)):
            self._add_worker_verbs(parsers, aliased=aliased)
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
        orphans_help = ("delete the django-taggit tags that no row of any model uses (taggit's "
                        "remove_orphaned_tags sees only taggit's own TaggedItem)")
        orphans = sub.add_parser("remove-orphaned-tags", help=orphans_help)
        orphans.add_argument("--dry-run", action="store_true")
        self._add_shards(sub)

    @staticmethod
    def _add_shards(sub: Any) -> None:
        """``shards init|show|plan|move``: ``snowflake-db shards`` with DATABASES aliases as
        targets (default: SNOWFLAKE_SHARD_ROUTER's TARGETS) and the control alias of the
        worker tables (default: CONTROL_DATABASE)."""
        shards = sub.add_parser("shards", help="the shard map; move logical shards online")
        verbs = shards.add_subparsers(dest="shards_action", required=True)
        parsers = {verb: verbs.add_parser(verb) for verb in ("init", "show", "plan", "move")}
        for verb, parser in parsers.items():
            parser.add_argument("--database", help="control alias (default: CONTROL_DATABASE)")
            if verb != "show":
                parser.add_argument("--target", action="append", default=[], metavar="ALIAS",
                                    help="a DATABASES alias holding shards; repeat "
                                    "(default: SNOWFLAKE_SHARD_ROUTER's TARGETS)")
            if verb in ("plan", "move"):
                parser.add_argument("--table", action="append", default=[], metavar="NAME")
                parser.add_argument("--shard", type=int, default=None)
                parser.add_argument("--to", default=None, metavar="ALIAS")
                parser.add_argument("--lease-seconds", type=float, default=30.0)
                parser.add_argument("--barrier-timeout", type=float, default=300.0)
                parser.add_argument("--assume-no-static-workers", action="store_true")
        parsers["init"].add_argument("--assign", action="append", default=[], metavar="ALIAS")
        parsers["show"].add_argument("--move", type=int, default=None, metavar="ID")
        parsers["show"].add_argument("--json", action="store_true")
        parsers["plan"].add_argument("--balance", action="store_true")
        parsers["plan"].add_argument("--json", action="store_true")
        which = parsers["move"].add_mutually_exclusive_group()
        which.add_argument("--resume", type=int, default=None, metavar="ID")
        which.add_argument("--abort", type=int, default=None, metavar="ID")
        which.add_argument("--dry-run", action="store_true")
        parsers["move"].add_argument("--force", action="store_true")
        parsers["move"].add_argument("--terminate-blockers", action="store_true")

    @staticmethod
    def _add_worker_verbs(parsers: Any, *, aliased: bool) -> None:
        """``workers list|reap|check``; with ``aliased``, the old top-level spellings
        ``leases``, ``reap`` and ``check`` of the same verbs."""
        alias_note = " (alias of workers {})" if aliased else ""
        listing = parsers.add_parser(
            "leases" if aliased else "list",
            help="list worker slots on the control database" + alias_note.format("list"),
        )
        listing.add_argument("--json", action="store_true")
        reap = parsers.add_parser(
            "reap",
            help="free leases that expired by the database clock" + alias_note.format("reap"),
        )
        reap.add_argument("--dry-run", action="store_true")
        check_help = "lease a worker ID with the SNOWFLAKE_DB layout and release it"
        check = parsers.add_parser("check", help=check_help + alias_note.format("check"))
        for parser in (listing, reap, check):
            parser.add_argument("--database", help="alias (default: CONTROL_DATABASE)")

    def execute(self, *args: Any, **options: Any) -> Any:
        """``shards`` skips the system checks: ``shards init`` creates the map the router's
        check (E013) looks for, and a move must run whatever the checks say."""
        if options.get("action") == "shards":
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "workers":
            action = options["workers_action"]
        if action == "list":
            action = "leases"
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
        elif action == "remove-orphaned-tags":
            self._remove_orphaned_tags(dry_run=options["dry_run"])
        elif action == "shards":
            self._shards(options)
        else:
            self._reap(options.get("database"), dry_run=options["dry_run"])

    def _widen(self, alias: str, *, dry_run: bool) -> None:
        from ...checks import unfixed_narrow_columns
        from ...widening import widen_columns

        connection = connections[alias]
        if connection.vendor == "sqlite":
            # https://www.sqlite.org/datatype3.html: an INTEGER column holds up to 8 bytes.
            self.stdout.write(f"every Snowflake column on {alias!r} is 64-bit: SQLite's integer "
                              "columns all hold 64 bits")
            return
        columns = unfixed_narrow_columns(connection)
        if not columns:
            self.stdout.write(f"every Snowflake column on {alias!r} is 64-bit (or a pending "
                              "migration widens it)")
            return
        widen_columns(alias, columns, dry_run=dry_run, stdout=self.stdout)

    def _remove_orphaned_tags(self, *, dry_run: bool) -> None:
        from django.apps import apps

        if not apps.is_installed("taggit"):
            raise CommandError("remove-orphaned-tags: 'taggit' is not in INSTALLED_APPS")
        try:
            from ...taggit import orphaned_tags
        except ImportError as error:  # MissingExtraError: the taggit extra
            raise CommandError(str(error)) from None
        for tags in orphaned_tags():
            label = tags.model._meta.label
            names = sorted(str(name) for name in tags.values_list("name", flat=True))
            if not dry_run:
                tags.filter(name__in=names).delete()
            self.stdout.write(f"{'would remove' if dry_run else 'removed'} {len(names)} "
                              f"orphaned {label}: {', '.join(names) or '-'}")

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
        """What ``snowflake-db workers list`` prints (one listing), for the alias's tables."""
        from ....worker import _health as health

        allocator = self._allocator(alias)
        try:
            slots = allocator.workers()
        except SnowflakeError as error:
            raise CommandError(str(error)) from None
        finally:
            allocator.close()
        records = health.slot_records(slots)
        if as_json:
            self.stdout.write(json.dumps(records, indent=2))
        else:
            self.stdout.write("\n".join(health.slot_table(records)))

    def _reap(self, alias: str | None, *, dry_run: bool) -> None:
        allocator = self._allocator(alias)
        try:
            if dry_run:
                expired = [s.worker_id for s in allocator.workers() if s.state is SlotState.EXPIRED]
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

    def _shards(self, options: dict[str, Any]) -> None:
        """``snowflake-db shards`` (:mod:`snowflake_db.cli.shards`) on DATABASES aliases: a
        mistake is a CommandError (exit 2), a move that stopped exits 1."""
        from ....cli import shards
        from ...worker import sqlalchemy_url

        conf = get_settings()
        verb = options["shards_action"]
        alias = options.get("database") or conf.control_database
        if alias not in connections:
            raise CommandError(f"--database {alias!r} is not a database alias", returncode=2)
        control: Any = (conf.engine_url if conf.engine_url and alias == conf.control_database
                        else sqlalchemy_url(alias))

        def write(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        try:
            if verb == "show":
                shards.show(control, schema=None, move_id=options["move"],
                            as_json=options["json"], write=write)
                return
            targets = {name: sqlalchemy_url(name) for name in self._shard_aliases(options)}
            if verb == "init":
                shards.init(control, targets, layout=conf.layout, assign=options["assign"],
                            schema=None, write=write)
                return
            tables = shards.parse_tables(options["table"])
            with shards.mover(control, targets, tables, schema=None,
                              lease_s=options["lease_seconds"],
                              barrier_timeout_s=options["barrier_timeout"],
                              layout=conf.layout,
                              assume_no_static_workers=options["assume_no_static_workers"],
                              ) as mover:
                if verb == "plan":
                    shards.plan(mover, shard=options["shard"], to=options["to"],
                                balance=options["balance"], as_json=options["json"],
                                write=write)
                else:
                    shards.move(mover, shard=options["shard"], to=options["to"],
                                resume=options["resume"], abort=options["abort"],
                                dry_run=options["dry_run"], force=options["force"],
                                terminate_blockers=options["terminate_blockers"], write=write)
        except shards.MoveStoppedCommandError as error:
            raise CommandError(str(error), returncode=1) from None
        except (SnowflakeError, ImportError) as error:
            raise CommandError(" ".join(str(error).split()), returncode=2) from None

    @staticmethod
    def _shard_aliases(options: dict[str, Any]) -> list[str]:
        aliases = list(options.get("target") or [])
        if not aliases:
            from ...sharding import shard_aliases

            try:
                aliases = list(shard_aliases())
            except Exception as error:
                raise CommandError(
                    f"give --target ALIAS (SNOWFLAKE_SHARD_ROUTER names none: {error})",
                    returncode=2) from None
        unknown = [alias for alias in aliases if alias not in connections]
        if unknown:
            raise CommandError(f"--target {unknown[0]!r} is not a database alias", returncode=2)
        return aliases
