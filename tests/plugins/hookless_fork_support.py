"""Forking the way uWSGI does (libc's ``fork()``, no Python fork hook in the child) and waiting
until no other thread is about to want the GIL first: shared by the hook-less fork tests.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

from snowflake_db.worker import TableLease

#: libc's fork(), as uWSGI calls it: no Python fork hook runs in the child. PyDLL keeps the GIL
#: across the call: with CDLL another thread (a heartbeat) could take it meanwhile, and the child
#: would wait forever for a GIL held by a thread that was not copied into it.
LIBC_FORK: Callable[[], int] = ctypes.PyDLL(None, use_errno=True).fork


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
