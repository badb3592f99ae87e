"""The bit layout of a Snowflake ID: how time, worker, sequence and shard share 63 bits.

From the most significant bit down: ``0`` (sign, so IDs fit a signed BIGINT) | time | worker |
sequence | shard. The shard sits lowest so that IDs of one generator still strictly increase when
each carries a different shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime

from ._validate import require_int
from .clock import wall_clock
from .errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidIdError,
    InvalidLayoutError,
)

#: 2020-01-01T00:00:00Z in Unix milliseconds: the default epoch.
DEFAULT_EPOCH_MS = 1_577_836_800_000

_DateTime = datetime  # the decoded ID has a field named ``datetime``

#: 10000-01-01T00:00:00Z in Unix ms: a layout must run out by then to decode every ID.
_DATETIME_LIMIT_MS = 253_402_300_800_000

#: Bits available to a layout: a signed 64-bit integer keeps its sign bit 0.
USABLE_BITS = 63


def _ms_to_datetime(timestamp_ms: int) -> datetime:
    seconds, millis = divmod(timestamp_ms, 1000)
    return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=millis * 1000)


def to_unix_ms(moment: datetime | str | int, name: str = "time") -> int:
    """Unix milliseconds from an aware datetime, an ISO 8601 string or an int.

    An ISO string without a zone means UTC, as everywhere in snowflake_db. A naive ``datetime``
    object is refused instead: it usually holds local time, and guessing would shift every ID.
    """
    if isinstance(moment, str):
        try:
            parsed = datetime.fromisoformat(moment)
        except ValueError:
            raise InvalidArgumentError(
                f"{name}={moment!r} is not an ISO 8601 date or time (e.g. 2020-01-01 or "
                "2020-01-01T00:00:00Z)"
            ) from None
        moment = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    if isinstance(moment, datetime):
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise InvalidArgumentError(
                f"{name}={moment.isoformat()} is a naive datetime (no time zone); pass an aware "
                "one (tzinfo=UTC), or an ISO string, which means UTC when it names no zone"
            )
        delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
        return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    return require_int(name, moment)


@dataclass(frozen=True, slots=True)
class SnowflakeId:
    """A decoded Snowflake ID. ``timestamp_ms`` is Unix milliseconds (start of the ID's tick)."""

    id: int
    timestamp_ms: int
    worker_id: int
    sequence: int
    shard: int
    datacenter_id: int | None = None
    machine_id: int | None = None
    datetime: _DateTime = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "datetime", _ms_to_datetime(self.timestamp_ms))


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How many bits each part of an ID takes, the epoch and the tick length.

    ``datacenter_bits`` only changes how the worker field is shown: its top bits are the
    datacenter, the rest the machine (5 + 5 in Twitter's original layout).
    """

    time_bits: int = 41
    worker_bits: int = 10
    sequence_bits: int = 12
    shard_bits: int = 0
    datacenter_bits: int = 0
    epoch_ms: int = DEFAULT_EPOCH_MS
    tick_ms: int = 1

    def __post_init__(self) -> None:
        require_int("time_bits", self.time_bits, minimum=1, error=InvalidLayoutError)
        for name in _BIT_FIELDS:
            require_int(name, getattr(self, name), minimum=0, error=InvalidLayoutError)
        total = self.time_bits + self.worker_bits + self.sequence_bits + self.shard_bits
        if total > USABLE_BITS:
            raise InvalidLayoutError(
                f"time_bits + worker_bits + sequence_bits + shard_bits = {total} exceeds the "
                f"{USABLE_BITS} bits of a signed 64-bit integer (the sign bit stays 0)"
            )
        require_int(
            "datacenter_bits",
            self.datacenter_bits,
            maximum=self.worker_bits,
            error=InvalidLayoutError,
            limit_note="the datacenter is the top part of the worker field",
        )
        require_int("tick_ms", self.tick_ms, minimum=1, error=InvalidLayoutError)
        require_int(
            "epoch_ms",
            self.epoch_ms,
            minimum=0,
            error=InvalidLayoutError,
            limit_note="Unix milliseconds: the epoch cannot lie before 1970-01-01T00:00:00Z",
        )
        require_int(
            "epoch_ms",
            self.epoch_ms,
            maximum=wall_clock(),
            error=InvalidLayoutError,
            limit_note="the epoch must not lie in the future",
        )
        if self.epoch_ms + (self.max_tick + 1) * self.tick_ms > _DATETIME_LIMIT_MS:
            raise InvalidLayoutError(
                f"time_bits={self.time_bits} with tick_ms={self.tick_ms} would last past "
                "9999-12-31, the last date a datetime can hold, so its IDs could not be "
                "decoded; use fewer time bits or a shorter tick"
            )

    def as_kwargs(self) -> dict[str, int]:
        """The keyword arguments that rebuild this layout: ``Layout(**layout.as_kwargs())``.

        The one list of a layout's fields: settings, migrations and the CLI derive from it, so
        a field added here (as ``datacenter_bits`` was) cannot be dropped by a copy elsewhere.
        """
        return {name: getattr(self, name) for name in LAYOUT_FIELDS}

    # -- sizes -------------------------------------------------------------------------------

    @property
    def total_bits(self) -> int:
        return self.time_bits + self.worker_bits + self.sequence_bits + self.shard_bits

    @property
    def max_id(self) -> int:
        return (1 << self.total_bits) - 1

    @property
    def max_worker_id(self) -> int:
        return (1 << self.worker_bits) - 1

    @property
    def max_sequence(self) -> int:
        return (1 << self.sequence_bits) - 1

    @property
    def max_shard(self) -> int:
        return (1 << self.shard_bits) - 1

    @property
    def max_tick(self) -> int:
        return (1 << self.time_bits) - 1

    @property
    def ids_per_tick(self) -> int:
        """IDs one worker can issue per tick (per shard value, when shard bits are used)."""
        return 1 << self.sequence_bits

    @property
    def max_ids_per_second(self) -> int:
        """The physical limit of one generator: ``ids_per_tick`` every ``tick_ms``."""
        return self.ids_per_tick * 1000 // self.tick_ms

    # -- shifts ------------------------------------------------------------------------------

    @property
    def sequence_shift(self) -> int:
        return self.shard_bits

    @property
    def worker_shift(self) -> int:
        return self.shard_bits + self.sequence_bits

    @property
    def time_shift(self) -> int:
        return self.shard_bits + self.sequence_bits + self.worker_bits

    # -- time range --------------------------------------------------------------------------

    @property
    def max_timestamp_ms(self) -> int:
        """The last Unix millisecond an ID of this layout can carry."""
        return self.epoch_ms + (self.max_tick + 1) * self.tick_ms - 1

    @property
    def epoch(self) -> datetime:
        return _ms_to_datetime(self.epoch_ms)

    @property
    def exhausted_at(self) -> datetime:
        """The first instant the time bits cannot represent: the layout runs out here."""
        return _ms_to_datetime(self.max_timestamp_ms + 1)

    def tick_of(self, timestamp_ms: int) -> int:
        """The tick number (since the epoch) of a Unix-ms time, validated against the layout."""
        require_int(
            "timestamp_ms",
            timestamp_ms,
            minimum=self.epoch_ms,
            limit_note=f"the layout's epoch {self.epoch.isoformat()}",
        )
        require_int(
            "timestamp_ms",
            timestamp_ms,
            maximum=self.max_timestamp_ms,
            limit_note=f"the layout's time bits run out at {self.exhausted_at.isoformat()}",
        )
        return (timestamp_ms - self.epoch_ms) // self.tick_ms

    def tick_start_ms(self, tick: int) -> int:
        """Unix milliseconds at which tick ``tick`` begins."""
        return self.epoch_ms + tick * self.tick_ms

    # -- encode / decode ---------------------------------------------------------------------

    def encode(self, *, timestamp_ms: int, worker_id: int, sequence: int, shard: int = 0) -> int:
        """Pack the parts into an ID; every part is checked against its limit."""
        tick = self.tick_of(timestamp_ms)
        self.check_worker_id(worker_id)
        require_int("sequence", sequence, minimum=0, maximum=self.max_sequence,
                    limit_note=f"{self.sequence_bits} sequence bits")
        self.check_shard(shard)
        return self._pack(tick, worker_id, sequence, shard)

    def _pack(self, tick: int, worker_id: int, sequence: int, shard: int = 0) -> int:
        return (
            tick << self.time_shift
            | worker_id << self.worker_shift
            | sequence << self.sequence_shift
            | shard
        )

    def check_worker_id(self, worker_id: object) -> int:
        return require_int("worker_id", worker_id, minimum=0, maximum=self.max_worker_id,
                           limit_note=f"{self.worker_bits} worker bits")

    def check_shard(self, shard: object) -> int:
        return require_int("shard", shard, minimum=0, maximum=self.max_shard,
                           limit_note=f"{self.shard_bits} shard bits")

    def check_id(self, snowflake_id: object) -> int:
        """Return the ID if it can belong to this layout, else raise :class:`InvalidIdError`."""
        if isinstance(snowflake_id, bool) or not isinstance(snowflake_id, int):
            raise InvalidArgumentTypeError(
                f"a Snowflake ID must be an int, got {type(snowflake_id).__name__} "
                f"{snowflake_id!r}"
            )
        return require_int("id", snowflake_id, minimum=0, maximum=self.max_id,
                           error=InvalidIdError, limit_note=f"{self.total_bits} bits of the layout")

    def decode(self, snowflake_id: int) -> SnowflakeId:
        """Split an ID into its parts; the ID must be an int in ``[0, max_id]``."""
        value = self.check_id(snowflake_id)
        tick = value >> self.time_shift
        worker = (value >> self.worker_shift) & self.max_worker_id
        machine_bits = self.worker_bits - self.datacenter_bits
        split = self.datacenter_bits > 0
        return SnowflakeId(
            id=value,
            timestamp_ms=self.epoch_ms + tick * self.tick_ms,
            worker_id=worker,
            sequence=(value >> self.sequence_shift) & self.max_sequence,
            shard=value & self.max_shard,
            datacenter_id=worker >> machine_bits if split else None,
            machine_id=worker & ((1 << machine_bits) - 1) if split else None,
        )

    def worker_id_for(self, *, datacenter_id: int, machine_id: int) -> int:
        """The worker ID of a machine in a datacenter, for layouts with ``datacenter_bits``."""
        machine_bits = self.worker_bits - self.datacenter_bits
        require_int("datacenter_id", datacenter_id, minimum=0,
                    maximum=(1 << self.datacenter_bits) - 1,
                    limit_note=f"{self.datacenter_bits} datacenter bits")
        require_int("machine_id", machine_id, minimum=0, maximum=(1 << machine_bits) - 1,
                    limit_note=f"{machine_bits} machine bits")
        return datacenter_id << machine_bits | machine_id

    # -- ranges for queries ------------------------------------------------------------------

    def min_id_for_time(self, moment: datetime | str | int) -> int:
        """The smallest ID of the tick containing ``moment`` (see :func:`to_unix_ms`).

        ``WHERE id BETWEEN min_id_for_time(t1) AND max_id_for_time(t2)`` selects every ID issued
        in the ticks from ``t1`` to ``t2`` inclusive, as a primary-key range scan.
        """
        tick = self.tick_of(to_unix_ms(moment, "moment"))
        return tick << self.time_shift

    def max_id_for_time(self, moment: datetime | str | int) -> int:
        """The largest ID of the tick containing ``moment`` (see :func:`to_unix_ms`)."""
        tick = self.tick_of(to_unix_ms(moment, "moment"))
        return ((tick + 1) << self.time_shift) - 1

    def describe(self) -> dict[str, object]:
        """The layout's fields and derived limits, for display (CLI ``layout``)."""
        return {
            **self.as_kwargs(),
            "epoch": self.epoch.isoformat(),
            "max_worker_id": self.max_worker_id,
            "max_shard": self.max_shard,
            "ids_per_tick": self.ids_per_tick,
            "max_ids_per_second_per_worker": self.max_ids_per_second,
            "max_id": self.max_id,
            "exhausted_at": self.exhausted_at.isoformat(),
        }


#: The constructor's keyword arguments, in declaration order (see :meth:`Layout.as_kwargs`).
LAYOUT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Layout) if f.init)
_BIT_FIELDS = tuple(name for name in LAYOUT_FIELDS if name.endswith("_bits"))

DEFAULT_LAYOUT = Layout()

#: IDs below 2**53, so a JavaScript number (and JSON as browsers parse it) holds every one
#: exactly: the largest is 2**53 - 1, ``Number.MAX_SAFE_INTEGER``. The price: 256 workers
#: (8 bits), 16 IDs per millisecond per worker (4 sequence bits: 16,000/s), and 41 bits of
#: 1 ms ticks from 2020-01-01 that run out on 2089-09-06. Its IDs do not mix with the default
#: layout's: choose it before the first row (the worker table refuses a second layout).
JS_SAFE_LAYOUT = Layout(time_bits=41, worker_bits=8, sequence_bits=4)


def require_layout(layout: object) -> Layout:
    """``layout`` if it is a :class:`Layout`; anything else is refused, naming its type."""
    if not isinstance(layout, Layout):
        raise InvalidArgumentTypeError(
            f"layout must be a snowflake_db.Layout, got {type(layout).__name__}"
        )
    return layout
