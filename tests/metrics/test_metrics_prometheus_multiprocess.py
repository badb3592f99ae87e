"""Prometheus behind a prefork server: the figures of every process, summed by prometheus_client's
multiprocess mode. Real processes (fork, multiprocessing and billiard pools whose children end
with os._exit, a child still running at the scrape) lease from a real control database; the scrape
must count every ID each of them issued, exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from snowflake_db import InvalidArgumentError, NotConfiguredError
from tests.plugins.databases import ScratchDatabase

REPO = str(Path(__file__).resolve().parents[2])

#: Runs in a fresh interpreter: PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is
#: first imported. Prints the scrapes as JSON.
SCENARIO = textwrap.dedent(
    """
    import json, multiprocessing, os, select, sys, time

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.parser import text_string_to_metric_families

    import snowflake_db
    from snowflake_db.exporters.prometheus_multiprocess import publish_multiprocess
    from snowflake_db.worker import TableWorkerAllocator

    def scrape():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        text = generate_latest(registry).decode()
        return {sample.name: sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name.startswith("snowflake_db_")}

    def issue(count):
        for _ in range(count):
            snowflake_db.snowflake_default()
        return count

    # Parent, forked child, four multiprocessing and four billiard pool children, running child.
    EVERY_ID = 1000 + 2000 + 4 * 3000 + 4 * 700 + 500

    snowflake_db.configure(allocator=TableWorkerAllocator(sys.argv[1], lease_seconds=30))
    publisher = publish_multiprocess(interval_seconds=0.1)
    assert publish_multiprocess(interval_seconds=0.1) is publisher
    try:
        publish_multiprocess(interval_seconds=1.0)
    except Exception as error:
        second_call = f"{type(error).__name__}: {error}"
    issue(1000)

    # A forked child that ends normally (atexit); it never calls publish() itself.
    pid = os.fork()
    if pid == 0:
        issue(2000)
        raise SystemExit(0)
    os.waitpid(pid, 0)

    # Pool children end with os._exit: their last figures come from their pool's exit path.
    # (close and join: the with-block's terminate() would kill children mid-exit, as SIGKILL.)
    pool = multiprocessing.get_context("fork").Pool(2, maxtasksperchild=1)
    assert pool.map(issue, [3000] * 4, chunksize=1) == [3000] * 4
    pool.close()
    pool.join()

    # billiard (Celery's prefork pool): its workers call os._exit after their on_exit callback.
    import billiard
    pool = billiard.Pool(2, maxtasksperchild=1)
    assert pool.map(issue, [700] * 4, chunksize=1) == [700] * 4
    pool.close()
    pool.join()

    # A child still running at the scrape: its own thread copied its figures meanwhile.
    ready_read, ready_write = os.pipe()
    done_read, done_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        issue(500)
        os.write(ready_write, b"x")
        select.select([done_read], [], [], 150)  # a parent that died must not hang the test
        raise SystemExit(0)
    os.read(ready_read, 1)
    # Its own thread copies its figures every 0.1 s, one counter after another: scrape until
    # all are there (30 s at most; a child whose thread never copies them leaves the counts
    # short, and the test fails). Its IDs alone once showed up a scrape before its lease.
    deadline = time.monotonic() + 30
    publisher.publish()
    while [(while_running := scrape()).get("snowflake_db_ids_issued_total"),
           while_running.get("snowflake_db_lease_acquisitions_total")] != [EVERY_ID, 11]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    os.write(done_write, b"x")
    os.waitpid(pid, 0)
    print(json.dumps({"while_running": while_running, "second_call": second_call,
                      "files": sorted(os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]))}))
    """
)


def test_every_process_is_counted_exactly_once(tmp_path: Path, sqlite_db: ScratchDatabase) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    env = dict(os.environ, PYTHONPATH=REPO, PROMETHEUS_MULTIPROC_DIR=str(directory))
    scenario = subprocess.Popen([sys.executable, "-X", "faulthandler", str(script),
                                 sqlite_db.url_string], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = scenario.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # once beside a second suite: say where it was
        scenario.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        stdout, stderr = scenario.communicate(timeout=30)
        pytest.fail(f"the scenario ran over 120 s; its stderr: {stderr}")
    assert scenario.returncode == 0, stderr
    result = subprocess.CompletedProcess(scenario.args, scenario.returncode, stdout, stderr)
    report = json.loads(result.stdout)
    running = report["while_running"]
    # Parent 1000, forked child 2000, four multiprocessing pool children 3000 each, four
    # billiard pool children 700 each, running child 500.
    assert running["snowflake_db_ids_issued_total"] == 1000 + 2000 + 4 * 3000 + 4 * 700 + 500
    # One lease per process: parent, forked child, eight pool children, running child.
    assert running["snowflake_db_lease_acquisitions_total"] == 11
    assert running["snowflake_db_lease_acquisition_failures_total"] == 0
    assert running["snowflake_db_fenced_generators"] == 0
    assert running["snowflake_db_time_left_days"] > 20_000
    assert report["second_call"].startswith("InvalidArgumentError: publish_multiprocess(")
    assert "already publishes every 0.1 s" in report["second_call"]
    # Eleven processes wrote counters (pool children included), each to its own file; each pool
    # may also have started up to two replacement workers before close() that never got a task
    # (their files hold zeros, as the totals above show).
    assert 11 <= sum(name.startswith("counter_") for name in report["files"]) <= 15


#: A fork while the publisher's copy holds prometheus_client's one lock for its multiprocess
#: values (a copy made slow on purpose): the child's first copy must not hang on it.
FORK_DURING_A_COPY = textwrap.dedent(
    """
    import os, sys, threading, time

    from prometheus_client import values

    import snowflake_db
    from snowflake_db import metrics
    from snowflake_db.exporters.prometheus_multiprocess import publish_multiprocess

    snowflake_db.configure(worker_id=3)
    snowflake_db.snowflake_default()
    publisher = publish_multiprocess(interval_seconds=3600)
    [prometheus_lock] = [cell.cell_contents for cell in values.ValueClass.inc.__closure__
                         if type(cell.cell_contents).__name__ == "lock"]
    snapshot = metrics.snapshot()
    gauge = next(g for field, g in publisher._gauges.items()
                 if getattr(snapshot, field) is not None)
    real_set, inside = gauge.set, threading.Event()

    def slow_set(value):  # this copy holds prometheus_client's lock for a second
        with prometheus_lock:
            inside.set()
            time.sleep(1)
        real_set(value)

    gauge.set = slow_set
    threading.Thread(target=publisher.publish).start()
    assert inside.wait(10)
    pid = os.fork()
    if pid == 0:
        gauge.set = real_set
        publisher.publish()  # the child's first copy
        os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            print("the child ended")
            sys.exit(0)
        time.sleep(0.05)
    os.kill(pid, 9)
    print("the child hung in its first copy")
    sys.exit(1)
    """
)


def _run_scenario(tmp_path: Path, scenario: str) -> subprocess.CompletedProcess[str]:
    """``scenario`` run in a fresh interpreter with its own ``PROMETHEUS_MULTIPROC_DIR``."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    script = tmp_path / "scenario.py"
    script.write_text(scenario)
    env = dict(os.environ, PYTHONPATH=REPO, PROMETHEUS_MULTIPROC_DIR=str(directory))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def test_a_fork_during_a_copy_waits_for_it_and_the_child_copies(tmp_path: Path) -> None:
    """prometheus_client's multiprocess values share one plain lock, which the publisher's
    thread takes: a fork while it held it gave the child a lock nobody would release."""
    result = _run_scenario(tmp_path, FORK_DURING_A_COPY)
    assert (result.returncode, result.stdout.strip()) == (0, "the child ended"), result.stderr


#: Records the size of each value file prometheus_client opens, in the parent and in a forked
#: child's first copy.
FILES_WHOLE = textwrap.dedent(
    """
    import json, os

    from prometheus_client import mmap_dict

    opened = []
    real_init = mmap_dict.MmapedDict.__init__

    def recording_init(self, filename, read_mode=False):
        size = os.path.getsize(filename) if os.path.exists(filename) else None
        opened.append((os.getpid(), os.path.basename(filename), size))
        real_init(self, filename, read_mode)

    mmap_dict.MmapedDict.__init__ = recording_init

    import snowflake_db
    from snowflake_db.exporters.prometheus_multiprocess import publish_multiprocess

    snowflake_db.configure(worker_id=3)
    snowflake_db.snowflake_default()
    publisher = publish_multiprocess(interval_seconds=3600)
    publisher.publish()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        publisher.publish()  # the child's first copy opens its own files
        os.write(write_end, json.dumps(opened).encode())
        os._exit(0)
    os.close(write_end)
    child = json.loads(os.read(read_end, 1 << 20))
    os.waitpid(pid, 0)
    print(json.dumps({"parent": os.getpid(), "child": pid, "opened": child,
                      "files": sorted(os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]))}))
    """
)


def test_value_files_are_whole_before_prometheus_client_opens_them(tmp_path: Path) -> None:
    """prometheus_client makes a missing value file empty and sizes it afterwards: a scrape in
    between fails (struct.error; once in a pool child's first copy beside a second suite), and a
    process killed in between leaves the empty file for good. The publisher makes its files
    whole first, in the parent and in a forked child."""
    result = _run_scenario(tmp_path, FILES_WHOLE)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_process: dict[int, dict[str, int | None]] = {}
    for pid, name, size in report["opened"]:
        by_process.setdefault(pid, {})[name] = size
    prefixes = ["counter", "gauge_livemin", "gauge_livesum", "gauge_max"]
    for pid in (report["parent"], report["child"]):
        assert by_process[pid] == {f"{prefix}_{pid}.db": 1 << 16 for prefix in prefixes}
    assert not [name for name in report["files"] if not name.endswith(".db")]  # no leftovers


def test_without_multiprocess_mode_the_error_says_how_to_set_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from snowflake_db.exporters.prometheus_multiprocess import MultiprocessPublisher

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(NotConfiguredError, match="PROMETHEUS_MULTIPROC_DIR is not set"):
        MultiprocessPublisher()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/late")
    with pytest.raises(NotConfiguredError, match="was set after prometheus_client was imported"):
        MultiprocessPublisher()


@pytest.mark.parametrize("interval", [0, 0.01, 3601, float("nan"), "5", True])
def test_intervals_outside_the_range_are_refused(interval: object) -> None:
    from snowflake_db.exporters.prometheus_multiprocess import MultiprocessPublisher

    with pytest.raises(InvalidArgumentError, match="interval_seconds"):
        MultiprocessPublisher(interval)  # type: ignore[arg-type]


def test_collector_for_the_fleets_slots_only(sqlite_db: ScratchDatabase) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    import snowflake_db
    from snowflake_db.exporters.prometheus import SnowflakeCollector
    from snowflake_db.worker import TableWorkerAllocator

    with pytest.raises(InvalidArgumentError, match="would report nothing"):
        SnowflakeCollector(with_slots=False, process_figures=False)
    allocator = TableWorkerAllocator(sqlite_db.url_string)
    snowflake_db.configure(allocator=allocator)
    try:
        snowflake_db.snowflake_default()
        registry = CollectorRegistry()
        registry.register(SnowflakeCollector(with_slots=True, process_figures=False))
        text = generate_latest(registry).decode()
    finally:
        snowflake_db.reset()
        allocator.close()  # its heartbeat thread would outlive the test (and its database)
    assert 'snowflake_db_worker_slots{state="live"} 1.0' in text
    assert "snowflake_db_ids_issued" not in text  # the multiprocess files report those
