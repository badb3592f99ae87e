"""Helpers for tests/worker/test_pool_parent_death.py: pool process functions (a billiard pool
as Celery's prefork pool sets it up), what /proc says about processes and the threads that
forked them, and the Celery app the tests run under ``celery worker``."""

from __future__ import annotations

import os
from pathlib import Path

from celery import platforms

import snowflake_db


def celery_like_init(markers: str) -> None:
    """Pool initializer: the parent-death signal Celery's ``process_initializer`` sets (with
    Celery's own function), then a lease, as the Celery recipe's ``worker_process_init``
    receiver takes it; ``<pid>.leased`` says so, holding the class name of the thread that
    forked this process (``Supervisor``: billiard's thread that replaces recycled processes)."""
    import threading

    forked_by = type(threading.current_thread()).__name__  # the forking thread's, copied
    platforms.set_pdeathsig("SIGKILL")
    snowflake_db.get_generator().ensure_worker()
    Path(markers, f"{os.getpid()}.leased").write_text(forked_by)


def own_pid(_: object = None) -> int:
    return os.getpid()


def leased_worker(_: object = None) -> tuple[int, int, str]:
    """This pool process's ID, its worker ID and its lease's token."""
    generator = snowflake_db.get_generator()
    lease = generator.lease
    return os.getpid(), generator.worker_id, str(getattr(lease, "token", ""))


def nap(markers: str, seconds: float) -> None:
    """A task that sleeps; ``<pid>.busy`` once it runs."""
    import time

    Path(markers, f"{os.getpid()}.busy").touch()
    time.sleep(seconds)


def record_exit_then_wait(markers: str, pid: int, exitcode: int) -> None:
    """The pool's ``on_process_exit`` (the process is ending; its release comes next):
    ``<pid>.exiting``, then wait for the test's ``go`` file, at most a minute."""
    import time

    Path(markers, f"{os.getpid()}.exiting").touch()
    for _ in range(600):
        if Path(markers, "go").exists():
            return
        time.sleep(0.1)


def init_with_death_signal(signum: int) -> None:
    """Pool initializer: this parent-death signal (0: none), then a lease."""
    from billiard.util import set_pdeathsig

    set_pdeathsig(signum)
    snowflake_db.get_generator().ensure_worker()


def death_signal_now(_: object = None) -> int | None:
    from snowflake_db.worker._parent_death import death_signal

    return death_signal()


def record_exit(markers: str, pid: int, exitcode: int) -> None:
    """The pool's ``on_process_exit``: the process is ending; its release comes next."""
    Path(markers, f"{os.getpid()}.exiting").touch()


def forking_thread(parent: int, child: int) -> int | None:
    """The thread of process ``parent`` whose child ``child`` is (the kernel sends the
    parent-death signal when that thread ends); None if no thread of ``parent`` has it."""
    for task in Path(f"/proc/{parent}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        if str(child) in children:
            return int(task.name)
    return None


def children_of(parent: int) -> set[int]:
    """The processes whose parent ``parent`` is, whichever of its threads forked them."""
    found: set[int] = set()
    for task in Path(f"/proc/{parent}/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie nobody has reaped yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    state = status.split("\nState:", 1)[1].split()[0]
    return state in ("Z", "X")


#: The Celery app of the ``celery worker`` tests (tasks.py): the recipe of
#: docs/deploying/celery.md (a lease as each pool process starts) over a filesystem broker, as
#: Celery runs brokers without event loop support: billiard's threaded pool. Markers:
#: ``<pid>.leased``, ``<pid>.busy`` (in a task), ``<pid>.exiting`` (worker_process_shutdown).
CELERY_APP = '''
import os
import signal
import time
from pathlib import Path

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

import snowflake_db
from snowflake_db import Layout
from snowflake_db.worker import TableWorkerAllocator

MARKERS = Path(os.environ["TEST_MARKERS"])
BROKER = os.environ["TEST_BROKER_DIR"]
app = Celery("tasks", broker="filesystem://")
app.conf.broker_transport_options = {
    "data_folder_in": BROKER, "data_folder_out": BROKER, "control_folder": BROKER}
snowflake_db.configure(
    allocator=TableWorkerAllocator(os.environ["SNOWFLAKE_WORKER_URL"], lease_seconds=30),
    layout=Layout(worker_bits=3),
)


@worker_process_init.connect
def lease_worker_id(**kwargs):
    snowflake_db.get_generator().ensure_worker()
    (MARKERS / f"{os.getpid()}.leased").touch()


@worker_process_shutdown.connect
def ending(**kwargs):
    """The process is ending (its release comes next): say so, then wait for the test's go
    (a slow exit path), at most a minute."""
    (MARKERS / f"{os.getpid()}.exiting").touch()
    go = MARKERS / "go"
    if (MARKERS / "hold-exits").exists():
        for _ in range(600):
            if go.exists():
                break
            time.sleep(0.1)


@app.task
def issue():
    return snowflake_db.snowflake_default()


@app.task
def hold(unresponsive=False):
    """Stay busy; ``unresponsive``: as a task inside C code that never returns to Python, never
    let this thread see SIGTERM (billiard's way to end a pool process) or the death signal."""
    if unresponsive:
        from snowflake_db.worker._parent_death import DEATH_SIGNAL

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, DEATH_SIGNAL})
    (MARKERS / f"{os.getpid()}.busy").touch()
    time.sleep(300)
'''
