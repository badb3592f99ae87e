"""``snowflake-db bench``: how fast this machine issues IDs, against the layout's physical limit.

The full comparison with other libraries and databases lives in ``benchmarks/`` in the repository;
this command needs nothing beyond the package, so it can be run on a production host.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..clock import monotonic
from ..errors import CommandError
from ..generator import SnowflakeGenerator
from .ids import add_layout_options, layout_from_args


def _window(
    generator: SnowflakeGenerator, issue: Callable[[], tuple[int, int]], seconds: float
) -> tuple[float, float]:
    """(IDs per second, share of the physical limit) of ``issue`` (returning how many IDs it
    made and the last one), called for ``seconds``.

    Measured in whole ticks: from the tick of an ID issued just before the window to the last
    tick the window reached, both included. Every ID made in the window lies in those ticks (IDs
    strictly increase), so the share cannot pass 100%. ``next_ids`` fills ticks left unused
    while its caller was busy elsewhere: timing only the calls, not the freeing of each batch
    between them, once counted those IDs against too little time (102% of the limit).
    """
    layout = generator.layout
    first_tick = layout.tick_of(layout.decode(generator.next_id()).timestamp_ms)
    issued = last_id = 0
    deadline = monotonic() + seconds
    while monotonic() < deadline:
        count, last_id = issue()
        issued += count
    last_tick = max(
        layout.tick_of(generator.clock()), layout.tick_of(layout.decode(last_id).timestamp_ms)
    )
    ticks = last_tick - first_tick + 1
    return issued / (ticks * layout.tick_ms / 1000), issued / (ticks * layout.ids_per_tick)


def _next_id_calls(generator: SnowflakeGenerator) -> Callable[[], tuple[int, int]]:
    next_id = generator.next_id
    # At most about 10 ticks' worth per round, so a tiny sequence does not overrun --seconds.
    calls = range(max(1, min(10_000, generator.layout.ids_per_tick * 10)))

    def issue() -> tuple[int, int]:
        for _ in calls:
            last = next_id()
        return len(calls), last

    return issue


def _next_ids_calls(generator: SnowflakeGenerator) -> Callable[[], tuple[int, int]]:
    batch = generator.layout.ids_per_tick * 100

    def issue() -> tuple[int, int]:
        ids = generator.next_ids(batch)
        return len(ids), ids[-1]  # freeing the list falls inside the window, as for a caller

    return issue


def _bench(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    if not args.seconds > 0:
        raise CommandError(f"--seconds {args.seconds} must be above 0")
    with SnowflakeGenerator(args.worker_id, layout=layout) as generator:
        rows = [
            ("next_id()", *_window(generator, _next_id_calls(generator), args.seconds)),
            ("next_ids(n)", *_window(generator, _next_ids_calls(generator), args.seconds)),
        ]
    print(f"{'method':<12}  {'IDs/s':>12}  {'of physical limit':>17}")
    for name, rate, share in rows:
        print(f"{name:<12}  {rate:>12,.0f}  {share:>17.1%}")
    print(f"physical limit of the layout: {layout.max_ids_per_second:,} IDs/s per worker")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = subparsers.add_parser("bench", help="measure ID generation speed on this machine")
    bench.add_argument("--seconds", type=float, default=1.0, help="per measurement (default 1)")
    bench.add_argument("--worker-id", type=int, default=0, metavar="W")
    add_layout_options(bench)
    bench.set_defaults(handler=_bench)
