"""Every exception snowflake_db raises.

All derive from :class:`SnowflakeError`; invalid arguments also derive from :class:`ValueError`
so code that already catches ``ValueError`` keeps working.
"""

from __future__ import annotations

from typing import Any


class SnowflakeError(Exception):
    """Base class of every snowflake_db error."""


class InvalidArgumentError(SnowflakeError, ValueError):
    """An argument is out of range or malformed; the message names the value and the limit."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type (for example a bool or float where an int is needed)."""


class InvalidLayoutError(InvalidArgumentError):
    """A :class:`~snowflake_db.Layout` whose fields do not fit together."""


class InvalidIdError(InvalidArgumentError):
    """A value that cannot be a Snowflake ID of the layout (negative or too large).

    A value of the wrong type raises :class:`InvalidArgumentTypeError` instead.
    """


class ClockError(SnowflakeError):
    """The clock cannot be trusted to give a time for a new ID."""


class ClockMovedBackwardsError(ClockError):
    """The clock went back further than the generator tolerates.

    ``delta_ms`` is how far it went back behind the last issued tick, ``tolerance_ms`` the limit.
    The generator is unchanged: calls succeed again once the clock is back within tolerance.
    """

    def __init__(self, delta_ms: int, tolerance_ms: int, detail: str = "") -> None:
        self.delta_ms = delta_ms
        self.tolerance_ms = tolerance_ms
        message = (
            f"clock moved backwards by {delta_ms} ms, more than the tolerated {tolerance_ms} ms; "
            "no ID was issued"
        )
        super().__init__(f"{message} ({detail})" if detail else message)


class ClockStalledError(ClockError):
    """The clock did not reach the next tick within the bounded wait."""


class ClockSkewError(ClockError):
    """This process's clock is further from the control database's clock than allowed.

    Raised when a worker lease is requested: ``skew_ms`` is how far the clock is at least off
    (positive: ahead of the database), ``bound_ms`` the allowed maximum. Nothing was written.
    """

    def __init__(self, skew_ms: int, bound_ms: int, detail: str) -> None:
        self.skew_ms = skew_ms
        self.bound_ms = bound_ms
        super().__init__(detail)


class TimeExhaustedError(SnowflakeError):
    """The current time lies past the last time the layout's time bits can represent."""


class NotConfiguredError(SnowflakeError):
    """Something a call needs was not set up first: the process-wide generator
    (``snowflake_default()`` before ``configure()``), or prometheus_client's multiprocess mode
    (``publish_multiprocess()`` without ``PROMETHEUS_MULTIPROC_DIR``)."""


class ForkedWorkerIdError(SnowflakeError):
    """A static worker ID would be shared by processes started from one parent.

    Raised when a generator with a static worker ID is used in a process forked from its creator,
    or when ``SNOWFLAKE_WORKER_ID`` is read in a forked or multiprocessing (spawn, forkserver)
    child: every child would share the worker ID and issue the same IDs.
    """


class GeneratorClosedError(SnowflakeError):
    """The generator was closed (its worker lease released) and issues no more IDs."""


class WorkerIdExhaustedError(SnowflakeError):
    """Every worker slot is held by a live lease; handing one out would duplicate IDs."""


class WorkerLeaseError(SnowflakeError):
    """The worker lease cannot be trusted, so no ID is issued (fencing)."""


class LeaseExpiredError(WorkerLeaseError):
    """The local lease deadline passed before the heartbeat could renew the lease."""


class LayoutMismatchError(SnowflakeError):
    """The worker tables serve another layout than this process's.

    Two layouts sharing one worker table can issue the same 64-bit value from different worker
    slots. ``recorded`` and ``given`` are the two layouts' ``Layout.as_kwargs()``.
    """

    def __init__(self, message: str, *, recorded: dict[str, int], given: dict[str, int]) -> None:
        self.recorded = recorded
        self.given = given
        super().__init__(message)


class AllocatorUnavailableError(SnowflakeError):
    """The worker-ID allocator's database could not be reached; there is no fallback worker ID."""


class SnowflakeMigrationError(SnowflakeError):
    """A Snowflake migration step cannot be carried out; the message says why and what to do."""


class NarrowColumnError(SnowflakeError):
    """A column that holds Snowflake keys (a key, or a foreign key to one) is narrower than 64
    bits in the database, so a key written there would fail or, on MySQL/MariaDB with
    ``INSERT IGNORE`` or without strict mode, be clamped and its row silently lost.

    ``columns`` lists them as ``(table, column, database type)``; nothing was written.
    """

    def __init__(self, message: str, columns: list[tuple[str, str, str]]) -> None:
        self.columns = columns
        super().__init__(message)


class KeyLookupOutOfRangeError(NarrowColumnError, ValueError):
    """A lookup compared a field that holds Snowflake keys with a value its column cannot hold.

    Django (5.0 and later) would answer such a lookup with an empty result without querying;
    a key that the column cannot hold means the column is too narrow, so this is raised
    instead. ``field`` is ``app_label.Model.field``, ``value`` the value compared.
    """

    def __init__(self, message: str, columns: list[tuple[str, str, str]], *, field: str,
                 value: int) -> None:
        self.field = field
        self.value = value
        super().__init__(message, columns)


# -- sharding ---------------------------------------------------------------------------------


class ShardingError(SnowflakeError):
    """A sharding configuration or routing request that cannot be honoured."""


class UnknownShardError(ShardingError, InvalidArgumentError):
    """A logical shard or target the router does not know."""


class ForeignIdError(InvalidIdError):
    """An ID that cannot come from this router's layout (for example another epoch)."""


class ShardMovedError(ShardingError):
    """A write met the fence of a logical shard that is moving or has moved to another target.

    Raised in place of the database's error (SQLSTATE ``SFM01`` on PostgreSQL); nothing of the
    transaction was committed, so it is safe to reload the shard map and run it again.
    """

    def __init__(
        self, message: str, *, shard: int, target: str, move_id: int | None = None
    ) -> None:
        super().__init__(message)
        self.shard = shard
        self.target = target
        self.move_id = move_id


class ShardMoveError(ShardingError):
    """A shard move that cannot start or go on; the message names the check and the fix."""


class MoverLeaseLostError(ShardMoveError):
    """Another mover took this move over (a forced resume): this one stops writing."""


class StaticWorkersUnconfirmedError(ShardMoveError):
    """The move reached the deletion of the source's rows without the operator's word that
    no process routes with a static worker ID (``assume_no_static_workers``)."""


class MoveStoppedError(ShardMoveError):
    """A move stopped at a step (the cause is chained); it can be resumed or, before the flip,
    aborted. ``move_id`` and ``step`` say where."""

    def __init__(self, message: str, *, move_id: int, step: str) -> None:
        super().__init__(message)
        self.move_id = move_id
        self.step = step


class FenceBlockedError(ShardMoveError):
    """A move's fence (or another lock it needs on the moving tables) was not granted within
    its budget; ``blockers`` are the sessions that held conflicting locks at the last attempt
    (:class:`~snowflake_db.sharding.moves.Blocker` values: typed loosely here, the core
    imports nothing of the sharding package). Nothing was created."""

    def __init__(self, message: str, *, blockers: tuple[Any, ...]) -> None:
        super().__init__(message)
        self.blockers = blockers


class CopyLostError(ShardMoveError):
    """A move's running copy can never finish (PostgreSQL: a table's copy ended and its
    table-sync slot was lost from the source, in a crash as the copy ended): the mover undoes
    the copy and makes it again (its ``recopy`` step), a bounded number of times per run."""


class MoveServerUnreachableError(ShardMoveError):
    """A server of a move did not answer: a connection was refused, or lost during a step (a
    restart, a network fault). The message names the server (never its password); the step
    can run again once it answers."""


class VerificationMismatchError(ShardMoveError):
    """The shard's rows differ between a move's source and target; ``verification`` holds
    both sides' results (a :class:`~snowflake_db.sharding.moves.Verification`)."""

    def __init__(self, message: str, *, verification: Any) -> None:
        super().__init__(message)
        self.verification = verification


# -- command line -----------------------------------------------------------------------------


class CommandError(SnowflakeError):
    """A mistake in a ``snowflake-db`` command line: reported on one line of stderr, exit 2."""


# -- signals ----------------------------------------------------------------------------------


class SignalHandlersError(SnowflakeError):
    """``install_signal_handlers()`` cannot do what was asked (installed twice, not the main
    thread); the message says what to do."""


# -- optional integrations --------------------------------------------------------------------


class MissingExtraError(SnowflakeError, ImportError):
    """An optional integration was imported without the package its extra installs.

    The message names the module, the missing package and the ``pip install`` line.
    """

    def __init__(self, module: str, *, package: str, extra: str) -> None:
        self.extra = extra
        super().__init__(
            f"{module} needs {package}, which is not installed: "
            f"pip install 'snowflake-db[{extra}]'",
            name=package,
        )


# -- bulk loads -------------------------------------------------------------------------------


class BulkLoadError(SnowflakeError):
    """A bulk load (:mod:`snowflake_db.bulk`) cannot be done as asked; nothing was loaded."""


class UnrepresentableValueError(BulkLoadError, InvalidArgumentError):
    """A value the target column cannot hold exactly (NUL in PostgreSQL text, a naive
    ``datetime`` for a time-zone-aware column, NaN for MariaDB, ...).

    ``column``, ``row`` (0-based position in the load) and ``value`` name it; nothing was loaded.
    """

    def __init__(self, message: str, *, column: str, row: int, value: object) -> None:
        self.column = column
        self.row = row
        self.value = value
        super().__init__(message)


class LocalInfileRefusedError(BulkLoadError):
    """``LOAD DATA LOCAL INFILE`` was required but the server or the client refuses local
    files; the message says which side and how to allow it (or use ``method="insert"``)."""


class BulkLoadRejectedError(BulkLoadError):
    """The database loaded fewer rows than given or changed values on the way
    (``LOAD DATA LOCAL`` turns duplicate keys and truncation into warnings); the load was
    rolled back. ``warnings`` holds the server's ``(level, code, message)`` rows."""

    def __init__(self, message: str, warnings: list[tuple[str, int, str]]) -> None:
        self.warnings = warnings
        super().__init__(message)


# -- public order numbers ---------------------------------------------------------------------


class PublicIdError(InvalidArgumentError):
    """A text refused as a public number (:mod:`snowflake_db.public_ids`); never a wrong ID.

    ``reason`` says why, for callers that answer differently: ``"length"``, ``"symbol"``,
    ``"check"`` (a mistyped or swapped symbol), ``"version"`` (a key version not configured),
    ``"key"`` (made with another key or namespace, or never issued) or ``"range"`` (a plain
    form above the largest ID). ``text`` is the refused text.
    """

    def __init__(self, message: str, *, reason: str, text: str) -> None:
        self.reason = reason
        self.text = text
        super().__init__(message)


class PublicIdKeyError(InvalidArgumentError):
    """A public-ID key that cannot be used (wrong length, bad version, malformed setting).

    The message names the key version and the length, never the key's bytes.
    """


class PublicIdKeysNotConfiguredError(PublicIdKeyError, NotConfiguredError):
    """No public-ID keys were configured; the message says how to configure them."""
