"""Counters and gauges for monitoring: IDs issued, clock trouble, fencing, leases, slots.

Readable at any time with :func:`snapshot` (the whole process) or
``SnowflakeGenerator.metrics()`` (one generator and its allocator), both returning a frozen
:class:`MetricsSnapshot`; :func:`add_listener` also reports each event as it happens.

Nothing is recorded per ID, so ``next_id()`` costs the same with metrics as without: each tick's
IDs come from one ``range`` iterator (a *window*), and the IDs taken from a window are its length
minus what is left in it (``operator.length_hint``), read when the window is replaced and, for
the open window, when a snapshot is taken. A replaced window is read again for
:data:`STRAGGLER_SECONDS` more, so an ID that a thread took from it just after the replacement
still counts. Every other figure is recorded on the generator's slow path (at most once per
tick), by the allocator's heartbeat, or read from the control database on demand
(``with_slots=True``), never on the hot path.

Figures are per process. A forked child starts from zero: it inherits no counts from its
parent (whose own counts are unaffected), so every process reports only what it did itself.
Counters are never lowered while their process lives: a generator or allocator that is
garbage-collected leaves its totals to the process.

This ``__init__`` is the package's public face; the figures are declared in :mod:`._figures`,
counted in :mod:`._recorder` and told to listeners in :mod:`._events`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import forks
from ..clock import wall_clock
from ..errors import InvalidArgumentTypeError, SnowflakeError
from ._events import EVENTS, Listener, add_listener, remove_listener
from ._figures import (
    FIGURES,
    Figure,
    MetricsSnapshot,
    SlotCounts,
    SlotRowLike,
    SlotState,
    Totals,
)
from ._recorder import STRAGGLER_SECONDS, MetricsRecorder, registry

if TYPE_CHECKING:
    from ..layout import Layout

__all__ = [
    "EVENTS",
    "FIGURES",
    "STRAGGLER_SECONDS",
    "Figure",
    "Listener",
    "MetricsRecorder",
    "MetricsSnapshot",
    "SlotCounts",
    "SlotRowLike",
    "SlotState",
    "add_listener",
    "days_left",
    "remove_listener",
    "snapshot",
]

_MS_PER_DAY = 86_400_000

#: The process's recorders, under the name this module has always given them.
_registry = registry


def _no_process_generator() -> Any:
    return None


#: Where :func:`snapshot` finds the process-wide generator: :mod:`snowflake_db.process` sets it
#: on import. That module is above this one (it builds generators, which record here), so this
#: one never imports it: that import closed a circle generator -> metrics -> process.
_process_generator: Callable[[], Any] = _no_process_generator


def set_process_generator_source(source: Callable[[], Any]) -> None:
    """Tell :func:`snapshot` how to find the process-wide generator without configuring one
    (``snowflake_db.process.current_generator``)."""
    global _process_generator  # noqa: PLW0603 - set once, when snowflake_db.process is imported
    _process_generator = source


def snapshot(*, with_slots: bool = False) -> MetricsSnapshot:
    """The figures of this whole process: every generator and allocator it has used.

    ``with_slots=True`` also counts the worker slots on the control database of the
    process-wide generator (``snowflake_db.configure``), one query, if it leases from one.
    """
    forks.reset_if_forked()
    registry.settle()
    with registry.lock:
        recorders = list(registry.live)
        totals = registry.retired.copy()
    layouts = []
    for recorder in recorders:
        totals.add(recorder.totals())
        if recorder.layout is not None:
            layouts.append(recorder.layout)
    slots_from = None
    if with_slots:
        generator = _process_generator()
        slots_from = generator if generator is not None else False
    return _build(totals, layouts, slots_from)


def snapshot_of(generator: Any, *, with_slots: bool = False) -> MetricsSnapshot:
    """One generator's figures, with its allocator's lease figures (shared by the generators
    using that allocator). Used by ``SnowflakeGenerator.metrics()``."""
    forks.reset_if_forked()
    totals = generator._metrics.totals()
    allocator_recorder = getattr(generator._allocator, "metrics_recorder", None)
    if isinstance(allocator_recorder, MetricsRecorder):
        totals.add(allocator_recorder.totals())
    return _build(totals, [generator.layout], generator if with_slots else None)


def _build(totals: Totals, layouts: list[Layout], slots_from: Any) -> MetricsSnapshot:
    """``slots_from``: None (not asked), False (asked, no generator) or a generator."""
    slots: SlotCounts | None = None
    slots_error: str | None = None
    if slots_from is False:
        slots_error = "no process-wide generator is configured"
    elif slots_from is not None:
        slots, slots_error = _slot_counts(slots_from)
    time_left_days = None
    if layouts:
        time_left_days = min(days_left(layout) for layout in layouts)
    return MetricsSnapshot(
        pid=os.getpid(),
        **totals,
        time_left_days=time_left_days,
        slots=slots,
        slots_error=slots_error,
    )


def days_left(layout: Layout, now_ms: int | None = None) -> float:
    """Days from ``now_ms`` (default: the wall clock) until the layout's time bits run out."""
    if now_ms is None:
        now_ms = wall_clock()
    return (layout.max_timestamp_ms + 1 - now_ms) / _MS_PER_DAY


def _slot_counts(generator: Any) -> tuple[SlotCounts | None, str | None]:
    count = getattr(generator._allocator, "slot_counts", None)
    if count is None:
        return None, f"{generator!r} has no allocator that counts slots"
    try:
        counts = count(layout=generator.layout)
    except SnowflakeError as error:
        return None, str(error)
    if not isinstance(counts, SlotCounts):
        raise InvalidArgumentTypeError(f"slot_counts() returned {counts!r}, not SlotCounts")
    return counts, None
