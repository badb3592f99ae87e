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
