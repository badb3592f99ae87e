"""A fork must not copy SQLite in the middle of a call.

SQLite keeps process-wide mutexes (its global mutex, the unix VFS lock taken when files are
opened and closed). If one thread is inside SQLite while another thread forks, the child starts
with that mutex held by a thread it does not have, and blocks for good in its first
``sqlite3.connect``: seen with billiard's pool (Celery), which forks from a supervisor thread
while the parent's heartbeat renews its lease on a SQLite control database. SQLite's own advice
is never to carry a call or a connection across ``fork()``
(https://www.sqlite.org/howtocorrupt.html#_carrying_an_open_database_connection_across_a_fork_).

So every SQLite engine of an allocator counts itself in while it connects or has a connection
checked out (:func:`gate_engine`), and a fork waits, for at most :data:`FORK_WAIT_S`, until no
such call is under way; new calls wait until the fork is done. PostgreSQL and MariaDB engines
are not gated: their drivers hold no process-wide lock across a call.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from sqlalchemy import Engine, event

from .. import forks

#: The longest a fork waits for SQLite calls of other threads to finish (then it forks anyway,
#: as it would without the gate).
FORK_WAIT_S = 5.0

_condition = threading.Condition()
_calls = 0  # SQLite connects and checked-out connections under way in this process
_forking = False


def gate_engine(engine: Engine) -> None:
    """Count ``engine``'s connects and checked-out connections as SQLite calls under way."""

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        _enter()
        try:
            return dialect.connect(*cargs, **cparams)
        finally:
            _leave()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        _enter()

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, record: Any) -> None:
        _leave()


def _enter() -> None:
    global _calls  # noqa: PLW0603 - the process-wide count the fork hook reads
    with _condition:
        _condition.wait_for(lambda: not _forking, timeout=FORK_WAIT_S)
        _calls += 1


def _leave() -> None:
    global _calls  # noqa: PLW0603
    with _condition:
        _calls = max(0, _calls - 1)
        _condition.notify_all()


def _before_fork() -> None:
    global _forking  # noqa: PLW0603
    with _condition:
        _forking = True
        _condition.wait_for(lambda: _calls == 0, timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _forking  # noqa: PLW0603
    with _condition:
        _forking = False
        _condition.notify_all()


def _after_fork_in_child(parent_pid: int) -> None:
    """The child has only the forking thread: nothing is under way, and the condition's lock
    is a copy another thread may have held."""
    global _condition, _calls, _forking  # noqa: PLW0603
    _condition = threading.Condition()
    _calls = 0
    _forking = False


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
forks.on_fork(_after_fork_in_child)
