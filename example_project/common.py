"""What both demo shops share: the layout, command line, database URLs, progress bar, checks."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue as queue_module
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from snowflake_db import Layout
from snowflake_db.sharding import ShardRouter

#: 41 time bits (1 ms, 2020 epoch), 10 worker bits, 8 sequence bits, 4 shard bits (16 logical
#: shards): an order embeds its customer's logical shard, so it is found from its ID alone.
SHOP_LAYOUT = Layout(time_bits=41, worker_bits=10, sequence_bits=8, shard_bits=4)

CONTROL_URL_ENV = "SHOP_CONTROL_URL"
SHARD_URLS_ENV = "SHOP_SHARD_URLS"  # comma- or space-separated
COORDINATOR_URL_ENV = "SHOP_COORDINATOR_URL"
#: ``--engine`` values: the distributed engines the SQLAlchemy shop runs on, and the SQL
#: dialect of their coordinator (Spider front) and shard (backend) URLs.
ENGINE_DIALECTS = {"postgresql-fdw": "postgresql", "spider": "mysql"}
#: Throwaway servers the demo starts itself: at most this many shards (give URLs for more).
MAX_LOCAL_SHARDS = 8
HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE / "var"
#: Written into every SQLite directory the demo makes: only such a directory is ever cleared.
MARKER = ".snowflake-db-demo"
#: The files the demo creates there (SQLite databases and their WAL and shared-memory files).
DEMO_FILE = re.compile(r"(control|shard\d+)\.sqlite3(-wal|-shm|-journal)?")


class BadInputError(Exception):
    """Wrong command-line input or an unreachable database: one line on stderr, exit status 2."""


@dataclass
class Options:
    control_url: str
    shard_urls: list[str]
    processes: int
    orders: int
    customers: int
    find: list[str] = field(default_factory=list)
    shard: int | None = None
    quiet: bool = False
    #: ``--engine``: ``None`` (sharded by the application) or a key of :data:`ENGINE_DIALECTS`.
    engine: str | None = None
    #: The coordinator (Spider front) with ``--engine``; empty: start throwaway servers.
    coordinator_url: str = ""
    #: How many shards the throwaway servers have (``--shards``), with ``--engine`` and no URL.
    local_shards: int = 0

    @property
    def shard_names(self) -> list[str]:
        return [f"shard{i}" for i in range(len(self.shard_urls))]

    @property
    def shard_urls_by_name(self) -> dict[str, str]:
        return dict(zip(self.shard_names, self.shard_urls, strict=True))

    def router(self) -> ShardRouter:
        return ShardRouter(self.shard_names, layout=SHOP_LAYOUT)


def parse_options(
    argv: Sequence[str] | None, prog: str, description: str, *, data_subdir: str,
    engines: bool = False,
) -> Options:
    """The demo's options; ``engines`` adds ``--engine`` and ``--coordinator-url``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if engines:
        parser.add_argument(
            "--engine", choices=list(ENGINE_DIALECTS), default=None,
            help="place orders through a distributed engine: a PostgreSQL coordinator with "
                 "postgres_fdw shards, or a MariaDB Spider front; without URLs the demo starts "
                 "throwaway local servers (stopped at the end)",
        )
        parser.add_argument(
            "--coordinator-url",
            help=f"with --engine: the coordinator or Spider front (env {COORDINATOR_URL_ENV}); "
                 "--shard-url then names each shard (backend) server",
        )
    parser.add_argument("--control-url",
                        help=f"database holding the worker table (env {CONTROL_URL_ENV})")
    parser.add_argument(
        "--shard-url", action="append", default=[],
        help=f"a shard database; repeat for each shard (env {SHARD_URLS_ENV}, comma-separated)",
    )
    parser.add_argument("--shards", type=int, default=4, help="SQLite shards when no URL is given")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"directory for the SQLite files (default {DEFAULT_DATA_DIR})")
    parser.add_argument("--processes", type=int, default=4, help="processes placing orders")
    parser.add_argument("--orders", type=int, default=2000, help="orders in total")
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--find", action="append", default=[], metavar="ORDER_ID",
                        help="also look up this order ID (repeatable)")
    parser.add_argument("--shard", type=int, default=None, metavar="N",
                        help="also list the first orders of logical shard N")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    control = args.control_url or os.environ.get(CONTROL_URL_ENV, "").strip()
    shards = list(args.shard_url)
    if not shards and os.environ.get(SHARD_URLS_ENV, "").strip():
        shards = os.environ[SHARD_URLS_ENV].replace(",", " ").split()
    if getattr(args, "engine", None):
        return _engine_options(args, control, shards)
    if getattr(args, "coordinator_url", None):
        raise BadInputError("--coordinator-url needs --engine")
    if bool(control) != bool(shards):
        raise BadInputError(
            "give both --control-url and at least one --shard-url (or neither, for SQLite)"
        )
    if not control:
        if args.shards < 1:
            raise BadInputError(f"--shards={args.shards}: need at least one shard")
        directory = prepare_data_dir(args.data_dir, data_subdir)
        control = f"sqlite:///{directory / 'control.sqlite3'}"
        shards = [f"sqlite:///{directory / f'shard{i}.sqlite3'}" for i in range(args.shards)]
    control = normalise_url(control, "--control-url")
    shards = [normalise_url(url, "--shard-url") for url in shards]
    for name, value, minimum in (("processes", args.processes, 1), ("orders", args.orders, 1),
                                 ("customers", args.customers, 1)):
        if value < minimum:
            raise BadInputError(f"--{name}={value}: must be at least {minimum}")
    return Options(control, shards, args.processes, args.orders, args.customers,
                   args.find, args.shard, args.quiet)


def _engine_options(args: argparse.Namespace, control: str, shards: list[str]) -> Options:
    """``--engine``: all three of control, coordinator and shard URLs, or none of them."""
    engine = args.engine
    for name, given in (("--data-dir", args.data_dir is not None), ("--find", args.find),
                        ("--shard", args.shard is not None)):
        if given:
            raise BadInputError(f"{name} is not available with --engine")
    coordinator = args.coordinator_url or os.environ.get(COORDINATOR_URL_ENV, "").strip()
    given = [bool(control), bool(coordinator), bool(shards)]
    if any(given) and not all(given):
        raise BadInputError(
            "with --engine give --control-url, --coordinator-url and at least one --shard-url "
            "(or none of them, to start throwaway local servers)"
        )
    local_shards = 0
    if not coordinator:
        local_shards = args.shards
        if not 1 <= local_shards <= MAX_LOCAL_SHARDS:
            raise BadInputError(
                f"--shards={local_shards}: throwaway servers take 1 to {MAX_LOCAL_SHARDS} shards "
                "(give --shard-url for more)"
            )
    else:
        control = normalise_url(control, "--control-url")
        dialect = ENGINE_DIALECTS[engine]
        coordinator = normalise_url(coordinator, "--coordinator-url")
        shards = [normalise_url(url, "--shard-url") for url in shards]
        for option, url in [("--coordinator-url", coordinator)] + [
                ("--shard-url", url) for url in shards]:
            backend = url.split(":", 1)[0].split("+", 1)[0]
            if (backend if backend != "mariadb" else "mysql") != dialect:
                raise BadInputError(
                    f"{option} {display_url(url)}: --engine {engine} runs on {dialect}, "
                    f"not {backend}"
                )
            host = _host(url)
            if engine == "spider" and option == "--shard-url" and host in ("", "localhost"):
                # MariaDB's client library reads "localhost" as the local Unix socket and
                # ignores the port: the front would link to itself, not to the backend.
                raise BadInputError(
                    f"--shard-url {display_url(url)}: Spider reaches a backend named "
                    "'localhost' through the front's own Unix socket; give 127.0.0.1 or a "
                    "host name"
                )
    for name, value in (("processes", args.processes), ("orders", args.orders),
                        ("customers", args.customers)):
        if value < 1:
            raise BadInputError(f"--{name}={value}: must be at least 1")
    return Options(control, shards, args.processes, args.orders, args.customers,
                   quiet=args.quiet, engine=engine, coordinator_url=coordinator,
                   local_shards=local_shards)


def _host(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).host or ""


def prepare_data_dir(data_dir: Path | None, subdir: str) -> Path:
    """The SQLite directory for this run, emptied of the demo's own files from a previous run.

    Nothing the demo did not create is ever deleted: a directory without the demo's marker
    must be empty (or, for the default ``example_project/var``, hold only the demo's files).
    """
    directory = (data_dir or DEFAULT_DATA_DIR) / subdir
    if directory.exists() and not directory.is_dir():
        raise BadInputError(f"--data-dir: {directory} is a file, not a directory")
    if directory.is_dir():
        entries = [entry for entry in directory.iterdir() if entry.name != MARKER]
        ours = (directory / MARKER).exists() or data_dir is None
        foreign = [e.name for e in entries if not (ours and DEMO_FILE.fullmatch(e.name))]
        if foreign:
            raise BadInputError(
                f"--data-dir: {directory} already holds files this demo did not create "
                f"({', '.join(sorted(foreign)[:3])}{', ...' if len(foreign) > 3 else ''}); "
                "give a new or empty directory"
            )
        for entry in entries:
            entry.unlink()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / MARKER).write_text(
            "Created by the snowflake_db demo, which deletes only its own *.sqlite3 files here.\n"
        )
    except OSError as error:
        raise BadInputError(f"--data-dir: cannot use {directory}: {error.strerror}") from None
    return directory


def normalise_url(url: str, option: str) -> str:
    """A SQLAlchemy URL with a driver: ``postgres://`` and ``mysql://`` as the CLI reads them."""
    from snowflake_db.cli.urls import resolve_url
    from snowflake_db.errors import CommandError

    try:
        return resolve_url(url, f"{option} ").render_as_string(hide_password=False)
    except CommandError as error:
        raise BadInputError(str(error)) from None


def plural(count: int, word: str, plural_form: str | None = None) -> str:
    """``1 shard``, ``2 shards``."""
    return f"{count} {word if count == 1 else plural_form or word + 's'}"


def check_find_and_shard(options: Options, router: ShardRouter) -> list[int]:
    """Validate ``--find`` IDs and ``--shard`` before any work, with one-line messages."""
    ids = []
    for raw in options.find:
        try:
            value = int(raw)
        except ValueError:
            raise BadInputError(f"--find {raw!r}: an order ID is an integer") from None
        try:
            ids.append(router.check_id(value))
        except ValueError as error:
            raise BadInputError(f"--find {value}: {error}") from None
    if options.shard is not None and not 0 <= options.shard < router.logical_shards:
        raise BadInputError(
            f"--shard {options.shard}: unknown shard; this shop has logical shards "
            f"0..{router.logical_shards - 1}"
        )
    return ids


def display_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class Progress:
    """A plain-text progress bar on stderr (no third-party package)."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, width: int = 30) -> None:
        # Frames only on a terminal: redirected to a file they would be noise, not a bar.
        self.enabled = enabled and sys.stderr.isatty()
        self.total, self.label, self.width = total, label, width
        self.done = 0
        self._last_draw = 0.0

    def advance(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if now - self._last_draw >= 0.1 or self.done >= self.total:
            self._last_draw = now
            self.draw()

    def draw(self) -> None:
        if not self.enabled:
            return
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        # No rate here: the one throughput figure is printed once all processes are done.
        sys.stderr.write(f"\r{self.label} [{bar}] {self.done}/{self.total}")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            self.draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


class Checks:
    """Collects pass/fail lines; the demo exits non-zero if any check failed."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, ok: bool, message: str) -> bool:
        print(f"  [{'ok' if ok else 'FAIL'}] {message}")
        if not ok:
            self.failures.append(message)
        return ok

    @property
    def exit_status(self) -> int:
        if self.failures:
            print(f"{plural(len(self.failures), 'check')} failed", file=sys.stderr)
            return 1
        print("all checks passed")
        return 0


def report_worker(queue: Any, seed: int, worker_id: int) -> None:
    """Tell the parent which worker ID this order process leased (see the queue protocol)."""
    queue.put((seed, os.getpid(), worker_id))


def iso(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def split_evenly(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


#: How long the order processes may go without a word (each reports every few orders) before
#: the demo stops waiting for them and reports the shortfall.
STALL_S = 120.0


def place_orders_in_processes(
    options: Options, customer_ids: list[int], child: Callable[..., None]
) -> tuple[list[int], float]:
    """Run ``child(options, customer_ids, count, seed, queue)`` in spawned processes at once.

    A child first puts ``(seed, pid, worker ID it leased)`` on the queue, then ints (orders
    placed, for the progress bar) and finally the list of its order IDs. Returns every placed
    ID and the elapsed seconds; a failed child stops the wait (its traceback is on stderr) and
    the verification that follows reports the shortfall.
    """
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    shares = split_evenly(options.orders, options.processes)
    processes = [
        context.Process(target=child, args=(options, customer_ids, n, seed, queue))
        for seed, n in enumerate(shares) if n
    ]
    started = time.perf_counter()
    for process in processes:
        process.start()
    bar = Progress(options.orders, "placing orders", enabled=not options.quiet)
    placed: list[int] = []
    leased: list[tuple[int, int, int]] = []
    finished = 0
    last_heard = time.monotonic()
    while finished < len(processes):
        # All ended before this wait: whatever they sent is in the queue's pipe already.
        ended = all(p.exitcode is not None for p in processes)
        try:
            message = queue.get(timeout=1)
        except queue_module.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                print("error: an order process failed (see its traceback above)", file=sys.stderr)
                break
            if ended:
                print("error: the order processes ended without reporting all their orders",
                      file=sys.stderr)
                break
            if time.monotonic() - last_heard > STALL_S:
                print(f"error: no order process reported for {STALL_S:g} s; stopping them",
                      file=sys.stderr)
                for process in processes:
                    process.terminate()
                break
            continue
        last_heard = time.monotonic()
        if isinstance(message, int):
            bar.advance(message)
        elif isinstance(message, tuple):
            leased.append(message)
        else:
            placed.extend(message)
            finished += 1
    elapsed = time.perf_counter() - started
    bar.finish()
    for process in processes:
        process.join(timeout=60)
    for seed, pid, worker_id in sorted(leased):
        print(f"  order process {seed + 1} (pid {pid}) leased worker ID {worker_id}")
    return placed, elapsed
