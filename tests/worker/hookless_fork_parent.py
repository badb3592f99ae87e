"""A parent process for tests/worker/test_fork_busy_heartbeat.py: raw ``fork()`` (no Python
fork hook) over and over while its heartbeat renews every 0.4 s and another thread keeps the GIL
busy.

Run as ``python -m tests.worker.hookless_fork_parent URL CHILDREN OUT_DIR``. Each child
issues IDs at once, again after its first renewal was due, then releases and ends with
``os._exit``; it writes ``childN.json`` (and ``childN.ids``). ``RUNNING`` children run at once
(each fork still happens beside the busy heartbeat).
The parent gives each child at most ``CHILD_DEADLINE_S`` from its fork, SIGKILLs one that is
still running (a hang), and writes ``parent.json``: per child its exit code, ``"hung"`` (after
the library's repair ran) or ``"hung before the repair"``, and the parent's own IDs.

Which: the parent registers an ``os.register_at_fork`` child hook, which a raw fork skips and
the library's repair runs (``PyOS_AfterFork_Child`` runs the hooks); it marks the child's byte
in memory shared with the parent. A child can hang before that, in CPython itself: if a thread
of the parent had asked for the GIL at the fork, the child's first check of that request waits
for a thread that does not exist, possibly before its first call of the library.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import mmap
import os
import signal
import sys
import threading
import time
import traceback
from array import array
from pathlib import Path
from typing import Any

import snowflake_db
from snowflake_db import forks
from snowflake_db.worker import TableLease, TableWorkerAllocator, _process_hooks

#: libc's fork() holding the GIL, as a C server (uWSGI) forks: no Python fork hook runs.
LIBC_FORK = ctypes.PyDLL(None, use_errno=True).fork
#: The heartbeat renews every 0.4 s, so forks land beside a busy heartbeat. The lease is long
#: because the allocator bounds each connect and statement by a third of it: with a 1.2 s lease
#: (a 1 s bound) two children, beside a second suite in its timing stage, got
#: AllocatorUnavailableError (connect or read timed out) where the server answered late.
LEASE_SECONDS = 9.0
RENEW_EVERY_S = 0.4
CHILD_DEADLINE_S = 20.0
RUN_S = 1.3  # each child also issues after 3 of its renewals were due
RENEWAL_WAIT_S = 8.0  # at most this much longer if none of them was done yet
#: Children alive at once: one. Two (12 s instead of 22 s per backend) loaded the machine
#: enough, beside a second suite, that 3 of 16 children hung in CPython before the repair (the
#: forking thread descheduled with the GIL, so a GIL request was pending at the fork).
RUNNING = 1
SWITCH_INTERVAL_S = 0.05


def _os_threads() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("\nThreads:", 1)[1].split("\n", 1)[0])


def _child(out: Path) -> None:
    # A child past its deadline gets SIGUSR1 first: its threads' stacks are written (by C code,
    # no GIL needed) where the test prints them, so a hang says where it was.
    stacks = out.with_suffix(".stacks").open("w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    # Read before the library's first call repairs this process: SQLite calls of the parent's
    # threads (its heartbeat's renewal) under way at the fork.
    report: dict[str, Any] = {"forked_mid_sqlite_call": _process_hooks._calls > 0}
    try:
        generator = snowflake_db.get_generator()
        ids = array("q", (snowflake_db.snowflake_default() for _ in range(200)))
        lease = generator.lease
        assert isinstance(lease, TableLease)
        report["threads_allowed"] = forks.threads_allowed()
        report["os_threads_after_lease"] = _os_threads()
        started, fenced = time.monotonic(), 0
        # RUN_S, then on until the first renewal, bounded: beside a second suite one child's
        # heartbeat renewed nothing in its 1.3 s (its new connection was slow), which says
        # nothing of a hang; the child still issues and is judged by its deadline.
        while (elapsed := time.monotonic() - started) < RUN_S or (
            lease.renewals == 0 and elapsed < RUN_S + RENEWAL_WAIT_S
        ):
            try:
                ids.extend(snowflake_db.snowflake_default() for _ in range(50))
            except snowflake_db.WorkerLeaseError:
                # A renewal late on a loaded machine fences the lease for a while: safe,
                # and not what is judged here (hangs are); the renewals are still counted.
                fenced += 1
            time.sleep(0.02)
        report["fenced"] = fenced
        report.update(
            worker=generator.worker_id,
            mine=lease.pid == os.getpid(),
            renewals=lease.renewals,
            caller_renewals=lease.caller_renewals,
            os_threads=_os_threads(),
        )
        _process_hooks._at_exit()  # what a clean exit runs: release this child's slot
        out.with_suffix(".ids").write_bytes(ids.tobytes())
    except BaseException:
        report["error"] = traceback.format_exc()
    out.with_suffix(".json").write_text(json.dumps(report))


#: One byte per child, shared with the children: 1 once the library's repair ran there.
_repaired = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)
_index = [0]


def _mark_repaired() -> None:  # an after-fork hook: only the library's repair runs it
    _repaired[_index[0]] = 1


def _reap(running: dict[int, tuple[int, float]], outcomes: dict[int, int | str],
          keep: int) -> None:
    """Wait until at most ``keep`` children run; SIGKILL any past its deadline (a hang)."""
    while len(running) > keep:
        for pid, (index, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                outcomes[index] = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGUSR1)  # its stacks, then the kill
                time.sleep(0.5)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                outcomes[index] = "hung" if _repaired[index] else "hung before the repair"
            else:
                continue
            del running[pid]
        time.sleep(0.005)


def main(url: str, children: int, out_dir: Path) -> None:
    # A GIL drop request pending at the fork (set once a waiting thread has waited longer than
    # the switch interval, as long as the fork itself can take on a loaded machine) makes the
    # child drop the GIL at its first bytecode, before any library code, and hang in CPython;
    # with the default 5 ms, beside a second suite, 3 of 16 did. The waiters themselves, what
    # the library repairs, are there whatever the interval.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    allocator = TableWorkerAllocator(
        url, lease_seconds=LEASE_SECONDS, renew_every=RENEW_EVERY_S
    )
    snowflake_db.configure(allocator=allocator)
    parent_ids = array("q", [snowflake_db.snowflake_default()])
    stop = threading.Event()

    def busy() -> None:  # wants the GIL all the time, as request threads do
        while not stop.is_set():
            for _ in range(200):
                pass
            time.sleep(0)  # gives the GIL up and waits for it again: always a waiter

    spinner = threading.Thread(target=busy, daemon=True)
    spinner.start()
    os.register_at_fork(after_in_child=_mark_repaired)
    outcomes: dict[int, int | str] = {}
    running: dict[int, tuple[int, float]] = {}
    try:
        for index in range(children):
            _reap(running, outcomes, RUNNING - 1)
            # The parent's own lease, its heartbeat starved by the busy thread beside a
            # second suite, may fence for a while: safe, and not what is judged here.
            with contextlib.suppress(snowflake_db.WorkerLeaseError):
                parent_ids.extend(snowflake_db.snowflake_default() for _ in range(20))
            _index[0] = index
            pid = LIBC_FORK()
            if pid == 0:  # the child: never returns into this loop
                try:
                    _child(out_dir / f"child{index}")
                finally:
                    os._exit(0)
            running[pid] = (index, time.monotonic() + CHILD_DEADLINE_S)
        _reap(running, outcomes, 0)
    finally:
        stop.set()
        spinner.join(5)
        snowflake_db.reset()
        allocator.close()
    (out_dir / "parent.json").write_text(
        json.dumps({"outcomes": [outcomes[i] for i in range(children)],
                    "ids": parent_ids.tolist()})
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
