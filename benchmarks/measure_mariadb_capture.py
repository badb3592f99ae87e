"""What a MariaDB move's change capture costs the source's other shards: triggers or binlog.

Issue 32 asks to choose between triggers that record the moving shard's changed keys in a
changelog (the pt-online-schema-change approach) and the binary log read as row events (the
gh-ost and VReplication approach), by the write overhead each puts on the source. This script
starts two throwaway mariadbd servers from one install (``example_project.local_servers``, via
the MariaDB move tests' ``Server``): one without a binary log, one with ``log_bin`` and
``binlog_format = ROW``. On each it loads an ``orders`` table (``--rows`` rows, 16 logical
shards) and measures the write rate of ``--writers`` writer PROCESSES (autocommit single-row
INSERT 60%, UPDATE 25%, DELETE 15% of their own rows, on every shard but the moving one) for
``--seconds`` per measurement, in six configurations:

* no capture (binary log off): the baseline;
* the triggers of ``MariaDBMoveBackend.capture()`` for moving shard 5 (fence and capture
  triggers on ``orders``; its changelog and fence tables), binary log off;
* the fence's three triggers alone, as they stay on the source after a move;
* binary log on (``ROW``), no triggers: what reading row events needs on every write;
* binary log on, streamed as it is written to a reader (``mariadb-binlog
  --read-from-remote-server --stop-never``, a C client, to /dev/null): the source's dump thread
  as a binlog-reading mover would use it, with a reader far cheaper than a Python one;
* binary log on and the triggers: a shop that already logs row events.

After an unmeasured warm-up on each server, each round measures the six in a rotating order;
the table shows the median of ``--rounds`` rounds and its ratio to the baseline of the same
run. The writes of the moving shard itself (``--moving-seconds``, the same writers on shard 5
only) are measured with and without the triggers: they also pay the changelog row and the
fence row's shared lock.

The binary log's cost is measured, not its reader's: python-mysql-replication would run in the
mover's process, on the mover's CPU, and is not needed to see what each write pays.

``--copy-rows N`` then also times the chunked copy (capture, copy, ``advance()`` until the copy
is done, no writers) of shard 5 of an ``orders`` table of N rows from the first server to an
empty database on the second, against ``mariadb-dump --where '(id & 15) = 5'`` piped into
``mariadb`` between the same servers (best of two each).

    .venv/bin/python benchmarks/measure_mariadb_capture.py [--quick] [--sync-binlog 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pymysql

from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.sharding.moves import MovedTable
from snowflake_db.sharding.moves._mariadb import MariaDBMoveBackend
from tests.plugins.shard_moves_mariadb import Server

LAYOUT = Layout(sequence_bits=8, shard_bits=4)
MOVING = 5
DATABASE = "capture"
DDL = """CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL,
    status VARCHAR(40) NOT NULL DEFAULT 'new', total_cents BIGINT NOT NULL,
    created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), note TEXT) ENGINE=InnoDB"""
LOAD = """INSERT INTO orders (id, customer_id, total_cents, note)
    SELECT (seq << 4) | (seq % 16), seq % 97, seq * 7, MD5(seq) FROM seq_1_to_{rows}"""
CONFIGS = ("none", "triggers", "fence", "binlog", "binlog+reader", "binlog+triggers")
LABELS = {
    "none": "no capture (binlog off)",
    "triggers": f"triggers for shard {MOVING} (binlog off)",
    "fence": "the fence's triggers alone (binlog off)",
    "binlog": "binlog ROW, no triggers",
    "binlog+reader": "binlog ROW, streamed to a reader",
    "binlog+triggers": "binlog ROW + triggers",
}


def _connect(port: int) -> Any:
    return pymysql.connect(host="127.0.0.1", port=port, user="root", database=DATABASE,
                           autocommit=True, connect_timeout=10)


def _writer(port: int, worker: int, *, shards: list[int], seconds: float, ready: Any,
            go: Any, results: Any) -> None:
    """Connect, say so, wait for ``go``, then write for ``seconds``; put the count."""
    generator = SnowflakeGenerator(worker, layout=LAYOUT)
    rng = random.Random(worker)
    connection = _connect(port)
    mine: list[int] = []
    done = 0
    with connection.cursor() as cursor:
        ready.put(worker)
        go.wait(120)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            roll = rng.random()
            if mine and roll < 0.25:
                cursor.execute("UPDATE orders SET status = %s WHERE id = %s",
                               (f"s{rng.randrange(999)}", rng.choice(mine)))
            elif mine and roll < 0.4:
                cursor.execute("DELETE FROM orders WHERE id = %s",
                               (mine.pop(rng.randrange(len(mine))),))
            else:
                oid = generator.next_id_in_shard(rng.choice(shards))
                cursor.execute("INSERT INTO orders (id, customer_id, total_cents) "
                               "VALUES (%s, 1, 1)", (oid,))
                mine.append(oid)
            done += 1
    connection.close()
    results.put(done)


def measure(port: int, writers: int, seconds: float, shards: list[int], first_worker: int
            ) -> float:
    """Writes per second of ``writers`` processes on ``shards`` of the server on ``port``,
    counted from the moment every one of them is connected."""
    context = multiprocessing.get_context("fork")  # no re-import per process
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    processes = [context.Process(target=_writer, args=(port, first_worker + i),
                                 kwargs={"shards": shards, "seconds": seconds, "ready": ready,
                                         "go": go, "results": results})
                 for i in range(writers)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=60)
    go.set()
    total = sum(results.get(timeout=seconds + 60) for _ in processes)
    for process in processes:
        process.join(30)
    return total / seconds


def _backend(port: int) -> MariaDBMoveBackend:
    url = f"mysql+pymysql://root@127.0.0.1:{port}/{DATABASE}"
    return MariaDBMoveBackend(source=url, target=url, layout=LAYOUT, shard=MOVING, move_id=1,
                              target_name="measure", tables=[MovedTable("orders")])


def _set_capture(port: int, on: bool, *, fence_only: bool = False) -> None:
    backend = _backend(port)
    if on:
        backend.capture()
        if fence_only:
            backend.cleanup()  # drops the capture's triggers and changelog, keeps the fence
    else:
        backend.cleanup()
        backend.unfence()


def _reader(port: int) -> subprocess.Popen[bytes]:
    """A client streaming the server's binary log from its first file, as it is written."""
    return subprocess.Popen(
        ["mariadb-binlog", "--read-from-remote-server", "--host=127.0.0.1", f"--port={port}",
         "--user=root", "--stop-never", "--to-last-log", "mariadb-bin.000001"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _prepare(server: Server, rows: int) -> None:
    connection = server.connect()
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {DATABASE}")
        cursor.execute(f"USE {DATABASE}")
        cursor.execute(DDL)
        cursor.execute(LOAD.format(rows=rows))
    connection.close()


def _settings(server: Server) -> str:
    connection = server.connect()
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@log_bin, @@binlog_format, @@sync_binlog, "
                       "@@innodb_flush_log_at_trx_commit, @@version")
        log_bin, binlog_format, sync_binlog, flush, version = cursor.fetchone()
    connection.close()
    return (f"log_bin={log_bin} binlog_format={binlog_format} sync_binlog={sync_binlog} "
            f"innodb_flush_log_at_trx_commit={flush} ({version})")


def run(args: argparse.Namespace) -> None:
    others = [s for s in range(LAYOUT.max_shard + 1) if s != MOVING]
    with ExitStack() as stack:
        plain = Server(name="capplain")
        stack.callback(plain.close)
        binlog = Server(binlog=True, name="capbinlog", template=plain.data)
        stack.callback(binlog.close)
        for server in (plain, binlog):
            server.launch()
        for server in (plain, binlog):
            server.wait_ready()
            _prepare(server, args.rows)
        if args.sync_binlog is not None:
            connection = binlog.connect()
            with connection.cursor() as cursor:
                cursor.execute(f"SET GLOBAL sync_binlog = {int(args.sync_binlog)}")
            connection.close()
        ports = {"none": plain.port, "triggers": plain.port, "fence": plain.port,
                 "binlog": binlog.port,
                 "binlog+reader": binlog.port, "binlog+triggers": binlog.port}
        rates: dict[str, list[float]] = {config: [] for config in CONFIGS}
        moving: dict[str, list[float]] = {"none": [], "triggers": []}
        worker = 1
        for port in (plain.port, binlog.port):  # warm both up (caches, the first pages)
            measure(port, args.writers, args.seconds / 2, others, worker)
            worker += args.writers
        load_before = os.getloadavg()
        for round_ in range(args.rounds):
            order = CONFIGS[round_ % len(CONFIGS):] + CONFIGS[:round_ % len(CONFIGS)]
            for config in order:
                port = ports[config]
                with_triggers = config.endswith(("triggers", "fence"))
                if with_triggers:
                    _set_capture(port, True, fence_only=config == "fence")
                reader = _reader(port) if config == "binlog+reader" else None
                try:
                    rates[config].append(measure(port, args.writers, args.seconds, others,
                                                 worker))
                    worker += args.writers
                    if config in moving:
                        moving[config].append(measure(port, args.writers,
                                                      args.moving_seconds, [MOVING], worker))
                        worker += args.writers
                finally:
                    if with_triggers:
                        _set_capture(port, False)
                    if reader is not None:
                        reader.terminate()
                        reader.wait(30)
                print(f"round {round_ + 1}: {LABELS[config]}: {rates[config][-1]:,.0f} "
                      "writes/s", flush=True)
        load_after = os.getloadavg()
        report(args, rates, moving, plain=_settings(plain), binlog=_settings(binlog),
               load=(load_before[0], load_after[0]))
        if args.copy_rows:
            copy_speed(plain, binlog, args.copy_rows)


def report(args: argparse.Namespace, rates: dict[str, list[float]],
           moving: dict[str, list[float]], *, plain: str, binlog: str,
           load: tuple[float, float]) -> None:
    base = statistics.median(rates["none"])
    print()
    print(f"{args.writers} writer processes, {args.seconds:g} s per measurement, "
          f"{args.rounds} round(s), {args.rows:,} rows loaded; load average "
          f"{load[0]:.1f} -> {load[1]:.1f}")
    print(f"  server without binlog: {plain}")
    print(f"  server with binlog:    {binlog}")
    print()
    print("| configuration | other shards' writes/s (median; each round) | ratio to no capture |")
    print("|---|---|---|")
    for config in CONFIGS:
        median = statistics.median(rates[config])
        each = ", ".join(f"{r:,.0f}" for r in rates[config])
        print(f"| {LABELS[config]} | {median:,.0f} ({each}) | {median / base:.2f} |")
    binlog_base = statistics.median(rates["binlog"])
    print(f"\nbinlog ROW + triggers vs binlog ROW alone: "
          f"{statistics.median(rates['binlog+triggers']) / binlog_base:.2f}")
    plain_moving = statistics.median(moving["none"])
    print(f"shard {MOVING}'s own writes (binlog off): no capture {plain_moving:,.0f}/s, "
          f"triggers {statistics.median(moving['triggers']):,.0f}/s "
          f"({statistics.median(moving['triggers']) / plain_moving:.2f})")


def copy_speed(source: Server, target: Server, rows: int) -> None:
    """The chunked copy of shard 5 against a dump piped into the client (best of two)."""
    connection = source.connect()
    with connection.cursor() as cursor:
        cursor.execute("CREATE DATABASE copysrc")
        cursor.execute("USE copysrc")
        cursor.execute(DDL)
        cursor.execute(LOAD.format(rows=rows))
        cursor.execute(f"SELECT COUNT(*) FROM orders WHERE (id & 15) = {MOVING}")
        shard_rows = int(cursor.fetchone()[0])
    connection.close()
    ours: list[float] = []
    pipe: list[float] = []
    for attempt in range(2):
        for name in (f"ours{attempt}", f"pipe{attempt}"):
            connection = target.connect()
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {name}")
                cursor.execute(f"USE {name}")
                cursor.execute(DDL)
            connection.close()
        backend = MariaDBMoveBackend(
            source=f"mysql+pymysql://root@127.0.0.1:{source.port}/copysrc",
            target=f"mysql+pymysql://root@127.0.0.1:{target.port}/ours{attempt}",
            layout=LAYOUT, shard=MOVING, move_id=100 + attempt, target_name="measure",
            tables=[MovedTable("orders")])
        started = time.monotonic()
        with backend.held():
            backend.capture()
            backend.copy()
            while not backend.copy_synced():
                backend.advance()
        ours.append(time.monotonic() - started)
        backend.cleanup()
        backend.unfence()
        started = time.monotonic()
        dump = subprocess.Popen(
            ["mariadb-dump", "--host=127.0.0.1", f"--port={source.port}", "--user=root",
             "--single-transaction", "--no-create-info", "--skip-triggers",
             f"--where=(id & 15) = {MOVING}", "copysrc", "orders"], stdout=subprocess.PIPE)
        subprocess.run(["mariadb", "--host=127.0.0.1", f"--port={target.port}", "--user=root",
                        f"pipe{attempt}"], stdin=dump.stdout, check=True)
        assert dump.stdout is not None
        dump.stdout.close()
        if dump.wait(60) != 0:
            raise RuntimeError("mariadb-dump failed")
        pipe.append(time.monotonic() - started)
    best_ours, best_pipe = min(ours), min(pipe)
    print(f"\ncopy of shard {MOVING} ({shard_rows:,} of {rows:,} rows): chunked copy "
          f"{best_ours:.2f} s ({shard_rows / best_ours:,.0f} rows/s; runs "
          f"{', '.join(f'{t:.2f}' for t in ours)}), mariadb-dump | mariadb {best_pipe:.2f} s "
          f"({shard_rows / best_pipe:,.0f} rows/s; runs {', '.join(f'{t:.2f}' for t in pipe)}): "
          f"ratio {best_pipe / best_ours:.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--moving-seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sync-binlog", type=int, default=None,
                        help="SET GLOBAL sync_binlog on the binlog server (server default: 0)")
    parser.add_argument("--copy-rows", type=int, default=0,
                        help="also time the chunked copy of shard 5 of a table this large")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.moving_seconds, args.rounds, args.rows = 2.0, 1.0, 1, 20_000
        args.copy_rows = min(args.copy_rows, 50_000)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
