"""snowflake_db: 64-bit Snowflake IDs for database primary keys (not the Snowflake data warehouse).

The core (this package's top level) imports only the standard library; integrations live in
``snowflake_db.sqlalchemy``, ``snowflake_db.django``, ``snowflake_db.alembic``,
``snowflake_db.sharding`` and ``snowflake_db.worker``.
"""

from .clock import MonotonicClock, wall_clock
from .errors import (
    AllocatorUnavailableError,
    ClockError,
    ClockMovedBackwardsError,
    ClockSkewError,
    ClockStalledError,
    ForkedWorkerIdError,
    GeneratorClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidIdError,
    InvalidLayoutError,
    LayoutMismatchError,
    LeaseExpiredError,
    MissingExtraError,
    NotConfiguredError,
    SignalHandlersError,
    SnowflakeError,
    TimeExhaustedError,
    WorkerIdExhaustedError,
    WorkerLeaseError,
)
from .generator import DEFAULT_ROLLBACK_TOLERANCE_MS, MAX_IDS_PER_CALL, SnowflakeGenerator
from .layout import DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, JS_SAFE_LAYOUT, Layout, SnowflakeId
from .lease import WorkerAllocator, WorkerLease
from .process import configure, get_generator, reset, snowflake_default
from .shutdown import install_signal_handlers

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EPOCH_MS",
    "DEFAULT_LAYOUT",
    "DEFAULT_ROLLBACK_TOLERANCE_MS",
    "JS_SAFE_LAYOUT",
    "MAX_IDS_PER_CALL",
    "AllocatorUnavailableError",
    "ClockError",
    "ClockMovedBackwardsError",
    "ClockSkewError",
    "ClockStalledError",
    "ForkedWorkerIdError",
    "GeneratorClosedError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidIdError",
    "InvalidLayoutError",
    "Layout",
    "LayoutMismatchError",
    "LeaseExpiredError",
    "MissingExtraError",
    "MonotonicClock",
    "NotConfiguredError",
    "SignalHandlersError",
    "SnowflakeError",
    "SnowflakeGenerator",
    "SnowflakeId",
    "TimeExhaustedError",
    "WorkerAllocator",
    "WorkerIdExhaustedError",
    "WorkerLease",
    "WorkerLeaseError",
    "configure",
    "get_generator",
    "install_signal_handlers",
    "reset",
    "snowflake_default",
    "wall_clock",
]
