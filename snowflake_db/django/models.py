"""Django models mirroring :mod:`snowflake_db.worker._schema` exactly, so migrations own the tables.

Column names, types, nullability and the ``high_water_ms`` default must match the SQLAlchemy
definition: the table allocator reads and writes these tables with its own SQL. A test compares
the migrated tables (the layout table's too) with that definition on every backend.
"""

from __future__ import annotations

from django.db import models

from ..metrics import SlotState

# The values of snowflake_db.worker._schema, repeated so importing the models needs no SQLAlchemy.
SLOTS_TABLE = "snowflake_worker_slots"
REGISTRATIONS_TABLE = "snowflake_worker_registrations"
LAYOUT_TABLE = "snowflake_worker_layout"
TOKEN_LENGTH = 32
NAME_LENGTH = 255
LAYOUT_TEXT_LENGTH = 1000


class WorkerRegistration(models.Model):
    """One row per acquisition; ``id & max_worker_id`` is the preferred slot."""

    # BIGINT identity/AUTO_INCREMENT; INTEGER PRIMARY KEY AUTOINCREMENT on SQLite, as in the schema.
    id = models.BigAutoField(primary_key=True)
    hostname = models.CharField(max_length=NAME_LENGTH)
    pid = models.IntegerField()
    started_at_ms = models.BigIntegerField()
    worker_id = models.IntegerField(null=True)

    class Meta:
        db_table = REGISTRATIONS_TABLE
        verbose_name = "worker registration"

    def __str__(self) -> str:
        return f"registration {self.id} ({self.hostname} pid {self.pid})"


class WorkerSlot(models.Model):
    """One row per worker ID ever used; never deleted (it keeps the high-water mark)."""

    worker_id = models.IntegerField(primary_key=True)
    lease_token = models.CharField(max_length=TOKEN_LENGTH, null=True)
    registration_id = models.BigIntegerField(null=True)
    hostname = models.CharField(max_length=NAME_LENGTH, null=True)
    pid = models.IntegerField(null=True)
    label = models.CharField(max_length=NAME_LENGTH, null=True)
    acquired_at_ms = models.BigIntegerField(null=True)
    renewed_at_ms = models.BigIntegerField(null=True)
    expires_at_ms = models.BigIntegerField(null=True)
    high_water_ms = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = SLOTS_TABLE
        verbose_name = "worker slot"
        ordering = ("worker_id",)

    def __str__(self) -> str:
        return f"worker {self.worker_id}"

    def state(self, now_ms: int) -> SlotState:
        """Its :class:`~snowflake_db.metrics.SlotState` at database time ``now_ms``."""
        return SlotState.of(
            lease_token=self.lease_token, expires_at_ms=self.expires_at_ms, now_ms=now_ms
        )

    @staticmethod
    def state_filter(state: SlotState, now: models.Expression | models.F) -> models.Q:
        """:meth:`SlotState.of` as a query condition, for rows whose database time is ``now``
        (the admin's state filter): the one rule, in SQL."""
        held = models.Q(lease_token__isnull=False)
        conditions = {
            SlotState.FREE: models.Q(lease_token__isnull=True),
            SlotState.RESERVED: held & models.Q(expires_at_ms__isnull=True),
            SlotState.LIVE: held & models.Q(expires_at_ms__gte=now),
            SlotState.EXPIRED: held & models.Q(expires_at_ms__lt=now),
        }
        return conditions[state]


class WorkerLayout(models.Model):
    """The layout the worker tables serve: one row (id 1), written by the first process to lease.

    Never edit it while processes run: a process with another layout is refused because two
    layouts sharing the tables can issue the same ID.
    """

    id = models.IntegerField(primary_key=True)
    layout = models.CharField(max_length=LAYOUT_TEXT_LENGTH)
    recorded_at_ms = models.BigIntegerField()
    hostname = models.CharField(max_length=NAME_LENGTH, null=True)
    pid = models.IntegerField(null=True)

    class Meta:
        db_table = LAYOUT_TABLE
        verbose_name = "worker layout"

    def __str__(self) -> str:
        return f"worker layout {self.layout}"


# -- the shard map (snowflake_db.sharding.shard_map), in the control database -------------------
# Same names, types, nullability and CHECKs as the SQLAlchemy definition, whose functions (and the
# routers following the map) read and write these tables with their own SQL. Foreign keys name
# their columns as the schema does (db_column) and add no index of their own (db_index=False).

SHARD_TARGET_LENGTH = 100
SHARD_BACKENDS = ("postgresql", "mariadb", "sqlite")
SHARD_STATES = ("serving", "moving", "cutover")
SHARD_MOVE_STATES = (
    "planned", "capturing", "copying", "catching_up", "fenced", "drained", "verified",
    "flipped", "barrier", "cleaning", "done", "aborting", "aborted",
)
SHARD_STEP_STATUSES = ("started", "done", "failed")
SHARD_DETAIL_LENGTH = 4000


class ShardTarget(models.Model):
    """A database shards can live on: a name (a ``DATABASES`` alias in Django), never a URL."""

    name = models.CharField(max_length=SHARD_TARGET_LENGTH, primary_key=True)
    backend = models.CharField(max_length=20)

    class Meta:
        db_table = "snowflake_shard_targets"
        verbose_name = "shard target"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(backend__in=SHARD_BACKENDS),
                name="snowflake_shard_targets_backend",
            )
        ]

    def __str__(self) -> str:
        return f"shard target {self.name} ({self.backend})"


class ShardMapVersion(models.Model):
    """The map's one version row, bumped in the transaction of every map change."""

    singleton = models.IntegerField(primary_key=True)
    version = models.BigIntegerField()
    layout = models.CharField(max_length=LAYOUT_TEXT_LENGTH)
    changed_at_ms = models.BigIntegerField()

    class Meta:
        db_table = "snowflake_shard_map_version"
        verbose_name = "shard map version"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(singleton=1), name="snowflake_shard_map_version_one"
            )
        ]

    def __str__(self) -> str:
        return f"shard map version {self.version}"


class ShardMapEntry(models.Model):
    """One logical shard: its target and state."""

    logical_shard = models.IntegerField(primary_key=True)
    target = models.ForeignKey(
        ShardTarget, models.PROTECT, db_column="target", db_index=False, related_name="+"
    )
    state = models.CharField(max_length=10)
    since_version = models.BigIntegerField()

    class Meta:
        db_table = "snowflake_shard_map"
        verbose_name = "shard map entry"
        verbose_name_plural = "shard map entries"
        ordering = ("logical_shard",)
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=SHARD_STATES), name="snowflake_shard_map_state"
            )
        ]

    def __str__(self) -> str:
        return f"logical shard {self.logical_shard}"


class ShardMove(models.Model):
    """One move of a logical shard (written by the mover)."""

    id = models.BigAutoField(primary_key=True)
    logical_shard = models.IntegerField()
    active_shard = models.IntegerField(null=True, unique=True)
    source = models.ForeignKey(
        ShardTarget, models.PROTECT, db_column="source", db_index=False, related_name="+"
    )
    target = models.ForeignKey(
        ShardTarget, models.PROTECT, db_column="target", db_index=False, related_name="+"
    )
    backend = models.CharField(max_length=20)
    state = models.CharField(max_length=20)
    capture = models.CharField(max_length=SHARD_DETAIL_LENGTH, null=True)
    flipped_version = models.BigIntegerField(null=True)
    mover_token = models.CharField(max_length=TOKEN_LENGTH, null=True)
    mover_expires_at_ms = models.BigIntegerField(null=True)
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()

    class Meta:
        db_table = "snowflake_shard_moves"
        verbose_name = "shard move"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=SHARD_MOVE_STATES), name="snowflake_shard_moves_state"
            )
        ]

    def __str__(self) -> str:
        return f"move {self.id} of shard {self.logical_shard}"


class ShardMoveStep(models.Model):
    """One row of the movers' append-only journal, keyed by ``(move_id, seq)``."""

    pk = models.CompositePrimaryKey("move", "seq")
    move = models.ForeignKey(ShardMove, models.PROTECT, db_index=False, related_name="+")
    seq = models.IntegerField()
    step = models.CharField(max_length=40)
    status = models.CharField(max_length=10)
    detail = models.CharField(max_length=SHARD_DETAIL_LENGTH, null=True)
    at_ms = models.BigIntegerField()

    class Meta:
        db_table = "snowflake_shard_move_steps"
        verbose_name = "shard move step"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=SHARD_STEP_STATUSES),
                name="snowflake_shard_move_steps_status",
            )
        ]

    def __str__(self) -> str:
        return f"move {self.move_id} step {self.seq}"  # type: ignore[attr-defined]


class ShardMapSeen(models.Model):
    """The map version the holder of a worker slot's lease routes with (the cleanup barrier)."""

    worker_id = models.IntegerField(primary_key=True)
    lease_token = models.CharField(max_length=TOKEN_LENGTH)
    map_version = models.BigIntegerField()
    seen_at_ms = models.BigIntegerField()

    class Meta:
        db_table = "snowflake_shard_map_seen"
        verbose_name = "shard map seen"
        verbose_name_plural = "shard map seen"

    def __str__(self) -> str:
        return f"worker {self.worker_id} at map version {self.map_version}"
