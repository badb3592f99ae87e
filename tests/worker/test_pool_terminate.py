"""Pool children ended by SIGTERM release their slots: ``Pool.terminate()``, which leaving a
``with Pool() as pool`` block calls, ends every child still running with SIGTERM, whose default
action skips every exit path. Real pools (multiprocessing fork and forkserver, billiard), busy and
idle children, and recycled ones caught halfway through their own exit; slots read afterwards."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import billiard
import pytest

import snowflake_db
from snowflake_db.shutdown import RELEASE_WAIT_SECONDS, STUCK_HANDLER_GRACE_SECONDS

from ..plugins.core_support import run_in_fork
from ..plugins.databases import ScratchDatabase
from ..plugins.scheduler_delay import SchedulerDelay
from ..plugins.worker_support import read_slots, wait_for
from .pool_support import (
    configure_child,
    configured_parent,
    issue_ids,
    lease_then_install_handlers,
    lease_then_stick_in_c,
    lease_then_wait,
    own_sigterm_handler,
    pool_context,
)

LEASE_SECONDS = 30.0
CHILDREN = 3


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    """Where children leave one file each (tmp_path also holds the SQLite databases)."""
    directory = tmp_path / "markers"
    directory.mkdir()
    return directory


class _Parent:
    """The parent's configured generator (fork children inherit it) and its own slot."""

    def __init__(self, url: str) -> None:
        self.allocator = configured_parent(url, LEASE_SECONDS)
        self.worker_id = snowflake_db.get_generator().worker_id

    def close(self) -> None:
        snowflake_db.reset()
        self.allocator.close()


def _child_slots(url: str, parent_worker: int) -> dict[int, str]:
    return {w: row.state for w, row in read_slots(url).items() if w != parent_worker}


#: How long a pool's tasks may take (seconds each): a child that dies or hangs in a task leaves
#: ``Pool.map`` waiting for ever.
TASKS_TIMEOUT_S = 120


def _finished(tasks: Any) -> Any:
    """The results of ``map_async``'s ``tasks``, or a failure naming the hang."""
    try:
        return tasks.get(TASKS_TIMEOUT_S)
    except multiprocessing.TimeoutError:
        pytest.fail(f"the pool's tasks did not finish in {TASKS_TIMEOUT_S} s")


def _pool(method: str, url: str, **options: Any) -> Any:
    context = pool_context(method)
    if method != "fork":
        options.update(initializer=configure_child, initargs=(url, LEASE_SECONDS))
    return context.Pool(CHILDREN, **options)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_leaving_a_pool_block_releases_busy_and_idle_childrens_slots(
    backend: str, method: str, database_factory: Callable[[str], ScratchDatabase],
    markers: Path, scheduler_delay: SchedulerDelay,
) -> None:
    url = database_factory(backend).url_string
    parent = _Parent(url)
    try:
        with _pool(method, url) as pool:
            results = _finished(pool.map_async(issue_ids, range(30), chunksize=1))
            busy = pool.map_async(lease_then_wait, [str(markers)] * CHILDREN, chunksize=1)
            # Every child holds a lease and is asleep in a task when the block ends.
            assert wait_for(lambda: len(os.listdir(markers)) == CHILDREN, 60)
            started = time.monotonic()
        ended = time.monotonic()
        took, allowed = ended - started, scheduler_delay.widen(RELEASE_WAIT_SECONDS, started, ended)
        assert not busy.ready()
        slots = _child_slots(url, parent.worker_id)
    finally:
        parent.close()
    assert [error for *_, error in results] == [None] * 30
    assert took < allowed, f"terminate() took {took:.1f} s, {allowed:.1f} s allowed"
    assert slots and all(state == "free" for state in slots.values()), slots


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_recycled_children_ended_halfway_through_their_exit_still_release(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    """``maxtasksperchild=1``: the block ends while the last children run their own exit path
    (the release); SIGTERM waits for it instead of cutting it short. Three rounds: without the
    wait most rounds parked one or two slots."""
    url = database_factory(backend).url_string
    parent = _Parent(url)
    try:
        for _ in range(3):
            with _pool("fork", url, maxtasksperchild=1) as pool:
                results = _finished(pool.map_async(issue_ids, range(10), chunksize=1))
            assert [error for *_, error in results] == [None] * 10
            slots = _child_slots(url, parent.worker_id)
            assert all(state == "free" for state in slots.values()), slots
    finally:
        parent.close()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_child_stuck_in_c_code_still_ends_and_releases_its_slot(
    backend: str, database_factory: Callable[[str], ScratchDatabase], markers: Path,
    scheduler_delay: SchedulerDelay,
) -> None:
    """SIGTERM's default action would end a child whose main thread waits in C for ever; the
    handler that replaced it runs only when that thread runs Python code again. The watchdog
    ends it after the grace and the release: without it ``Pool.terminate()`` never returned."""
    url = database_factory(backend).url_string
    parent = _Parent(url)
    try:
        pool = pool_context("fork").Pool(1)
        pool.map_async(lease_then_stick_in_c, [str(markers)], chunksize=1)
        assert wait_for(lambda: len(os.listdir(markers)) == 1, 60)
        (child,) = (int(name) for name in os.listdir(markers))
        terminating = threading.Thread(target=pool.terminate, daemon=True)
        started = time.monotonic()
        terminating.start()
        bound = STUCK_HANDLER_GRACE_SECONDS + RELEASE_WAIT_SECONDS + 5
        ended = scheduler_delay.wait_for(lambda timeout: _joined(terminating, timeout), bound)
        took = time.monotonic() - started
        if not ended:
            os.kill(child, signal.SIGKILL)  # the test's own cleanup of a child that never ended
        slots = _child_slots(url, parent.worker_id)
    finally:
        parent.close()
    assert ended, f"Pool.terminate() still waited for the stuck child after {took:.0f} s"
    assert took >= STUCK_HANDLER_GRACE_SECONDS  # the handler had its chance first
    assert slots and all(state == "free" for state in slots.values()), slots


def _joined(thread: threading.Thread, timeout: float) -> bool:
    thread.join(timeout)
    return not thread.is_alive()


def test_billiard_pool_terminate_releases_its_childrens_slots(
    sqlite_db: ScratchDatabase, markers: Path
) -> None:
    url = sqlite_db.url_string
    parent = _Parent(url)
    pool = billiard.Pool(CHILDREN)
    try:
        busy = pool.map_async(lease_then_wait, [str(markers)] * CHILDREN, chunksize=1)
        assert wait_for(lambda: len(os.listdir(markers)) == CHILDREN, 60)
        pool.terminate()
        pool.join()
        assert not busy.ready()
        slots = _child_slots(url, parent.worker_id)
    finally:
        parent.close()
    assert len(slots) == CHILDREN and all(state == "free" for state in slots.values()), slots


def test_a_childs_own_sigterm_handler_stays_in_charge(
    sqlite_db: ScratchDatabase, markers: Path
) -> None:
    """A SIGTERM handler the application set is never replaced: it runs, and its slot then
    waits for its lease (the application chose what SIGTERM does)."""
    url = sqlite_db.url_string
    parent = _Parent(url)
    try:
        pool = multiprocessing.get_context("fork").Pool(
            CHILDREN, initializer=own_sigterm_handler, initargs=(str(markers),))
        with pool:
            pool.map_async(lease_then_wait, [str(markers)] * CHILDREN, chunksize=1)
            assert wait_for(lambda: len(os.listdir(markers)) == CHILDREN, 60)
        slots = _child_slots(url, parent.worker_id)
    finally:
        parent.close()
    ran = [name for name in os.listdir(markers) if name.endswith(".term")]
    assert len(ran) == CHILDREN  # each child's own handler ran
    assert sorted(slots.values()) == ["live"] * CHILDREN


def test_install_signal_handlers_in_a_pool_child_keeps_one_release(
    sqlite_db: ScratchDatabase,
) -> None:
    url = sqlite_db.url_string
    parent = _Parent(url)
    try:
        with _pool("fork", url) as pool:
            workers = _finished(pool.map_async(lease_then_install_handlers, range(12), chunksize=1))
        slots = _child_slots(url, parent.worker_id)
    finally:
        parent.close()
    assert None not in workers
    assert slots and all(state == "free" for state in slots.values()), slots


def _armed_then_fork() -> dict[str, int]:
    """In a (forked) child with SIGTERM at its default: arm the pool child's handling, then
    fork: the grandchild must not keep writing its signals into this process's pipe."""
    from snowflake_db import shutdown

    shutdown.release_on_sigterm_in_pool_child()
    armed = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(armed)
    in_grandchild = run_in_fork(lambda: signal.set_wakeup_fd(-1))["result"]
    return {"armed": armed, "in_grandchild": in_grandchild}


def test_the_watchdogs_wakeup_fd_is_not_inherited_by_a_fork() -> None:
    report = run_in_fork(_armed_then_fork)["result"]
    assert report["armed"] != -1  # the watchdog's pipe is the wakeup fd
    assert report["in_grandchild"] == -1  # unset in the fork
