"""Read-only admin pages for the worker tables: who holds which slot, and a "reap" action.

Registered on the default admin site by :mod:`snowflake_db.django.admin` (the app's admin
module, which the admin's autodiscovery imports); :func:`register` puts them on another site.
Nobody can add, change or delete a row here (the allocator owns them, and a deleted slot row
would lose its high-water mark); the only write is the action, which calls the table
allocator's ``reap`` for the selected slots. Lease states are judged by the database's clock,
read once per page.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_value
from django.db import connections
from django.db.models import BigIntegerField, F, Value

from ..errors import SnowflakeError
from ..metrics import SlotCounts, SlotState
from .conf import get_settings
from .models import WorkerRegistration, WorkerSlot
from .worker import control_allocator

__all__ = ["WorkerRegistrationAdmin", "WorkerSlotAdmin", "database_now_ms", "register"]

def database_now_ms(alias: str) -> int:
    """The clock of database ``alias`` in Unix ms: the allocator's own expression
    (:class:`snowflake_db.worker._store.db_now_ms`), compiled for the alias's vendor."""
    from sqlalchemy import select
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    from ..worker._store import db_now_ms

    connection = connections[alias]
    dialects = {"postgresql": postgresql, "mysql": mysql, "sqlite": sqlite}
    if connection.vendor not in dialects:
        raise NotImplementedError(f"no database clock for vendor {connection.vendor!r}")
    sql = str(select(db_now_ms()).compile(dialect=dialects[connection.vendor].dialect()))
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


def _shown_time(ms: int | None, model_admin: admin.ModelAdmin[Any]) -> str:
    """A Unix-ms column as the change list shows a datetime: localised, in the current time
    zone, ``-`` when unset. Returned as text because the change form shows a method's raw
    ``str()`` (``2024-01-01 00:00:00+00:00``) where the list localises it."""
    moment = None if not ms else datetime.fromtimestamp(ms / 1000, tz=UTC)
    return str(display_for_value(moment, model_admin.get_empty_value_display()))


class _ReadOnly:
    """No add, change or delete, for anyone: the allocator owns these rows."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class _StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(state.value, state.value) for state in SlotState]

    def queryset(self, request: Any, queryset: Any) -> Any:
        value = self.value()
        if value not in SlotState.__members__.values():
            return queryset
        return queryset.filter(WorkerSlot.state_filter(SlotState(value), F("now_ms")))


class WorkerSlotAdmin(_ReadOnly, admin.ModelAdmin):
    """Every worker slot: state, holder, expiry by the database clock, high-water mark."""

    list_display = (
        "worker_id",
        "state",
        "holder",
        "hostname",
        "pid",
        "expires_in",
        "renewed",
        "high_water",
    )
    list_filter = (_StateFilter,)
    search_fields = ("hostname", "label")
    ordering = ("worker_id",)
    actions = ("reap_expired",)
    fields = (
        "worker_id",
        "state",
        "holder",
        "registration_id",
        "hostname",
        "pid",
        "label",
        "acquired",
        "renewed",
        "expires_in",
        "high_water",
        "high_water_ms",
    )
    readonly_fields = fields

    def get_queryset(self, request: Any) -> Any:
        queryset = super().get_queryset(request)
        # One reading of the database clock per page, given to every row as ``now_ms``.
        now_ms = database_now_ms(queryset.db)
        return queryset.annotate(now_ms=Value(now_ms, output_field=BigIntegerField()))

    def changelist_view(self, request: Any, extra_context: dict[str, Any] | None = None) -> Any:
        context = dict(extra_context or {})
        try:
            context.setdefault("subtitle", self._summary(request))
        except Exception as error:  # the page itself reports a database failure
            context.setdefault("subtitle", f"slot counts unavailable: {error}")
        return super().changelist_view(request, extra_context=context)

    def _summary(self, request: Any) -> str:
        """The "worker IDs" line of ``snowflake-db doctor`` (:class:`~snowflake_db.metrics.
        SlotCounts`), for the layout and ``max_floor_wait_ms`` of ``SNOWFLAKE_DB``."""
        from ..worker import DEFAULT_MAX_FLOOR_WAIT_MS, SlotRow

        conf = get_settings()
        rows = [
            SlotRow(
                worker_id=slot.worker_id,
                lease_token=slot.lease_token,
                registration_id=slot.registration_id,
                hostname=slot.hostname,
                pid=slot.pid,
                label=slot.label,
                acquired_at_ms=slot.acquired_at_ms,
                renewed_at_ms=slot.renewed_at_ms,
                expires_at_ms=slot.expires_at_ms,
                high_water_ms=slot.high_water_ms,
                db_now_ms=slot.now_ms,
            )
            for slot in self.get_queryset(request)
        ]
        wait_ms = conf.allocator_options.get("max_floor_wait_ms", DEFAULT_MAX_FLOOR_WAIT_MS)
        return f"worker IDs: {SlotCounts.of(rows, conf.layout, wait_ms).describe()}"

    # -- columns -----------------------------------------------------------------------------

    @admin.display(description="state")
    def state(self, obj: WorkerSlot) -> str:
        return obj.state(obj.now_ms)

    @admin.display(description="holder")
    def holder(self, obj: WorkerSlot) -> str:
        if obj.lease_token is None:
            return "-"
        if obj.label:
            return str(obj.label)
        return f"registration {obj.registration_id}"

    @admin.display(description="expires in", ordering="expires_at_ms")
    def expires_in(self, obj: WorkerSlot) -> str:
        if obj.lease_token is None:
            return "-"
        if obj.expires_at_ms is None:
            return "never"
        return f"{(obj.expires_at_ms - obj.now_ms) / 1000:.1f} s"

    @admin.display(description="renewed", ordering="renewed_at_ms")
    def renewed(self, obj: WorkerSlot) -> str:
        if obj.lease_token is None or obj.renewed_at_ms is None:
            return "-"
        return f"{(obj.now_ms - obj.renewed_at_ms) / 1000:.1f} s ago"

    @admin.display(description="acquired")
    def acquired(self, obj: WorkerSlot) -> str:
        return _shown_time(obj.acquired_at_ms, self)

    @admin.display(description="high-water mark", ordering="high_water_ms")
    def high_water(self, obj: WorkerSlot) -> str:
        return _shown_time(obj.high_water_ms, self)

    # -- the action --------------------------------------------------------------------------

    def has_reap_permission(self, request: Any) -> bool:
        opts = self.opts
        return bool(request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))

    @admin.action(description="Reap expired leases of the selected slots", permissions=["reap"])
    def reap_expired(self, request: Any, queryset: Any) -> None:
        selected = sorted(queryset.values_list("worker_id", flat=True))
        try:
            allocator = control_allocator(queryset.db)
            try:
                reaped = allocator.reap(selected)
            finally:
                allocator.close()
        except (SnowflakeError, ImportError, NotImplementedError) as error:
            self.message_user(request, f"Nothing reaped: {error}", messages.ERROR)
            return
        kept = [worker_id for worker_id in selected if worker_id not in reaped]
        text = f"Reaped {len(reaped)} expired lease(s): {', '.join(map(str, reaped)) or '-'}."
        if kept:
            left = ", ".join(map(str, kept))
            text += f" Not expired (live, reserved or free), left alone: {left}."
        self.message_user(request, text, messages.SUCCESS if reaped else messages.WARNING)


class WorkerRegistrationAdmin(_ReadOnly, admin.ModelAdmin):
    """The acquisition log: one row per lease taken."""

    list_display = ("id", "hostname", "pid", "started", "worker_id")
    search_fields = ("hostname",)
    ordering = ("-id",)
    fields = ("id", "hostname", "pid", "started", "started_at_ms", "worker_id")
    readonly_fields = fields

    @admin.display(description="started", ordering="started_at_ms")
    def started(self, obj: WorkerRegistration) -> str:
        return _shown_time(obj.started_at_ms, self)


def register(site: Any = None) -> None:
    """Put the worker pages on ``site`` (default: ``django.contrib.admin.site``).

    A model already on ``site`` is left as it is (a second call, or your own admin class for
    it), so calling this from a project's admin module or ``ready()`` never raises
    ``AlreadyRegistered``.
    """
    site = site if site is not None else admin.site
    for model, model_admin in (
        (WorkerSlot, WorkerSlotAdmin),
        (WorkerRegistration, WorkerRegistrationAdmin),
    ):
        if not site.is_registered(model):
            site.register(model, model_admin)
