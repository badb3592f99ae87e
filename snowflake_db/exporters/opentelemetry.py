"""OpenTelemetry: observable instruments that read :func:`snowflake_db.metrics.snapshot`.

::

    from snowflake_db.exporters.opentelemetry import create_instruments

    create_instruments()   # on the global MeterProvider's meter "snowflake_db"

Every figure of :data:`snowflake_db.metrics.FIGURES` becomes an observable counter or gauge
named ``snowflake_db.<field>``; ``with_slots=True`` adds the gauge ``snowflake_db.worker_slots``
(attribute ``state``), read from the control database at each collection (one query).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import MissingExtraError

try:
    from opentelemetry.metrics import (
        CallbackOptions,
        Instrument,
        Meter,
        Observation,
        get_meter,
    )
except ImportError as error:
    raise MissingExtraError(__name__, package="opentelemetry-api", extra="opentelemetry") from error

from .. import metrics
from ..metrics import FIGURES, Figure, MetricsSnapshot

__all__ = ["METER_NAME", "PREFIX", "create_instruments"]

METER_NAME = "snowflake_db"
PREFIX = "snowflake_db."
_UNITS = {"": "1", "seconds": "s", "ms": "ms", "days": "d"}

Callback = Callable[[CallbackOptions], Iterable[Observation]]


def create_instruments(
    meter: Meter | None = None,
    *,
    with_slots: bool = False,
    snapshot: Callable[..., MetricsSnapshot] = metrics.snapshot,
) -> list[Instrument]:
    """Create the observable instruments on ``meter`` (default: the global provider's
    ``snowflake_db`` meter) and return them. Call it once per meter.

    ``snapshot`` replaces the process-wide :func:`snowflake_db.metrics.snapshot` (for example
    ``generator.metrics``).
    """
    meter = meter if meter is not None else get_meter(METER_NAME)
    instruments: list[Instrument] = []
    for figure in FIGURES:
        create = meter.create_observable_counter if figure.counter else (
            meter.create_observable_gauge
        )
        instruments.append(
            create(
                PREFIX + figure.field,
                callbacks=[_observe(figure, snapshot)],
                unit=_UNITS[figure.unit],
                description=figure.description,
            )
        )
    if with_slots:
        instruments.append(
            meter.create_observable_gauge(
                PREFIX + "worker_slots",
                callbacks=[_observe_slots(snapshot)],
                unit="1",
                description="the layout's worker IDs by state on the control database "
                "(the states add up to the capacity)",
            )
        )
    return instruments


def _observe(figure: Figure, snapshot: Callable[..., MetricsSnapshot]) -> Callback:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        value = getattr(snapshot(), figure.field)
        return [] if value is None else [Observation(value)]

    return callback


def _observe_slots(snapshot: Callable[..., MetricsSnapshot]) -> Callback:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        counts = snapshot(with_slots=True).slots
        if counts is None:
            return []
        return [Observation(count, {"state": state}) for state, count in counts.by_state().items()]

    return callback
