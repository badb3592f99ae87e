"""Prometheus behind a prefork server: every process's figures, summed at scrape time.

A :class:`~snowflake_db.exporters.prometheus.SnowflakeCollector` reports the process that answers
the scrape; behind gunicorn or uWSGI each scrape reaches another worker, so its counters would
jump up and down. ``prometheus_client``'s multiprocess mode
(https://prometheus.github.io/client_python/multiprocess/) solves that with per-process files
that the scraping process adds up. :func:`publish_multiprocess` copies this process's figures
into such files every ``interval_seconds`` (and at exit), in a daemon thread that forked
children start again::

    # PROMETHEUS_MULTIPROC_DIR is set before prometheus_client is first imported
    from snowflake_db.exporters.prometheus_multiprocess import publish_multiprocess

    publish_multiprocess()

The metric names are :class:`SnowflakeCollector`'s. Counters are summed over every process
that wrote to the directory; ``fenced_generators`` is summed over live processes, the two
maxima are the largest seen, ``time_left_days`` is the smallest among live processes. The
control database's slots are one figure for the whole fleet, not a per-process one: count
them in the scraping process with ``SnowflakeCollector(with_slots=True, process_figures=False)``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    MissingExtraError,
    NotConfiguredError,
)
from ..shutdown import keep_signals_off_this_thread

try:
    from prometheus_client import Counter, Gauge, values
except ImportError as error:
    raise MissingExtraError(__name__, package="prometheus_client", extra="prometheus") from error

from .. import metrics
from ..metrics import FIGURES, MetricsSnapshot
from .prometheus import PREFIX, help_text

__all__ = ["DEFAULT_INTERVAL_SECONDS", "MultiprocessPublisher", "publish_multiprocess"]

#: How often each process copies its figures into its file, by default.
DEFAULT_INTERVAL_SECONDS = 5.0
#: Accepted intervals, in seconds: a tenth of a second (tests) to an hour.
_INTERVAL_RANGE = (0.1, 3600.0)

#: How each gauge combines over processes (prometheus_client's ``multiprocess_mode``).
_GAUGE_MODES: dict[str, Any] = {
    "clock_rollback_max_ms": "max",
    "fenced_generators": "livesum",
    "lease_renewal_max_seconds": "max",
    "time_left_days": "livemin",
}

logger = logging.getLogger("snowflake_db.exporters")

_publisher: MultiprocessPublisher | None = None
_publisher_lock = threading.RLock()  # publish_multiprocess holds it while one is made


def publish_multiprocess(
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
) -> MultiprocessPublisher:
    """Start copying this process's figures (and its forked children's) to
    ``PROMETHEUS_MULTIPROC_DIR``; a second call with the same interval returns the same
    publisher."""
    with _publisher_lock:
        if _publisher is not None:
            if _publisher.interval_seconds != interval_seconds:
                raise InvalidArgumentError(
                    f"publish_multiprocess(interval_seconds={interval_seconds!r}): this process "
                    f"already publishes every {_publisher.interval_seconds!r} s; call it once "
                    "(a second publisher would count every figure twice)"
                )
            return _publisher
        return MultiprocessPublisher(interval_seconds)


class MultiprocessPublisher:
    """Copies :func:`snowflake_db.metrics.snapshot` into multiprocess-mode metric objects.

    Counters receive what grew since the last copy; a forked child starts from zero, as its
    figures and its file do. One per process (made by :func:`publish_multiprocess`): two would
    add the same growth twice.
    """

    def __init__(
        self,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        *,
        snapshot: Callable[..., MetricsSnapshot] = metrics.snapshot,
    ) -> None:
        low, high = _INTERVAL_RANGE
        if isinstance(interval_seconds, bool) or not isinstance(interval_seconds, int | float):
            raise InvalidArgumentTypeError(
                f"interval_seconds must be a number of seconds, got {interval_seconds!r}"
            )
        if not low <= interval_seconds <= high:
            raise InvalidArgumentError(
                f"interval_seconds={interval_seconds!r} is outside {low:g}..{high:g} seconds"
            )
        _require_multiprocess_mode()
        global _publisher  # noqa: PLW0603
        with _publisher_lock:
            if _publisher is not None:
                raise InvalidArgumentError(
                    "this process already has a MultiprocessPublisher; a second one would count "
                    "every figure twice (publish_multiprocess() returns the existing one)"
                )
            _publisher = self
        self.interval_seconds = interval_seconds
        self._snapshot = snapshot
        self._files_made_for: int | None = None
        self._make_files()  # the values below open this process's files at once
        # registry=None: the scraping process reads the files, not a registry (and a second
        # registration of the same names would fail).
        self._counters = {
            figure.field: Counter(
                PREFIX + figure.field, help_text(figure), registry=None
            )
            for figure in FIGURES
            if figure.counter
        }
        self._gauges = {
            figure.field: Gauge(
                PREFIX + figure.field,
                help_text(figure),
                registry=None,
                multiprocess_mode=_GAUGE_MODES[figure.field],
            )
            for figure in FIGURES
            if not figure.counter
        }
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._published: dict[str, float] = {}
        self._start_thread()
        # Python's fork hook (gunicorn --preload, Celery prefork, multiprocessing fork): the
        # child gets its own thread. A fork without the hooks is still counted right (the pid
        # check in publish()), from its own publish() or exit only. The fork waits for a copy
        # under way: prometheus_client's multiprocess values share one plain lock, taken by
        # this thread's inc() and set(); forked while it held it, a child would inherit it
        # held and hang at its first copy.
        os.register_at_fork(before=self._before_fork, after_in_parent=self._after_fork_in_parent,
                            after_in_child=self._after_fork_in_child)
        atexit.register(self._publish_logged)
        # Pool children end with os._exit, past atexit: at a child's first lease (its first ID)
        # the last copy is hooked onto its pool's exit path, as the lease's release is.
        self._exit_hooked_pid = self._pid
        metrics.add_listener(self._on_event)

    def publish(self) -> None:
        """Copy the figures now (the thread does it every ``interval_seconds``)."""
        snapshot = self._snapshot()
        with self._lock:
            pid = os.getpid()
            if pid != self._pid:  # a fork that skipped the hooks: this child starts from zero
                self._pid, self._published = pid, {}
            self._make_files()
            for field, counter in self._counters.items():
                total = getattr(snapshot, field)
                grown = total - self._published.get(field, 0)
                if grown > 0:
                    counter.inc(grown)
                    self._published[field] = total
            for field, gauge in self._gauges.items():
                value = getattr(snapshot, field)
                if value is not None:
                    gauge.set(value)

    def _make_files(self) -> None:
        """Make this process's value files, each whole at once, before prometheus_client opens
        them (in a forked child, at the first copy).

        prometheus_client makes a missing file empty and only then sizes it: a scrape in
        between fails on every process's figures (``struct.error``, "unpack_from requires a
        buffer of at least 4 bytes"; seen here in a pool child's first copy), and a process
        killed in between leaves the empty file for every later scrape
        (https://github.com/prometheus/client_python/issues/1199). A file linked into place
        already sized, all zeros, reads as holding no value yet, as a new one does; one that
        exists (another metric of the process made it) is left as it is."""
        pid = os.getpid()
        if self._files_made_for == pid:
            return
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory:
            prefixes = ["counter", *sorted({f"gauge_{mode}" for mode in _GAUGE_MODES.values()})]
            for prefix in prefixes:
                _make_value_file(os.path.join(directory, f"{prefix}_{pid}.db"))
        self._files_made_for = pid

    def _publish_logged(self) -> None:
        """publish() for the thread and the exit paths: a failure is logged, never raised."""
        try:
            self.publish()
        except Exception:
            logger.exception("snowflake_db: copying the metrics for Prometheus failed")

    def _start_thread(self) -> None:
        threading.Thread(target=self._run, name="snowflake-db-prometheus", daemon=True).start()

    def _run(self) -> None:
        keep_signals_off_this_thread()
        while True:
            time.sleep(self.interval_seconds)
            self._publish_logged()

    def _on_event(self, event: str, value: float) -> None:
        if event != "lease_acquired" or self._exit_hooked_pid == os.getpid():
            return
        self._exit_hooked_pid = os.getpid()
        # A lease came from the table allocator: SQLAlchemy is in.
        from ..worker import _process_hooks

        publish = self._publish_logged
        _process_hooks.via_billiard(publish) or _process_hooks.via_multiprocessing(publish)

    def _before_fork(self) -> None:
        self._lock.acquire()  # the lock of now: a child forked earlier made its own

    def _after_fork_in_parent(self) -> None:
        self._lock.release()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # the parent's is held by the fork
        self._pid, self._published = os.getpid(), {}
        self._start_thread()


def _make_value_file(path: str) -> None:
    """``path`` as prometheus_client makes a new value file (its initial size, zeros), appearing
    whole: written under a name the scrape does not read, then linked into place."""
    if os.path.exists(path):
        return
    from prometheus_client import mmap_dict

    size = getattr(mmap_dict, "_INITIAL_MMAP_SIZE", 1 << 16)  # any size reads the same
    temporary = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{threading.get_ident()}.new"
    with open(temporary, "wb") as file:
        file.truncate(size)
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass  # made meanwhile by prometheus_client itself (another metric of this process)
    finally:
        os.unlink(temporary)


def _require_multiprocess_mode() -> None:
    """prometheus_client picks its value files when it is first imported, from the variable."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        when = (
            f"PROMETHEUS_MULTIPROC_DIR={directory} was set after prometheus_client was imported"
            if directory
            else "PROMETHEUS_MULTIPROC_DIR is not set"
        )
        raise NotConfiguredError(
            f"prometheus_client is not in multiprocess mode ({when}): set the variable to an "
            "empty directory, writable by every worker, before the server starts (see "
            "https://prometheus.github.io/client_python/multiprocess/)"
        )
