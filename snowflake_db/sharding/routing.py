"""Routing Snowflake IDs and shard keys to logical shards, and logical shards to targets.

Standard library and snowflake_db core only; the SQLAlchemy and Django modules build on this,
through :class:`ShardRouter` and the per-table :class:`~snowflake_db.sharding.rules.ShardRule`.

Two routing modes, chosen by the layout:

* **Embedded shard bits** (``Layout(shard_bits=b)``, ``b > 0``): there are ``2**b`` logical
  shards and an ID carries its logical shard in its lowest ``b`` bits: ``shard = id & (2**b - 1)``.
  A new order takes the shard of its shard key (``shard_for_key(customer_id)``), so a customer's
  orders share a shard and each order is found from its ID alone.
* **Mixing** (``shard_bits == 0``): ``shard = splitmix64(id) % logical_shards``. ``id % N`` is
  skewed at low traffic (the sequence restarts at 0 every tick, so low bits are mostly 0); a
  64-bit finalizer spreads every input bit over the output. No co-location in this mode.

``engine=`` (``"postgresql-hash"``, ``"mariadb-key"``, ``"mariadb-hash"``) swaps the fixed hashes
below for the partition function of that engine (:mod:`snowflake_db.sharding.engines`), so logical
shard ``s`` is the engine's partition ``s`` (PostgreSQL: ``REMAINDER s``; MariaDB/Spider: ``ps``)
for a table partitioned by the shard key into ``logical_shards`` partitions. Keys are then BIGINT
ints only. With shard bits an ID still carries its shard (its shard key's partition); without,
``shard_of_id`` is the engine's partition of the ID itself (a table partitioned by its ID).

The fixed, documented hashes (never Python's ``hash()``, which is salted per process):

* ``splitmix64(x)`` -- one step of Vigna's SplitMix64 with state ``x``:
  ``z = (x + 0x9E3779B97F4A7C15) mod 2**64``;
  ``z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 mod 2**64``;
  ``z = (z ^ (z >> 27)) * 0x94D049BB133111EB mod 2**64``; result ``z ^ (z >> 31)``.
  ``splitmix64(0) == 0xE220A8397B1DCDAF``, the reference generator's first output for seed 0.
* ``key_hash(key)``: an ``int`` in ``[-2**63, 2**64)`` hashes as ``splitmix64(key mod 2**64)``;
  ``str`` (UTF-8), ``bytes`` and ``uuid.UUID`` (its 16 bytes) as BLAKE2b with an 8-byte digest,
  read big-endian (``hashlib.blake2b(data, digest_size=8)``). ``5`` and ``"5"`` differ: keep
  one type per shard key.
* ``shard_for_key(key) = key_hash(key) % logical_shards``.

Logical shards map to physical targets (database aliases, engine names, table names) through a
mapping that can change: moving a logical shard to another target rewrites no ID. The mapping is
fixed in code (:class:`ShardRouter`) or followed in the control database's shard map
(:meth:`ShardRouter.from_control`, :class:`ControlledShardRouter`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import forks
from .._validate import require_seconds
from ..clock import monotonic, wall_clock
from ..errors import (
    ForeignIdError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidIdError,
    ShardingError,
    ShardMovedError,
    UnknownShardError,
)
from ..generator import SnowflakeGenerator
from ..layout import DEFAULT_LAYOUT, Layout, require_layout
from ..process import current_generator, get_generator
from ..shutdown import keep_signals_off_this_thread
from .engines import ROUTING_ENGINES

if TYPE_CHECKING:
    from .shard_map import ShardMap

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB

#: How far in the future an ID's time may lie before ``check_id`` calls it foreign.
DEFAULT_FUTURE_SLACK_MS = 60_000
#: How often a router following the control database's map re-reads its version (seconds).
DEFAULT_REFRESH_SECONDS = 2.0
#: The shortest ``refresh_s`` accepted: each check is a round trip to the control database.
MIN_REFRESH_SECONDS = 0.05
# The worker slots table's default name (snowflake_db.worker), repeated: that package needs
# SQLAlchemy, which this module does not import.
_SLOTS_TABLE = "snowflake_worker_slots"

ShardKey = int | str | bytes | uuid.UUID


def splitmix64(value: int) -> int:
    """SplitMix64 output for state ``value`` (taken mod 2**64): a fixed 64-bit mixer."""
    z = (value + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    return z ^ (z >> 31)


def blake2b64(data: bytes) -> int:
    """BLAKE2b with an 8-byte digest, read as a big-endian unsigned integer."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def key_hash(key: ShardKey) -> int:
    """The fixed 64-bit hash of a shard key; identical in every process and Python version."""
    if isinstance(key, bool):
        raise InvalidArgumentTypeError(f"a shard key must not be a bool, got {key!r}")
    if isinstance(key, int):
        if not -(1 << 63) <= key <= _MASK64:
            raise InvalidArgumentError(
                f"shard key {key} is outside the 64-bit range [-2**63, 2**64 - 1]"
            )
        return splitmix64(key & _MASK64)
    if isinstance(key, str):
        return blake2b64(key.encode("utf-8"))
    if isinstance(key, bytes | bytearray | memoryview):
        return blake2b64(bytes(key))
    if isinstance(key, uuid.UUID):
        return blake2b64(key.bytes)
    raise InvalidArgumentTypeError(
        f"a shard key must be an int, str, bytes or uuid.UUID, got {type(key).__name__} {key!r}"
    )


def id_range_for_time(
    layout: Layout, start: datetime | int, end: datetime | int
) -> tuple[int, int]:
    """Inclusive ``(low, high)`` IDs of every tick from ``start`` to ``end`` (aware or Unix ms).

    ``WHERE id BETWEEN low AND high`` is a primary-key range scan on every shard; shard bits
    are the lowest bits, so the range holds every shard's IDs.
    """
    low = layout.min_id_for_time(start)
    high = layout.max_id_for_time(end)
    if high < low:
        raise InvalidArgumentError(f"the time window ends ({end!r}) before it starts ({start!r})")
    return low, high


class FanOut(NamedTuple):
    """What a query without a shard key reads, from one view of the mapping.

    ``targets`` are the targets serving at least one logical shard; ``keep`` names the targets
    whose rows must be filtered to their own logical shards (``(id & mask) IN keep[target]``):
    between a move's copy and its cleanup a shard's rows are on two targets, and only the one
    the map names may be counted. ``mapping`` is the ``{logical_shard: target}`` the two were
    derived from, so routing by keys in the same query agrees with them.
    """

    targets: tuple[str, ...]
    keep: dict[str, tuple[int, ...]]
    mapping: dict[int, str]
    mask: int


class RoutedShards:
    """The logical shards a transaction routed (in the thread that opened the record, see
    :meth:`ShardRouter.recording_routes`) and the target each was first given.

    :meth:`confirm`, called after the transaction's last statement and before its commit,
    refuses it with :class:`~snowflake_db.errors.ShardMovedError` when one of those shards has
    moved since: an ``UPDATE`` or ``DELETE`` by ID sent to the old target after a move deleted
    its rows there matches nothing, and no fence can refuse a statement that touches no row.
    """

    def __init__(self, router: ShardRouter, lease: tuple[str, int] | None) -> None:
        self.router = router
        #: the process's lease (token, lapses) when the record opened; ``None``: none held
        self.lease = lease
        #: ``{logical_shard: target}`` as first routed inside the record
        self.targets: dict[int, str] = {}

    def confirm(self) -> None:
        """Raise :class:`~snowflake_db.errors.ShardMovedError` if a shard routed inside the
        record is no longer on the target it was given (see
        :meth:`ControlledShardRouter.recording_routes` for what is read)."""
        self.router._confirm_routes(self)


class ShardRouter:
    """Logical shards of a layout and the physical target each one lives on.

    ``targets`` is a sequence of target names (logical shard ``s`` goes to
    ``targets[s % len(targets)]``) or an explicit mapping ``{logical_shard: target}`` covering
    every logical shard. With shard bits the layout fixes ``logical_shards = 2**shard_bits``;
    without, pass ``logical_shards`` (choose more than you have servers, e.g. 64: the count is
    permanent because it decides where every existing ID lives, the mapping is not).
    ``engine`` routes keys as that engine partitions them (see the module docstring).
    """

    def __init__(
        self,
        targets: Sequence[str] | Mapping[int, str],
        *,
        layout: Layout | None = None,
        logical_shards: int | None = None,
        engine: str | None = None,
    ) -> None:
        self.layout = require_layout(layout if layout is not None else DEFAULT_LAYOUT)
        if isinstance(targets, str):
            raise InvalidArgumentTypeError(
                f"targets must be a sequence or mapping of target names, got the string {targets!r}"
            )
        count = self._logical_count(targets, logical_shards)
        if isinstance(targets, Mapping):
            mapping = {int(shard): target for shard, target in targets.items()}
            missing = [shard for shard in range(count) if shard not in mapping]
            extra = sorted(shard for shard in mapping if not 0 <= shard < count)
            if missing or extra:
                raise InvalidArgumentError(
                    f"the mapping must give a target to each logical shard 0..{count - 1}; "
                    f"missing {missing[:10]}, unknown {extra[:10]}"
                )
        else:
            names = list(targets)
            if not names:
                raise InvalidArgumentError("a ShardRouter needs at least one target")
            mapping = {shard: names[shard % len(names)] for shard in range(count)}
        for target in mapping.values():
            if not isinstance(target, str) or not target:
                raise InvalidArgumentTypeError(
                    f"targets must be non-empty strings, got {target!r}"
                )
        self.logical_shards = count
        self.engine = engine
        self._engine = self._engine_function(engine, count)
        self._mapping = mapping
        self._embedded = self.layout.shard_bits > 0
        self._max_shard = self.layout.max_shard
        # Targets in the order given (a sequence) or in logical-shard order (a mapping).
        names_in_order = targets if not isinstance(targets, Mapping) else mapping.values()
        self.targets: tuple[str, ...] = tuple(dict.fromkeys(names_in_order))

    def _logical_count(
        self, targets: Sequence[str] | Mapping[int, str], logical_shards: int | None
    ) -> int:
        if self.layout.shard_bits > 0:
            count = 1 << self.layout.shard_bits
            if logical_shards is not None and logical_shards != count:
                raise InvalidArgumentError(
                    f"logical_shards={logical_shards} disagrees with the layout's "
                    f"{self.layout.shard_bits} shard bits ({count} logical shards)"
                )
            return count
        if logical_shards is None:
            logical_shards = len(targets)
        if isinstance(logical_shards, bool) or not isinstance(logical_shards, int):
            raise InvalidArgumentTypeError(
                f"logical_shards must be an int, got {type(logical_shards).__name__}"
            )
        if logical_shards < 1:
            raise InvalidArgumentError(f"logical_shards={logical_shards} is below the minimum 1")
        return logical_shards

    @staticmethod
    def _engine_function(engine: str | None, count: int) -> Callable[[int, int], int] | None:
        if engine is None:
            return None
        function = ROUTING_ENGINES.get(engine) if isinstance(engine, str) else None
        if function is None:
            raise InvalidArgumentError(
                f"unknown routing engine {engine!r}; known engines: {', '.join(ROUTING_ENGINES)}"
            )
        try:
            function(0, count)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"logical_shards={count} does not fit engine {engine!r}: {error}"
            ) from None
        return function

    @classmethod
    def from_control(
        cls,
        control: Any,
        *,
        layout: Layout,
        refresh_s: float | None = None,
        **options: Any,
    ) -> ShardRouter:
        """A router that follows the shard map in the control database ``control`` (a
        SQLAlchemy ``Engine`` or URL): it loads the map, refuses one of another layout, and
        re-reads the map's version at most every ``refresh_s`` seconds (default
        :data:`DEFAULT_REFRESH_SECONDS`), reloading the map
        when it changed. Needs SQLAlchemy; see :class:`ControlledShardRouter` for ``options``."""
        return ControlledShardRouter(
            control,
            layout=layout,
            refresh_s=DEFAULT_REFRESH_SECONDS if refresh_s is None else refresh_s,
            **options,
        )

    # -- mapping ---------------------------------------------------------------------------

    @property
    def embedded(self) -> bool:
        """True when IDs carry their logical shard in the layout's shard bits."""
        return self._embedded

    @property
    def mapping(self) -> dict[int, str]:
        """A copy of ``{logical_shard: target}``."""
        return dict(self._mapping)

    def moved(self, shard: int, target: str) -> ShardRouter:
        """A new router with logical ``shard`` on ``target``; every ID keeps its shard."""
        self._check_shard(shard)
        mapping = dict(self._mapping)
        mapping[shard] = target
        return ShardRouter(
            mapping, layout=self.layout, logical_shards=self.logical_shards, engine=self.engine
        )

    def shards_on(self, target: str) -> list[int]:
        """The logical shards living on ``target``."""
        if target not in self.targets:
            raise UnknownShardError(
                f"unknown shard target {target!r}; known targets: {', '.join(self.targets)}"
            )
        return [shard for shard, name in self._mapping.items() if name == target]

    def target_of_shard(self, shard: int) -> str:
        """The target holding logical ``shard``."""
        return self._target_of(self._check_shard(shard))

    def _target_of(self, shard: int) -> str:
        """The target of a shard already checked (routing by key and by ID computes it)."""
        return self._mapping[shard]

    def refresh_after_miss(self) -> bool:
        """A read routed by this router found nothing: whether the mapping changed since, so
        the read is worth running once more. A fixed mapping never changes: ``False``."""
        return False

    @contextmanager
    def recording_routes(self) -> Iterator[RoutedShards]:
        """A record of the shards routed inside the block, to :meth:`RoutedShards.confirm`
        before the commit. A fixed mapping never changes: nothing to confirm."""
        yield RoutedShards(self, None)

    def _confirm_routes(self, routes: RoutedShards) -> None:
        """A fixed mapping never changes: every route stands."""

    def _check_shard(self, shard: object) -> int:
        if isinstance(shard, bool) or not isinstance(shard, int):
            raise InvalidArgumentTypeError(
                f"a logical shard must be an int, got {type(shard).__name__} {shard!r}"
            )
        if not 0 <= shard < self.logical_shards:
            raise UnknownShardError(
                f"unknown logical shard {shard}; this router has shards "
                f"0..{self.logical_shards - 1}"
            )
        return shard

    # -- routing ---------------------------------------------------------------------------

    def shard_for_key(self, key: ShardKey) -> int:
        """The logical shard of a shard key: ``key_hash(key) % logical_shards``, or the
        engine's partition of ``key`` when the router has an ``engine``."""
        if self._engine is None:
            return key_hash(key) % self.logical_shards
        if isinstance(key, bool) or not isinstance(key, int):
            raise InvalidArgumentTypeError(
                f"engine {self.engine!r} routes BIGINT shard keys (ints), got "
                f"{type(key).__name__} {key!r}"
            )
        return self._engine(key, self.logical_shards)

    def shard_of_id(self, snowflake_id: int) -> int:
        """The logical shard of an ID: its shard bits, else ``splitmix64(id) % logical_shards``
        (or the engine's partition of the ID when the router has an ``engine``)."""
        value = self.layout.check_id(snowflake_id)
        if self._embedded:
            return value & self._max_shard
        if self._engine is not None:
            return self._engine(value, self.logical_shards)
        return splitmix64(value) % self.logical_shards

    def target_for_key(self, key: ShardKey) -> str:
        return self._target_of(self.shard_for_key(key))

    def target_for_id(self, snowflake_id: int) -> str:
        return self._target_of(self.shard_of_id(snowflake_id))

    def fan_out(self) -> FanOut:
        """The targets a query without a shard key reads. A fixed router's targets hold only
        their own shards' rows, so nothing is filtered (``keep`` is empty)."""
        return FanOut(self.targets, {}, dict(self._mapping), self._max_shard)

    def targets_for_ids(self, snowflake_ids: Iterable[int]) -> dict[str, list[int]]:
        """Group IDs by target (for ``WHERE id IN (...)`` per shard)."""
        groups: dict[str, list[int]] = {}
        for snowflake_id in snowflake_ids:
            groups.setdefault(self.target_for_id(snowflake_id), []).append(snowflake_id)
        return groups

    def check_id(
        self,
        snowflake_id: object,
        *,
        now_ms: int | None = None,
        future_slack_ms: int = DEFAULT_FUTURE_SLACK_MS,
    ) -> int:
        """Return the ID if this layout could have issued it by now, else raise.

        An ID of another layout (other epoch or bit split) usually decodes to a time in the
        future, or past the layout's 63 bits: both are reported as :class:`ForeignIdError`.
        """
        try:
            value = self.layout.check_id(snowflake_id)
        except InvalidIdError as error:
            raise ForeignIdError(f"{error}; is it an ID of another layout?") from None
        now = wall_clock() if now_ms is None else now_ms
        issued_ms = self.layout.decode(value).timestamp_ms
        if issued_ms > now + future_slack_ms:
            raise ForeignIdError(
                f"ID {value} decodes to Unix ms {issued_ms}, {issued_ms - now} ms in the future "
                f"for this layout (epoch {self.layout.epoch.isoformat()}, shard_bits "
                f"{self.layout.shard_bits}); it comes from another layout"
            )
        return value

    # -- new IDs ---------------------------------------------------------------------------

    def checked_generator(
        self, generator: SnowflakeGenerator | None = None
    ) -> SnowflakeGenerator:
        """``generator`` (default: the process-wide one), refused unless it has this layout."""
        chosen = generator if generator is not None else get_generator()
        if chosen.layout != self.layout:
            raise ShardingError(
                f"the generator's layout {chosen.layout!r} differs from the router's "
                f"{self.layout!r}: IDs would be routed with the wrong bits"
            )
        return chosen

    def new_id(
        self,
        *,
        key: ShardKey | None = None,
        shard: int | None = None,
        generator: SnowflakeGenerator | None = None,
    ) -> int:
        """A new ID placed on the shard of ``key`` (or on ``shard``); needs shard bits.

        Without either, the ID is placed by its own mix: with shard bits the shard is
        ``splitmix64(id_without_shard) & max_shard``, so new keyless IDs spread evenly.
        ``generator`` defaults to the process-wide one (``snowflake_db.configure``).
        """
        source = self.checked_generator(generator)
        if key is not None and shard is not None:
            raise InvalidArgumentError("pass key or shard, not both")
        if key is None and shard is None:
            base = source.next_id()
            if self._embedded:
                return base | (splitmix64(base) & self._max_shard)
            return base
        if not self._embedded:
            raise ShardingError(
                "placing an ID on a chosen shard needs a layout with shard_bits > 0; without "
                "shard bits an ID's shard is a mix of the whole ID, so it cannot be chosen"
            )
        chosen = self.shard_for_key(key) if key is not None else self._check_shard(shard)
        return source.next_id_in_shard(chosen)

    def new_ids(
        self,
        n: int,
        *,
        key: ShardKey | None = None,
        shard: int | None = None,
        generator: SnowflakeGenerator | None = None,
    ) -> list[int]:
        """``n`` new IDs on the shard of ``key`` (or ``shard``), from one ``next_ids`` call."""
        source = self.checked_generator(generator)
        if key is None and shard is None:
            if self._embedded:
                return [i | (splitmix64(i) & self._max_shard) for i in source.next_ids(n)]
            return source.next_ids(n)
        if key is not None and shard is not None:
            raise InvalidArgumentError("pass key or shard, not both")
        if not self._embedded:
            raise ShardingError("placing IDs on a chosen shard needs a layout with shard_bits > 0")
        chosen = self.shard_for_key(key) if key is not None else self._check_shard(shard)
        return [i | chosen for i in source.next_ids(n)]

    # -- time ------------------------------------------------------------------------------

    def id_range(self, start: datetime | int, end: datetime | int) -> tuple[int, int]:
        """Inclusive ID bounds of the window ``start``..``end`` (see :func:`id_range_for_time`)."""
        return id_range_for_time(self.layout, start, end)

    def time_of_id(self, snowflake_id: int) -> datetime:
        return self.layout.decode(snowflake_id).datetime

    def describe(self) -> dict[str, object]:
        mode = "splitmix64 mixing" if self.engine is None else f"{self.engine} partitions"
        described: dict[str, object] = {
            "mode": "embedded shard bits" if self._embedded else mode,
            "logical_shards": self.logical_shards,
            "targets": {target: self.shards_on(target) for target in self.targets},
        }
        if self.engine is not None:
            described["engine"] = self.engine
        return described

    def __repr__(self) -> str:
        mode = f"shard_bits={self.layout.shard_bits}" if self._embedded else "mixing"
        if self.engine is not None:
            mode += f" engine={self.engine!r}"
        return (
            f"<ShardRouter {mode} logical_shards={self.logical_shards} "
            f"targets={list(self.targets)}>"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardRouter):
            return NotImplemented
        return (self.layout, self.logical_shards, self.engine, self._mapping) == (
            other.layout,
            other.logical_shards,
            other.engine,
            other._mapping,
        )

    __hash__ = None  # type: ignore[assignment]


# -- a router following the shard map in the control database ----------------------------------
# SQLAlchemy is imported only through snowflake_db.sharding.shard_map, and only when such a router
# is built: fixed routers and this module need the standard library alone.

logger = logging.getLogger("snowflake_db.sharding")


# Keyed by id(): routers compare by mapping and are unhashable, as ShardRouter is.
_routers: weakref.WeakValueDictionary[int, ControlledShardRouter] = weakref.WeakValueDictionary()


class _Snapshot(NamedTuple):
    """What routing reads, replaced as a whole."""

    mapping: dict[int, str]
    targets: tuple[str, ...]
    map: ShardMap | None


class ControlledShardRouter(ShardRouter):
    """A router whose mapping is the control database's shard map, kept fresh.

    Built by :meth:`ShardRouter.from_control`. It loads the map
    (:mod:`snowflake_db.sharding.shard_map`) once, refusing a map of another layout, then routes
    exactly like a fixed router with that mapping. At most every ``refresh_s`` seconds it
    re-reads the map's one version row and reloads the rows when the version changed: from the
    routing call that finds the check due, and from a background thread (``background=True``),
    so an idle process keeps reporting too. :meth:`refresh` checks at once (the retry helpers
    call it after a :class:`~snowflake_db.errors.ShardMovedError`). Promptness is ``refresh_s``;
    safety is the move's fence, which refuses the writes a stale process sends to the old target.

    After each check the router records the version it routes with in
    ``snowflake_shard_map_seen`` under the process's lease (the worker ID and token of
    ``generator``'s table lease, default the process-wide generator's, written only while the
    control database's slots table holds that token): a move's cleanup barrier waits for it.

    Thread-safe: routing reads one immutable snapshot; one thread at a time checks, the others
    route with the map they have meanwhile, so a control database that hangs never holds routing
    up (a forced :meth:`refresh` excepted). A failed check keeps the current map, is logged and
    kept in :attr:`last_error`. In a forked child the router drops its parent's pooled
    connections (``Engine.dispose(close=False)``), thread and lock, and checks at its first use.

    ``control`` is a SQLAlchemy ``Engine`` (used as it is) or a URL (the router creates the
    engine and :meth:`close` disposes it); ``slots_table`` and ``schema`` name the worker tables
    and the map's schema.
    """

    def __init__(
        self,
        control: Any,  # a SQLAlchemy Engine, URL or URL string (see shard_map.control_engine)
        *,
        layout: Layout,
        refresh_s: float = DEFAULT_REFRESH_SECONDS,
        engine: str | None = None,
        generator: SnowflakeGenerator | None = None,
        slots_table: str = _SLOTS_TABLE,
        schema: str | None = None,
        background: bool = True,
    ) -> None:
        self._ready = False
        self._snapshot = _Snapshot({}, (), None)
        refresh_s = require_seconds("refresh_s", refresh_s)
        if refresh_s < MIN_REFRESH_SECONDS:
            raise InvalidArgumentError(
                f"refresh_s={refresh_s} is below the minimum {MIN_REFRESH_SECONDS}: every check "
                "is a round trip to the control database"
            )
        layout = require_layout(layout)
        from .shard_map import control_engine, read_shard_map

        self._control, self._owns_engine = control_engine(control)
        self.refresh_s = refresh_s
        self.schema = schema
        self.slots_table = slots_table
        self._generator = generator
        self._background = background
        shard_map = read_shard_map(self._control, schema=schema)
        shard_map.check_layout(layout)
        super().__init__(shard_map.mapping, layout=layout, engine=engine)
        self._snapshot = self._snapshot._replace(map=shard_map)
        #: the error of the last failed check, ``None`` after a good one
        self.last_error: BaseException | None = None
        self._reported: tuple[int, str, int] | None = None
        self._start_process_state()
        self._ready = True
        _routers[id(self)] = self
        forks.on_fork(_after_fork_in_child)
        self._report(shard_map.version)
        self._ensure_thread()

    def _start_process_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._next_check = monotonic() + self.refresh_s
        #: when the last check that succeeded began (monotonic; 0: none in this process yet)
        self._checked_from = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: per thread: the open :class:`RoutedShards` records (``stack``)
        self._recording = threading.local()

    # -- what the base class reads ---------------------------------------------------------

    @property
    def _mapping(self) -> dict[int, str]:
        self._follow()
        return self._snapshot.mapping

    @_mapping.setter
    def _mapping(self, mapping: dict[int, str]) -> None:
        self._snapshot = self._snapshot._replace(mapping=mapping)

    @property
    def targets(self) -> tuple[str, ...]:
        """The targets serving at least one logical shard in the current map."""
        self._follow()
        return self._snapshot.targets

    @targets.setter
    def targets(self, targets: tuple[str, ...]) -> None:
        self._snapshot = self._snapshot._replace(targets=targets)

    # -- the map ---------------------------------------------------------------------------

    @property
    def shard_map(self) -> ShardMap:
        """The map this router routes with (version, rows, every known target)."""
        self._follow()
        shard_map = self._snapshot.map
        assert shard_map is not None
        return shard_map

    @property
    def version(self) -> int:
        """The map version this router routes with."""
        return self.shard_map.version

    @property
    def known_targets(self) -> tuple[str, ...]:
        """Every target registered in the map, serving shards or not (an engine or alias is
        needed for each: a move can put a shard on any of them)."""
        return tuple(sorted(self.shard_map.targets))

    def state_of(self, shard: int) -> str:
        """``serving``, ``moving`` or ``cutover`` (writes refused by the fence until the flip)."""
        self._check_shard(shard)
        return self.shard_map.rows[shard].state

    def refresh(self) -> int:
        """Check the map's version now (reloading the map if it changed) and return the version
        routed with; errors are raised, not logged."""
        self._check(force=True)
        return self.version

    def _target_of(self, shard: int) -> str:
        """A shard that is not ``serving`` can flip to its new target at any moment: it is
        routed with the map as of this call (one version read of the control database, shared
        by the calls that wait for it), so a read never looks on the old target for an order
        acknowledged on the new one. A move publishes the ``moving`` state and waits until every
        leased process has seen it before it flips."""
        self._follow()
        shard_map = self._snapshot.map
        if shard_map is not None and shard_map.rows[shard].state != "serving":
            self._check_since(monotonic())
        target = self._snapshot.mapping[shard]
        for routes in getattr(self._recording, "stack", ()):
            routes.targets.setdefault(shard, target)
        return target

    def _check_since(self, since: float) -> None:
        """Make sure a check that began at ``since`` or later has finished: run one, or take the
        one another thread began meanwhile. A failed check is logged and the current map stays
        (writes are still refused by the move's fence)."""
        with self._lock:
            if self._checked_from >= since:
                return
            began = monotonic()
            if self._checked(began, failing="for a moving shard", raise_errors=False):
                self._next_check = began + self.refresh_s

    def refresh_after_miss(self) -> bool:
        """A read by ID, key or public number found nothing: check the map's version now (one
        primary-key read of the control database) and return whether it changed, so the caller
        reads once more with the new map. A process that has not refreshed since a move's flip
        (a long ``refresh_s``, a process without a lease the cleanup barrier cannot wait for)
        would otherwise look on the old target after its rows were deleted there. A failed
        check is logged and answers ``False``: the miss stands."""
        before = self._snapshot.map.version if self._snapshot.map is not None else None
        try:
            self._check(force=True)
        except Exception as error:
            logger.warning("snowflake_db: checking the shard map after a read miss failed "
                           "(%s: %s)", type(error).__name__, error)
            return False
        return self.version != before

    def _follow(self) -> None:
        if not self._ready:
            return
        if monotonic() < self._next_check and self._pid == os.getpid():
            return
        self._check(force=False)

    def _check(self, *, force: bool) -> None:
        forks.reset_if_forked()
        if not self._lock.acquire(blocking=force):
            return  # another thread checks; route with the current map meanwhile
        try:
            now = monotonic()
            if not force and now < self._next_check:
                return
            self._next_check = now + self.refresh_s
            self._checked(now, failing="until the next check", raise_errors=force)
        finally:
            self._lock.release()
        self._ensure_thread()

    def _checked(self, began: float, *, failing: str, raise_errors: bool) -> bool:
        """One check, under the lock, that began at ``began``: reload the map if its version
        changed. A failure is kept in :attr:`last_error` and raised, or logged (the current map
        stays, ``failing`` says for how long); returns whether the check succeeded."""
        try:
            self._reload_if_changed()
        except Exception as error:
            self.last_error = error
            if raise_errors:
                raise
            logger.warning(
                "snowflake_db: checking the shard map failed (%s: %s); routing with version %s %s",
                type(error).__name__, error, self._snapshot.map and self._snapshot.map.version,
                failing,
            )
            return False
        self._checked_from = began
        self.last_error = None
        return True

    def _reload_if_changed(self) -> None:
        from .shard_map import read_map_version, read_shard_map

        current = self._snapshot.map
        assert current is not None
        version = read_map_version(self._control, schema=self.schema)
        if version != current.version:
            shard_map = read_shard_map(self._control, schema=self.schema)
            shard_map.check_layout(self.layout)
            self._install(shard_map)
        self._report(self._snapshot.map.version if self._snapshot.map else version)

    def _install(self, shard_map: ShardMap) -> None:
        mapping = shard_map.mapping
        if sorted(mapping) != list(range(self.logical_shards)):
            raise ShardingError(
                f"the shard map version {shard_map.version} has shards {sorted(mapping)[:10]}..., "
                f"not 0..{self.logical_shards - 1}"
            )
        targets = tuple(dict.fromkeys(mapping[shard] for shard in sorted(mapping)))
        self._snapshot = _Snapshot(mapping, targets, shard_map)
        logger.info("snowflake_db: routing with shard map version %d", shard_map.version)

    # -- confirming a transaction's routes before its commit ----------------------------------

    @contextmanager
    def recording_routes(self) -> Iterator[RoutedShards]:
        """Record the shards this thread routes inside the block (by ID, key, shard or fan-out)
        and the target each was first given; :meth:`RoutedShards.confirm` before the commit
        raises :class:`~snowflake_db.errors.ShardMovedError` if one has moved since, so the
        retry helpers roll back and run the transaction again on the new target.

        What confirming reads: a move deletes the source's rows only after its barrier, which
        waits until every live lease has reported the flipped map, and this router reports a
        version only after it routes with it. So while this process's table lease (on this
        control database, reported under by this router) stayed valid without a lapse from
        the record's start to the confirmation, the router's current map is enough: no round
        trip. Otherwise (no lease, a lapse, another lease) it checks the control database's
        map first, and a failed check is raised: a route that cannot be confirmed is not
        committed.
        """
        routes = RoutedShards(self, self._lease_stamp())
        stack: list[RoutedShards] | None = getattr(self._recording, "stack", None)
        if stack is None:
            stack = self._recording.stack = []
        stack.append(routes)
        try:
            yield routes
        finally:
            stack.remove(routes)

    def _confirm_routes(self, routes: RoutedShards) -> None:
        if not routes.targets:
            return
        if routes.lease is None or self._lease_stamp() != routes.lease:
            self._check(force=True)
        snapshot = self._snapshot
        for shard, target in sorted(routes.targets.items()):
            now = snapshot.mapping[shard]
            if now != target:
                version = snapshot.map.version if snapshot.map is not None else "?"
                raise ShardMovedError(
                    f"logical shard {shard} moved from {target} to {now} (map version "
                    f"{version}) while this transaction ran on {target}: an UPDATE or DELETE "
                    f"there may have matched rows no longer there; roll back and run it again",
                    shard=shard, target=now,
                )

    def _lease_stamp(self) -> tuple[str, int] | None:
        """``(token, lapses)`` of this process's table lease while it is valid here and this
        router has reported under it; ``None`` otherwise. Equal stamps at a record's start and
        at its confirmation mean the lease stayed valid throughout (a renewal after its local
        deadline passed counts a lapse: the barrier may have stopped waiting for it)."""
        lease = self._held_lease()
        reported = self._reported
        if lease is None or reported is None or reported[1] != lease.token:
            return None
        lapses = getattr(lease, "lapses", None)
        valid_until = getattr(lease, "valid_until", None)
        if not isinstance(lapses, int) or not isinstance(valid_until, (int, float)):
            return None
        if monotonic() >= valid_until:
            return None
        return lease.token, lapses

    # -- reporting the version under the process's lease -----------------------------------

    def _held_lease(self) -> Any:
        """This process's held table lease, or ``None`` (duck-typed: the worker package needs
        SQLAlchemy, which routing does not import)."""
        generator = self._generator if self._generator is not None else current_generator()
        lease = generator.lease if generator is not None else None
        token = getattr(lease, "token", None)
        if lease is None or not isinstance(token, str) or getattr(lease, "state", None) != "held":
            return None
        if getattr(lease, "pid", None) != os.getpid():
            return None
        return lease

    def _lease(self) -> tuple[int, str] | None:
        """The worker ID and token of this process's held table lease."""
        lease = self._held_lease()
        return None if lease is None else (lease.worker_id, lease.token)

    def _report(self, version: int) -> None:
        """Write the version routed with under this process's lease, once per change."""
        held = self._lease()
        if held is None:
            return
        from .shard_map import report_seen

        key = (held[0], held[1], version)
        if key == self._reported:
            return
        written = report_seen(
            self._control, worker_id=held[0], lease_token=held[1], version=version,
            slots_table=self.slots_table, schema=self.schema,
        )
        if written:
            self._reported = key

    @property
    def reported(self) -> tuple[int, str, int] | None:
        """``(worker_id, lease_token, version)`` last written to the seen table, if any."""
        return self._reported

    # -- the background check --------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if not self._background or self._stop.is_set():
            return
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        if not forks.threads_allowed():
            return  # a child forked without Python's hooks: routing calls check instead
        thread = threading.Thread(
            target=_background_checks, args=(weakref.ref(self), self._stop, self.refresh_s),
            name="snowflake_db-shard-map", daemon=True,
        )
        self._thread = thread
        thread.start()

    def close(self) -> None:
        """Stop the background check and dispose the engine if the router created it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        if self._owns_engine:
            self._control.dispose()

    def _after_fork(self) -> None:
        closed = self._stop.is_set()
        self._control.dispose(close=False)  # the parent's pooled connections stay the parent's
        self._start_process_state()
        if closed:
            self._stop.set()  # a router closed before the fork starts no thread in the child
        self._next_check = 0.0  # check at the first use: the child may hold another lease
        self._reported = None

    def fan_out(self) -> FanOut:
        """The targets serving shards in the current map, each to be filtered to its own
        logical shards unless it serves all of them: a moved shard's rows stay on its source
        until the move's cleanup, and must not be read there twice (or at all once the map
        names the new target)."""
        self._follow()
        shard_map = self._snapshot.map
        if shard_map is not None and any(row.state != "serving" for row in shard_map.rows.values()):
            self._check_since(monotonic())  # a moving shard: the map as of this call
        mapping = self._snapshot.mapping  # one snapshot: targets and filters agree
        for routes in getattr(self._recording, "stack", ()):
            for shard, target in mapping.items():
                routes.targets.setdefault(shard, target)
        by_target: dict[str, list[int]] = {}
        for shard in sorted(mapping):
            by_target.setdefault(mapping[shard], []).append(shard)
        keep = {
            target: tuple(shards)
            for target, shards in by_target.items()
            if len(shards) < self.logical_shards
        }
        return FanOut(tuple(by_target), keep, dict(mapping), self._max_shard)

    def moved(self, shard: int, target: str) -> ShardRouter:
        """A fixed router with ``shard`` on ``target`` (the map is changed by the mover only)."""
        return ShardRouter(self.mapping, layout=self.layout, engine=self.engine).moved(
            shard, target
        )

    def __repr__(self) -> str:
        shard_map = self._snapshot.map
        version = shard_map.version if shard_map is not None else "?"
        return (
            f"<ControlledShardRouter version={version} logical_shards={self.logical_shards} "
            f"targets={list(self._snapshot.targets)} refresh_s={self.refresh_s}>"
        )


def _background_checks(
    router_ref: weakref.ReferenceType[ControlledShardRouter],
    stop: threading.Event,
    refresh_s: float,
) -> None:
    """Check the map every ``refresh_s`` until the router is closed or collected."""
    keep_signals_off_this_thread()
    while not stop.wait(refresh_s):
        router = router_ref()
        if router is None:
            return
        try:
            router._follow()
        except Exception:
            logger.exception("snowflake_db: the shard map's background check failed")
        del router


def _after_fork_in_child(parent_pid: int) -> None:
    for router in list(_routers.values()):
        router._after_fork()

