"""The PostgreSQL steps of an online move of one logical shard from a source to a target.

Each method is one step of ``docs/design/shard-moves.md``: idempotent, and finding its objects
by name (``sfdb_move_<move id>`` for the publication, slot and subscription,
``sfdb_fence_<move id>_{w,d,t}`` for the fence triggers), so that any step can run again after
the mover died, and :meth:`PostgresMoveBackend.cleanup` removes whatever a run left. Which
step runs when, the journal and the shard map belong to the orchestration, not here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ...errors import (
    FenceBlockedError,
    InvalidArgumentError,
    MissingExtraError,
    ShardMoveError,
    VerificationMismatchError,
)

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg.pq import TransactionStatus
except ImportError as error:  # pragma: no cover - the postgres extra is missing
    raise MissingExtraError(__name__, package="psycopg", extra="postgres") from error

from ...layout import Layout
from ._connections import CONNECT_TIMEOUT_S, Connector, Endpoint
from ._results import (
    Blocker,
    CleanupReport,
    CopyProgress,
    FenceResult,
    Leftovers,
    MovedTable,
    TableChecksum,
    Verification,
    check_move_arguments,
)

#: SQLSTATE of a write refused by a fence (the library maps it to ShardMovedError).
FENCE_SQLSTATE = "SFM01"
#: The trigger function every fence trigger calls; its arguments are shard, target, move.
FENCE_FUNCTION = "sfdb_fence_refuse"
#: A session setting equal to the shard number lets the mover's own deletes pass the fence.
#: The fence guards against stale routing, not against a user who means to bypass it.
FENCE_BYPASS_SETTING = "sfdb.fence_bypass"
#: The fence's three triggers: INSERT or UPDATE, DELETE, TRUNCATE.
FENCE_SUFFIXES = ("w", "d", "t")
#: Slots and senders a move needs free on the source: its slot and one table copy's.
NEEDED_SLOTS = 2
NEEDED_SENDERS = 2
NEEDED_WORKERS = 2

_FENCE_BODY = f"""
BEGIN
    IF current_setting('{FENCE_BYPASS_SETTING}', true) = TG_ARGV[0] THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = '{FENCE_SQLSTATE}',
        MESSAGE = format('shard %s of %s moved to %s', TG_ARGV[0], TG_TABLE_NAME, TG_ARGV[1]),
        DETAIL = format('shard=%s target=%s move=%s', TG_ARGV[0], TG_ARGV[1], TG_ARGV[2]),
        HINT = 'reload the shard map and retry the transaction';
END
"""
#: The function of the two-pass verification's change-tracking triggers; its arguments are
#: the change log (qualified), the moved table's name and its ID column.
TRACK_FUNCTION = "sfdb_track_change"
#: The change tracking's four triggers: INSERT, UPDATE, DELETE (rows), TRUNCATE (statement).
TRACK_SUFFIXES = ("i", "u", "d", "t")
#: The change log's row saying the first pass (before the fence) found both sides equal.
PASS1_MARK = "*pass1"

_TRACK_BODY = """
DECLARE
    changed bigint;
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN  -- TRUNCATE: every row changed
        EXECUTE format('INSERT INTO %s (tbl, id) VALUES ($1, NULL)', TG_ARGV[0])
            USING TG_ARGV[1];
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        EXECUTE format('SELECT ($1).%I', TG_ARGV[2]) INTO changed USING OLD;
        EXECUTE format('INSERT INTO %s (tbl, id) VALUES ($1, $2)', TG_ARGV[0])
            USING TG_ARGV[1], changed;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        EXECUTE format('SELECT ($1).%I', TG_ARGV[2]) INTO changed USING NEW;
        EXECUTE format('INSERT INTO %s (tbl, id) VALUES ($1, $2)', TG_ARGV[0])
            USING TG_ARGV[1], changed;
    END IF;
    RETURN NULL;
END
"""
_SYNC_SLOT = re.compile(r"^pg_(\d+)_sync_(\d+)_(\d+)$")
# Lock modes a session keeps while it writes a table; CREATE TRIGGER (SHARE ROW EXCLUSIVE)
# waits for each of them, DROP TRIGGER (ACCESS EXCLUSIVE) also for readers.
_WRITE_LOCKS = ("RowExclusiveLock", "ShareUpdateExclusiveLock", "ShareLock",
                "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")
_ANY_LOCKS = ("AccessShareLock", "RowShareLock", *_WRITE_LOCKS)
_CHECKSUM_SETTINGS = (
    ("TimeZone", "UTC"), ("DateStyle", "ISO, YMD"), ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"), ("bytea_output", "hex"),
)

_IDLE = TransactionStatus.IDLE
#: One round trip that makes a server's WAL durable up to now (see ``flush``).
#: Only when some WAL is not flushed yet: otherwise nothing is written. A transaction that
#: only took an XID commits without flushing (it wrote no WAL before its commit record), so
#: it writes a transactional logical message (prefix ``sfdb_flush``; pgoutput passes messages
#: on only to subscribers that ask for them, which a subscription does not).
_FLUSH_WAL = ("BEGIN; SET LOCAL synchronous_commit = local; DO $flush$ BEGIN "
              "IF pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn() THEN "
              "PERFORM pg_logical_emit_message(true, 'sfdb_flush', ''); END IF; END $flush$; "
              "COMMIT")
#: The position a drain waits for: the end of the WAL inserted so far, so every commit before
#: (the writes the fence waited out, the fence's own) lies below it. Not
#: ``pg_current_wal_lsn()``: that is where WAL has been *written* to, which lags the commits of
#: asynchronous transactions (``synchronous_commit = off``) by up to ``wal_writer_delay``; a
#: drain to it could end before such a commit is even decoded.
_INSERT_LSN = "SELECT pg_current_wal_insert_lsn()::text"
#: The settings that shape ``row::text``, pinned in one round trip (no parameters: several
#: statements in one query).
_PIN_SETTINGS = sql.SQL("; ").join(
    sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(name), sql.Literal(value))
    for name, value in _CHECKSUM_SETTINGS)


@dataclass(frozen=True)
class _TargetFacts:
    """What tells the move's table-copy slots apart on the source: the target's system ID,
    its tables' OIDs and the subscriptions that exist there."""

    system_identifier: int
    relids: frozenset[int]
    subscriptions: frozenset[int]
    our_subscription: int | None


class PostgresMoveBackend:
    """The steps of move ``move_id`` of logical shard ``shard`` from ``source`` to ``target``.

    ``source`` and ``target`` are connection strings, SQLAlchemy engines (psycopg driver) or
    psycopg connections, used by the mover; ``source_conninfo_for_target`` is the connection
    string the target's subscription uses to reach the source (its ``CONNECTION``; prefer a
    password file on the target to a password in it: PostgreSQL shows the statement in
    ``pg_stat_activity`` and logs it if it fails). ``target_name`` is the shard map's name of
    the target, written into the fence's error for the application. List ``tables`` parents
    first: rows are deleted in the reverse order, so foreign keys between them hold.

    A :class:`~snowflake_db.sharding.moves.MoveBackend`: the target's subscription copies
    and streams on its own (:meth:`advance` does nothing), the backlog is WAL bytes.
    """

    kind: str = "postgresql"
    backlog_unit: str = "bytes"

    def __init__(
        self,
        *,
        source: Endpoint,
        target: Endpoint,
        source_conninfo_for_target: str,
        layout: Layout,
        shard: int,
        move_id: int,
        target_name: str,
        tables: Sequence[MovedTable | str],
        lock_timeout_ms: int = 100,
        fence_attempts: int = 50,
        retry_pause_s: float = 0.05,
        slot_timeout_s: float = 30.0,
    ) -> None:
        self.tables = check_move_arguments(
            move_id=move_id, target_name=target_name, tables=tables,
            at_least_one={"lock_timeout_ms": lock_timeout_ms, "fence_attempts": fence_attempts})
        self.layout = layout
        self.shard = shard
        self.move_id = move_id
        self.target_name = target_name
        self.lock_timeout_ms = lock_timeout_ms
        self.fence_attempts = fence_attempts
        self.retry_pause_s = retry_pause_s
        self.slot_timeout_s = slot_timeout_s
        self.name = f"sfdb_move_{move_id}"
        self._source = Connector(source, "source")
        self._target = Connector(target, "target")
        try:
            parts = conninfo_to_dict(source_conninfo_for_target)
        except psycopg.ProgrammingError as error:  # the message quotes no part of the string
            raise InvalidArgumentError(
                "source_conninfo_for_target is not a libpq connection string or URI"
            ) from error
        # A subscription to a source that does not answer must fail, not hang (DROP too).
        self._subscription_conninfo = (
            source_conninfo_for_target if "connect_timeout" in parts
            else make_conninfo(source_conninfo_for_target, connect_timeout=CONNECT_TIMEOUT_S)
        )
        self._suboid: int | None = None

    @contextmanager
    def held(self, *, source: bool = True, target: bool = True) -> Iterator[None]:
        """Keep one session open on each side (``source``, ``target``) for every step run
        inside: the cutover's steps and the polls of a wait then pay no connection set-up
        (a new server process) per call."""
        with self._source.held() if source else _nothing(), \
                self._target.held() if target else _nothing():
            yield

    # -- names and SQL pieces -----------------------------------------------------------------

    @property
    def mask(self) -> int:
        return self.layout.max_shard

    def trigger_names(self) -> list[str]:
        return [f"sfdb_fence_{self.move_id}_{suffix}" for suffix in FENCE_SUFFIXES]

    @staticmethod
    def _table(table: MovedTable) -> sql.Identifier:
        return sql.Identifier(*table.name.split("."))

    def _shard_filter(self, table: MovedTable, row: str | None = None) -> sql.Composed:
        """``(("id" & 15) = 5)``, of ``row``'s column (``NEW``/``OLD``) when given."""
        column = (sql.Identifier(row, table.id_column) if row else sql.Identifier(table.id_column))
        return sql.SQL("(({} & {}) = {})").format(
            column, sql.SQL(str(self.mask)), sql.SQL(str(self.shard)))

    def _has_shard_rows(self, conn: psycopg.Connection[Any], table: MovedTable) -> bool:
        query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {})").format(
            self._table(table), self._shard_filter(table))
        return bool(_one(conn, query))

    def _regclass(self, conn: psycopg.Connection[Any], table: MovedTable) -> int | None:
        quoted = ".".join(f'"{part}"' for part in table.name.split("."))
        oid = _one(conn, "SELECT to_regclass(%s)::oid", (quoted,))
        return None if oid is None else int(oid)

    @staticmethod
    def _columns(conn: psycopg.Connection[Any], oid: int) -> list[tuple[str, str]]:
        rows = conn.execute(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)
        ).fetchall()
        return [(str(name), str(kind)) for name, kind in rows]

    # -- check -------------------------------------------------------------------------------

    def check(self) -> None:
        """Every pre-check of a move; the first failure is a :class:`ShardMoveError` naming the
        check and the fix. Reads only: nothing is created on either server."""
        if self.layout.shard_bits == 0:
            raise ShardMoveError(
                "check 'layout': the layout has no shard bits (shard_bits=0), so a shard is not "
                "id & mask and cannot be moved by its rows' IDs; moves need Layout(shard_bits>0)"
            )
        if isinstance(self.shard, bool) or not isinstance(self.shard, int) or not (
            0 <= self.shard <= self.mask
        ):
            raise ShardMoveError(
                f"check 'shard': shard {self.shard!r} is not a logical shard of this layout "
                f"(0..{self.mask}, {self.layout.shard_bits} shard bits)"
            )
        with self._source.session() as s:
            self._check_source_settings(s)
            source_columns = {t.name: self._check_source_table(s, t) for t in self.tables}
        with self._target.session() as t:
            self._check_target(t, source_columns)

    def _check_source_settings(self, s: psycopg.Connection[Any]) -> None:
        where = f"on the source {self._source.description}"
        wal_level = _one(s, "SELECT current_setting('wal_level')")
        if wal_level != "logical":
            raise ShardMoveError(
                f"check 'wal_level': wal_level is {wal_level!r} {where}; a move needs "
                "wal_level = logical in its postgresql.conf (ALTER SYSTEM SET wal_level = "
                "logical), which takes a restart of the source"
            )
        free_slots = _one(s, """SELECT current_setting('max_replication_slots')::int
            - (SELECT count(*) FROM pg_replication_slots WHERE slot_name <> %s)""", (self.name,))
        if free_slots < NEEDED_SLOTS:
            raise ShardMoveError(
                f"check 'replication slots': {free_slots} free replication slot(s) {where}, a "
                f"move needs {NEEDED_SLOTS} (its own and one table copy's); raise "
                "max_replication_slots (takes a restart) or drop unused slots "
                "(pg_replication_slots)"
            )
        free_senders = _one(s, """SELECT current_setting('max_wal_senders')::int
            - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')""")
        if free_senders < NEEDED_SENDERS:
            raise ShardMoveError(
                f"check 'wal senders': {free_senders} free WAL sender(s) {where}, a move needs "
                f"{NEEDED_SENDERS} (its stream and one table copy); raise max_wal_senders "
                "(takes a restart) or end idle replication connections (pg_stat_replication)"
            )

    def _check_source_table(self, s: psycopg.Connection[Any], table: MovedTable
                            ) -> list[tuple[str, str]]:
        where = f"on the source {self._source.description}"
        oid = self._regclass(s, table)
        if oid is None:
            raise ShardMoveError(f"check 'tables': table {table.name} does not exist {where}")
        relkind = _one(s, "SELECT relkind FROM pg_class WHERE oid = %s", (oid,))
        if relkind != "r":
            raise ShardMoveError(
                f"check 'tables': {table.name} {where} is not a plain table (relkind "
                f"{relkind!r}); moving partitioned tables is not supported yet"
            )
        columns = self._columns(s, oid)
        kinds = dict(columns)
        if kinds.get(table.id_column) != "bigint":
            raise ShardMoveError(
                f"check 'id column': {table.name}.{table.id_column} {where} is "
                f"{kinds.get(table.id_column, 'missing')}, not the bigint Snowflake ID the shard "
                "bits are read from; pass MovedTable(name, id_column=...)"
            )
        identity, covered = s.execute(
            """SELECT c.relreplident::text, coalesce((
                   SELECT bool_or(a.attname = %s) FROM pg_index i
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                   WHERE i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary)
                         OR (c.relreplident = 'i' AND i.indisreplident))), false)
               FROM pg_class c WHERE c.oid = %s""", (table.id_column, oid)).fetchone() or ("", 0)
        if identity != "f" and not covered:
            raise ShardMoveError(
                f"check 'replica identity': the replica identity of {table.name} {where} "
                f"(relreplident {identity!r}) does not cover {table.id_column}: the move's row "
                f"filter on {table.id_column} would make every UPDATE and DELETE of the table "
                f"fail on the source (42P10); give it a primary key on {table.id_column} or "
                "ALTER TABLE ... REPLICA IDENTITY USING INDEX (a unique index with "
                f"{table.id_column}) or REPLICA IDENTITY FULL"
            )
        return columns

    def _check_target(self, t: psycopg.Connection[Any],
                      source_columns: dict[str, list[tuple[str, str]]]) -> None:
        where = f"on the target {self._target.description}"
        free_workers = _one(t, """SELECT current_setting('max_logical_replication_workers')::int
            - (SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL)""")
        if free_workers < NEEDED_WORKERS:
            raise ShardMoveError(
                f"check 'logical replication workers': {free_workers} free {where}, a move "
                f"needs {NEEDED_WORKERS} (apply and one table copy); raise "
                "max_logical_replication_workers (takes a restart)"
            )
        for table in self.tables:
            oid = self._regclass(t, table)
            if oid is None:
                raise ShardMoveError(
                    f"check 'tables': table {table.name} does not exist {where}; create it with "
                    "the application's migrations first"
                )
            columns = self._columns(t, oid)
            if columns != source_columns[table.name]:
                raise ShardMoveError(
                    f"check 'columns': {table.name} differs between source and target (names, "
                    f"types and order must match): source {source_columns[table.name]}, target "
                    f"{columns}; run the same migrations on both"
                )
            if self._has_shard_rows(t, table):
                raise ShardMoveError(
                    f"check 'target rows': {table.name} {where} already has rows of shard "
                    f"{self.shard} ({table.id_column} & {self.mask} = {self.shard}); delete them "
                    "(an aborted move's copy?) before moving the shard there"
                )

    # -- capture and copy --------------------------------------------------------------------

    def capture(self) -> dict[str, Any]:
        """Source: the publication of the shard's rows of every table, then the slot; their
        names (for the journal).

        The publication must exist first: pgoutput reads it through the slot's snapshot, so a
        slot created before it fails with "publication does not exist" (measured).
        """
        with self._source.session() as s:
            has_publication = _exists(s, "SELECT 1 FROM pg_publication WHERE pubname = %s",
                                      self.name)
            has_slot = self._slot_exists(s)
            if not has_publication:
                if has_slot:
                    raise ShardMoveError(
                        f"capture: slot {self.name} exists on the source without its "
                        "publication (made before it, it cannot decode the publication); run "
                        "cleanup, then capture again"
                    )
                entries = sql.SQL(", ").join(
                    sql.SQL("TABLE {} WHERE {}").format(self._table(t), self._shard_filter(t))
                    for t in self.tables
                )
                s.execute(sql.SQL("CREATE PUBLICATION {} FOR {}").format(
                    sql.Identifier(self.name), entries))
            if not has_slot:
                self._create_slot(s)
        return {"publication": self.name, "slot": self.name}

    def _slot_exists(self, s: psycopg.Connection[Any]) -> bool:
        return _exists(s, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", self.name)

    def _create_slot(self, s: psycopg.Connection[Any]) -> None:
        """The slot waits for running write transactions (a consistent start); bounded."""
        try:
            with s.transaction():
                s.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(
                    sql.Literal(f"{int(self.slot_timeout_s * 1000)}ms")))
                s.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                          (self.name,))
        except psycopg.errors.QueryCanceled as error:
            old = s.execute(
                """SELECT pid, round(extract(epoch FROM now() - xact_start)::numeric, 1)
                   FROM pg_stat_activity WHERE backend_xid IS NOT NULL
                   AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 5""").fetchall()
            raise ShardMoveError(
                f"capture: slot {self.name} not created in {self.slot_timeout_s} s: it waits "
                "for every write transaction running on the source to end; oldest (pid, "
                f"seconds): {old}"
            ) from error

    def copy(self) -> dict[str, Any]:
        """Target: the subscription (the mover's slot, ``copy_data = true``); returns its name
        and OID (journal them: the table-copy slots on the source are named after the OID)."""
        with self._source.session() as s:
            if not self._slot_exists(s):
                raise ShardMoveError(f"copy: slot {self.name} does not exist on the source; "
                                     "run capture first")
        with self._target.session() as t:
            suboid = self._subscription_oid(t)
            if suboid is None:
                statement = sql.SQL(
                    "CREATE SUBSCRIPTION {name} CONNECTION {conninfo} PUBLICATION {name} WITH "
                    "(create_slot = false, slot_name = {slot}, copy_data = true)"
                ).format(name=sql.Identifier(self.name),
                         conninfo=sql.Literal(self._subscription_conninfo),
                         slot=sql.Literal(self.name))
                try:
                    # Durable before the journal says so: on a target running
                    # synchronous_commit = off a crash loses commits acknowledged a moment
                    # before, and a resume then found no subscription.
                    with t.transaction():
                        t.execute("SET LOCAL synchronous_commit = local")
                        t.execute(statement)
                except psycopg.Error as error:
                    raise ShardMoveError(
                        f"copy: CREATE SUBSCRIPTION {self.name} on the target "
                        f"{self._target.description} failed ({error.sqlstate}): "
                        f"{error.diag.message_primary}"
                    ) from error
                suboid = self._subscription_oid(t)
            assert suboid is not None
            self._suboid = suboid
            return {"subscription": self.name, "subscription_oid": suboid}

    def advance(self) -> int:
        """Nothing (0): the subscription's workers on the target copy and apply on their own."""
        return 0

    def _subscription_oid(self, t: psycopg.Connection[Any]) -> int | None:
        suboid: int | None = _one(
            t, """SELECT oid::bigint FROM pg_subscription WHERE subname = %s
                  AND subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())""",
            (self.name,))
        if suboid is not None:
            self._suboid = suboid
        return suboid

    def copy_lost(self, *, finished: bool = True) -> str | None:
        """Target: once :meth:`copy` began, whether the subscription is gone (the target
        restored from a backup taken before the copy, or a hand's ``DROP SUBSCRIPTION``): the
        stream cannot go on, and its slot on the source (if left) is consumed by nobody.
        ``finished=False`` (the step did not journal its end): lost only if the target holds
        rows of the shard, which a subscription lost midway copied (a new one would copy
        them into the same keys); none, and the step just makes its subscription."""
        with self._target.session() as t:
            if self._subscription_oid(t) is not None:
                return None
            copied = [table.name for table in self.tables if self._has_shard_rows(t, table)]
        lost = f"no subscription {self.name} on the target {self._target.description}"
        if finished:
            return lost
        if not copied:
            return None
        return (f"{lost}, and rows of shard {self.shard} in {', '.join(copied)} there, copied "
                "by a subscription lost before the copy step finished")

    def copy_stranded(self) -> str | None:
        """Target and source: the tables whose copy finished (``f``) and whose table-sync
        slot is gone from the source. PostgreSQL drops that slot before it commits the table's
        next state: a source that crashes between the two has dropped it, the target's state
        stays ``f``, and the table's worker asks for the slot for ever ("does not exist")."""
        with self._target.session() as t:
            finished = t.execute(
                """SELECT r.srrelid::bigint, s.oid::bigint FROM pg_subscription_rel r
                   JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = %s
                   AND s.subdbid = (SELECT oid FROM pg_database
                                    WHERE datname = current_database())
                   AND r.srsubstate = 'f'""", (self.name,)).fetchall()
            if not finished:
                return None
            system: int = _one(t, "SELECT system_identifier FROM pg_control_system()")
            names = {self._regclass(t, table): table.name for table in self.tables}
        system %= 2**64  # shown as a signed bigint; the slot's name has it unsigned
        slots = {f"pg_{suboid}_sync_{relid}_{system}": names.get(relid, str(relid))
                 for relid, suboid in finished}
        with self._source.session() as s:
            present = {row[0] for row in s.execute(
                "SELECT slot_name::text FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                (list(slots),)).fetchall()}
        gone = sorted((table, slot) for slot, table in slots.items() if slot not in present)
        if not gone:
            return None
        return "; ".join(
            f"the copy of {table} ended on the target {self._target.description} but its "
            f"table-sync slot {slot} is gone from the source {self._source.description} (a "
            "crash of the source as the copy ended): PostgreSQL cannot finish that table"
            for table, slot in gone)

    def copy_progress(self) -> CopyProgress:
        """Target: each table's subscription state; ``synced`` once every one is ready."""
        with self._target.session() as t:
            if self._subscription_oid(t) is None:
                raise ShardMoveError(f"copy_progress: no subscription {self.name} on the target")
            names = {self._regclass(t, table): table.name for table in self.tables}
            rows = t.execute(
                """SELECT r.srrelid::bigint, r.srsubstate::text FROM pg_subscription_rel r
                   JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = %s
                   AND s.subdbid = (SELECT oid FROM pg_database
                                    WHERE datname = current_database())""",
                (self.name,)).fetchall()
        return CopyProgress({names.get(relid, str(relid)): state for relid, state in rows},
                            len(self.tables))

    def copy_synced(self) -> bool:
        """Target: whether every table's copy is done (all ``r``): one query, for polling."""
        with self._target.session() as t:
            row = t.execute(
                """SELECT s.oid, count(r.srrelid), count(r.srrelid) FILTER
                          (WHERE r.srsubstate = 'r')
                   FROM pg_subscription s LEFT JOIN pg_subscription_rel r ON r.srsubid = s.oid
                   WHERE s.subname = %s AND s.subdbid = (SELECT oid FROM pg_database
                                                         WHERE datname = current_database())
                   GROUP BY s.oid""", (self.name,)).fetchone()
        if row is None:
            raise ShardMoveError(f"copy_synced: no subscription {self.name} on the target")
        return int(row[1]) == len(self.tables) and int(row[2]) == int(row[1])

    def backlog(self) -> int | None:
        """Source: the lag, bytes of WAL the target has not confirmed (``None`` until it
        first did)."""
        with self._source.session() as s:
            if not self._slot_exists(s):
                raise ShardMoveError(f"backlog: slot {self.name} does not exist on the source")
            lag: int | None = _one(
                s, """SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
                      FROM pg_replication_slots WHERE slot_name = %s""", (self.name,))
            return lag

    # -- fence, drain ------------------------------------------------------------------------

    def fence(self, *, terminate_blockers: bool = False) -> FenceResult:
        """Source: the fence triggers on every table, in one transaction under
        ``lock_timeout``, retried up to ``fence_attempts`` times.

        ``CREATE TRIGGER`` waits for every transaction that wrote a table, so a write of the
        shard either commits before the fence LSN (and is streamed) or meets the fence. When
        the budget is spent, the sessions holding locks are reported
        (:class:`FenceBlockedError`), or with ``terminate_blockers`` ended (their
        transactions roll back: nothing acknowledged is lost) and the budget tried once more.
        """
        with self._source.session() as s:
            oids = self._source_oids(s, "fence")
            self._ensure_fence_function(s)
            if self._fence_complete(s, oids):
                return FenceResult(position=_one(s, _INSERT_LSN), attempts=0)
            statements = [self._trigger_sql(table) for table in self.tables]
            terminated: tuple[int, ...] = ()
            attempts = 0
            for round_ in range(2 if terminate_blockers else 1):
                taken, tried = self._under_lock_timeout(s, [q for qs in statements for q in qs])
                attempts += tried
                if taken:
                    lsn = _one(s, _INSERT_LSN)
                    return FenceResult(position=lsn, attempts=attempts, terminated=terminated)
                blockers = self._blockers(s, oids, _WRITE_LOCKS)
                if round_ == 0 and terminate_blockers and blockers:
                    terminated = tuple(sorted({b.pid for b in blockers}))
                    for pid in terminated:
                        s.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    continue
                raise FenceBlockedError(
                    f"fence: lock not granted in {attempts} attempts of {self.lock_timeout_ms} "
                    f"ms on the source {self._source.description}; sessions holding write locks "
                    f"on the moving tables: {_describe(blockers)}; end them or rerun fence "
                    "with terminate_blockers=True (nothing was created)",
                    blockers=blockers,
                )
        raise AssertionError("unreachable")  # pragma: no cover

    def _trigger_sql(self, table: MovedTable) -> list[sql.Composed]:
        w, d, t = (sql.Identifier(n) for n in self.trigger_names())
        args = sql.SQL(", ").join(sql.Literal(str(v))
                                  for v in (self.shard, self.target_name, self.move_id))
        parts = {"t": self._table(table), "f": sql.Identifier(FENCE_FUNCTION), "a": args}
        return [
            sql.SQL("CREATE OR REPLACE TRIGGER {n} BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW "
                    "WHEN ({c}) EXECUTE FUNCTION {f}({a})").format(
                n=w, c=self._shard_filter(table, "new"), **parts),
            sql.SQL("CREATE OR REPLACE TRIGGER {n} BEFORE DELETE ON {t} FOR EACH ROW "
                    "WHEN ({c}) EXECUTE FUNCTION {f}({a})").format(
                n=d, c=self._shard_filter(table, "old"), **parts),
            sql.SQL("CREATE OR REPLACE TRIGGER {n} BEFORE TRUNCATE ON {t} FOR EACH STATEMENT "
                    "EXECUTE FUNCTION {f}({a})").format(n=t, **parts),
        ]

    def _ensure_fence_function(self, s: psycopg.Connection[Any]) -> None:
        current = _one(s, "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure(%s)",
                       (f"{FENCE_FUNCTION}()",))
        if current != _FENCE_BODY:
            s.execute(sql.SQL(
                "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}"
            ).format(sql.Identifier(FENCE_FUNCTION), sql.Literal(_FENCE_BODY)))

    def _source_oids(self, s: psycopg.Connection[Any], step: str) -> list[int]:
        oids = []
        for table in self.tables:
            oid = self._regclass(s, table)
            if oid is None:
                raise ShardMoveError(f"{step}: table {table.name} does not exist on the source")
            oids.append(oid)
        return oids

    def _fence_triggers(self, s: psycopg.Connection[Any], oids: Iterable[int]) -> list[str]:
        rows = s.execute(
            "SELECT tgrelid::regclass::text || '.' || tgname FROM pg_trigger "
            "WHERE tgrelid = ANY (%s) AND tgname = ANY (%s) ORDER BY 1",
            (list(oids), self.trigger_names())).fetchall()
        return [str(r[0]) for r in rows]

    def _fence_complete(self, s: psycopg.Connection[Any], oids: list[int]) -> bool:
        return len(self._fence_triggers(s, oids)) == len(oids) * len(FENCE_SUFFIXES)

    def _under_lock_timeout(self, s: psycopg.Connection[Any],
                            statements: Sequence[sql.Composed]) -> tuple[bool, int]:
        """Run ``statements`` in one transaction under ``lock_timeout``; retry on 55P03."""
        for attempt in range(1, self.fence_attempts + 1):
            try:
                with s.transaction():
                    s.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                        sql.Literal(f"{self.lock_timeout_ms}ms")))
                    # durable at commit, whatever the server's synchronous_commit
                    s.execute("SET LOCAL synchronous_commit = local")
                    # The statements in one round trip: the writers queued behind the first
                    # lock taken wait for the others' too.
                    s.execute(sql.SQL("; ").join(statements))
                return True, attempt
            except psycopg.errors.LockNotAvailable:
                time.sleep(self.retry_pause_s)  # the writers queued behind the attempt go on
        return False, self.fence_attempts

    @staticmethod
    def _blockers(s: psycopg.Connection[Any], oids: list[int],
                  modes: Sequence[str]) -> tuple[Blocker, ...]:
        rows = s.execute(
            """SELECT DISTINCT ON (l.pid) l.pid, a.state,
                      extract(epoch FROM now() - a.xact_start)::float8,
                      coalesce(a.application_name, ''), l.relation::regclass::text
               FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
               WHERE l.locktype = 'relation' AND l.granted AND l.relation = ANY (%s)
               AND l.mode = ANY (%s) AND l.pid <> pg_backend_pid()
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               ORDER BY l.pid""", (oids, list(modes))).fetchall()
        return tuple(Blocker(pid=r[0], state=r[1], xact_age_s=r[2], application_name=r[3],
                             table=r[4]) for r in rows)

    def drained(self, position: str) -> bool:
        """Source: whether the target confirmed everything up to the fence LSN ``position``
        (the slot's ``confirmed_flush_lsn``; read on the source, it needs no connection to the
        target)."""
        with self._source.session() as s:  # one query: the drain polls it
            row = s.execute("""SELECT coalesce(confirmed_flush_lsn >= %s::pg_lsn, false)
                FROM pg_replication_slots WHERE slot_name = %s""", (position, self.name)
                            ).fetchone()
        if row is None:
            raise ShardMoveError(f"drained: slot {self.name} does not exist on the source")
        return bool(row[0])

    def flush(self, *, source: bool = True, target: bool = True) -> None:
        """Make the WAL written so far durable now on the ``source`` and the ``target``, best
        effort (a failure is left to the next poll).

        A drain waits for two flushes that a server may otherwise leave to its WAL writer
        (``wal_writer_delay``, 200 ms by default) when commits are asynchronous: the
        source's, before its walsender decodes up to the fence LSN, and the target's, before
        its apply worker (whose commits are asynchronous: a subscription's
        ``synchronous_commit`` is ``off`` by default) reports the shard's last transactions
        as flushed. The initial copy's last state changes wait for the source's WAL the same
        way. A transaction that writes a logical message and commits with
        ``synchronous_commit = local`` flushes every record before it; it touches no table,
        and runs only when some WAL is not flushed yet.
        """
        for connector in (self._source,) * source + (self._target,) * target:
            try:
                with connector.session() as conn:
                    try:
                        conn.execute(_FLUSH_WAL)
                    except psycopg.Error:
                        if not conn.broken and conn.info.transaction_status != _IDLE:
                            conn.execute("ROLLBACK")  # the held session stays usable
                        raise
            except (ShardMoveError, psycopg.Error):
                continue

    def unfence(self) -> list[str]:
        """Source: drop this move's fence triggers (an abort; a finished move keeps them).
        ``DROP TRIGGER`` takes ACCESS EXCLUSIVE: bounded like the fence."""
        with self._source.session() as s:
            oids = [oid for t in self.tables if (oid := self._regclass(s, t)) is not None]
            present = self._fence_triggers(s, oids)
            if not present:
                return []
            statements = [
                sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(n),
                                                                  self._table(table))
                for table in self.tables if self._regclass(s, table) is not None
                for n in self.trigger_names()
            ]
            taken, attempts = self._under_lock_timeout(s, statements)
            if not taken:
                blockers = self._blockers(s, oids, _ANY_LOCKS)
                raise FenceBlockedError(
                    f"unfence: lock not granted in {attempts} attempts of "
                    f"{self.lock_timeout_ms} ms; sessions holding locks on the moving tables: "
                    f"{_describe(blockers)}", blockers=blockers)
            return present

    def shard_fences_on_target(self) -> list[str]:
        """Target: the fence triggers of this shard on the moving tables (an earlier move of
        the shard away from the target left them; found by the fence function and its first
        argument, the shard)."""
        with self._target.session() as t:
            oids = [oid for table in self.tables if (oid := self._regclass(t, table)) is not None]
            rows = t.execute(
                r"""SELECT tgname::text FROM pg_trigger
                    WHERE tgrelid = ANY (%s) AND tgfoid = to_regprocedure(%s)
                    AND split_part(encode(tgargs, 'escape'), '\000', 1) = %s""",
                (oids, f"{FENCE_FUNCTION}()", str(self.shard))).fetchall()
        return [str(name) for (name,) in rows]

    # -- verify ------------------------------------------------------------------------------

    def verify(self) -> Verification:
        """Both sides, after the drain: columns, then per table the shard's row count, sum and
        bit_xor of ``hashtextextended(row::text, 0)`` with the settings that shape
        ``row::text`` pinned. Equal, or :class:`VerificationMismatchError` carrying both
        sides' results.

        When :meth:`verify_before_fence` passed and the change tracking it started is intact
        on both sides, only the rows written since it started are compared (``scope
        "changed"``): the first pass compared every other row, and the tracking proves those
        unchanged on both sides since. Otherwise every row (``scope "full"``).
        """
        with self._source.session() as s, self._target.session() as t:
            self._compare_columns(s, t, "verify")
            changed = self._changed_ids(s, t)
            if changed is None:
                result = Verification(
                    source={table.name: self._checksum(s, table) for table in self.tables},
                    target={table.name: self._checksum(t, table) for table in self.tables},
                )
            else:
                with _snapshot(s), _snapshot(t):
                    # Read again inside the snapshots: a row the target's log names is compared
                    # as the snapshot sees it (the source's log is complete since the fence).
                    changed = self._changed_ids(s, t)
                    assert changed is not None
                    result = Verification(
                        source={tb.name: self._checksum(s, tb, only=changed[tb.name])
                                for tb in self.tables},
                        target={tb.name: self._checksum(t, tb, only=changed[tb.name])
                                for tb in self.tables},
                        scope="changed", changed={k: len(v) for k, v in changed.items()},
                    )
        self._raise_if_different(result, "verify")
        return result

    def verify_before_fence(self, *, timeout_s: float = 120.0) -> Verification:
        """The first pass of the two-pass verification, while the shard is still written.

        Starts change tracking on both sides (:meth:`_track`: triggers logging the ID of every
        written row of the shard into ``sfdb_changes_<move id>``; target first), waits until
        the target confirmed the source's WAL position read after the source's tracking
        committed (everything written before the tracking is applied), then compares every
        row of the shard that neither log names: the target's snapshot first, then the
        source's, so every change the target has applied was logged on the source by then.
        Equal: a mark in the source's log lets :meth:`verify` compare only the logged rows.
        A mismatch is :class:`VerificationMismatchError` (nothing paused; abort possible).
        """
        with self._target.session() as t:
            self._track(t, "target")
        with self._source.session() as s:
            self._source_oids(s, "verify_before_fence")
            self._track(s, "source")
            tracked_at = str(_one(s, _INSERT_LSN))
        deadline = time.monotonic() + timeout_s
        while not self.drained(tracked_at):
            if time.monotonic() > deadline:
                raise ShardMoveError(
                    f"verify_before_fence: the target did not confirm {tracked_at} in "
                    f"{timeout_s:g} s (lag {self.backlog()} bytes)")
            self.flush()
            time.sleep(0.02)
        with self._source.session() as s, self._target.session() as t:
            self._compare_columns(s, t, "verify_before_fence")
            with _snapshot(t):
                target_logged = self._logged(t)
                with _snapshot(s):
                    source_logged = self._logged(s)
                    exclude = {tb.name: sorted(source_logged.get(tb.name, set())
                                               | target_logged.get(tb.name, set()))
                               for tb in self.tables}
                    source = {tb.name: self._checksum(s, tb, exclude=exclude[tb.name])
                              for tb in self.tables}
                target = {tb.name: self._checksum(t, tb, exclude=exclude[tb.name])
                          for tb in self.tables}
            result = Verification(source=source, target=target, scope="before_fence",
                                  changed={k: len(v) for k, v in exclude.items()})
            self._raise_if_different(result, "verify_before_fence")
            log = self._find_log(s)
            assert log is not None
            s.execute(sql.SQL("INSERT INTO {} (tbl, id) VALUES (%s, NULL)").format(log),
                      (PASS1_MARK,))
        return result

    def _compare_columns(self, s: psycopg.Connection[Any], t: psycopg.Connection[Any],
                         step: str) -> None:
        problems = []
        for table in self.tables:
            s_oid, t_oid = self._regclass(s, table), self._regclass(t, table)
            if s_oid is None or t_oid is None:
                raise ShardMoveError(f"{step}: table {table.name} is missing on the "
                                     f"{'source' if s_oid is None else 'target'}")
            s_cols, t_cols = self._columns(s, s_oid), self._columns(t, t_oid)
            if s_cols != t_cols:
                problems.append(f"{table.name}: columns differ, source {s_cols}, "
                                f"target {t_cols}")
        if problems:
            raise ShardMoveError(f"{step}: " + "; ".join(problems))

    def _raise_if_different(self, result: Verification, step: str) -> None:
        different = [
            f"{name}: source {_triple(result.source[name])}, target {_triple(result.target[name])}"
            for name in result.source if result.source[name] != result.target[name]
        ]
        if different:
            rows = "" if result.scope == "full" else f" ({result.scope} rows)"
            raise VerificationMismatchError(
                f"{step}: shard {self.shard} differs between source {self._source.description} "
                f"and target {self._target.description}{rows} (rows, hash sum, hash xor): "
                + "; ".join(different),
                verification=result,
            )

    def _checksum(self, conn: psycopg.Connection[Any], table: MovedTable, *,
                  only: Sequence[int] | None = None,
                  exclude: Sequence[int] = ()) -> TableChecksum:
        """The shard's rows of ``table``; only the IDs ``only`` (by the primary key) when
        given, without the IDs ``exclude``. Inside the caller's transaction when one is open."""
        where = self._shard_filter(table, "r")
        params: list[Any] = []
        column = sql.Identifier("r", table.id_column)
        if only is not None:
            where = sql.SQL("{} = ANY (%s) AND {}").format(column, where)
            params.append(list(only))
        if exclude:
            where = sql.SQL("{} AND NOT ({} = ANY (%s))").format(where, column)
            params.append(list(exclude))
        with conn.transaction():
            conn.execute(_PIN_SETTINGS)
            row = conn.execute(sql.SQL(
                """SELECT count(*), coalesce(sum(h::numeric), 0)::text, coalesce(bit_xor(h), 0)
                   FROM (SELECT hashtextextended(r::text, 0) AS h FROM {} AS r WHERE {}) AS x"""
            ).format(self._table(table), where), params).fetchone()
        assert row is not None
        return TableChecksum(rows=int(row[0]), hash_sum=str(row[1]), hash_xor=int(row[2]))

    # -- change tracking (the two-pass verification) -----------------------------------------

    @property
    def change_log_name(self) -> str:
        return f"sfdb_changes_{self.move_id}"

    def track_names(self) -> list[str]:
        return [f"sfdb_track_{self.move_id}_{suffix}" for suffix in TRACK_SUFFIXES]

    def _find_log(self, conn: psycopg.Connection[Any]) -> sql.Composable | None:
        """The change log of this move on ``conn``'s database, qualified, or None."""
        row = conn.execute(
            "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = "
            "c.relnamespace WHERE c.relname = %s AND c.relkind = 'r' ORDER BY 1 LIMIT 1",
            (self.change_log_name,)).fetchone()
        return None if row is None else sql.Identifier(row[0], self.change_log_name)

    def _track_triggers(self, conn: psycopg.Connection[Any]) -> list[str]:
        oids = [oid for t in self.tables if (oid := self._regclass(conn, t)) is not None]
        rows = conn.execute(
            "SELECT tgrelid::regclass::text || '.' || tgname FROM pg_trigger "
            "WHERE tgrelid = ANY (%s) AND tgname = ANY (%s) AND tgenabled = 'A' ORDER BY 1",
            (oids, self.track_names())).fetchall()
        return [str(r[0]) for r in rows]

    def _tracking_complete(self, conn: psycopg.Connection[Any]) -> bool:
        return (self._find_log(conn) is not None
                and len(self._track_triggers(conn)) == len(self.tables) * len(TRACK_SUFFIXES))

    def _track(self, conn: psycopg.Connection[Any], side: str) -> None:
        """The change log and the tracking triggers on one side (``ENABLE ALWAYS``: the
        target's apply worker runs as a replica and fires them too); rerunnable. The
        triggers take SHARE ROW EXCLUSIVE, under ``lock_timeout`` like the fence."""
        if self._tracking_complete(conn):
            return
        current = _one(conn, "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure(%s)",
                       (f"{TRACK_FUNCTION}()",))
        if current != _TRACK_BODY:
            conn.execute(sql.SQL(
                "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}"
            ).format(sql.Identifier(TRACK_FUNCTION), sql.Literal(_TRACK_BODY)))
        log = self._find_log(conn)
        if log is None:
            first = self._regclass(conn, self.tables[0])
            schema = _one(conn, "SELECT relnamespace::regnamespace::text FROM pg_class "
                                "WHERE oid = %s", (first,))
            log = sql.Identifier(str(schema).strip('"'), self.change_log_name)
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (tbl text NOT NULL, id bigint)"
                                 ).format(log))
        log_text = log.as_string(conn)
        statements: list[sql.Composed] = []
        i, u, d, tr = (sql.Identifier(n) for n in self.track_names())
        for table in self.tables:
            args = sql.SQL(", ").join(sql.Literal(v) for v in (log_text, table.name,
                                                               table.id_column))
            parts = {"t": self._table(table), "f": sql.Identifier(TRACK_FUNCTION), "a": args}
            new, old = self._shard_filter(table, "new"), self._shard_filter(table, "old")
            statements += [
                sql.SQL("CREATE OR REPLACE TRIGGER {n} AFTER INSERT ON {t} FOR EACH ROW "
                        "WHEN ({c}) EXECUTE FUNCTION {f}({a})").format(n=i, c=new, **parts),
                sql.SQL("CREATE OR REPLACE TRIGGER {n} AFTER UPDATE ON {t} FOR EACH ROW "
                        "WHEN ({o} OR {c}) EXECUTE FUNCTION {f}({a})").format(
                    n=u, o=old, c=new, **parts),
                sql.SQL("CREATE OR REPLACE TRIGGER {n} AFTER DELETE ON {t} FOR EACH ROW "
                        "WHEN ({c}) EXECUTE FUNCTION {f}({a})").format(n=d, c=old, **parts),
                sql.SQL("CREATE OR REPLACE TRIGGER {n} AFTER TRUNCATE ON {t} FOR EACH "
                        "STATEMENT EXECUTE FUNCTION {f}({a})").format(n=tr, **parts),
            ]
            statements += [sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(
                self._table(table), name) for name in (i, u, d, tr)]
        taken, attempts = self._under_lock_timeout(conn, statements)
        if not taken:
            oids = [oid for t in self.tables if (oid := self._regclass(conn, t)) is not None]
            blockers = self._blockers(conn, oids, _WRITE_LOCKS)
            raise FenceBlockedError(
                f"verify_before_fence: the change tracking's lock on the {side} not granted in "
                f"{attempts} attempts of {self.lock_timeout_ms} ms; sessions holding write "
                f"locks on the moving tables: {_describe(blockers)}", blockers=blockers)

    def _logged(self, conn: psycopg.Connection[Any]) -> dict[str, set[int]]:
        """The IDs the change log names per table (``-1`` stands for a TRUNCATE)."""
        log = self._find_log(conn)
        if log is None:
            return {}
        found: dict[str, set[int]] = {}
        for tbl, row_id in conn.execute(sql.SQL(
                "SELECT DISTINCT tbl, id FROM {} WHERE tbl <> %s").format(log), (PASS1_MARK,)):
            found.setdefault(tbl, set()).add(-1 if row_id is None else int(row_id))
        return found

    def _changed_ids(self, s: psycopg.Connection[Any], t: psycopg.Connection[Any]
                     ) -> dict[str, list[int]] | None:
        """Per table, the IDs either side's log names, when the first pass passed and the
        tracking is intact on both sides (no TRUNCATE logged); else None (compare all)."""
        source_log = self._find_log(s)
        if source_log is None or not (self._tracking_complete(s) and self._tracking_complete(t)):
            return None
        if not _exists(s, sql.SQL("SELECT 1 FROM {} WHERE tbl = %s").format(source_log)
                       .as_string(s), PASS1_MARK):
            return None
        source, target = self._logged(s), self._logged(t)
        changed = {tb.name: sorted(source.get(tb.name, set()) | target.get(tb.name, set()))
                   for tb in self.tables}
        if any(-1 in ids for ids in changed.values()):
            return None
        return changed

    def _drop_tracking(self, conn: psycopg.Connection[Any], side: str) -> list[str]:
        """Drop this move's tracking triggers (ACCESS EXCLUSIVE, bounded like the fence) and
        change log on one side; what was dropped."""
        dropped = self._track_triggers_any(conn)
        if dropped:
            statements = [
                sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(n),
                                                                  self._table(table))
                for table in self.tables if self._regclass(conn, table) is not None
                for n in self.track_names()
            ]
            taken, attempts = self._under_lock_timeout(conn, statements)
            if not taken:
                raise ShardMoveError(
                    f"cleanup: the change tracking's triggers on the {side} not dropped: lock "
                    f"not granted in {attempts} attempts of {self.lock_timeout_ms} ms; run "
                    "cleanup again")
        log = self._find_log(conn)
        if log is not None:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(log))
            dropped.append(log.as_string(conn))
        return dropped

    def _track_triggers_any(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Tracking triggers present, enabled or not."""
        oids = [oid for t in self.tables if (oid := self._regclass(conn, t)) is not None]
        rows = conn.execute(
            "SELECT tgrelid::regclass::text || '.' || tgname FROM pg_trigger "
            "WHERE tgrelid = ANY (%s) AND tgname = ANY (%s) ORDER BY 1",
            (oids, self.track_names())).fetchall()
        return [str(r[0]) for r in rows]

    def _verify_objects(self, conn: psycopg.Connection[Any], side: str) -> list[str]:
        found = [f"{side}:{name}" for name in self._track_triggers_any(conn)]
        log = self._find_log(conn)
        if log is not None:
            found.append(f"{side}:{log.as_string(conn)}")
        return found

    # -- cleanup and leftovers ---------------------------------------------------------------

    def cleanup(self) -> CleanupReport:
        """Drop the subscription, the slot, the table-copy slots and the publication.

        Target first: ``DROP SUBSCRIPTION`` drops its slots on the source. If that fails (the
        source does not answer), the subscription is disabled, detached from its slot
        (``slot_name = NONE``) and dropped, and the source's slots are dropped here once the
        source answers: the report says ``source_pending`` until then; run cleanup again.
        The fence triggers stay (see :meth:`unfence`).
        """
        report = CleanupReport()
        facts: _TargetFacts | None = None
        tracking_error: ShardMoveError | None = None
        try:
            with self._target.session() as t:
                self._drop_subscription(t, report)
                facts = self._target_facts(t)
                try:
                    report.done.extend(f"dropped {name} on the target"
                                       for name in self._drop_tracking(t, "target"))
                except ShardMoveError as error:
                    tracking_error = error
        except ShardMoveError as error:  # the target does not answer: clean the source anyway
            report.done.append(f"target skipped: {error}")
        try:
            with self._source.session() as s:
                report.done.extend(f"dropped {name} on the source"
                                   for name in self._drop_tracking(s, "source"))
                for slot, active_pid in self._source_slots(s, facts):
                    self._drop_slot(s, slot, active_pid)
                    report.done.append(f"dropped slot {slot} on the source")
                if _exists(s, "SELECT 1 FROM pg_publication WHERE pubname = %s", self.name):
                    self._drop_publication(s)
                    report.done.append(f"dropped publication {self.name} on the source")
        except FenceBlockedError:
            raise  # the source answers: a session holds the lock (named); run cleanup again
        except ShardMoveError as error:
            report.source_pending = True
            report.source_error = str(error)
        if tracking_error is not None:
            raise tracking_error
        return report

    def _drop_publication(self, s: psycopg.Connection[Any]) -> None:
        """Drop the publication with its tables locked in SHARE mode until the drop commits,
        bounded like the fence. A writer that builds a table's publication info while the
        publication is dropped fails with ``cache lookup failed for publication`` (XX000, not
        a refusal the application can retry): 1-4 writes in 2,000 create-and-drop rounds on
        PostgreSQL 15, none with the lock, which holds new writes off (and waits out those
        under way) until the catalog no longer names the publication."""
        present = {table: oid for table in self.tables
                   if (oid := self._regclass(s, table)) is not None}
        statements = [sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(self.name))]
        if present:
            statements.insert(0, sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
                sql.SQL(", ").join(self._table(table) for table in present)))
        taken, attempts = self._under_lock_timeout(s, statements)
        if not taken:
            blockers = self._blockers(s, list(present.values()), _WRITE_LOCKS)
            raise FenceBlockedError(
                f"cleanup: the lock on the source's moving tables to drop publication "
                f"{self.name} not granted in {attempts} attempts of {self.lock_timeout_ms} ms; "
                f"sessions holding write locks on them: {_describe(blockers)}; run the "
                "cleanup again (resume the move)", blockers=blockers)

    def _drop_subscription(self, t: psycopg.Connection[Any], report: CleanupReport) -> None:
        if self._subscription_oid(t) is None:
            return
        name = sql.Identifier(self.name)
        try:
            t.execute(sql.SQL("DROP SUBSCRIPTION IF EXISTS {}").format(name))
            report.done.append(f"dropped subscription {self.name} (and its slots on the source)")
        except psycopg.Error as error:
            # Measured: with the source down this is 08006 and nothing is dropped.
            t.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(name))
            t.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(name))
            t.execute(sql.SQL("DROP SUBSCRIPTION {}").format(name))
            report.done.append(
                f"dropped subscription {self.name} detached from its slot "
                f"({error.sqlstate}: {error.diag.message_primary}); its slots on the source "
                "are dropped from there"
            )

    def _target_facts(self, t: psycopg.Connection[Any]) -> _TargetFacts:
        system_identifier = _one(t, "SELECT system_identifier FROM pg_control_system()")
        relids = frozenset(oid for table in self.tables
                           if (oid := self._regclass(t, table)) is not None)
        subscriptions = frozenset(r[0] for r in t.execute(
            "SELECT oid::bigint FROM pg_subscription").fetchall())
        return _TargetFacts(int(system_identifier), relids, subscriptions,
                            self._subscription_oid(t))

    def _source_slots(self, s: psycopg.Connection[Any], facts: _TargetFacts | None
                      ) -> list[tuple[str, int | None]]:
        """The move's slot and its table-copy slots ``pg_<suboid>_sync_<relid>_<sysid>``: of
        the subscription's OID when known, or left by a subscription of the target that no
        longer exists (``slot_name = NONE``) for one of the moving tables."""
        rows = s.execute(
            """SELECT slot_name::text, active_pid FROM pg_replication_slots
               WHERE slot_name = %s OR slot_name LIKE 'pg\\_%%\\_sync\\_%%'""",
            (self.name,)).fetchall()
        ours = []
        for slot, active_pid in rows:
            match = _SYNC_SLOT.match(slot)
            if slot == self.name:
                ours.append((slot, active_pid))
            elif match:
                suboid, relid, sysid = (int(g) for g in match.groups())
                mine = suboid == self._suboid or (
                    facts is not None and relid in facts.relids
                    and sysid == facts.system_identifier and suboid not in facts.subscriptions
                )
                if mine:
                    ours.append((slot, active_pid))
        return ours

    @staticmethod
    def _drop_slot(s: psycopg.Connection[Any], slot: str, active_pid: int | None) -> None:
        """Drop a slot, ending the WAL sender that streams from it first (bounded wait)."""
        deadline = time.monotonic() + 10
        while active_pid is not None:
            s.execute("SELECT pg_terminate_backend(%s)", (active_pid,))
            time.sleep(0.02)
            active_pid = _one(s, "SELECT active_pid FROM pg_replication_slots "
                                 "WHERE slot_name = %s", (slot,))
            if time.monotonic() > deadline:
                raise ShardMoveError(f"cleanup: slot {slot} stays in use by pid {active_pid}")
        if _exists(s, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", slot):
            s.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

    def leftovers(self) -> Leftovers:
        """Everything of this move still present on either server (both must answer)."""
        with self._target.session() as t:
            facts = self._target_facts(t)
            subscriptions = (self.name,) if facts.our_subscription is not None else ()
            verify_objects = self._verify_objects(t, "target")
        with self._source.session() as s:
            verify_objects += self._verify_objects(s, "source")
            publications = tuple(r[0] for r in s.execute(
                "SELECT pubname::text FROM pg_publication WHERE pubname = %s",
                (self.name,)).fetchall())
            slots = tuple(slot for slot, _ in self._source_slots(s, facts))
            oids = [oid for t_ in self.tables if (oid := self._regclass(s, t_)) is not None]
            triggers = tuple(self._fence_triggers(s, oids))
        return Leftovers(publications=publications, slots=slots, fence_triggers=triggers,
                         subscriptions=subscriptions, verify_objects=tuple(verify_objects))

    # -- rows --------------------------------------------------------------------------------

    def measure(self) -> tuple[dict[str, int], int]:
        """Source: the shard's rows per table and their bytes (``pg_column_size`` of each
        row), for the plan."""
        rows: dict[str, int] = {}
        size = 0
        with self._source.session() as s:
            for table in self.tables:
                query = sql.SQL(
                    "SELECT count(*), coalesce(sum(pg_column_size(r.*)), 0)::bigint FROM {} AS r "
                    "WHERE {}"
                ).format(self._table(table), self._shard_filter(table, "r"))
                found = s.execute(query).fetchone()
                assert found is not None
                rows[table.name] = int(found[0])
                size += int(found[1])
        return rows, size

    def rows_copied(self) -> int:
        """Target: rows the table-copy workers have written so far (``pg_stat_progress_copy``
        of the target's database)."""
        with self._target.session() as t:
            found = t.execute(
                "SELECT coalesce(sum(tuples_processed), 0)::bigint FROM pg_stat_progress_copy "
                "WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
        return int(found[0]) if found else 0

    def delete_source_rows(self, *, batch_size: int = 5000, pause_ratio: float = 1.0) -> int:
        """Source, after the flip and the barrier: delete the shard's rows in batches.

        Refused while the publication or slot exists (the deletes would stream to the target)
        and unless the fence is up (the source would still be serving the shard). The mover's
        session passes the fence by :data:`FENCE_BYPASS_SETTING`. Paced by ``pause_ratio``
        (see :meth:`_delete_rows`) so the other shards' writes keep their rate.
        """
        with self._source.session() as s:
            oids = self._source_oids(s, "delete_source_rows")
            if _exists(s, "SELECT 1 FROM pg_publication WHERE pubname = %s", self.name) or (
                self._slot_exists(s)
            ):
                raise ShardMoveError(
                    f"delete_source_rows: publication or slot {self.name} still exists on the "
                    "source, so the deletes would be streamed to the target; run cleanup first"
                )
            if not self._fence_complete(s, oids):
                raise ShardMoveError(
                    f"delete_source_rows: the fence of move {self.move_id} is not up on every "
                    "table of the source, which therefore may still serve the shard's writes"
                )
            return self._delete_rows(s, batch_size, pause_ratio)

    def delete_target_rows(self, *, batch_size: int = 5000, pause_ratio: float = 1.0) -> int:
        """Target, to abort: delete the shard's copied rows in batches (after cleanup)."""
        with self._target.session() as t:
            if self._subscription_oid(t) is not None:
                raise ShardMoveError(
                    f"delete_target_rows: subscription {self.name} still exists on the target "
                    "and would copy the rows again; run cleanup first"
                )
            return self._delete_rows(t, batch_size, pause_ratio)

    def _delete_rows(self, conn: psycopg.Connection[Any], batch_size: int,
                     pause_ratio: float) -> int:
        """Delete the shard's rows of every table, children first, in batches by ID.

        The IDs are read by ONE scan per table: a ``WITH HOLD`` cursor, materialised when
        its statement ends (no transaction stays open while the deletes run), fetched
        ``batch_size`` at a time; each batch is one short transaction ``DELETE ... WHERE id
        = ANY (...)`` (the primary key's index). After each batch the session sleeps
        ``pause_ratio`` times as long as the batch took, so the deletes use at most
        ``1 / (1 + pause_ratio)`` of one connection's time and the other shards' writes
        keep their rate. A second scan confirms nothing is left (nothing can be added: the
        fence is up on the source; the subscription is gone on the target); it repeats if
        rows appeared, at most three scans in all.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size {batch_size!r} must be an int >= 1")
        if not isinstance(pause_ratio, int | float) or isinstance(pause_ratio, bool) or not (
            0 <= pause_ratio <= 100
        ):
            raise InvalidArgumentError(f"pause_ratio {pause_ratio!r} must be a number in "
                                       "[0, 100]")
        total = 0
        for table in reversed(self.tables):  # children (listed after their parents) first
            if self._regclass(conn, table) is None:
                continue
            column = sql.Identifier(table.id_column)
            select = sql.SQL("SELECT {c} FROM {t} WHERE {f}").format(
                c=column, t=self._table(table), f=self._shard_filter(table))
            delete = sql.SQL("DELETE FROM {t} WHERE {c} = ANY (%s)").format(
                t=self._table(table), c=column)
            for _scan in range(3):
                found = 0
                with conn.cursor(name=f"sfdb_delete_{self.move_id}", withhold=True) as cursor:
                    cursor.execute(select)
                    while batch := cursor.fetchmany(batch_size):
                        started = time.monotonic()
                        with conn.transaction():  # the shard's fence lets these deletes pass
                            conn.execute("SELECT set_config(%s, %s, true)",
                                         (FENCE_BYPASS_SETTING, str(self.shard)))
                            total += conn.execute(delete, ([row[0] for row in batch],)).rowcount
                        found += len(batch)
                        if pause_ratio:
                            time.sleep((time.monotonic() - started) * pause_ratio)
                if not found:
                    break
            else:
                raise ShardMoveError(
                    f"delete rows: {table.name} still had rows of shard {self.shard} after "
                    "three scans: something keeps writing them; run the step again")
        return total


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _snapshot(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A REPEATABLE READ transaction: every query inside sees one snapshot (taken by the
    first). Checksums nested inside run as savepoints of it."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        yield


def _one(conn: psycopg.Connection[Any], query: Any, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def _exists(conn: psycopg.Connection[Any], query: str, value: object) -> bool:
    return conn.execute(query, (value,)).fetchone() is not None


def _describe(blockers: Sequence[Blocker]) -> str:
    if not blockers:
        return "none left at the last attempt"
    return ", ".join(
        f"pid {b.pid} ({b.state}, transaction open {b.xact_age_s or 0:.1f} s, "
        f"application {b.application_name!r}, table {b.table})" for b in blockers
    )


def _triple(checksum: TableChecksum) -> str:
    return f"({checksum.rows}, {checksum.hash_sum}, {checksum.hash_xor})"

