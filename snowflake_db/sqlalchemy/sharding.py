"""SQLAlchemy horizontal sharding driven by a :class:`ShardRouter`, and a table-per-shard helper.

:class:`ShardedRouting` builds the three choosers of ``sqlalchemy.ext.horizontal_shard``:

* ``shard_chooser`` (writes): the shard in the row's ID, or of its shard key.
* ``identity_chooser`` (``session.get``): the one shard of the primary key.
* ``execute_chooser`` (queries): the shards pinned by ``field == value`` / ``field IN (...)``
  on a routing field, combined through ``AND``/``OR``; anything else fans out to every shard.

New objects get their primary key in ``before_flush`` (embedding the shard of their shard key or
parent), because the shard must be known before SQLAlchemy picks a connection for the INSERT.
The routing itself (which shard an ID or key lives on) is :mod:`snowflake_db.sharding`.

With a router that follows the shard map in the control database
(``ShardRouter.from_control``), every chooser asks the router at the time of the statement, so
sessions route by the current map; :func:`run_transaction` runs a unit of work again when a
moving shard's fence refused it (:class:`~snowflake_db.errors.ShardMovedError`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

from sqlalchemy import Column, Delete, Insert, MetaData, Table, Update, and_, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import Mapper, ORMExecuteState, Session, sessionmaker
from sqlalchemy.orm.interfaces import MANYTOONE
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ClauseElement,
    Grouping,
)
from sqlalchemy.sql.selectable import Alias, Join, Select

from ..errors import ShardingError
from ..generator import SnowflakeGenerator
from ..sharding.moved import DEFAULT_ATTEMPTS, DEFAULT_TIMEOUT_SECONDS, retry_shard_moved
from ..sharding.routing import ShardKey, ShardRouter
from ..sharding.rules import ShardRule

__all__ = ["ShardedRouting", "TablePerShard", "run_transaction", "sharded_sessionmaker"]

_T = TypeVar("_T")
#: The execution option carrying a fan-out's per-target filters to :meth:`keep_own_shards`.
KEEP_OPTION = "snowflake_db_keep_shards"


def _table_name(table: Table | str | type) -> str:
    if isinstance(table, str):
        return table
    if isinstance(table, Table):
        return table.name
    mapper: Mapper[Any] = inspect(table)
    return str(mapper.local_table.name)  # type: ignore[attr-defined]


class ShardedRouting:
    """Choosers for ``ShardedSession`` from a router and per-table :class:`ShardRule` objects.

    ``rules`` maps a table name, ``Table`` or mapped class to its rule; tables without a rule
    are not sharded and live on ``unsharded_target`` (or fan out if it is ``None``).
    """

    def __init__(
        self,
        router: ShardRouter,
        rules: Mapping[Any, ShardRule],
        *,
        generator: SnowflakeGenerator | None = None,
        unsharded_target: str | None = None,
    ) -> None:
        self.router = router
        self.rules = {_table_name(table): rule.check(router) for table, rule in rules.items()}
        self.generator = generator
        self.unsharded_target = unsharded_target

    # -- helpers ---------------------------------------------------------------------------

    def _targets(self, shards: Iterable[int]) -> list[str]:
        return list(dict.fromkeys(self.router.target_of_shard(s) for s in sorted(shards)))

    def _rule_for_mapper(self, mapper: Mapper[Any]) -> ShardRule | None:
        return self.rules.get(str(mapper.local_table.name))  # type: ignore[attr-defined]

    def _all(self) -> list[str]:
        return list(self.router.targets)

    def _row_values(self, instance: Any, rule: ShardRule) -> dict[str, object]:
        """Routing field values of an instance, following many-to-one parents not flushed yet."""
        state = inspect(instance)
        mapper = state.mapper
        values: dict[str, object] = {}
        for field in rule.fields:
            value = state.dict.get(field)
            if value is None:
                value = self._from_parent(instance, mapper, field)
            values[field] = value
        return values

    def _from_parent(self, instance: Any, mapper: Mapper[Any], field: str) -> object:
        for relationship in mapper.relationships:
            if relationship.direction is not MANYTOONE:
                continue
            for local, remote in relationship.local_remote_pairs or ():
                if local.key != field:
                    continue
                parent = inspect(instance).dict.get(relationship.key)
                if parent is None:
                    return None
                self._ensure_pk(parent)
                return getattr(parent, str(remote.key), None)
        return None

    def _ensure_pk(self, instance: Any) -> None:
        state = inspect(instance)
        mapper = state.mapper
        rule = self._rule_for_mapper(mapper)
        if rule is None or len(mapper.primary_key) != 1:
            return
        pk_field = mapper.get_property_by_column(mapper.primary_key[0]).key
        if state.dict.get(pk_field) is not None:
            return
        values = self._row_values(instance, rule)
        setattr(instance, pk_field, rule.new_pk(self.router, pk_field, values, self.generator))

    # -- event and choosers ----------------------------------------------------------------

    def assign_ids(self, session: Session, flush_context: Any, instances: Any) -> None:
        """``before_flush``: give each new routed object its primary key (and so its shard)."""
        for instance in list(session.new):
            self._ensure_pk(instance)

    def shard_chooser(
        self, mapper: Mapper[Any] | None, instance: Any, clause: ClauseElement | None = None,
        **kw: Any,
    ) -> str:
        if mapper is None or instance is None:
            raise ShardingError(
                "no shard can be chosen without an object: pass "
                "bind_arguments={'shard_id': ...} or execution_options(_sa_shard_id=...)"
            )
        rule = self._rule_for_mapper(mapper)
        if rule is None:
            if self.unsharded_target is None:
                raise ShardingError(f"table {mapper.local_table} has no ShardRule")
            return self.unsharded_target
        shard = rule.shard_of(self.router, self._row_values(instance, rule))
        if shard is None:
            raise ShardingError(
                f"{instance!r} has none of its routing fields {rule.fields} set, so it has no shard"
            )
        return self.router.target_of_shard(shard)

    def identity_chooser(
        self, mapper: Mapper[Any], primary_key: Sequence[Any], *,
        lazy_loaded_from: Any = None, **kw: Any,
    ) -> list[str]:
        if lazy_loaded_from is not None and lazy_loaded_from.identity_token is not None:
            return [lazy_loaded_from.identity_token]
        rule = self._rule_for_mapper(mapper)
        if rule is None:
            return [self.unsharded_target] if self.unsharded_target else self._all()
        names = [mapper.get_property_by_column(c).key for c in mapper.primary_key]
        shard = rule.shard_of(self.router, dict(zip(names, primary_key, strict=True)))
        return self._all() if shard is None else self._targets([shard])

    def execute_chooser(self, context: ORMExecuteState) -> list[str]:
        if context.is_select and context.lazy_loaded_from is not None:
            token = context.lazy_loaded_from.identity_token
            if token is not None:
                return [str(token)]
        statement = context.statement
        if isinstance(statement, Insert):
            raise ShardingError(
                "a bulk INSERT cannot be split across shards: add the objects to the session, "
                "or pass bind_arguments={'shard_id': router.target_for_id(...)} per shard"
            )
        where = getattr(statement, "whereclause", None)
        parameters = context.parameters
        params = parameters if isinstance(parameters, Mapping) else {}
        shards = self._shards_of(where, params) if where is not None else None
        if shards is None and self._only_unsharded(statement) and self.unsharded_target:
            return [self.unsharded_target]
        plan = self.router.fan_out()  # one view of the map for the targets and their filters
        if shards is None:
            targets = list(plan.targets)
        else:  # contradictory filters: no row can match anywhere, ask one target
            targets = list(dict.fromkeys(plan.mapping[s] for s in sorted(shards)))
            targets = targets or list(plan.targets[:1])
        if plan.keep:
            context.update_execution_options(
                **{KEEP_OPTION: tuple((t, plan.keep[t], plan.mask) for t in targets
                                      if t in plan.keep)}
            )
        return targets

    def keep_own_shards(self, context: ORMExecuteState) -> Any:
        """``do_orm_execute``, after the fan-out has picked one target: restrict the sharded
        tables of the statement to the logical shards the map gives that target (see
        :meth:`~snowflake_db.sharding.ShardRouter.fan_out`), so a moved shard's rows left on
        its source until the cleanup are neither read twice nor updated there."""
        plan = context.execution_options.get(KEEP_OPTION)
        target = context.bind_arguments.get("shard_id")
        if not plan or target is None:
            return None
        for name, shards, mask in plan:
            if name == target:
                statement = self.restrict(context.statement, shards, mask)
                if statement is None:
                    return None
                return context.invoke_statement(statement=statement)
        return None

    def restrict(self, statement: Any, shards: Sequence[int], mask: int) -> Any:
        """``statement`` with ``(id & mask) IN shards`` on each sharded table it reads or
        changes (the first ID field of its rule; tables routed by a key hash are left alone:
        no move moves them), or ``None`` when it has none. Tables on the optional side of an
        outer join are not filtered: their rows follow the rows they join."""
        if isinstance(statement, Select):
            tables: list[Any] = []
            for from_ in statement.get_final_froms():
                self._filtered_froms(from_, tables)
        elif isinstance(statement, Update | Delete):
            tables = [statement.table]
        else:
            return None
        criteria = []
        for table in tables:
            column = self._shard_column(table)
            if column is not None:
                criteria.append(column.bitwise_and(mask).in_(list(shards)))
        if not criteria:
            return None
        return statement.where(*criteria)

    def _filtered_froms(self, from_: Any, found: list[Any]) -> None:
        if isinstance(from_, Join):
            if not from_.full:
                self._filtered_froms(from_.left, found)
                if not from_.isouter:
                    self._filtered_froms(from_.right, found)
            return
        found.append(from_)

    def _shard_column(self, from_: Any) -> Any:
        table = from_.element if isinstance(from_, Alias) else from_
        if not isinstance(table, Table):
            return None
        rule = self.rules.get(table.name)
        if rule is None:
            return None
        for field in rule.id_fields:
            if field in from_.c:
                return from_.c[field]
        return None

    def _only_unsharded(self, statement: Any) -> bool:
        tables = getattr(statement, "get_final_froms", None)
        if not isinstance(statement, Select) or tables is None:
            return False
        names = {getattr(t, "name", None) for t in statement.get_final_froms()}
        return not names & set(self.rules)

    def _shards_of(
        self, clause: ClauseElement, params: Mapping[str, Any] | None = None
    ) -> set[int] | None:
        """Shards a WHERE clause confines rows to; ``None`` when it does not confine them."""
        if isinstance(clause, Grouping):
            return self._shards_of(clause.element, params)  # type: ignore[arg-type]
        if isinstance(clause, BooleanClauseList):
            parts = [self._shards_of(c, params) for c in clause.clauses]
            if clause.operator is operators.and_:
                known = [p for p in parts if p is not None]
                if not known:
                    return None
                result = set(known[0])
                for part in known[1:]:
                    result &= part
                return result
            if clause.operator is operators.or_:
                if any(p is None for p in parts):
                    return None
                return set().union(*parts)  # type: ignore[arg-type]
            return None
        if isinstance(clause, BinaryExpression):
            return self._shards_of_comparison(clause, params or {})
        return None

    def _shards_of_comparison(
        self, clause: BinaryExpression[Any], params: Mapping[str, Any]
    ) -> set[int] | None:
        column, bind = clause.left, clause.right
        if isinstance(column, BindParameter) and isinstance(bind, Column):
            column, bind = bind, column
        if not isinstance(column, Column) or not isinstance(bind, BindParameter):
            return None
        table = getattr(column.table, "name", None)
        rule = self.rules.get(str(table)) if isinstance(column.table, Table) else None
        if rule is None or column.key not in rule.fields:
            return None
        # session.get() passes the key as an execution parameter, not a bound value.
        value = params.get(bind.key) if bind.key in params else bind.effective_value
        if value is None:
            return None
        if clause.operator is operators.eq:
            return {rule.shard_of_field(self.router, column.key, value)}
        if clause.operator is operators.in_op and isinstance(value, list | tuple):
            return {rule.shard_of_field(self.router, column.key, v) for v in value}
        return None

    def session_kwargs(self) -> dict[str, Any]:
        return {
            "shard_chooser": self.shard_chooser,
            "identity_chooser": self.identity_chooser,
            "execute_chooser": self.execute_chooser,
        }


def sharded_sessionmaker(
    routing: ShardedRouting,
    engines: Mapping[str, Engine],
    **session_options: Any,
) -> sessionmaker[ShardedSession]:
    """A ``sessionmaker`` of ``ShardedSession`` bound to one engine per router target.

    IDs are assigned in ``before_flush`` on every session it makes. Every target of the router
    (and the unsharded target) needs an engine; for a router following the control database's
    map, every target registered in the map (a move can put a shard on any of them).
    """
    router = routing.router
    needed = set(getattr(router, "known_targets", router.targets))
    if routing.unsharded_target:
        needed.add(routing.unsharded_target)
    missing = sorted(needed - set(engines))
    if missing:
        raise ShardingError(f"no engine for shard target(s) {missing}; got {sorted(engines)}")
    factory = sessionmaker(
        class_=_MapFollowingSession, shards=dict(engines), routing=routing,
        **routing.session_kwargs(), **session_options,
    )
    from sqlalchemy import event

    event.listen(factory, "before_flush", routing.assign_ids)
    return factory


class _MapFollowingSession(ShardedSession):
    """A ``ShardedSession`` whose fan-outs keep each target's rows to the logical shards the
    shard map gives it. The listener is the session's own, added after ``ShardedSession``'s:
    it runs once per target, inside the fan-out (``invoke_statement`` runs later listeners)."""

    def __init__(self, *args: Any, routing: ShardedRouting, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from sqlalchemy import event

        self._snowflake_routing = routing
        event.listen(self, "do_orm_execute", routing.keep_own_shards, retval=True)

    def get(self, entity: Any, ident: Any, **kwargs: Any) -> Any:
        """``Session.get``; a miss routed by a map-following router checks the map once and,
        when it changed (a shard moved since the router last looked), looks again: a router
        that has not refreshed since a move's cleanup never misses an existing row."""
        found = super().get(entity, ident, **kwargs)
        if (found is None and kwargs.get("identity_token") is None
                and self._snowflake_routing.router.refresh_after_miss()):
            found = super().get(entity, ident, **kwargs)
        return found


def run_transaction(
    session_factory: Callable[[], Session],
    work: Callable[[Session], _T],
    *,
    router: ShardRouter | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    timeout_s: float = DEFAULT_TIMEOUT_SECONDS,
) -> _T:
    """Run ``work(session)`` in a new session's transaction, again if a moving shard's fence
    refused it.

    Each attempt opens a session from ``session_factory`` (a :func:`sharded_sessionmaker`),
    begins, runs ``work`` and commits; a refusal (SQLSTATE ``SFM01``, seen through SQLAlchemy's
    ``DBAPIError``) rolls it back, refreshes ``router`` (when it follows the control database's
    map) and tries again, within ``attempts`` and ``timeout_s``
    (:func:`snowflake_db.sharding.moved.retry_shard_moved`). ``work`` must be safe to run again:
    build the objects inside it, not before. Before the commit the session is flushed and the
    shards it routed are confirmed (:meth:`~snowflake_db.sharding.RoutedShards.confirm`, on
    ``router`` or else the session's routing's): one that moved meanwhile rolls the attempt
    back and runs it again, so an ``UPDATE`` or ``DELETE`` that reached the old target after
    the move deleted its rows there is not lost with 0 rows.
    """

    def attempt() -> _T:
        with session_factory() as session:
            chosen = router if router is not None else _router_of(session)
            recording = chosen.recording_routes() if chosen is not None else nullcontext()
            with recording as routes, session.begin():
                result = work(session)
                session.flush()
                if routes is not None:
                    routes.confirm()
            return result

    refresh = getattr(router, "refresh", None) if router is not None else None
    return retry_shard_moved(attempt, refresh=refresh, attempts=attempts, timeout_s=timeout_s)


def _router_of(session: Session) -> ShardRouter | None:
    """The router a :func:`sharded_sessionmaker` session routes with (another session routes
    nothing through a shard map: nothing to confirm)."""
    routing = getattr(session, "_snowflake_routing", None)
    return routing.router if routing is not None else None


class TablePerShard:
    """One copy of ``table`` per logical shard in one database: ``orders_00`` .. ``orders_15``.

    Rows go to the table of their shard (from the ID or the shard key, as ``rule`` says); an ID
    lookup reads one table; a time window is an ID range on each table.
    """

    def __init__(
        self,
        table: Table,
        router: ShardRouter,
        *,
        rule: ShardRule | None = None,
        metadata: MetaData | None = None,
        name_format: str = "{name}_{shard:02d}",
        generator: SnowflakeGenerator | None = None,
    ) -> None:
        self.router = router
        primary = list(table.primary_key.columns)
        if len(primary) != 1:
            raise ShardingError(f"table {table.name} needs a single-column primary key")
        self.pk = primary[0].key
        self.rule = (rule or ShardRule(id_fields=(self.pk,))).check(router)
        self.generator = generator
        self.metadata = metadata if metadata is not None else MetaData()
        self.tables: dict[int, Table] = {
            shard: table.to_metadata(
                self.metadata, name=name_format.format(name=table.name, shard=shard)
            )
            for shard in range(router.logical_shards)
        }

    def table_for_id(self, snowflake_id: int) -> Table:
        return self.tables[self.router.shard_of_id(snowflake_id)]

    def table_for_key(self, key: ShardKey) -> Table:
        return self.tables[self.router.shard_for_key(key)]

    def create_all(self, bind: Connection | Engine) -> None:
        self.metadata.create_all(bind, tables=list(self.tables.values()))

    def drop_all(self, bind: Connection | Engine) -> None:
        self.metadata.drop_all(bind, tables=list(self.tables.values()))

    def insert(self, connection: Connection, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Insert rows into their shards' tables (one executemany per table); return the IDs."""
        by_shard: dict[int, list[dict[str, Any]]] = {}
        ids: list[int] = []
        for row in rows:
            values = dict(row)
            if values.get(self.pk) is None:
                values[self.pk] = self.rule.new_pk(self.router, self.pk, values, self.generator)
            shard = self.rule.shard_of(self.router, values)
            assert shard is not None
            by_shard.setdefault(shard, []).append(values)
            ids.append(values[self.pk])
        for shard, batch in by_shard.items():
            connection.execute(self.tables[shard].insert(), batch)
        return ids

    def get(self, connection: Connection, snowflake_id: int) -> Any:
        """The row with this ID, read from its one table (``None`` if absent)."""
        table = self.table_for_id(snowflake_id)
        return connection.execute(select(table).where(table.c[self.pk] == snowflake_id)).first()

    def select_time_range(self, start: Any, end: Any) -> list[Select[Any]]:
        """One ``SELECT ... WHERE pk BETWEEN low AND high`` per table for the time window."""
        low, high = self.router.id_range(start, end)
        return [
            select(t).where(and_(t.c[self.pk] >= low, t.c[self.pk] <= high))
            for t in self.tables.values()
        ]
