"""Celery's prefork pool sets each pool process's parent-death signal to SIGKILL, and Linux sends
it when the *thread* that forked the process ends. billiard's threaded pool (Celery's with a
broker that has no event loop support) forks the replacements of recycled processes from its
supervisor thread, which a warm shutdown ends: those processes were killed halfway through
releasing their slots. A worker killed outright ended all its pool processes the same way.

Real billiard pools and a real ``celery worker``; the slots are read afterwards. A slow exit is
made deterministic (a lock the test holds on the slot rows, or an exit the test lets go), and
the moment the death signal is sent is read from /proc (the forking thread no longer lists the
process as its child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import billiard.pool
import pytest
from sqlalchemy import create_engine, text

import snowflake_db
from snowflake_db.shutdown import RELEASE_WAIT_SECONDS
from snowflake_db.worker._parent_death import DEATH_SIGNAL, ORPHAN_EXIT_SECONDS

from ..plugins.databases import ScratchDatabase
from ..plugins.scheduler_delay import communicate_patiently, wait_patiently
from ..plugins.worker_support import read_slots
from .parent_death_support import (
    CELERY_APP,
    celery_like_init,
    children_of,
    death_signal_now,
    ended,
    forking_thread,
    init_with_death_signal,
    leased_worker,
    nap,
    own_pid,
    record_exit,
    record_exit_then_wait,
)
from .pool_support import configured_parent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a parent-death signal is Linux's")

LEASE_SECONDS = 30.0
BIN = Path(sys.executable).parent


def _poll(condition: Callable[[], object], bound: float) -> bool:
    """Wait for ``condition`` (checked every 50 ms), at most ``bound`` seconds of running time."""

    def check(pause: float) -> bool:
        if condition():
            return True
        threading.Event().wait(min(pause, 0.05))
        return False

    return wait_patiently(check, bound)


def _markers(directory: Path, suffix: str) -> dict[int, str]:
    return {int(p.name.split(".")[0]): p.read_text() for p in directory.glob(f"*.{suffix}")}


@contextmanager
def _rows_locked(database: ScratchDatabase, pids: set[int]) -> Iterator[None]:
    """Hold the slot rows of these processes locked (SQLite: the whole database), so that their
    release waits for the end of the block."""
    engine = create_engine(database.url)
    try:
        with engine.connect() as connection:
            if database.backend == "sqlite":
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                connection.begin()
                listed = ", ".join(str(int(pid)) for pid in pids)
                locked = connection.execute(text(
                    f"SELECT worker_id FROM snowflake_worker_slots WHERE pid IN ({listed}) "
                    "FOR UPDATE")).all()
                assert len(locked) == len(pids), locked
            try:
                yield
            finally:
                connection.exec_driver_sql("ROLLBACK")
    finally:
        engine.dispose()


def _join_bounded(pool: Any, seconds: float) -> None:
    joiner = threading.Thread(target=pool.join, daemon=True)
    joiner.start()
    assert _poll(lambda: not joiner.is_alive(), seconds), "the pool's processes did not exit"


# -- a warm close: the supervisor thread that forked the replacements ends ---------------------


@pytest.mark.timing(seconds=8)  # see tests/conftest.py: a held release waits at most 10 s
@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"])
def test_warm_close_lets_replacements_forked_by_the_supervisor_finish_a_slow_release(
    backend: str, database_factory: Callable[[str], ScratchDatabase], tmp_path: Path
) -> None:
    """``maxtasksperchild=1``: the processes that replace the first two are forked by billiard's
    supervisor thread. Both end while the test holds their slot rows, so their releases wait;
    then ``close()`` ends the supervisor thread (the parent-death signal is sent), and only then
    does the test let the releases go. Without the fix they were SIGKILLed mid-release."""
    database = database_factory(backend)
    markers = tmp_path / "markers"
    markers.mkdir()
    parent = configured_parent(database.url_string, LEASE_SECONDS)
    parent_worker = snowflake_db.get_generator().worker_id
    before = children_of(os.getpid())
    pool = billiard.pool.Pool(
        2, maxtasksperchild=1, initializer=celery_like_init, initargs=(str(markers),),
        on_process_exit=partial(record_exit, str(markers)))
    try:
        # One task retires a process. The pool's first two (forked by this thread in the
        # constructor) are retired until none is left: usually two tasks, but a replacement
        # may take the second task before the other first process does (beside a second
        # suite: the tasks ran on a first process and its replacement, and the other first
        # process stayed, never to be replaced), so at most six.
        initial = children_of(os.getpid()) - before
        assert len(initial) == 2, initial
        first: set[int] = set()
        while initial & (children_of(os.getpid()) - first) and len(first) < 6:
            first.add(pool.apply_async(own_pid).get(60))

        def replacements_ready() -> set[int] | None:
            current = children_of(os.getpid()) - first - before
            leased = _markers(markers, "leased")
            ready = {pid for pid in current if leased.get(pid) == "Supervisor"}
            return ready if len(ready) == 2 else None

        assert _poll(replacements_ready, 60), (_markers(markers, "leased"), initial, first)
        replacements = replacements_ready()
        assert replacements is not None
        forked_by = {pid: forking_thread(os.getpid(), pid) for pid in replacements}
        assert set(forked_by.values()) == {pool._worker_handler.native_id}, forked_by
        with _rows_locked(database, replacements):
            ran = {pool.apply_async(own_pid).get(60) for _ in range(2)}
            assert ran == replacements  # each ran one task and is now ending
            assert _poll(lambda: replacements <= set(_markers(markers, "exiting")), 60)
            pool.close()  # ends the supervisor thread
            assert _poll(
                lambda: all(forking_thread(os.getpid(), pid) != forked_by[pid]
                            for pid in replacements), 60), "the supervisor thread did not end"
        # The death signal was sent before the releases could go on.
        _join_bounded(pool, 120)
    finally:
        pool.terminate()
        snowflake_db.reset()
        parent.close()
    slots = {w: row.state for w, row in read_slots(database.url).items() if w != parent_worker}
    assert slots and all(state == "free" for state in slots.values()), slots


@pytest.mark.parametrize(("chosen", "kept"), [
    (signal.SIGKILL, DEATH_SIGNAL), (0, 0), (signal.SIGUSR2, signal.SIGUSR2)])
def test_only_celerys_sigkill_death_signal_is_taken_over(
    chosen: int, kept: int, sqlite_db: ScratchDatabase
) -> None:
    """A pool process that leased: SIGKILL (Celery's) becomes billiard's terminate signal;
    none, or a signal the application chose, stays as it is."""
    parent = configured_parent(sqlite_db.url_string, LEASE_SECONDS)
    pool = billiard.pool.Pool(1, initializer=init_with_death_signal, initargs=(int(chosen),))
    try:
        seen = pool.apply_async(death_signal_now).get(60)
        pool.close()
        _join_bounded(pool, 60)
    finally:
        pool.terminate()
        snowflake_db.reset()
        parent.close()
    assert seen == kept


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_death_signal_that_arrives_again_during_the_exit_still_releases(
    backend: str, database_factory: Callable[[str], ScratchDatabase], tmp_path: Path
) -> None:
    """Linux sends the parent-death signal each time the thread the process counts as its
    parent ends, so a killed worker's pool process can get it two or three times. Here the
    first ends the task, the process's exit path waits in the pool's exit callback, and the
    signal comes twice more: the process must go on to release its slot (under SIGTERM,
    billiard's handler left the second to the default action, which ended the process
    there, the slot left live)."""
    database = database_factory(backend)
    markers = tmp_path / "markers"
    markers.mkdir()
    parent = configured_parent(database.url_string, LEASE_SECONDS)
    pool = billiard.pool.Pool(
        1, initializer=celery_like_init, initargs=(str(markers),),
        on_process_exit=partial(record_exit_then_wait, str(markers)))
    try:
        pid, worker, token = pool.apply_async(leased_worker).get(60)
        assert pool.apply_async(death_signal_now).get(60) == DEATH_SIGNAL
        pool.apply_async(nap, (str(markers), 120))
        assert _poll(lambda: pid in _markers(markers, "busy"), 60)
        pool.close()  # no replacement: the slot stays the one this process held
        os.kill(pid, DEATH_SIGNAL)
        assert _poll(lambda: pid in _markers(markers, "exiting"), 60)
        os.kill(pid, DEATH_SIGNAL)  # again, as the dying worker's next thread ends
        os.kill(pid, DEATH_SIGNAL)
        (markers / "go").touch()
        assert _poll(lambda: ended(pid), 60), "the pool process did not end"
        _join_bounded(pool, 60)
    finally:
        pool.terminate()
        snowflake_db.reset()
        parent.close()
    row = read_slots(database.url)[worker]
    assert row.state == "free" or row.lease_token != token, row


# -- a real `celery worker` --------------------------------------------------------------------


class _CeleryWorker:
    """``celery worker`` (prefork, 2 processes) running :data:`CELERY_APP` from ``tmp_path``."""

    def __init__(self, tmp_path: Path, url: str, *options: str) -> None:
        self.markers, broker = tmp_path / "markers", tmp_path / "broker"
        # kombu's filesystem transport creates a message's file, then writes it, and the
        # worker may read it in between: empty, it ends the worker ("Unrecoverable error:
        # JSONDecodeError", celery/kombu#1551, once under load). The producer writes into
        # ``staging`` and :meth:`send` renames each file into ``broker`` whole.
        self.broker, self.staging = broker, tmp_path / "staging"
        self.markers.mkdir()
        broker.mkdir()
        self.staging.mkdir()
        (tmp_path / "tasks.py").write_text(CELERY_APP)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFLAKE_")}
        environment.update(SNOWFLAKE_WORKER_URL=url, TEST_MARKERS=str(self.markers),
                           TEST_BROKER_DIR=str(broker))
        self.process = subprocess.Popen(
            [str(BIN / "celery"), "-A", "tasks", "worker", "--concurrency", "2",
             "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
             *options],
            cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        from celery import Celery

        self.producer = Celery("tasks", broker="filesystem://")
        self.producer.conf.broker_transport_options = {
            "data_folder_in": str(broker), "data_folder_out": str(self.staging),
            "control_folder": str(broker)}
        self.seen: set[int] = set()

    def send(self, name: str, *args: object) -> None:
        self.producer.send_task(f"tasks.{name}", args=args)
        for written in sorted(self.staging.iterdir()):
            os.replace(written, self.broker / written.name)

    def pool_processes(self) -> set[int]:
        return children_of(self.process.pid)

    def marked(self, suffix: str) -> set[int]:
        return set(_markers(self.markers, suffix))

    def wait_for(self, condition: Callable[[], object], bound: float = 120) -> None:
        assert _poll(lambda: condition() or self.process.poll() is not None, bound)
        assert self.process.poll() is None, self.output()

    def output(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        out = communicate_patiently(self.process, 60)
        return "" if out is None else out[0][-4000:]

    def cleanup(self) -> None:
        """Kill whatever is left: the worker, and pool processes that outlived it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(60)
        for pid in self.seen:
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_celery_warm_shutdown_lets_recycled_processes_release_through_a_slow_exit(
    postgres_db: ScratchDatabase, tmp_path: Path
) -> None:
    """``--max-tasks-per-child 1`` with a filesystem broker (billiard's threaded pool): the
    replacements of the first two processes run a task each and end, and their exit path
    (``worker_process_shutdown``) waits for the test. A warm shutdown (SIGTERM to the worker)
    ends the supervisor thread that forked them; then the test lets their exits go on."""
    worker = _CeleryWorker(tmp_path, postgres_db.url_string, "--max-tasks-per-child", "1")
    pid = worker.process.pid
    try:
        worker.wait_for(lambda: len(worker.marked("leased")) == 2)
        first = worker.pool_processes()
        worker.send("issue")
        worker.send("issue")

        def replacements() -> set[int]:
            current = worker.pool_processes() - first
            return current if len(current) == 2 and current <= worker.marked("leased") else set()

        worker.wait_for(replacements)
        second = replacements()
        worker.seen |= first | second
        forked_by = {child: forking_thread(pid, child) for child in second}
        assert pid not in forked_by.values(), forked_by  # not the main thread: the supervisor
        (worker.markers / "hold-exits").touch()
        worker.send("issue")
        worker.send("issue")
        worker.wait_for(lambda: second <= worker.marked("exiting"))  # both are in their exit
        worker.process.send_signal(signal.SIGTERM)  # warm shutdown
        worker.wait_for(lambda: all(forking_thread(pid, child) != forked_by[child]
                                    for child in second))
        (worker.markers / "go").touch()  # the death signal was sent: let the exits go on
        output = communicate_patiently(worker.process, 120)
        assert output is not None, "the worker did not finish its warm shutdown"
        assert worker.process.returncode == 0, output[0][-4000:]
        worker.seen |= set(_markers(worker.markers, "leased"))
        assert _poll(lambda: all(ended(child) for child in worker.seen), 60)
    finally:
        worker.cleanup()
    slots = {w: row.state for w, row in read_slots(postgres_db.url).items()}
    assert len(slots) >= 4 and all(state == "free" for state in slots.values()), (
        slots, output[0][-4000:])


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "unresponsive"), [
    ("postgresql", False), ("sqlite", False), ("postgresql", True)])
def test_celery_worker_killed_outright_its_pool_processes_release_and_end(
    backend: str, unresponsive: bool, database_factory: Callable[[str], ScratchDatabase],
    tmp_path: Path,
) -> None:
    """SIGKILL to the worker while both pool processes run a task: each releases its slot and
    ends. ``unresponsive``: the tasks never let a signal be handled (as one inside C code), so
    the process ends only by the watch on the parent, after ``ORPHAN_EXIT_SECONDS``."""
    database = database_factory(backend)
    worker = _CeleryWorker(tmp_path, database.url_string)
    try:
        worker.wait_for(lambda: len(worker.marked("leased")) == 2)
        worker.seen |= worker.pool_processes()
        worker.send("hold", unresponsive)
        worker.send("hold", unresponsive)
        worker.wait_for(lambda: len(worker.marked("busy")) == 2)
        busy = worker.marked("busy")
        assert busy <= worker.seen
        worker.process.kill()
        worker.process.wait(60)
        bound = 60 + (ORPHAN_EXIT_SECONDS + RELEASE_WAIT_SECONDS if unresponsive else 0)
        assert _poll(lambda: all(ended(child) for child in busy), bound), (
            "pool processes outlived their parent")
        slots = {w: row.state for w, row in read_slots(database.url).items()}
        # What the pool processes logged (they wrote to the killed worker's pipe): a release
        # that failed says why (seen once: a slot left live on SQLite, the cause not kept).
        logged = worker.output()
    finally:
        worker.cleanup()
    # A string, not a tuple: pytest cuts a tuple's repr to a line, and the log is the point.
    assert len(slots) == 2 and all(state == "free" for state in slots.values()), (
        f"{slots}\nwhat the worker and its pool processes wrote:\n{logged}")
