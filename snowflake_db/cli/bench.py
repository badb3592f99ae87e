"""``snowflake-db bench``: how fast this machine issues IDs, against the layout's physical limit.

The full comparison with other libraries and databases lives in ``benchmarks/`` in the repository;
this command needs nothing beyond the package, so it can be run on a production host.
"""

from __future__ import annotations

import argparse
import time

from ..generator import SnowflakeGenerator
from .ids import add_layout_options, layout_from_args


def _rate_next_id(generator: SnowflakeGenerator, seconds: float) -> float:
    next_id = generator.next_id
    issued = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(10_000):
            next_id()
        issued += 10_000
    return issued / (time.perf_counter() - started)


def _rate_next_ids(generator: SnowflakeGenerator, seconds: float) -> float:
    batch = generator.layout.ids_per_tick * 100
    issued = 0
    elapsed = 0.0
    while elapsed < seconds:
        started = time.perf_counter()
        ids = generator.next_ids(batch)
        elapsed += time.perf_counter() - started
        issued += len(ids)
        del ids  # freeing the list is the caller's cost, not the generator's: keep it untimed
    return issued / elapsed


def _bench(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    limit = layout.max_ids_per_second
    with SnowflakeGenerator(args.worker_id, layout=layout) as generator:
        rows = [
            ("next_id()", _rate_next_id(generator, args.seconds)),
            ("next_ids(n)", _rate_next_ids(generator, args.seconds)),
        ]
    print(f"{'method':<12}  {'IDs/s':>12}  {'of physical limit':>17}")
    for name, rate in rows:
        print(f"{name:<12}  {rate:>12,.0f}  {rate / limit:>17.1%}")
    print(f"physical limit of the layout: {limit:,} IDs/s per worker")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = subparsers.add_parser("bench", help="measure ID generation speed on this machine")
    bench.add_argument("--seconds", type=float, default=1.0, help="per measurement (default 1)")
    bench.add_argument("--worker-id", type=int, default=0, metavar="W")
    add_layout_options(bench)
    bench.set_defaults(handler=_bench)
