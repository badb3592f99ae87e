"""The ``database_delay`` probe: how long the test's database took to commit a one-row write.

A lease renewal is one UPDATE and its commit. When the shared server is overloaded (its threads
waiting for a CPU, its commits for the disk: load 17-21 on two cores, beside a second suite and
the lease benchmark) that can outlast a short lease's slack although this process ran on time
(``scheduler_delay``) and the product did nothing wrong. A probe on a connection of its own
commits a one-row UPDATE every 100 ms and records how long each took; a test excuses a lapse
by the database only when the probe saw a commit that slow around it. A product that stops
renewing (what such tests guard) still fails: the probe then sees a database that answers.

SQLite's probe writes a file of its own beside the database (the same disk, not the same
lock: it must not hold up the renewals it measures).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text

from .databases import ScratchDatabase
from .scheduler_delay import monotonic

#: How long the probe waits between two commits.
PROBE_INTERVAL_S = 0.1
_TABLE = "sfdb_database_delay_probe"


class DatabaseDelay:
    """A thread committing a one-row UPDATE over and over, recording when each began and
    ended (:func:`~.scheduler_delay.monotonic`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._began = array("d")
        self._ended = array("d")
        self._pending = float("inf")  # the commit under way, if any
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="database-delay-probe",
                                        daemon=True)

    def start(self) -> None:
        with self._engine.begin() as connection:
            connection.execute(text(f"CREATE TABLE IF NOT EXISTS {_TABLE} "
                                    "(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"))
            connection.execute(text(f"DELETE FROM {_TABLE}"))
            connection.execute(text(f"INSERT INTO {_TABLE} (id, n) VALUES (1, 0)"))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = monotonic()
            with self._lock:
                self._pending = began
            try:
                with self._engine.begin() as connection:
                    connection.execute(text(f"UPDATE {_TABLE} SET n = n + 1 WHERE id = 1"))
            except Exception:  # a cut database (outage tests): the span stays pending
                self._stop.wait(PROBE_INTERVAL_S)
                continue
            ended = monotonic()
            with self._lock:
                self._began.append(began)
                self._ended.append(ended)
                self._pending = float("inf")
            self._stop.wait(PROBE_INTERVAL_S)

    def slowest(self, start: float, end: float) -> float:
        """The longest commit that overlapped ``[start, end]`` (one still under way counts up
        to now), in seconds."""
        with self._lock:
            spans = [(b, e) for b, e in zip(self._began, self._ended, strict=True)
                     if e >= start and b <= end]
            if self._pending <= end:
                spans.append((self._pending, monotonic()))
        return max((e - b for b, e in spans), default=0.0)


def _probe_engine(database: ScratchDatabase) -> Engine:
    if database.backend == "sqlite":
        return create_engine(f"sqlite:///{database.url.database}.delay-probe")
    return create_engine(database.url, pool_size=1, max_overflow=0)


@contextmanager
def database_probing(database: ScratchDatabase) -> Iterator[DatabaseDelay]:
    """A probe of ``database`` running for the ``with`` block."""
    engine = _probe_engine(database)
    probe = DatabaseDelay(engine)
    try:
        probe.start()
        yield probe
    finally:
        probe.stop()
        engine.dispose()
