"""``snowflake-db parse``, ``generate`` and ``layout``: work with IDs and layouts offline."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from ..errors import InvalidIdError
from ..generator import SnowflakeGenerator
from ..layout import DEFAULT_EPOCH_MS, Layout, to_unix_ms
from . import CommandError

_MAX_GENERATE = 10_000_000


def add_layout_options(parser: argparse.ArgumentParser) -> None:
    """The options describing a layout, shared by every command that needs one."""
    group = parser.add_argument_group("layout (defaults: 41/10/12 bits, epoch 2020-01-01)")
    defaults = Layout()
    for name in ("time_bits", "worker_bits", "sequence_bits", "shard_bits", "datacenter_bits"):
        group.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name), metavar="N"
        )
    group.add_argument(
        "--epoch",
        default=str(DEFAULT_EPOCH_MS),
        help="ISO 8601 time with a zone (e.g. 2020-01-01T00:00:00Z) or Unix milliseconds",
    )
    group.add_argument("--tick-ms", type=int, default=defaults.tick_ms, metavar="MS")


def layout_from_args(args: argparse.Namespace) -> Layout:
    return Layout(
        time_bits=args.time_bits,
        worker_bits=args.worker_bits,
        sequence_bits=args.sequence_bits,
        shard_bits=args.shard_bits,
        datacenter_bits=args.datacenter_bits,
        epoch_ms=_parse_epoch(args.epoch),
        tick_ms=args.tick_ms,
    )


def _parse_epoch(text: str) -> int:
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(
            f"--epoch {text!r} is neither Unix milliseconds nor an ISO 8601 time"
        ) from None
    return to_unix_ms(moment, "--epoch")


def _parse_id_text(text: str) -> int:
    stripped = text.strip()
    if not stripped.lstrip("-").isdigit():
        raise InvalidIdError(f"{text!r} is not a decimal integer ID")
    return int(stripped)


def _parse(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    decoded: list[dict[str, Any]] = []
    for text in args.ids:
        part = layout.decode(_parse_id_text(text))
        row: dict[str, Any] = {
            "id": str(part.id) if args.json else part.id,
            "timestamp_ms": part.timestamp_ms,
            "datetime": part.datetime.isoformat(),
            "worker_id": part.worker_id,
            "sequence": part.sequence,
            "shard": part.shard,
        }
        if part.datacenter_id is not None:
            row["datacenter_id"] = part.datacenter_id
            row["machine_id"] = part.machine_id
        decoded.append(row)
    if args.json:
        # IDs as strings: JSON consumers such as JavaScript lose precision above 2**53.
        json.dump(decoded, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(decoded)
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))


def _generate(args: argparse.Namespace) -> int:
    if not 1 <= args.n <= _MAX_GENERATE:
        raise CommandError(f"-n {args.n} is outside 1..{_MAX_GENERATE:,}")
    layout = layout_from_args(args)
    generator = SnowflakeGenerator(args.worker_id, layout=layout)
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
    parse.add_argument("ids", nargs="+", metavar="ID")
    parse.add_argument("--json", action="store_true", help="JSON output (IDs as strings)")
    add_layout_options(parse)
    parse.set_defaults(handler=_parse)

    generate = subparsers.add_parser(
        "generate",
        help="print new IDs for a static worker ID (ad hoc: never run two at once "
        "with the same worker ID)",
    )
    generate.add_argument("-n", type=int, default=1, help="how many IDs (default 1)")
    generate.add_argument("--worker-id", type=int, required=True, metavar="W")
    add_layout_options(generate)
    generate.set_defaults(handler=_generate)

    layout = subparsers.add_parser("layout", help="show a layout's bits, capacity and end date")
    layout.add_argument("--json", action="store_true")
    add_layout_options(layout)
    layout.set_defaults(handler=_layout)
