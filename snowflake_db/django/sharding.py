"""Django sharding: a ``DATABASE_ROUTERS`` router and a manager routing by Snowflake ID.

Settings::

    SNOWFLAKE_SHARD_ROUTER = "myproject.sharding.ROUTER"  # a ShardRouter whose targets are
                                                          # database aliases (or a callable)
    DATABASE_ROUTERS = ["snowflake_db.django.routers.ControlDatabaseRouter",
                        "snowflake_db.django.sharding.ShardedDatabaseRouter"]

To follow the shard map in the control database (``ShardRouter.from_control``) instead of a
fixed router, give a dict::

    SNOWFLAKE_SHARD_ROUTER = {
        "CONTROL_DATABASE": "default",       # alias holding the map (default: SNOWFLAKE_DB's)
        "TARGETS": ["shard0", "shard1"],     # aliases that may hold shards: migrated, and the
                                             # only names the map may use
        "REFRESH_SECONDS": 2.0,              # how stale the map may get (optional)
    }

The map's targets are ``DATABASES`` aliases; the router reads the map through SQLAlchemy (as the
table worker allocator does) with the layout of ``SNOWFLAKE_DB["LAYOUT"]``, and routes every
query by the map as it is when the query runs. :func:`atomic_with_retry` runs a transaction again
when a moving shard's fence refused it.

A sharded model mixes in :class:`ShardedModelMixin`, sets ``snowflake_shard_rule`` and uses
``objects = ShardedManager()``. Its primary key is a plain ``BigIntegerField(primary_key=True)``
filled by ``save()``/``create()``/``bulk_create()`` with an ID that embeds the row's shard (a
field default cannot see the row's shard key). Django's router API only sees model instances,
never filter values (https://docs.djangoproject.com/en/stable/topics/db/multi-db/#hints), so
``get(pk=...)`` and shard-key filters are routed by the queryset, which sets ``.using(alias)``.
The routing itself (which shard an ID or key lives on) is :mod:`snowflake_db.sharding`; the
partitioning migration operations are :mod:`snowflake_db.django.operations`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models, transaction
from django.db.models import F, Q
from django.db.models.lookups import In
from django.utils.module_loading import import_string

from ..errors import ShardingError
from ..sharding.moved import DEFAULT_ATTEMPTS, DEFAULT_TIMEOUT_SECONDS, retry_shard_moved
from ..sharding.routing import FanOut, ShardRouter
from ..sharding.rules import ShardRule
from .conf import get_settings, when_changed

__all__ = [
    "ShardedDatabaseRouter",
    "ShardedManager",
    "ShardedModelMixin",
    "ShardedQuerySet",
    "alias_for_instance",
    "atomic_with_retry",
    "ensure_pk",
    "get_shard_router",
]

SETTING_NAME = "SNOWFLAKE_SHARD_ROUTER"
#: Keys of the dict form (a router following the control database's shard map).
CONTROL_KEYS = frozenset({"CONTROL_DATABASE", "TARGETS", "REFRESH_SECONDS"})
_cached: ShardRouter | None = None
_T = TypeVar("_T")


def _control_setting() -> dict[str, Any] | None:
    """The dict form of the setting, checked; ``None`` for a router given in code."""
    value = getattr(settings, SETTING_NAME, None)
    if not isinstance(value, dict):
        return None
    unknown = sorted(set(value) - CONTROL_KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.{SETTING_NAME}: unknown key(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(CONTROL_KEYS))}"
        )
    targets = value.get("TARGETS")
    if isinstance(targets, str) or not isinstance(targets, list | tuple) or not targets:
        raise ImproperlyConfigured(
            f"settings.{SETTING_NAME}['TARGETS'] must list the DATABASES aliases that may hold "
            f"shards, got {targets!r}"
        )
    missing = [alias for alias in [*targets, value.get("CONTROL_DATABASE")]
               if alias is not None and alias not in settings.DATABASES]
    if missing:
        raise ImproperlyConfigured(
            f"settings.{SETTING_NAME}: alias(es) {missing} are not in DATABASES"
        )
    return value


def shard_aliases() -> tuple[str, ...]:
    """The aliases sharded models live on (and are migrated to): ``TARGETS`` of the dict form
    (read without the control database, so ``migrate`` works before the map exists), else the
    router's targets."""
    control = _control_setting()
    if control is not None:
        return tuple(control["TARGETS"])
    return get_shard_router().targets


def _router_from_control(control: dict[str, Any]) -> ShardRouter:
    from .worker import sqlalchemy_url

    conf = get_settings()
    alias = control.get("CONTROL_DATABASE") or conf.control_database
    url: Any = conf.engine_url if conf.engine_url and alias == conf.control_database \
        else sqlalchemy_url(alias)
    refresh_s = control.get("REFRESH_SECONDS")
    router = ShardRouter.from_control(url, layout=conf.layout, refresh_s=refresh_s)
    allowed = set(control["TARGETS"])
    strangers = [name for name in getattr(router, "known_targets", router.targets)
                 if name not in allowed]
    if strangers:
        _close(router)
        raise ImproperlyConfigured(
            f"the shard map on alias {alias!r} names target(s) {strangers} that are not in "
            f"settings.{SETTING_NAME}['TARGETS'] {sorted(allowed)}"
        )
    return router


def get_shard_router() -> ShardRouter:
    """The :class:`ShardRouter` named by ``settings.SNOWFLAKE_SHARD_ROUTER`` (cached), or the
    router following the control database's shard map for the dict form."""
    global _cached  # noqa: PLW0603 - cleared when settings change
    if _cached is None:
        control = _control_setting()
        if control is not None:
            _cached = _router_from_control(control)
            return _cached
        value = getattr(settings, SETTING_NAME, None)
        if value is None:
            raise ImproperlyConfigured(
                f"settings.{SETTING_NAME} is not set: give the dotted path of a ShardRouter "
                "whose targets are database aliases, or a dict naming the control database "
                "that holds the shard map"
            )
        if isinstance(value, str):
            value = import_string(value)
        if callable(value) and not isinstance(value, ShardRouter):
            value = value()
        if not isinstance(value, ShardRouter):
            raise ImproperlyConfigured(
                f"settings.{SETTING_NAME} must name a ShardRouter, got {value!r}"
            )
        missing = [alias for alias in value.targets if alias not in settings.DATABASES]
        if missing:
            raise ImproperlyConfigured(
                f"settings.{SETTING_NAME}: shard target(s) {missing} are not in DATABASES"
            )
        _cached = value
    return _cached


def _close(router: ShardRouter) -> None:
    close = getattr(router, "close", None)
    if close is not None:
        close()


def _clear_cache(setting: str, value: Any) -> None:
    global _cached  # noqa: PLW0603
    if _cached is not None:
        _close(_cached)
    _cached = None


def atomic_with_retry(
    work: Callable[[], _T],
    *,
    using: str | Callable[[], str] | None = None,
    router: ShardRouter | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    timeout_s: float = DEFAULT_TIMEOUT_SECONDS,
) -> _T:
    """Run ``work()`` in ``transaction.atomic(using=...)``, again if a moving shard's fence
    refused it (SQLSTATE ``SFM01``, seen through Django's ``DatabaseError.__cause__``).

    ``using`` is an alias, or a function returning one, called before each attempt so that it
    routes by the refreshed map (``lambda: Order.objects.alias_for(customer)``...); ``None``
    leaves the transactions to ``work``. Between attempts the router (default:
    :func:`get_shard_router`) is refreshed when it follows the control database's map. Before
    the commit, the shards the attempt routed are confirmed
    (:meth:`~snowflake_db.sharding.RoutedShards.confirm`): one that moved meanwhile rolls the
    attempt back and runs it again, so an ``update()`` or ``delete()`` that reached the old
    target after the move deleted its rows there is not lost with 0 rows (not done when
    ``using`` is ``None``: the commit is ``work``'s).
    Bounded by ``attempts`` and ``timeout_s``
    (:func:`snowflake_db.sharding.moved.retry_shard_moved`). Refused inside an atomic block:
    the outer transaction is already lost when the fence refuses, so only it could retry.
    """

    chosen = router if router is not None else get_shard_router()

    def attempt() -> _T:
        with chosen.recording_routes() as routes:
            alias = using() if callable(using) else using
            if alias is None:
                return work()
            if transaction.get_connection(alias).in_atomic_block:
                raise ShardingError(
                    f"atomic_with_retry() runs its own transaction: call it outside any atomic "
                    f"block on {alias!r} (a refused write aborts the outer transaction)"
                )
            with transaction.atomic(using=alias):
                result = work()
                routes.confirm()
            return result

    refresh = getattr(chosen, "refresh", None)
    return retry_shard_moved(attempt, refresh=refresh, attempts=attempts, timeout_s=timeout_s)


when_changed((SETTING_NAME, "DATABASES"), _clear_cache)


def rule_of(model: Any) -> ShardRule | None:
    rule = getattr(model, "snowflake_shard_rule", None)
    return rule if isinstance(rule, ShardRule) else None


def _attname(model: Any, name: str) -> str:
    """``customer`` / ``customer_id`` / ``pk`` -> the concrete column attribute name."""
    opts = model._meta
    if name == "pk":
        return str(opts.pk.attname)
    try:
        field = opts.get_field(name)
    except FieldDoesNotExist:
        return name
    return str(getattr(field, "attname", name))


def _through_public_id(model: Any, name: str, values: list[Any]) -> tuple[str, list[Any]]:
    """A ``PublicId`` lookup as the lookup of the key it encodes (``public_id=text`` ->
    ``pk=key``), so that an order number is routed like its key; numbers the namespace refuses
    match nothing and are dropped. Any other field is returned as it is."""
    from .public_ids import PublicId

    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return name, values
    if not isinstance(field, PublicId):
        return name, values
    keys = [field.key_or_refused(value) for value in values]
    return field.target_name, [key for key in keys if isinstance(key, int)]


def _values(instance: Any, rule: ShardRule) -> dict[str, object]:
    return {name: getattr(instance, _attname(type(instance), name), None) for name in rule.fields}


def ensure_pk(instance: Any) -> int:
    """Give a sharded instance its primary key (embedding its shard) if it has none."""
    rule = rule_of(type(instance))
    if rule is None:
        raise ShardingError(f"{type(instance).__name__} has no snowflake_shard_rule")
    if instance.pk is None:
        pk_name = type(instance)._meta.pk.attname
        instance.pk = rule.new_pk(get_shard_router(), pk_name, _values(instance, rule))
    return int(instance.pk)


def alias_for_instance(instance: Any) -> str:
    """The database alias of a sharded instance; its routing fields must agree on one shard."""
    rule = rule_of(type(instance))
    if rule is None:
        raise ShardingError(f"{type(instance).__name__} has no snowflake_shard_rule")
    router = get_shard_router()
    values = _values(instance, rule)
    shards = {rule.shard_of_field(router, name, value)
              for name, value in values.items() if value is not None}
    if not shards:
        raise ShardingError(
            f"{type(instance).__name__} has none of its routing fields {rule.fields} set"
        )
    if len(shards) > 1:
        raise ShardingError(
            f"{type(instance).__name__} {values} disagree about the shard ({sorted(shards)}): "
            "was the primary key made without its shard key? Leave it empty to have it assigned"
        )
    return router.target_of_shard(shards.pop())


class ShardedDatabaseRouter:
    """Sends sharded models to the alias of their instance's shard, and migrates them there.

    Unsharded models get ``None`` (other routers or ``default`` decide) for reads and writes,
    and are not migrated onto shard aliases that are not also the ``default`` alias.
    """

    def _rule(self, model: Any) -> ShardRule | None:
        return rule_of(model)

    def _route(self, model: Any, hints: dict[str, Any], action: str) -> str | None:
        if self._rule(model) is None:
            return None
        instance = hints.get("instance")
        if instance is not None:
            sharded = rule_of(type(instance)) is not None
            if sharded and type(instance) is model and instance._state.adding:
                # A new row: its fields decide (assigning a parent already set _state.db, but
                # the primary key must agree with it).
                if instance.pk is None:
                    ensure_pk(instance)
                return alias_for_instance(instance)
            if instance._state.db is not None:
                return str(instance._state.db)  # loaded rows and related managers stay put
            if sharded:
                return alias_for_instance(instance)
        raise ShardingError(
            f"cannot tell which shard to {action} {model.__name__} on: use "
            f"{model.__name__}.objects.get(pk=...) / .filter(<routing field>=...) with "
            "ShardedManager, .using(alias), or .across_shards()"
        )

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._route(model, hints, "read")

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._route(model, hints, "write")

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        if rule_of(type(obj1)) is None and rule_of(type(obj2)) is None:
            return None
        db1, db2 = obj1._state.db, obj2._state.db
        if db1 is None or db2 is None:
            return True
        return bool(db1 == db2)

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        # Migrations pass historical models, which lack snowflake_shard_rule: use the real one.
        model = None
        if model_name is not None:
            from django.apps import apps

            try:
                model = apps.get_model(app_label, model_name)
            except LookupError:
                model = hints.get("model")
        targets = shard_aliases()
        if model is not None and rule_of(model) is not None:
            return db in targets
        if model is not None and db in targets and db != "default":
            return False
        return None


class ShardedQuerySet(models.QuerySet):
    """A queryset that picks its shard from ``pk``/routing-field filters, or fans out."""

    def _rule(self) -> ShardRule:
        rule = rule_of(self.model)
        if rule is None:
            raise ShardingError(f"{self.model.__name__} has no snowflake_shard_rule")
        return rule

    def _aliases_for(
        self, kwargs: dict[str, Any], mapping: dict[int, str] | None = None
    ) -> set[str] | None:
        """Aliases pinned by ``field=value`` / ``field__in=[...]`` lookups, else ``None``
        (by ``mapping``, a :meth:`~snowflake_db.sharding.ShardRouter.fan_out`'s view of the
        map, when given)."""
        rule, router = self._rule(), get_shard_router()
        target_of = mapping.__getitem__ if mapping is not None else router.target_of_shard
        names = {_attname(self.model, f): f for f in rule.fields}
        pinned: set[str] | None = None
        for lookup, value in kwargs.items():
            field, _, operator = lookup.partition("__")
            if operator not in ("", "exact", "in"):
                continue
            values = list(value) if operator == "in" else [value]
            field, values = _through_public_id(self.model, field, values)
            attname = _attname(self.model, field)
            if attname not in names:
                continue
            # URL kwargs arrive as strings: convert like the field does ("123" -> 123).
            field_object = self.model._meta.get_field(field) if field != "pk" \
                else self.model._meta.pk
            values = [field_object.to_python(getattr(v, "pk", v)) for v in values]
            if any(v is None for v in values):
                continue
            aliases = {target_of(rule.shard_of_field(router, names[attname], v))
                       for v in values}
            pinned = aliases if pinned is None else pinned & aliases
        return pinned

    @property
    def aliases(self) -> tuple[str, ...]:
        return get_shard_router().targets

    def _fan_out(self, aliases: Iterable[str] | None = None, plan: FanOut | None = None
                 ) -> list[Any]:
        """One queryset per alias (default: every alias serving shards), each kept to the
        logical shards the shard map gives its alias (:meth:`ShardRouter.fan_out`): a moved
        shard's rows stay on its source until the move's cleanup and must not be read there."""
        plan = plan if plan is not None else get_shard_router().fan_out()
        column = self._shard_column()
        querysets = []
        for alias in plan.targets if aliases is None else aliases:
            queryset = self.using(alias)
            shards = plan.keep.get(alias)
            if shards is not None and column is not None:
                # add_q, not filter(): a sliced queryset keeps its slice over the kept rows
                queryset.query.add_q(Q(In(F(column).bitand(plan.mask), list(shards))))
            querysets.append(queryset)
        return querysets

    def _shard_column(self) -> str | None:
        """The column whose low bits are the row's logical shard (the rule's first ID field);
        ``None`` for a model placed by a key's hash (no move moves it)."""
        rule = self._rule()
        return _attname(self.model, rule.id_fields[0]) if rule.id_fields else None

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """``get()`` on the shard its filters pin (or every shard); a miss routed by a
        map-following router checks the map once and, when it changed (a shard moved since the
        router last looked), looks again, so a stale router never misses an existing row."""
        if self._db is not None:
            return super().get(*args, **kwargs)
        try:
            return self._get_routed(*args, **kwargs)
        except self.model.DoesNotExist:
            if not get_shard_router().refresh_after_miss():
                raise
        return self._get_routed(*args, **kwargs)

    def _get_routed(self, *args: Any, **kwargs: Any) -> Any:
        plan = get_shard_router().fan_out()
        aliases = self._aliases_for(kwargs, plan.mapping)
        if aliases is not None and len(aliases) == 1:
            return self.using(aliases.pop()).get(*args, **kwargs)
        found = []
        chosen = sorted(aliases) if aliases is not None else None
        for queryset in self._fan_out(chosen, plan):
            found.extend(queryset.filter(*args, **kwargs)[:2])
        if not found:
            raise self.model.DoesNotExist(
                f"{self.model._meta.object_name} matching query does not exist on any shard."
            )
        if len(found) > 1:
            raise self.model.MultipleObjectsReturned(
                f"get() returned more than one {self.model._meta.object_name} across shards"
            )
        return found[0]

    def filter(self, *args: Any, **kwargs: Any) -> Any:
        clone = super().filter(*args, **kwargs)
        if clone._db is None:
            aliases = self._aliases_for(kwargs)
            if aliases is not None and len(aliases) == 1:
                clone = clone.using(aliases.pop())
        return clone

    def time_range(self, start: datetime | int, end: datetime | int) -> Any:
        """Rows whose IDs were issued from ``start`` to ``end``: a primary-key range."""
        low, high = get_shard_router().id_range(start, end)
        return self.filter(pk__gte=low, pk__lte=high)

    def across_shards(self) -> Iterator[Any]:
        """Iterate the query's rows on every shard alias, one after the other (each alias's
        rows kept to its logical shards in the shard map, see :meth:`_fan_out`)."""
        return itertools.chain.from_iterable(self._fan_out())

    def count_by_shard(self) -> dict[str, int]:
        """The query's row count on each alias serving shards (kept to its logical shards)."""
        return {queryset.db: queryset.count() for queryset in self._fan_out()}

    def create(self, **kwargs: Any) -> Any:
        instance = self.model(**kwargs)
        ensure_pk(instance)
        instance.save(force_insert=True, using=self._db or alias_for_instance(instance))
        return instance

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        objs = list(objs)
        for obj in objs:
            ensure_pk(obj)
        if self._db is not None:
            return super().bulk_create(objs, *args, **kwargs)
        groups: dict[str, list[Any]] = {}
        for obj in objs:
            groups.setdefault(alias_for_instance(obj), []).append(obj)
        for alias, group in groups.items():
            self.using(alias).bulk_create(group, *args, **kwargs)
        return objs

    def in_bulk(self, id_list: Iterable[Any] | None = None, **kwargs: Any) -> dict[Any, Any]:
        """By primary key: each ID read on its shard's alias only. Without IDs or by another
        field: every alias serving shards, each kept to its logical shards."""
        if self._db is not None:
            return super().in_bulk(id_list, **kwargs)
        result: dict[Any, Any] = {}
        plan = get_shard_router().fan_out()
        rule, pk = self._rule(), self.model._meta.pk
        routing_field = next((f for f in rule.fields if _attname(self.model, f) == pk.attname),
                             None)
        if (id_list is not None and routing_field is not None
                and kwargs.get("field_name", "pk") in ("pk", pk.name)):
            router = get_shard_router()
            groups: dict[str, list[Any]] = {}
            for value in id_list:
                key = pk.to_python(value)
                shard = rule.shard_of_field(router, routing_field, key)
                groups.setdefault(plan.mapping[shard], []).append(key)
            for alias, ids in groups.items():
                result.update(self.using(alias).in_bulk(ids, **kwargs))
            return result
        for queryset in self._fan_out(plan=plan):
            result.update(queryset.in_bulk(id_list, **kwargs))
        return result


ShardedManager = models.Manager.from_queryset(ShardedQuerySet)
ShardedManager.__doc__ = "The manager of sharded models (see :class:`ShardedQuerySet`)."


class ShardedModelMixin:
    """Gives a sharded model its shard-embedding primary key on ``save()``."""

    snowflake_shard_rule: ClassVar[ShardRule]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is None:  # type: ignore[attr-defined]
            ensure_pk(self)
        super().save(*args, **kwargs)  # type: ignore[misc]
