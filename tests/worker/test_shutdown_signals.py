"""``install_signal_handlers()``: SIGTERM (containers, systemd) releases the worker slot, then
the previous handler runs. Real subprocesses; the slot is read from the database afterwards."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from snowflake_db import SnowflakeGenerator
from snowflake_db.worker import TableWorkerAllocator

from ..plugins.databases import ScratchDatabase
from ..plugins.scheduler_delay import SchedulerDelay
from ..plugins.worker_support import read_slots

_CHILD = """
import signal, sys, time
# As a foreground process starts: a shell running `make test &` starts its commands with SIGINT
# ignored, which install_signal_handlers() rightly leaves ignored.
signal.signal(signal.SIGINT, signal.SIG_DFL)
import snowflake_db
from snowflake_db.worker import TableWorkerAllocator

url, mode = sys.argv[1], sys.argv[2]
if mode == "chained":
    def previous(signum, frame):
        print("previous handler ran with", signal.Signals(signum).name, flush=True)
        raise SystemExit(7)
    signal.signal(signal.SIGTERM, previous)
gen = snowflake_db.configure(allocator=TableWorkerAllocator(url, lease_seconds=30))
gen.next_id()
if mode != "none":
    snowflake_db.install_signal_handlers()
if mode == "twice":
    try:
        snowflake_db.install_signal_handlers()
    except snowflake_db.SignalHandlersError as error:
        print(type(error).__name__, error, flush=True)
    raise SystemExit(0)
print(gen.worker_id, flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
raise SystemExit(3)
"""


def _start(url: str, mode: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 60)
    if not ready:
        child.kill()
        pytest.fail("the child did not report its worker ID within 60 s")
    return child, child.stdout.readline().strip()


def _stop(child: subprocess.Popen[str]) -> tuple[int, str, str]:
    child.send_signal(signal.SIGTERM)
    try:
        stdout, stderr = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the child did not end within 30 s of SIGTERM")
    return child.returncode, stdout, stderr


def test_sigterm_releases_the_slot_and_ends_the_process(
    any_db: ScratchDatabase, scheduler_delay: SchedulerDelay
) -> None:
    child, worker = _start(any_db.url_string, "hooked")
    assert read_slots(any_db.url)[int(worker)].state == "live"
    started = time.monotonic()
    returncode, _, stderr = _stop(child)
    assert returncode == -signal.SIGTERM, stderr  # the default action still ends it
    ended = time.monotonic()
    assert ended - started < scheduler_delay.widen(15, started, ended)
    assert read_slots(any_db.url)[int(worker)].state == "free"


def test_without_the_hook_sigterm_parks_the_slot(sqlite_db: ScratchDatabase) -> None:
    """The control: what the hook is for (SIGTERM's default action skips atexit)."""
    child, worker = _start(sqlite_db.url_string, "none")
    returncode, _, _ = _stop(child)
    assert returncode == -signal.SIGTERM
    assert read_slots(sqlite_db.url)[int(worker)].state == "live"


def test_the_previous_python_handler_runs_after_the_release(sqlite_db: ScratchDatabase) -> None:
    child, worker = _start(sqlite_db.url_string, "chained")
    returncode, stdout, stderr = _stop(child)
    assert returncode == 7, stderr
    assert stdout.strip() == "previous handler ran with SIGTERM"
    assert read_slots(sqlite_db.url)[int(worker)].state == "free"


def test_installing_twice_is_refused(sqlite_db: ScratchDatabase) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, sqlite_db.url_string, "twice"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("SignalHandlersError ")
    assert "already called in this process (for SIGTERM, SIGINT); call it once" in child.stdout


def _blocked_signals(native_id: int) -> set[int]:
    """The signals thread ``native_id`` of this process blocks (its SigBlk mask in /proc)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1],
               16)
    return {signum for signum in range(1, 65) if mask >> (signum - 1) & 1}


def test_library_threads_leave_process_signals_to_the_main_thread(
    sqlite_db: ScratchDatabase,
) -> None:
    """A SIGTERM the kernel hands to the heartbeat thread is handled only when the main thread
    runs Python again: a pool child idle in its queue's lock never did, and Pool.terminate()
    waited for it for ever. The heartbeat and caller-renewal threads block such signals."""
    with TableWorkerAllocator(sqlite_db.url_string, lease_seconds=6) as allocator:
        generator = SnowflakeGenerator(allocator=allocator)
        generator.next_id()  # the lease, and its heartbeat thread
        threads = [thread for thread in threading.enumerate()
                   if thread is not threading.main_thread() and thread.name.startswith(
                       "snowflake_db") and thread.native_id is not None]
        assert threads, [thread.name for thread in threading.enumerate()]
        for thread in threads:
            assert thread.native_id is not None
            assert {signal.SIGTERM, signal.SIGINT} <= _blocked_signals(thread.native_id), thread
            assert signal.SIGSEGV not in _blocked_signals(thread.native_id)
        main_id = threading.main_thread().native_id
        assert main_id is not None and signal.SIGTERM not in _blocked_signals(main_id)
        generator.close()
