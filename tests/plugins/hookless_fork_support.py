"""Forking the way uWSGI does (libc's ``fork()``, no Python fork hook in the child) and waiting
until no other thread is about to want the GIL first: shared by the hook-less fork tests.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

from snowflake_db.worker import TableLease, _process_hooks

#: libc's fork(), as uWSGI calls it: no Python fork hook runs in the child. PyDLL keeps the GIL
#: across the call: with CDLL another thread (a heartbeat) could take it meanwhile, and the child
#: would wait forever for a GIL held by a thread that was not copied into it.
_RAW_FORK: Callable[[], int] = ctypes.PyDLL(None, use_errno=True).fork
#: How many of the SQLite fork gate's waits (5 s each) a fork waits for SQLite calls to end.
GATE_TRIES = 6


def LIBC_FORK() -> int:  # noqa: N802 - named as the libc function it stands for
    """libc's fork() (no Python fork hook in the child), once no thread of this process is inside
    a SQLite call of an allocator: the library's SQLite fork gate, which a fork with the hooks
    runs itself, run here around the raw fork.

    A child forked while the parent's heartbeat had a SQLite transaction open (a renewal, or the
    clock comparison after it) inherits SQLite's in-process lock records of that file: its own
    connection then finds the file locked for good (``AllocatorUnavailableError``, "database is
    locked", after the busy timeout; the documented limit of hook-less forks, see
    docs/reference/worker-table.md). A quiet period after a renewal avoided that by chance only;
    these tests fork outside SQLite calls for sure, to test one thing each.
    """
    try:
        # The gate waits until no SQLite call is under way, new ones wait for the fork; a call
        # may wait on a lock a child holds, so the gate is given a few of its own bounds.
        for _ in range(GATE_TRIES):
            _process_hooks._sqlite_before_fork()
            if not _process_hooks._calls:
                break
        else:
            raise AssertionError(
                f"{_process_hooks._calls} SQLite call(s) of this process still under way after "
                f"{GATE_TRIES} x {_process_hooks.FORK_WAIT_S:g} s: a hook-less child would "
                "inherit their locks")
        pid = _RAW_FORK()
    except BaseException:
        _process_hooks._sqlite_after_fork_in_parent()
        raise
    if pid != 0:  # the child resets the gate in its first call of the library
        _process_hooks._sqlite_after_fork_in_parent()
    return pid


def settle_threads(lease: TableLease | None = None) -> None:
    """Return when no other thread of this process is about to want the GIL: just after the
    heartbeat renewed ``lease``, or once a new heartbeat has gone to sleep.

    A thread waiting for the GIL at the moment of a hook-less fork leaves the child's GIL state
    inconsistent (the uWSGI deadlock reports, https://github.com/unbit/uwsgi/issues/1369). The
    child's first call repairs it (snowflake_db.fork_repair;
    tests/worker/test_fork_busy_heartbeat.py forks beside a busy heartbeat on purpose); these
    tests avoid it, to test one thing each.
    """
    if lease is not None:
        renewals, deadline = lease.renewals, time.monotonic() + 10
        while lease.renewals == renewals and time.monotonic() < deadline:
            time.sleep(0.002)
        assert lease.renewals > renewals, "the parent's heartbeat did not renew"
    # Then a quiet period: no event says when a thread is about to want the GIL.
    time.sleep(0.05 if lease is not None else 0.2)
