"""A :class:`~snowflake_db.sharding.ShardRouter` that follows the shard map in the control database.

``ShardRouter.from_control(control, layout=...)`` builds a :class:`ControlledShardRouter`. It
loads the map (:mod:`snowflake_db.sharding.shard_map`) once, refusing a map of another layout,
then routes exactly like a fixed router with that mapping. At most every ``refresh_s`` seconds
it re-reads the map's one version row (a primary-key read) and reloads the rows when the version
changed: from the routing call that finds the check due, and from a background thread, so an
idle process keeps reporting too. ``refresh()`` forces the check (the retry helpers call it
after a :class:`~snowflake_db.errors.ShardMovedError`).

Promptness is ``refresh_s``; safety is the move's fence, which refuses a write a stale process
sends to the old target. After each check the router reports the version it routes with into
``snowflake_shard_map_seen`` under the process's lease (the worker ID and lease token of the
process-wide generator's table lease, when it leases from the same control database): the
cleanup barrier of a move waits for those reports.

Thread-safe: routing reads one immutable snapshot; one thread at a time checks, the others route
with the map they have meanwhile (a control database that hangs never holds routing up, except
a forced ``refresh()``). A failed check keeps the current map and is logged. In a forked child
the router forgets its parent's pooled connections (``Engine.dispose(close=False)``), its thread
and its lock, and checks the map at its first use.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL

from .. import forks
from .._validate import require_seconds
from ..clock import monotonic
from ..errors import InvalidArgumentError, ShardingError
from ..layout import Layout, require_layout
from ..worker._schema import DEFAULT_SLOTS_TABLE
from .routing import ShardRouter
from .shard_map import ShardMap, read_map_version, read_shard_map, report_seen

if TYPE_CHECKING:
    from ..generator import SnowflakeGenerator

__all__ = ["DEFAULT_REFRESH_SECONDS", "ControlledShardRouter"]

logger = logging.getLogger("snowflake_db.sharding")

#: How often a router re-reads the map's version by default (seconds).
DEFAULT_REFRESH_SECONDS = 2.0
#: The shortest ``refresh_s`` accepted: each check is a round trip to the control database.
MIN_REFRESH_SECONDS = 0.05

# Keyed by id(): routers compare by mapping and are unhashable, as ShardRouter is.
_routers: weakref.WeakValueDictionary[int, ControlledShardRouter] = weakref.WeakValueDictionary()


class _Snapshot(NamedTuple):
    """What routing reads, replaced as a whole."""

    mapping: dict[int, str]
    targets: tuple[str, ...]
    map: ShardMap | None


class ControlledShardRouter(ShardRouter):
    """A router whose mapping is the control database's shard map, kept fresh.

    ``control`` is a SQLAlchemy :class:`~sqlalchemy.Engine` (used as it is) or a URL (the router
    creates and owns an engine; :meth:`close` disposes it). ``refresh_s`` bounds how stale the
    map may be while the control database answers. ``generator`` is the generator whose lease
    reports the version (default: the process-wide one, when configured); ``slots_table`` and
    ``schema`` name the worker tables and the map's schema.
    """

    def __init__(
        self,
        control: Engine | URL | str,
        *,
        layout: Layout,
        refresh_s: float = DEFAULT_REFRESH_SECONDS,
        engine: str | None = None,
        generator: SnowflakeGenerator | None = None,
        slots_table: str = DEFAULT_SLOTS_TABLE,
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
        if isinstance(control, Engine):
            self._control, self._owns_engine = control, False
        elif isinstance(control, URL | str):
            self._control, self._owns_engine = create_engine(control, pool_pre_ping=True), True
        else:
            raise InvalidArgumentError(
                f"control must be a SQLAlchemy Engine, URL or URL string, got "
                f"{type(control).__name__}"
            )
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            try:
                self._reload_if_changed()
                self.last_error = None
            except Exception as error:
                self.last_error = error
                if force:
                    raise
                logger.warning(
                    "snowflake_db: checking the shard map failed (%s: %s); routing with "
                    "version %s until the next check",
                    type(error).__name__, error, self._snapshot.map and self._snapshot.map.version,
                )
        finally:
            self._lock.release()
        self._ensure_thread()

    def _reload_if_changed(self) -> None:
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

    # -- reporting the version under the process's lease -----------------------------------

    def _lease(self) -> tuple[int, str] | None:
        from ..process import current_generator
        from ..worker._table_lease import HELD, TableLease

        generator = self._generator if self._generator is not None else current_generator()
        lease = generator.lease if generator is not None else None
        if not isinstance(lease, TableLease) or lease.state != HELD or lease.pid != os.getpid():
            return None
        return lease.worker_id, lease.token

    def _report(self, version: int) -> None:
        """Write the version routed with under this process's lease, once per change."""
        held = self._lease()
        if held is None:
            return
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
        self._control.dispose(close=False)  # the parent's pooled connections stay the parent's
        self._start_process_state()
        self._next_check = 0.0  # check at the first use: the child may hold another lease
        self._reported = None

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

