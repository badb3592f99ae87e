"""Process hooks: fork hygiene and release at a clean exit, for every live allocator.

After ``os.fork()`` the child owns copies of the parent's pooled connections and leases. It must
not use either: the connections' sockets are shared with the parent, and the leases are the
parent's. Each allocator's part of the child's reset drops the pools without closing them
(``Engine.dispose(close=False)``, see
https://docs.sqlalchemy.org/en/20/core/pooling.html#using-connection-pools-with-multiprocessing-or-os-fork),
marks inherited leases abandoned and starts a new heartbeat; generators then lease a new worker
ID lazily. It runs as part of :mod:`snowflake_db.forks`' one reset per process: from Python's
fork hook, or from the first allocator or generator call in a child forked without the hooks.

Pool children (``multiprocessing`` fork and forkserver, billiard: Celery's prefork pool) end
with ``os._exit``, which skips ``atexit``; a child that takes a lease runs the exit hooks from
its pool's own exit path instead (:func:`release_at_child_exit`), and on SIGTERM, with which
``Pool.terminate()`` ends them (:mod:`snowflake_db.shutdown`).

**Exit paths of pool children.** ``multiprocessing`` (fork and forkserver):
``Process._bootstrap`` runs the finalizers registered in the child
(``multiprocessing.util._exit_function``) before ``os._exit``. billiard (Celery's prefork pool):
its ``Process._bootstrap`` runs the same function (``billiard.util`` re-exports
multiprocessing's ``Finalize`` and ``_exit_function``), but a pool worker never gets there:
``billiard.pool.Worker._do_exit`` calls ``os._exit`` itself, straight after the worker's
``on_exit(pid, exitcode)`` callback (the pool's ``on_process_exit``; Celery's
``process_destructor``, which sends ``worker_process_shutdown``). So a pool worker releases from
that callback, after the one it had (:func:`via_billiard`, :func:`via_multiprocessing`). Neither
library is imported here: only one already loaded can have started this process.

A billiard pool worker's release holds off billiard's terminate signal (SIGTERM) and the
library's parent-death signal, whose handlers raise ``SystemExit`` wherever the process is:
``Pool.terminate()``, or the parent's death, arriving during the release would cut it short.
Celery sets that death signal to SIGKILL, which Linux also sends when the *thread* that forked
the process ends (billiard's supervisor thread, in a warm shutdown): :mod:`._parent_death` makes
it a signal of the library's own, handled once, instead.

**A fork must not copy SQLite in the middle of a call.** SQLite keeps process-wide mutexes (its
global mutex, the unix VFS lock taken when files are opened and closed). If one thread is inside
SQLite while another thread forks, the child starts with that mutex held by a thread it does not
have, and blocks for good in its first ``sqlite3.connect``: seen with billiard's pool (Celery),
which forks from a supervisor thread while the parent's heartbeat renews its lease on a SQLite
control database. SQLite's own advice is never to carry a call or a connection across ``fork()``
(https://www.sqlite.org/howtocorrupt.html#_carrying_an_open_database_connection_across_a_fork_).
So every SQLite engine of an allocator counts itself in while it connects or has a connection
checked out (:func:`gate_engine`), and a fork waits, for at most :data:`FORK_WAIT_S`, until no
such call is under way; new calls wait until the fork is done. PostgreSQL and MariaDB engines
are not gated: their drivers hold no process-wide lock across a call.

The gate cannot cover every fork: a fork that skips Python's hooks (uWSGI without
``py-call-uwsgi-fork-hooks``), one that waited :data:`FORK_WAIT_S` in vain, or one that lands in
SQLite calls the gate does not count (the pool's ping before a checkout, the close of a
connection given back). So a forked child's first SQLite connect runs in a thread of its own,
given :data:`FORK_CONNECT_WAIT_S`; if it is still waiting then, a lock was copied held, and
every allocator call on SQLite in that process fails with
:class:`~snowflake_db.errors.AllocatorUnavailableError` saying so, rather than hanging for good
(seen once in 16 raw forks beside a busy heartbeat, under load).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event

from .. import forks
from ..errors import AllocatorUnavailableError
from ..shutdown import (
    add_release_hook,
    release_on_sigterm_in_pool_child,
    signals_deferred,
    signals_held,
)
from . import _parent_death

# -- exit paths of pool children ------------------------------------------------------------


def via_billiard(release: Callable[[], None]) -> bool:
    """In a billiard child, arrange for ``release`` to run as it ends; False elsewhere."""
    current = _billiard_child()
    if current is None:
        return False
    worker = _billiard_pool_worker(current)
    if worker is not None:
        worker.on_exit = _ReleaseAfter(worker.on_exit, release)
        return True
    _finalize(release)  # a plain billiard.Process: its _bootstrap runs the finalizers
    return True


def _billiard_child() -> Any:
    """billiard's record of this process if billiard started it; else None."""
    process = sys.modules.get("billiard.process")
    if process is None:
        return None
    current = process.current_process()
    if getattr(current, "_parent_pid", None) is None:
        return None  # billiard's main process (a Celery worker's parent), not a child
    return current


def _billiard_pool_worker(current: Any) -> Any:
    """The ``billiard.pool.Worker`` this billiard child runs, if it is a pool process."""
    pool = sys.modules.get("billiard.pool")
    worker = getattr(current, "_target", None)  # a pool process runs a Worker as its target
    return worker if pool is not None and isinstance(worker, pool.Worker) else None


def _release_as_billiard_pool_worker() -> bool:
    """In a billiard pool process (Celery's prefork pool), release from its exit path with its
    terminate and death signals held off, and take over a SIGKILL parent-death signal
    (:mod:`._parent_death`); False elsewhere."""
    current = _billiard_child()
    worker = _billiard_pool_worker(current) if current is not None else None
    if worker is None:
        return False
    common = sys.modules.get("billiard.common")
    terminate = int(getattr(common, "TERM_SIGNAL", signal.SIGTERM))
    release = _parent_death.ExitRelease(_at_exit)
    worker.on_exit = _ReleaseAfter(worker.on_exit, release,
                                   hold=(terminate, _parent_death.DEATH_SIGNAL))
    _parent_death.take_over(current._parent_pid, release)
    return True


def via_multiprocessing(release: Callable[[], None]) -> bool:
    """In a ``multiprocessing`` child, arrange for ``release`` to run as it ends; False
    elsewhere (the finalizers inherited from the parent are cleared when a child starts)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return False
    _finalize(release)
    return True


def _finalize(release: Callable[[], None]) -> None:
    from multiprocessing import util

    util.Finalize(None, release, exitpriority=0)


class _ReleaseAfter:
    """A billiard pool worker's ``on_exit``: the callback it had first (its receivers, such as
    Celery's ``worker_process_shutdown``, may still issue IDs), then the release, with the
    ``hold`` signals held off: billiard's handler of its terminate signal raises
    ``SystemExit`` wherever the process is, and a release cut short leaves the slot parked."""

    def __init__(
        self, previous: Any, release: Callable[[], None], hold: tuple[int, ...] = ()
    ) -> None:
        self.previous = previous
        self.release = release
        self.hold = hold

    def __call__(self, pid: int, exitcode: int) -> None:
        try:
            if self.previous is not None:
                self.previous(pid, exitcode)
        finally:
            with signals_held(self.hold):
                self.release()


# -- the SQLite fork gate -------------------------------------------------------------------

#: The longest a fork waits for SQLite calls of other threads to finish (then it forks anyway,
#: as it would without the gate).
FORK_WAIT_S = 5.0
#: The longest a forked child's first SQLite connect may take before the child decides that
#: the fork copied one of SQLite's process-wide locks held (a local connect takes milliseconds).
FORK_CONNECT_WAIT_S = 10.0

_condition = threading.Condition()
_calls = 0  # SQLite connects and checked-out connections under way in this process
_forking = False
_first_connect_watched = False  # a forked child's first connect, until one has succeeded
_sqlite_wedged: str | None = None  # why SQLite cannot be used in this process
_kept_from_the_parent: list[Any] = []  # the parent's SQLite pools, never closed in a child


def keep_parent_sqlite_connections(engine: Engine) -> None:
    """In a forked child, before ``engine.dispose(close=False)``: keep the parent's pool of a
    SQLite engine referenced for good, so the garbage collector never closes its connections
    here. A close takes SQLite's locks, and one a thread of the parent held at the fork is
    never released (a child hung so in the collector, after its own connect had been told);
    SQLite's advice is to leave a connection carried across a fork alone."""
    if engine.dialect.name == "sqlite":
        _kept_from_the_parent.append(engine.pool)


def gate_engine(engine: Engine) -> None:
    """Count ``engine``'s connects and checked-out connections as SQLite calls under way."""

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        _sqlite_enter()
        try:
            if _first_connect_watched or _sqlite_wedged:
                return _watched_connect(dialect, cargs, cparams)
            return dialect.connect(*cargs, **cparams)
        finally:
            _sqlite_leave()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        _sqlite_enter()

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, record: Any) -> None:
        _sqlite_leave()


def _watched_connect(dialect: Any, cargs: Any, cparams: Any) -> Any:
    """A forked child's first connect, in a thread given :data:`FORK_CONNECT_WAIT_S`: still
    waiting then, it waits on a lock of SQLite's that a thread of the parent held at the fork,
    for good; the process is marked so and the caller told. Connected directly where no thread
    may start, or where the connection must stay in its thread (``check_same_thread``)."""
    global _first_connect_watched, _sqlite_wedged  # noqa: PLW0603
    if _sqlite_wedged:
        raise AllocatorUnavailableError(_sqlite_wedged)
    if cparams.get("check_same_thread", True) or not forks.threads_allowed():
        return dialect.connect(*cargs, **cparams)
    outcome: dict[str, Any] = {}

    def connect() -> None:
        try:
            outcome["connection"] = dialect.connect(*cargs, **cparams)
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=connect, name="sfdb-sqlite-first-connect", daemon=True)
    thread.start()
    thread.join(FORK_CONNECT_WAIT_S)
    if thread.is_alive():
        _sqlite_wedged = (
            f"pid {os.getpid()}: SQLite's first connect in this forked process did not finish "
            f"in {FORK_CONNECT_WAIT_S:g} s: the fork copied a process-wide SQLite lock held by "
            "a thread of the parent (a fork that skipped Python's fork hooks, or landed in a "
            "SQLite call), and no SQLite call can take it in this process; fork before "
            "the parent's first lease, fork with os.fork(), or keep the worker table on "
            "PostgreSQL or MariaDB"
        )
        raise AllocatorUnavailableError(_sqlite_wedged)
    _first_connect_watched = False
    if "error" in outcome:
        raise outcome["error"]
    return outcome["connection"]


def _sqlite_enter() -> None:
    global _calls  # noqa: PLW0603 - the process-wide count the fork hook reads
    with _condition:
        _condition.wait_for(lambda: not _forking, timeout=FORK_WAIT_S)
        _calls += 1


def _sqlite_leave() -> None:
    global _calls  # noqa: PLW0603
    with _condition:
        _calls = max(0, _calls - 1)
        _condition.notify_all()


def _sqlite_before_fork() -> None:
    global _forking  # noqa: PLW0603
    with _condition:
        _forking = True
        _condition.wait_for(lambda: _calls == 0, timeout=FORK_WAIT_S)


def _sqlite_after_fork_in_parent() -> None:
    global _forking  # noqa: PLW0603
    with _condition:
        _forking = False
        _condition.notify_all()


def _sqlite_after_fork_in_child(parent_pid: int) -> None:
    """The child has only the forking thread: nothing is under way, and the condition's lock
    is a copy another thread may have held."""
    global _condition, _calls, _forking, _first_connect_watched  # noqa: PLW0603
    _condition = threading.Condition()
    _calls = 0
    _forking = False
    _first_connect_watched = True


os.register_at_fork(before=_sqlite_before_fork, after_in_parent=_sqlite_after_fork_in_parent)
forks.on_fork(_sqlite_after_fork_in_child)


# -- every live allocator's hooks -----------------------------------------------------------

#: Per live allocator, weak references to its two hooks (it registers its own methods, so this
#: module calls nothing private and keeps no allocator alive).
_hooks: list[tuple[weakref.WeakMethod[Any], weakref.WeakMethod[Any]]] = []
#: The process whose multiprocessing exit path already runs the exit hooks.
_finalizer_pid: int | None = None


def track(after_fork_in_child: Callable[[int], None], at_exit: Callable[[], None]) -> None:
    """Call these bound methods after a fork (in the child, with the parent's PID) and at a
    clean exit, for as long as their object lives."""
    _live()  # drop the entries of objects gone since
    _hooks.append((weakref.WeakMethod(after_fork_in_child), weakref.WeakMethod(at_exit)))


def _live() -> list[tuple[Callable[..., None], Callable[..., None]]]:
    """The hooks of objects still alive; dead entries are dropped."""
    live = []
    for after_fork, at_exit in list(_hooks):
        fork_hook, exit_hook = after_fork(), at_exit()
        if fork_hook is None or exit_hook is None:
            # No lock (a fork hook must never wait on one): another thread may remove it first.
            with contextlib.suppress(ValueError):
                _hooks.remove((after_fork, at_exit))
            continue
        live.append((fork_hook, exit_hook))
    return live


def release_at_child_exit() -> None:
    """In a pool child that will end with ``os._exit``, run the exit hooks from its pool's own
    exit path: multiprocessing's finalizers, or a billiard pool worker's ``on_exit``.

    Called whenever a lease is taken, so a recycled pool worker (``maxtasksperchild``, Celery's
    ``--max-tasks-per-child``) frees its slot as it ends rather than parking it for the lease
    length, and so does one that ``Pool.terminate()`` ends with SIGTERM (while SIGTERM has its
    default action). In a billiard pool worker it also takes over a SIGKILL parent-death signal
    (Celery's; :mod:`._parent_death`). Once per process; a no-op outside such children.
    """
    global _finalizer_pid  # noqa: PLW0603
    pid = os.getpid()
    if _finalizer_pid == pid:
        return
    if (
        _release_as_billiard_pool_worker()
        or via_billiard(_at_exit)
        or via_multiprocessing(_at_exit)
    ):
        _finalizer_pid = pid
        release_on_sigterm_in_pool_child()


def _after_fork_in_child(parent_pid: int) -> None:
    for after_fork, _ in _live():
        after_fork(parent_pid)


def _at_exit() -> None:
    forks.reset_if_forked()  # a child forked without the hooks must not close the parent's pools
    with signals_deferred():  # Pool.terminate()'s SIGTERM must not cut a release short
        for _, at_exit in _live():
            at_exit()


forks.on_fork(_after_fork_in_child)
atexit.register(_at_exit)
add_release_hook(_at_exit)  # snowflake_db.install_signal_handlers(): SIGTERM releases too
