"""The control database goes away while IDs are being issued: the generator fences (no ID after
its local deadline), then recovers when the heartbeat gets through again; zero duplicates.

PostgreSQL: the allocator's (heartbeat's) connections are terminated (pg_terminate_backend) and
new ones are refused (ALLOW_CONNECTIONS false). MariaDB: the allocator's own user is locked
(ACCOUNT LOCK) and its connections are killed (KILL CONNECTION). SQLite: another connection holds
the file's exclusive lock.
"""

from __future__ import annotations

import time

import pytest

from snowflake_db import LeaseExpiredError, SnowflakeError, SnowflakeGenerator, WorkerLeaseError
from snowflake_db.worker import TableLease, TableWorkerAllocator

from ..plugins.databases import ScratchDatabase
from ..plugins.outage_support import STEADY_LEASE_SECONDS, Outage, recording
from ..plugins.worker_support import wait_for


@pytest.mark.timing(seconds=12)  # see tests/conftest.py
@pytest.mark.slow
def test_connections_killed_then_database_unreachable_fences_and_recovers(
    any_db: ScratchDatabase,
) -> None:
    outage = Outage(any_db)
    # A steady lease: killing the connections in step 1 costs a renewal or two, and on a
    # loaded machine the reconnect can take most of a 1.5 s lease (beside a second suite, a
    # caller was fenced 0.2 s before the cut); only the cut may fence here.
    alloc = TableWorkerAllocator(outage.url, lease_seconds=STEADY_LEASE_SECONDS)
    gen = SnowflakeGenerator(allocator=alloc)
    try:
        gen.ensure_worker()
        lease = gen.lease
        assert isinstance(lease, TableLease)
        with recording(gen) as recorder:
            # 1. Killing the allocator's connections alone: the heartbeat reconnects and renews.
            assert wait_for(lambda: lease.renewals >= 1, 10)
            if any_db.backend != "sqlite":
                assert outage.kill_allocator_connections() >= 1
                renewals = lease.renewals
                assert wait_for(lambda: lease.renewals >= renewals + 2, 10)
                assert not lease.lost

            # 2. The database is unreachable for longer than a lease.
            cut_at = time.monotonic()
            outage.cut()
            cut_done = time.monotonic()  # cut() takes a while: a renewal may start meanwhile
            assert wait_for(lambda: any(e is LeaseExpiredError for e, _ in recorder.errors), 20)
            time.sleep(0.5)
            restored_at = time.monotonic()
            outage.restore()
            # No ID once the lease could have expired: its deadline is at most one lease length
            # after the last renewal, which started before the cut was complete.
            assert recorder.issued_between(cut_done + STEADY_LEASE_SECONDS, restored_at) == []

            # 3. Back: the heartbeat renews (nobody took the slot) and IDs flow again.
            assert wait_for(lambda: bool(recorder.issued_between(restored_at, 1e12)), 20)
            time.sleep(0.3)
        ids = [i for i, _ in recorder.ids]
        assert len(ids) == len(set(ids)) and ids == sorted(ids)
        assert all(issubclass(e, WorkerLeaseError | SnowflakeError) for e, _ in recorder.errors)
        # Nobody claimed the expired slot meanwhile, so the same lease was renewed, not replaced.
        assert gen.lease is lease and not lease.lost
        fenced = [at for e, at in recorder.errors if e is LeaseExpiredError]
        assert cut_at < min(fenced) < restored_at
    finally:
        gen.close()
        alloc.close()
        outage.close()
