"""``snowflake-db parse``, ``generate`` and ``layout``: work with IDs and layouts offline."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

from ..clock import wall_clock
from ..errors import CommandError
from ..generator import SnowflakeGenerator
from ..layout import DEFAULT_EPOCH_MS, LAYOUT_FIELDS, USABLE_BITS, Layout, to_unix_ms
from ..process import WORKER_ID_ENV
from .decoded import decode_ids, json_text, suspicions, table_lines

_MAX_GENERATE = 10_000_000


#: (name, minimum, maximum) of each integer layout option; checked here so that a message names
#: the option as typed and its real limits.
_LAYOUT_INT_OPTIONS = (
    ("time_bits", 1, USABLE_BITS),
    ("worker_bits", 0, USABLE_BITS),
    ("sequence_bits", 0, USABLE_BITS),
    ("shard_bits", 0, USABLE_BITS),
    ("datacenter_bits", 0, USABLE_BITS),
    ("tick_ms", 1, None),
)


def add_layout_options(parser: argparse.ArgumentParser, *, title: str | None = None,
                       unset: bool = False) -> None:
    """The options describing a layout, shared by every command that needs one. ``unset``:
    an option not given stays ``None`` (:func:`layout_given` says whether any was), for a
    command that can take the layout from elsewhere."""
    group = parser.add_argument_group(
        title or "layout (defaults: 41/10/12 bits, epoch 2020-01-01)")
    defaults = Layout().as_kwargs()
    for name, default in defaults.items():
        if name == "epoch_ms":
            group.add_argument(
                "--epoch",
                default=None if unset else str(DEFAULT_EPOCH_MS),
                help="Unix milliseconds, or an ISO 8601 date or time; without a zone it means "
                "UTC (2020-01-01 is 2020-01-01T00:00:00Z)",
            )
        else:
            group.add_argument(_option(name), type=int, default=None if unset else default,
                               metavar="MS" if name == "tick_ms" else "N")


def layout_given(args: argparse.Namespace) -> bool:
    """Whether any layout option was given (options added with ``unset=True``)."""
    return any(getattr(args, name) is not None
               for name in (*LAYOUT_FIELDS, "epoch") if name != "epoch_ms")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def layout_from_args(args: argparse.Namespace) -> Layout:
    defaults = {**Layout().as_kwargs(), "epoch": str(DEFAULT_EPOCH_MS)}
    for name, default in defaults.items():  # options added with unset=True, not given
        if hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, default)
    for name, minimum, maximum in _LAYOUT_INT_OPTIONS:
        value = getattr(args, name)
        if value < minimum:
            raise CommandError(f"{_option(name)} {value} is below the minimum {minimum}")
        if maximum is not None and value > maximum:
            raise CommandError(f"{_option(name)} {value} exceeds the maximum {maximum}")
    epoch_ms = parse_epoch(args.epoch)
    now_ms = wall_clock()
    if epoch_ms < 0:
        raise CommandError(
            f"--epoch {args.epoch} lies before 1970-01-01T00:00:00Z; give Unix milliseconds "
            "from 0 or an ISO date such as 2020-01-01"
        )
    if epoch_ms > now_ms:
        raise CommandError(
            f"--epoch {args.epoch} must not lie in the future (now is "
            f"{_iso(now_ms)}): IDs count time from the epoch"
        )
    fields = {name: getattr(args, name) for name in LAYOUT_FIELDS if name != "epoch_ms"}
    return Layout(**fields, epoch_ms=epoch_ms)


def _iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_epoch(text: str) -> int:
    """Unix milliseconds from ``--epoch``: an integer, or ISO 8601 where no zone means UTC."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise CommandError(
            f"--epoch {text!r} is neither Unix milliseconds nor an ISO 8601 date or time "
            "(e.g. 2020-01-01 or 2020-01-01T00:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return to_unix_ms(moment, "--epoch")


def _id_texts(arguments: list[str]) -> Iterator[str]:
    """The IDs given, ``-`` standing for whitespace-separated IDs read from stdin."""
    for argument in arguments:
        if argument == "-":
            for line in sys.stdin:
                yield from line.split()
        else:
            yield argument


def _parse(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    rows = decode_ids(layout, _id_texts(args.ids))
    if not rows:
        raise CommandError("no ID given (on stdin for 'parse -')")
    print(json_text(rows) if args.json else "\n".join(table_lines(rows)))
    sys.stdout.flush()  # the table before the warnings when both go to a terminal
    for warning in suspicions(layout, rows, wall_clock()):
        print(
            f"snowflake-db parse: warning: {warning} (see --epoch and the --*-bits options)",
            file=sys.stderr,
        )
    return 0


def _worker_id(args: argparse.Namespace, layout: Layout) -> int:
    """``--worker-id``, else ``$SNOWFLAKE_WORKER_ID``; a message names whichever was used."""
    if args.worker_id is not None:
        if not 0 <= args.worker_id <= layout.max_worker_id:
            raise CommandError(f"--worker-id {args.worker_id} is outside 0..{layout.max_worker_id}"
                               f" ({layout.worker_bits} worker bits)")
        return int(args.worker_id)
    raw = os.environ.get(WORKER_ID_ENV, "").strip()
    if not raw:
        raise CommandError(f"give --worker-id W (or set {WORKER_ID_ENV})")
    try:
        worker_id = int(raw)
    except ValueError:
        raise CommandError(
            f"{WORKER_ID_ENV}={raw!r} is not an integer; set it to 0..{layout.max_worker_id} "
            "or pass --worker-id W"
        ) from None
    if not 0 <= worker_id <= layout.max_worker_id:
        raise CommandError(
            f"{WORKER_ID_ENV}={worker_id} is outside 0..{layout.max_worker_id} "
            f"({layout.worker_bits} worker bits); "
            "set it within that range or pass --worker-id W"
        )
    return worker_id


def _generate(args: argparse.Namespace) -> int:
    if not 1 <= args.n <= _MAX_GENERATE:
        raise CommandError(f"-n {args.n} is outside 1..{_MAX_GENERATE:,}")
    layout = layout_from_args(args)
    generator = SnowflakeGenerator(_worker_id(args, layout), layout=layout)
    sys.stdout.write("\n".join(map(str, generator.next_ids(args.n))))
    sys.stdout.write("\n")
    return 0


def _layout(args: argparse.Namespace) -> int:
    description = layout_from_args(args).describe()
    if args.json:
        json.dump(description, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    width = max(map(len, description))
    for key, value in description.items():
        shown = f"{value:,}" if isinstance(value, int) and key != "epoch_ms" else value
        print(f"{key.ljust(width)}  {shown}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parse = subparsers.add_parser("parse", help="decode IDs into time, worker, sequence, shard")
    parse.add_argument(
        "ids", nargs="+", metavar="ID", help="decimal IDs; - reads IDs from stdin"
    )
    parse.add_argument("--json", action="store_true", help="JSON output (IDs as strings)")
    add_layout_options(parse)
    parse.set_defaults(handler=_parse)

    generate = subparsers.add_parser(
        "generate",
        help="print new IDs for a static worker ID (ad hoc: never run two at once "
        "with the same worker ID)",
    )
    generate.add_argument("-n", type=int, default=1, help="how many IDs (default 1)")
    generate.add_argument(
        "--worker-id", type=int, default=None, metavar="W", help=f"default: ${WORKER_ID_ENV}"
    )
    add_layout_options(generate)
    generate.set_defaults(handler=_generate)

    layout = subparsers.add_parser("layout", help="show a layout's bits, capacity and end date")
    layout.add_argument("--json", action="store_true")
    add_layout_options(layout)
    layout.set_defaults(handler=_layout)
