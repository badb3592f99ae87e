"""The process-wide generator behind ``snowflake_default()`` and its ``configure()``.

``snowflake_default`` is what model columns use as their default, so it is a plain zero-argument
function that SQLAlchemy and Django call once per row.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import forks, metrics
from ._validate import require_int
from .clock import Clock
from .errors import (
    ForkedWorkerIdError,
    GeneratorClosedError,
    InvalidArgumentError,
    NotConfiguredError,
)
from .generator import SnowflakeGenerator
from .layout import Layout
from .lease import WorkerAllocator

#: Environment variable holding a static worker ID, read when nothing was configured.
WORKER_ID_ENV = "SNOWFLAKE_WORKER_ID"
#: Environment variable holding a database URL for a :class:`TableWorkerAllocator`.
WORKER_URL_ENV = "SNOWFLAKE_WORKER_URL"
#: The URL forms accepted (``snowflake_db.worker``'s URL normaliser), for messages and ``--help``.
URL_FORMS = (
    "postgresql://USER@HOST/DB (or postgres://), mysql:// or mariadb://USER@HOST/DB, "
    "or sqlite:///PATH"
)
#: Entry-point group of allocator factories (a callable taking the URL); ``table`` serves
#: ``SNOWFLAKE_WORKER_URL``.
ALLOCATOR_ENTRY_POINTS = "snowflake_db.allocators"

_NOT_CONFIGURED_HELP = (
    "snowflake_db is not configured: call snowflake_db.configure(worker_id=N) with a worker ID "
    "unique to this process, or snowflake_db.configure(allocator="
    "snowflake_db.worker.TableWorkerAllocator(url)) to lease one from a database table, or set "
    f"the environment variable {WORKER_URL_ENV} (a database URL) or {WORKER_ID_ENV} (an integer)"
)

# What NotConfiguredError says; integrations (the Django app) name their own settings instead.
_not_configured_help = _NOT_CONFIGURED_HELP

# Re-entrant: configuring from the environment runs configure() while holding it.
_lock = threading.RLock()
_generator: SnowflakeGenerator | None = None
_forked_from_pid: int | None = None
# The clock and last tick of each retired static generator, so that a later generator with the
# same worker ID, layout and clock (configure(5), configure(6), configure(5)) starts above it.
_retired_ticks: dict[tuple[Layout, int], tuple[Clock, int]] = {}


def _process_lock() -> threading.RLock:
    """The module's lock, after this process's after-fork reset (see :mod:`snowflake_db.forks`)."""
    forks.reset_if_forked()
    return _lock


def _unconfigured_next_id() -> int:
    return get_generator().next_id()


_next_id: Callable[[], int] = _unconfigured_next_id


def snowflake_default() -> int:
    """The next ID from the process-wide generator: use it as a column or field default."""
    try:
        return _next_id()
    except GeneratorClosedError:
        # configure() replaced the generator while this call was in flight: use the new one.
        return get_generator().next_id()


def configure(
    *,
    worker_id: int | None = None,
    allocator: WorkerAllocator | None = None,
    layout: Layout | None = None,
    clock: Clock | None = None,
    **generator_options: Any,
) -> SnowflakeGenerator:
    """Set up the process-wide generator and return it.

    Give a static ``worker_id`` unique to this process, or an ``allocator`` that leases one from a
    database table (each forked child leases its own). With neither, the environment is used:
    ``SNOWFLAKE_WORKER_URL`` (a table allocator URL), then ``SNOWFLAKE_WORKER_ID``.
    Extra keyword arguments go to :class:`SnowflakeGenerator`.
    """
    if worker_id is None and allocator is None:
        with _process_lock():
            return _configure_from_environment(layout=layout, clock=clock, **generator_options)
    generator = SnowflakeGenerator(
        worker_id, layout=layout, clock=clock, allocator=allocator, **generator_options
    )
    _install(generator)
    return generator


def get_generator() -> SnowflakeGenerator:
    """The process-wide generator, configured from the environment (once) if need be."""
    generator = _generator
    if generator is not None:
        return generator
    with _process_lock():
        if _generator is not None:
            return _generator
        return _configure_from_environment()


def current_generator() -> SnowflakeGenerator | None:
    """The process-wide generator if one is configured; unlike :func:`get_generator`, never
    configures one (for monitoring, which must not lease a worker ID)."""
    return _generator


def reset() -> None:
    """Close and forget the process-wide generator (tests, shutdown)."""
    global _generator, _next_id  # noqa: PLW0603
    with _process_lock():
        previous, _generator = _generator, None
        _next_id = _unconfigured_next_id
        if previous is not None:
            _retire(previous)


@contextmanager
def overridden(generator: SnowflakeGenerator) -> Iterator[SnowflakeGenerator]:
    """Make ``generator`` the process-wide one for the block, then put the previous one back.

    Neither is closed (the caller owns ``generator``): for tests, see
    :func:`snowflake_db.testing.deterministic_ids`.
    """
    global _generator, _next_id
    with _process_lock():
        saved = (_generator, _next_id)
        _generator, _next_id = generator, generator.next_id
    try:
        yield generator
    finally:
        with _process_lock():
            _generator, _next_id = saved


def _install(generator: SnowflakeGenerator) -> None:
    """Replace the process-wide generator without ever letting two issue from the same ticks.

    The old generator is closed first: from then on it can only hand out what is left of the
    windows it already opened. The new one starts above the last tick its worker ID used here.
    """
    global _generator, _next_id  # noqa: PLW0603
    with _process_lock():
        previous = _generator
        if previous is not None and previous is not generator:
            _retire(previous)
        if generator.worker_id is not None:
            retired = _retired_ticks.get((generator.layout, generator.worker_id))
            if retired is not None and retired[0] is generator.clock:
                generator.resume_after(retired[1])
        _generator = generator
        _next_id = generator.next_id


def _retire(generator: SnowflakeGenerator) -> None:
    worker_id = generator.worker_id
    generator.close()
    if worker_id is not None:
        key = (generator.layout, worker_id)
        previous = _retired_ticks.get(key)
        last_tick = generator.last_tick
        if previous is not None and previous[0] is generator.clock:
            last_tick = max(last_tick, previous[1])
        _retired_ticks[key] = (generator.clock, last_tick)


def set_not_configured_help(text: str | None) -> None:
    """Replace what ``NotConfiguredError`` says (None restores the default).

    For integrations whose users configure through their own settings: the Django app names
    ``SNOWFLAKE_DB`` here, which the environment-based default message cannot know about.
    """
    global _not_configured_help  # noqa: PLW0603
    _not_configured_help = _NOT_CONFIGURED_HELP if text is None else text


def _configure_from_environment(
    *, layout: Layout | None = None, clock: Clock | None = None, **generator_options: Any
) -> SnowflakeGenerator:
    url = os.environ.get(WORKER_URL_ENV, "").strip()
    raw_worker_id = os.environ.get(WORKER_ID_ENV, "").strip()
    if url:
        return configure(
            allocator=_table_allocator(url), layout=layout, clock=clock, **generator_options
        )
    if not raw_worker_id:
        raise NotConfiguredError(_not_configured_help)
    parent_pid = _forked_from_pid or _multiprocessing_parent_pid()
    if parent_pid is not None:
        raise ForkedWorkerIdError(
            f"{WORKER_ID_ENV}={raw_worker_id} was inherited from pid {parent_pid}, which forked or "
            "spawned this process: every child it starts (gunicorn, uvicorn --workers or "
            "--reload, Celery prefork, multiprocessing) would share it and issue the same IDs. "
            f"Use a table allocator ({WORKER_URL_ENV} or configure(allocator=...)), or call "
            "configure(worker_id=N) with a distinct N in each child."
        )
    try:
        worker_id = int(raw_worker_id)
    except ValueError:
        raise InvalidArgumentError(
            f"{WORKER_ID_ENV}={raw_worker_id!r} is not an integer worker ID"
        ) from None
    effective = layout if layout is not None else Layout()
    require_int(
        WORKER_ID_ENV,
        worker_id,
        minimum=0,
        maximum=effective.max_worker_id,
        limit_note=f"{effective.worker_bits} worker bits",
    )
    return configure(worker_id=worker_id, layout=layout, clock=clock, **generator_options)


def _table_allocator(url: str) -> WorkerAllocator:
    """The allocator of ``SNOWFLAKE_WORKER_URL``, found through the ``table`` entry point.

    The core imports only the standard library: ``snowflake_db.worker`` registers its
    ``TableWorkerAllocator`` in the package metadata (``pyproject.toml``), so nothing here names
    it. A registration at import time would not do: nothing imports ``snowflake_db.worker``
    when the URL comes from the environment.
    """
    from importlib.metadata import entry_points

    found = entry_points(group=ALLOCATOR_ENTRY_POINTS, name="table")
    if not found:
        raise NotConfiguredError(
            f"{WORKER_URL_ENV} is set, but no allocator is registered under the entry point "
            f"group {ALLOCATOR_ENTRY_POINTS!r} (name 'table'): install the snowflake-db "
            "distribution (pip install snowflake-db[sqlalchemy]) rather than running it from a "
            "bare source tree, or call configure(allocator=...)"
        )
    factory: Callable[[str], WorkerAllocator] = next(iter(found)).load()
    return factory(url)


def _multiprocessing_parent_pid() -> int | None:
    """The parent's pid in a multiprocessing child (spawn and forkserver copy the environment)."""
    multiprocessing = sys.modules.get("multiprocessing")
    parent = multiprocessing.parent_process() if multiprocessing is not None else None
    return None if parent is None else parent.pid


def _after_fork_in_child(parent_pid: int) -> None:
    global _forked_from_pid  # noqa: PLW0603
    global _lock  # noqa: PLW0603
    _forked_from_pid = parent_pid
    _lock = threading.RLock()


forks.on_fork(_after_fork_in_child)
metrics.set_process_generator_source(current_generator)
