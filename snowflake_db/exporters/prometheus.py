"""Prometheus: a collector that reads :func:`snowflake_db.metrics.snapshot` at scrape time.

::

    from prometheus_client import REGISTRY
    from snowflake_db.exporters.prometheus import SnowflakeCollector

    REGISTRY.register(SnowflakeCollector())

Every figure of :data:`snowflake_db.metrics.FIGURES` becomes ``snowflake_db_<field>``
(counters get Prometheus's ``_total`` suffix); with ``with_slots=True`` each scrape also counts
the control database's slots (one query) as ``snowflake_db_worker_slots{state=...}``.
It reports the process that answers the scrape: behind a prefork server use
:mod:`snowflake_db.exporters.prometheus_multiprocess` for the workers' figures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from ..errors import InvalidArgumentError, MissingExtraError

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as error:
    raise MissingExtraError(__name__, package="prometheus_client", extra="prometheus") from error

from .. import metrics
from ..metrics import FIGURES, Figure, MetricsSnapshot

__all__ = ["PREFIX", "SnowflakeCollector", "help_text"]

PREFIX = "snowflake_db_"
logger = logging.getLogger("snowflake_db.exporters")


class SnowflakeCollector(Collector):
    """Exposes this process's snowflake_db figures; register it once per registry.

    ``snapshot`` replaces the process-wide :func:`snowflake_db.metrics.snapshot` (for example
    ``generator.metrics``) and receives ``with_slots``. ``process_figures=False`` leaves out
    this process's figures, for the scraping process of a prefork server whose figures come
    from :mod:`snowflake_db.exporters.prometheus_multiprocess` (the slots are the fleet's).
    """

    def __init__(
        self,
        *,
        with_slots: bool = False,
        process_figures: bool = True,
        snapshot: Callable[..., MetricsSnapshot] = metrics.snapshot,
    ) -> None:
        if not (with_slots or process_figures):
            raise InvalidArgumentError(
                "SnowflakeCollector(with_slots=False, process_figures=False) would report "
                "nothing; keep one of them"
            )
        self.with_slots = bool(with_slots)
        self.process_figures = bool(process_figures)
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        # Names without values, so registering never takes a snapshot or queries a database.
        return list(self._families(None))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self._snapshot(with_slots=self.with_slots))

    def _families(self, snapshot: MetricsSnapshot | None) -> Iterator[Metric]:
        """The metric families, with the snapshot's values (None: names only)."""
        for figure in FIGURES if self.process_figures else ():
            kind = CounterMetricFamily if figure.counter else GaugeMetricFamily
            family = kind(PREFIX + figure.field, help_text(figure))
            if snapshot is not None:
                value = getattr(snapshot, figure.field)
                if value is None:
                    continue  # time_left_days without a generator
                family.add_metric([], value)
            yield family
        if self.with_slots:
            yield from _slot_families(snapshot)


def _slot_families(snapshot: MetricsSnapshot | None) -> Iterator[Metric]:
    slots = GaugeMetricFamily(
        PREFIX + "worker_slots",
        "the layout's worker IDs by state on the control database (the states add up to the "
        "capacity)",
        labels=["state"],
    )
    capacity = GaugeMetricFamily(PREFIX + "worker_slot_capacity", "worker IDs the layout allows")
    available = GaugeMetricFamily(
        PREFIX + "worker_slots_available", "worker IDs a new process could lease now"
    )
    parked = GaugeMetricFamily(
        PREFIX + "worker_slots_parked",
        "free or expired worker IDs whose high-water mark is still too far ahead to lease",
    )
    stalest = GaugeMetricFamily(
        PREFIX + "stalest_renewal_seconds",
        "seconds since the live lease that renewed longest ago last renewed",
    )
    answered = GaugeMetricFamily(
        PREFIX + "control_database_up",
        "1 if the control database answered the slot count of this scrape, else 0",
    )
    if snapshot is None:
        yield from (slots, capacity, available, parked, stalest, answered)
        return
    counts = snapshot.slots
    answered.add_metric([], 0 if counts is None else 1)
    yield answered
    if counts is None:
        # The scrape still answers (control_database_up 0); the log says why.
        logger.warning("snowflake_db: the worker slots were not counted: %s", snapshot.slots_error)
        return
    for state, count in counts.by_state().items():
        slots.add_metric([state], count)
    capacity.add_metric([], counts.size)
    available.add_metric([], counts.available)
    parked.add_metric([], counts.parked)
    yield from (slots, capacity, available, parked)
    if counts.stalest_renewal_seconds is not None:
        stalest.add_metric([], counts.stalest_renewal_seconds)
        yield stalest


def help_text(figure: Figure) -> str:
    """A figure's HELP line: its description, with the unit where the name lacks it."""
    if figure.unit in ("seconds", "ms"):
        return f"{figure.description} ({figure.unit})"
    return figure.description
