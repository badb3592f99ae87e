"""``snowflake-db shards init|show|plan|move``: the shard map in the control database and online
moves of logical shards between two servers of the same backend (PostgreSQL or MariaDB).

Targets are given as ``--target NAME=URL`` on every call and never stored (the control
database holds names only; URLs carry passwords). ``move`` journals every step in the control
database, so ``move --resume ID`` continues a move whose mover died and ``move --abort ID``
undoes one that has not flipped. Exit status 2 with one line for a mistake in the command
(nothing changed), 1 when a started move stopped (resume or abort it), 0 when done.

The functions ``init``, ``show``, ``plan`` and ``move`` are shared with ``manage.py snowflake
shards`` (Django names targets by ``DATABASES`` alias).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CommandError, SnowflakeError
from ..process import WORKER_URL_ENV
from . import EXIT_FAILURE
from .ids import add_layout_options, layout_from_args, layout_given
from .urls import resolve_url

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ..layout import Layout

Write = Callable[[str], object]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    shards = subparsers.add_parser(
        "shards",
        help="the shard map in the control database; move logical shards online",
        description="Initialise and show the shard map in the control database, plan and run "
        "online moves of logical shards between two servers of the same backend (PostgreSQL "
        "with wal_level = logical, or MariaDB). Targets are --target NAME=URL, never stored.",
    )
    actions = shards.add_subparsers(dest="action", required=True, metavar="ACTION")
    init_ = actions.add_parser("init", help="create the map's tables and place every logical "
                               "shard (again: registers new targets, moves nothing)")
    _control_option(init_)
    _target_option(init_)
    init_.add_argument("--assign", action="append", default=[], metavar="NAME",
                       help="targets the logical shards are spread over at first (round robin; "
                       "default: every --target); the others are registered, empty")
    add_layout_options(init_, unset=True, title="layout (the first time; run again without "
                       "them, the map's own; defaults: 41/10/12 bits, epoch 2020-01-01)")
    init_.set_defaults(handler=_init_command, command_path="shards init")
    show = actions.add_parser("show", help="the map: version, shards per target, moves")
    _control_option(show)
    show.add_argument("--move", type=int, default=None, metavar="ID",
                      help="show this move and its journal")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_show_command, command_path="shards show")
    plan_ = actions.add_parser("plan", help="check a move without changing anything, or "
                               "propose the fewest moves that balance the shards")
    _mover_options(plan_)
    plan_.add_argument("--shard", type=int, default=None, metavar="K")
    plan_.add_argument("--to", default=None, metavar="NAME")
    plan_.add_argument("--balance", action="store_true",
                       help="propose moves spreading the shards evenly over every --target")
    plan_.add_argument("--json", action="store_true")
    plan_.set_defaults(handler=_plan_command, command_path="shards plan")
    move_ = actions.add_parser("move", help="move a logical shard online (or resume or abort "
                               "a move)")
    _mover_options(move_)
    move_.add_argument("--shard", type=int, default=None, metavar="K")
    move_.add_argument("--to", default=None, metavar="NAME")
    which = move_.add_mutually_exclusive_group()
    which.add_argument("--resume", type=int, default=None, metavar="ID",
                       help="continue move ID from its last journaled step")
    which.add_argument("--abort", type=int, default=None, metavar="ID",
                       help="undo move ID (only before its flip)")
    which.add_argument("--dry-run", action="store_true",
                       help="run every check and print the plan; change nothing")
    move_.add_argument("--force", action="store_true",
                       help="with --resume/--abort: take the move over although its mover's "
                       "lease has not lapsed (only when that mover is gone for sure)")
    move_.add_argument("--terminate-blockers", action="store_true",
                       help="end sessions whose open write transactions keep the fence's "
                       "lock from being granted (their transactions roll back)")
    move_.set_defaults(handler=_move_command, command_path="shards move")


def _control_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--control", default=None, metavar="URL",
                        help=f"the control database (default: ${WORKER_URL_ENV})")
    parser.add_argument("--schema", default=None, metavar="NAME")


def _target_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", action="append", default=[], metavar="NAME=URL",
                        help="a target server by its map name; repeat for each")


def _mover_options(parser: argparse.ArgumentParser) -> None:
    _control_option(parser)
    _target_option(parser)
    parser.add_argument("--table", action="append", default=[], metavar="NAME",
                        help="a sharded table (schema.table; ID column: NAME:COLUMN, default "
                        "id); repeat, parents first")
    parser.add_argument("--lease-seconds", type=float, default=30.0, metavar="S",
                        help="the mover's lease on the move (renewed while it runs)")
    parser.add_argument("--barrier-timeout", type=float, default=300.0, metavar="S",
                        help="how long to wait for every process to route with the new map")
    parser.add_argument("--slots-table", default=None, metavar="NAME",
                        help="the worker slots table of the control database whose leases the "
                        "move waits for (default snowflake_worker_slots)")
    parser.add_argument("--assume-no-static-workers", action="store_true",
                        help="no process routes with a static worker ID (or without a lease): "
                        "the barrier cannot see such processes, so without this word the move "
                        "stops before deleting the source's rows; resume with it once they "
                        "route with the new map")


# -- argument parsing ----------------------------------------------------------------------------


def _control_url(args: argparse.Namespace) -> URL:
    if args.control:
        return resolve_url(args.control, "--control ")
    if os.environ.get(WORKER_URL_ENV, "").strip():
        return resolve_url(os.environ[WORKER_URL_ENV], f"{WORKER_URL_ENV}=")
    raise CommandError(f"give --control URL (or set {WORKER_URL_ENV})")


def parse_targets(values: Sequence[str]) -> dict[str, URL]:
    """``NAME=URL`` options as ``{name: URL}``; a mistake is a :class:`CommandError`."""
    targets: dict[str, URL] = {}
    for value in values:
        name, sep, url = value.partition("=")
        name = name.strip()
        if not sep or not name or "://" in name or not url.strip():
            raise CommandError(f"--target {value.split('://')[0]!r}... must be NAME=URL")
        if name in targets:
            raise CommandError(f"--target {name} is given twice")
        targets[name] = resolve_url(url.strip(), f"--target {name}=")
    return targets


def parse_tables(values: Sequence[str]) -> list[Any]:
    from ..sharding.moves import MovedTable

    if not values:
        raise CommandError("give the sharded tables: --table NAME (repeat, parents first)")
    tables = []
    for value in values:
        name, _, column = value.partition(":")
        tables.append(MovedTable(name, column or "id"))
    return tables


def _printer(write: Write) -> Callable[[object], object]:
    return lambda event: write(str(event))


def _print(text: str) -> None:
    print(text, flush=True)


# -- the actions, shared with manage.py ----------------------------------------------------------


def init(control: Any, targets: Mapping[str, Any], *, layout: Layout | None,
         assign: Sequence[str], schema: str | None, write: Write) -> None:
    """Create the tables, place the shards on ``assign`` (default: every target) the first
    time, register every target. ``layout`` ``None``: the existing map's, or the default
    layout for a new map."""
    from sqlalchemy.engine import make_url

    from ..layout import Layout
    from ..sharding.shard_map import (
        add_target,
        backend_of,
        control_engine,
        create_shard_map_tables,
        existing_layout,
        init_shard_map,
    )

    if not targets:
        raise CommandError("give at least one --target NAME=URL")
    unknown = [name for name in assign if name not in targets]
    if unknown:
        raise CommandError(f"--assign {unknown[0]} is not one of the --target names "
                           f"({', '.join(targets)})")
    backends = {name: backend_of(make_url(url)) for name, url in targets.items()}
    engine, created = control_engine(control)
    try:
        create_shard_map_tables(engine, schema=schema)
        if layout is None:
            layout = existing_layout(engine, schema=schema) or Layout()
        current = init_shard_map(engine, layout=layout, assignment=list(assign or targets),
                                 backend=backends, schema=schema)
        for name in targets:
            if name not in current.targets:
                add_target(engine, name, backend=backends[name], schema=schema)
        _show_map(engine, schema, write)
    finally:
        if created:
            engine.dispose()


def show(control: Any, *, schema: str | None, move_id: int | None, as_json: bool,
         write: Write) -> None:
    from ..sharding.shard_map import control_engine

    engine, created = control_engine(control)
    try:
        if move_id is not None:
            _show_move(engine, schema, move_id, as_json, write)
        elif as_json:
            write(json.dumps(_map_dict(engine, schema), indent=2))
        else:
            _show_map(engine, schema, write)
    finally:
        if created:
            engine.dispose()


def _map_dict(engine: Any, schema: str | None) -> dict[str, Any]:
    from sqlalchemy import MetaData

    from ..sharding.moves._journal import list_moves
    from ..sharding.shard_map import read_shard_map, shard_map_tables

    current = read_shard_map(engine, schema=schema)
    tables = shard_map_tables(MetaData(), schema=schema)
    return {
        "version": current.version,
        "layout": current.layout.as_kwargs(),
        "targets": {name: {"backend": backend,
                           "shards": sorted(s for s, r in current.rows.items()
                                            if r.target == name)}
                    for name, backend in sorted(current.targets.items())},
        "not_serving": {str(s): r.state for s, r in sorted(current.rows.items())
                        if r.state != "serving"},
        "moves": [{"id": m.id, "shard": m.shard, "source": m.source, "target": m.target,
                   "state": m.state, "flipped_version": m.flipped_version}
                  for m in list_moves(engine, tables, limit=10)],
    }


def _show_map(engine: Any, schema: str | None, write: Write) -> None:
    data = _map_dict(engine, schema)
    count = sum(len(t["shards"]) for t in data["targets"].values())
    write(f"shard map version {data['version']}, {count} logical shards")
    for name, target in data["targets"].items():
        shards = ", ".join(map(str, target["shards"])) or "-"
        write(f"  {name} ({target['backend']}): {len(target['shards'])} shard(s): {shards}")
    for shard, state in data["not_serving"].items():
        write(f"  shard {shard}: {state}")
    for move in data["moves"]:
        write(f"  move {move['id']}: shard {move['shard']} {move['source']} -> "
              f"{move['target']}, {move['state']}")


def _show_move(engine: Any, schema: str | None, move_id: int, as_json: bool,
               write: Write) -> None:
    from sqlalchemy import MetaData

    from ..sharding.moves._journal import read_journal, read_move
    from ..sharding.shard_map import shard_map_tables

    tables = shard_map_tables(MetaData(), schema=schema)
    move = read_move(engine, tables, move_id)
    journal = read_journal(engine, tables, move_id)
    if as_json:
        write(json.dumps({"move": move.__dict__, "journal": [row.__dict__ for row in journal]},
                         indent=2, default=str))
        return
    write(f"move {move.id}: shard {move.shard} {move.source} -> {move.target}, state "
          f"{move.state}" + (f", flipped at version {move.flipped_version}"
                             if move.flipped_version else ""))
    for row in journal:
        write(f"  {row.seq:>3} {row.step:<20} {row.status:<8} {row.detail or ''}")


def mover(control: Any, targets: Mapping[str, Any], tables: Sequence[Any], *,
          schema: str | None, lease_s: float, barrier_timeout_s: float,
          layout: Layout | None = None, assume_no_static_workers: bool = False,
          slots_table: str | None = None) -> Any:
    """A :class:`~snowflake_db.sharding.moves.ShardMover` with the map's layout (or
    ``layout``, checked against the map)."""
    from ..sharding.moves import ShardMover
    from ..sharding.shard_map import control_engine, read_shard_map
    from ..worker import DEFAULT_SLOTS_TABLE

    engine, created = control_engine(control)
    try:
        found = read_shard_map(engine, schema=schema).layout
    finally:
        if created:
            engine.dispose()
    return ShardMover(control, targets, layout=layout or found, tables=tables, schema=schema,
                      lease_s=lease_s, barrier_timeout_s=barrier_timeout_s,
                      assume_no_static_workers=assume_no_static_workers,
                      slots_table=slots_table or DEFAULT_SLOTS_TABLE)


def plan(shard_mover: Any, *, shard: int | None, to: str | None, balance: bool,
         as_json: bool, write: Write) -> None:
    if balance:
        if shard is not None or to is not None:
            raise CommandError("give either --balance or --shard K --to NAME, not both")
        proposals = shard_mover.plan_balance()
        if as_json:
            write(json.dumps([p.__dict__ for p in proposals]))
        else:
            write(f"{len(proposals)} move(s) balance the shards" + (":" if proposals else ""))
            for proposal in proposals:
                write(f"  {proposal}")
        return
    if shard is None or to is None:
        raise CommandError("give --shard K --to NAME (or --balance)")
    result = shard_mover.plan(shard, to)
    write(json.dumps(result.as_dict()) if as_json else str(result))


def move(shard_mover: Any, *, shard: int | None, to: str | None, resume: int | None,
         abort: int | None, dry_run: bool, force: bool, terminate_blockers: bool,
         write: Write) -> int:
    """Run, resume or abort a move; 0 when it ended, 1 when it stopped (one line)."""
    from ..sharding.moves import MoverLeaseLostError, MoveStoppedError

    progress = _printer(write)
    try:
        if resume is not None or abort is not None:
            if shard is not None or to is not None:
                raise CommandError("--resume and --abort take a move ID only, not --shard/--to")
            if abort is not None:
                record = shard_mover.abort(abort, progress=progress, force=force)
            else:
                record = shard_mover.resume(resume, progress=progress, force=force,
                                            terminate_blockers=terminate_blockers)
            write(f"move {record.id}: shard {record.shard} {record.source} -> "
                  f"{record.target}, {record.state}")
            return 0
        if force:
            raise CommandError("--force goes with --resume or --abort")
        if shard is None or to is None:
            raise CommandError("give --shard K --to NAME (or --resume ID / --abort ID)")
        if dry_run:
            write(f"dry run: {shard_mover.move(shard, to, dry_run=True)}")
            return 0
        move_id = shard_mover.move(shard, to, progress=progress,
                                   terminate_blockers=terminate_blockers)
        write(f"move {move_id}: shard {shard} is on {to}, done")
        return 0
    except (MoveStoppedError, MoverLeaseLostError) as error:
        raise MoveStoppedCommandError(" ".join(str(error).split())) from None


class MoveStoppedCommandError(Exception):
    """A move that started and stopped: exit status 1."""


# -- the snowflake-db handlers -------------------------------------------------------------------


def _one_line(error: BaseException) -> CommandError:
    return CommandError(" ".join(str(error).split()))


def _run(action: Callable[[], int | None], command: str) -> int:
    try:
        return int(action() or 0)
    except MoveStoppedCommandError as stopped:
        from .workers import fail

        return fail(command, stopped)
    except CommandError:
        raise
    except SnowflakeError as error:
        raise _one_line(error) from None


def _init_command(args: argparse.Namespace) -> int:
    layout = layout_from_args(args) if layout_given(args) else None
    control, targets = _control_url(args), parse_targets(args.target)
    return _run(lambda: init(control, targets, layout=layout, assign=args.assign,
                             schema=args.schema, write=_print), "shards init")


def _show_command(args: argparse.Namespace) -> int:
    control = _control_url(args)
    return _run(lambda: show(control, schema=args.schema, move_id=args.move,
                             as_json=args.json, write=_print), "shards show")


def _shard_mover(args: argparse.Namespace) -> Any:
    control, targets = _control_url(args), parse_targets(args.target)
    tables = parse_tables(args.table)
    return mover(control, targets, tables, schema=args.schema, lease_s=args.lease_seconds,
                 barrier_timeout_s=args.barrier_timeout,
                 assume_no_static_workers=args.assume_no_static_workers,
                 slots_table=args.slots_table)


def _plan_command(args: argparse.Namespace) -> int:
    def action() -> None:
        with _shard_mover(args) as shard_mover:
            plan(shard_mover, shard=args.shard, to=args.to, balance=args.balance,
                 as_json=args.json, write=_print)
    return _run(action, "shards plan")


def _move_command(args: argparse.Namespace) -> int:
    def action() -> int:
        with _shard_mover(args) as shard_mover:
            return move(shard_mover, shard=args.shard, to=args.to, resume=args.resume,
                        abort=args.abort, dry_run=args.dry_run, force=args.force,
                        terminate_blockers=args.terminate_blockers, write=_print)
    return _run(action, "shards move")


__all__ = [
    "EXIT_FAILURE",
    "MoveStoppedCommandError",
    "init",
    "move",
    "mover",
    "parse_tables",
    "parse_targets",
    "plan",
    "register",
    "show",
]
