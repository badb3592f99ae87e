"""Public order numbers per second in one thread, against text codes measured in the same run.

Run it with ``.venv/bin/python benchmarks/bench_public_ids.py`` (``--quick`` for a short run,
``--check`` to exit non-zero when the target from DESIGN.md is missed: at least 50,000 encodes
and 50,000 decodes per second, so a page of 100 orders costs under 2 ms). Contenders, all on the
same Snowflake IDs, interleaved round by round (background load hits all alike), best round:

* ``PublicIdCodec`` (FF1 over AES, check symbol, 16 symbols) -- keyed: hides the ID;
* ``to_base32``/``from_base32`` and ``to_base62``/``from_base62`` of this library -- unkeyed;
* the standard library's ``base64.b32encode`` of the 8 bytes -- the plainest base32 there is;
* sqids (``pip install sqids``, part of the ``bench`` extra), which its authors say is not
  encryption; skipped with a note if missing.

A report, never a unit test: the machine may be busy, so numbers vary between runs.
"""

from __future__ import annotations

import argparse
import base64
import gc
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snowflake_db
from snowflake_db import SnowflakeGenerator
from snowflake_db.public_ids import (
    PublicIdCodec,
    from_base32,
    from_base62,
    to_base32,
    to_base62,
)

TARGET_PER_S = 50_000
PAGE = 100


def _stdlib_b32encode(snowflake_id: int) -> bytes:
    return base64.b32encode(snowflake_id.to_bytes(8, "big"))


def _stdlib_b32decode(text: bytes) -> int:
    return int.from_bytes(base64.b32decode(text), "big")


def contenders() -> dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]]:
    """name -> (encode, decode)."""
    codec = PublicIdCodec(os.urandom(32), namespace="orders")
    found: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
        "PublicIdCodec (FF1, keyed)": (codec.encode, codec.decode),
        "to_base32 / from_base32": (to_base32, from_base32),
        "to_base62 / from_base62": (to_base62, from_base62),
        "stdlib base64.b32encode": (_stdlib_b32encode, _stdlib_b32decode),
    }
    try:
        from importlib.metadata import version

        from sqids import Sqids
    except ImportError:
        return found
    sqids = Sqids()
    found[f"sqids {version('sqids')} (not encryption)"] = (
        lambda snowflake_id: sqids.encode([snowflake_id]),
        lambda text: sqids.decode(text)[0],
    )
    return found


def _rate(call: Callable[[Any], Any], values: Iterable[Any], count: int) -> tuple[float, list[Any]]:
    gc.disable()
    try:
        started = time.perf_counter()
        results = list(map(call, values))
        elapsed = time.perf_counter() - started
    finally:
        gc.enable()
    return count / elapsed, results


def measure(ids: list[int], rounds: int) -> dict[str, tuple[float, float]]:
    """name -> (best encodes/s, best decodes/s); every round checks the round trip untimed."""
    calls = contenders()
    best = {name: (0.0, 0.0) for name in calls}
    for _ in range(rounds):
        for name, (encode, decode) in calls.items():
            encode_rate, texts = _rate(encode, ids, len(ids))
            decode_rate, back = _rate(decode, texts, len(ids))
            if back != ids:
                raise SystemExit(f"{name}: the round trip lost IDs")
            best[name] = (max(best[name][0], encode_rate), max(best[name][1], decode_rate))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts, fewer rounds")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args(argv)
    count, rounds = (20_000, 3) if args.quick else (100_000, 5)

    print(f"snowflake_db {snowflake_db.__version__} on {platform.python_implementation()} "
          f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{count:,} Snowflake IDs (one generator, default layout) x best of {rounds} rounds, "
          "one thread\n")
    ids = SnowflakeGenerator(7).next_ids(count)
    rates = measure(ids, rounds)

    sqids_name = next((name for name in rates if name.startswith("sqids")), None)
    header = ("contender", "encodes/s", "decodes/s", "page of 100", "vs sqids", "target")
    rows = [header]
    missed = []
    for name, (encode_rate, decode_rate) in rates.items():
        page_ms = PAGE / encode_rate * 1000
        ratio = (f"{encode_rate / rates[sqids_name][0]:.2f}x / "
                 f"{decode_rate / rates[sqids_name][1]:.2f}x") if sqids_name else "-"
        target = ""
        if name.startswith("PublicIdCodec"):
            passed = min(encode_rate, decode_rate) >= TARGET_PER_S
            target = f">= {TARGET_PER_S:,}/s each: {'PASS' if passed else 'FAIL'}"
            if not passed:
                missed.append(name)
        rows.append((name, f"{encode_rate:,.0f}", f"{decode_rate:,.0f}", f"{page_ms:.2f} ms",
                     ratio, target))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))
    if sqids_name is None:
        print("\nsqids is not installed: pip install sqids (the comparison column is empty)")
    print(f"\n'page of 100': time to encode {PAGE} numbers. 'vs sqids': encode / decode rate "
          "ratios in this run. Every round checks the round trip outside the timed section.")
    if missed:
        print(f"missed targets: {', '.join(missed)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
