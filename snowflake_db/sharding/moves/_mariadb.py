"""The MariaDB steps of an online move of one logical shard from a source to a target.

MariaDB has no row-filtered logical replication, so the change capture is triggers
(``docs/design/shard-moves.md``, "MariaDB", says why and what was measured): ``capture``
creates, on every moved table of the source, ``BEFORE`` fence triggers that refuse the shard's
writes once its fence row says so (``sfdb_fence_<move id>``) and ``AFTER`` capture triggers that
record the ID of every written row of the shard in a changelog (``sfdb_changes_<move id>``), in
the writer's own transaction. The copy reads the shard's rows in ascending ID chunks and inserts
them on the target (each chunk in parts, one inserted while the next is read, in one target
transaction); applying a captured change re-reads the row from the source and replaces or
deletes it on the target. Both are done by :meth:`MariaDBMoveBackend.advance`, one bounded unit
per call, in the caller's process. The fence is one row update that waits for every transaction
holding the fence row's shared lock, which each write of the shard takes.

Every object is named after the move (``sfdb_fence_<m>_<i|u|d>_<table>``,
``sfdb_capture_<m>_<i|u|d>_<table>``, ``sfdb_changes_<m>``, ``sfdb_fence_<m>``,
``sfdb_copy_<m>`` on the target), so each step can run again after the mover died and
:meth:`MariaDBMoveBackend.cleanup` removes whatever a run left.
"""

from __future__ import annotations

import json
import re
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from ...errors import (
    InvalidArgumentError,
    MissingExtraError,
    MoveServerUnreachableError,
    ShardMoveError,
)
from ...layout import Layout
from ._connections import CONNECT_TIMEOUT_S, MariaDBConnector, MariaDBEndpoint
from ._results import (
    Blocker,
    CleanupReport,
    CopyProgress,
    FenceBlockedError,
    FenceResult,
    Leftovers,
    MovedTable,
    TableChecksum,
    Verification,
    VerificationMismatchError,
    check_move_arguments,
)

try:
    import pymysql  # type: ignore[import-untyped]
except ImportError as error:  # pragma: no cover - the mysql extra is missing
    raise MissingExtraError(__name__, package="PyMySQL", extra="mysql") from error

#: The SQLSTATE of the fence's ``SIGNAL`` (clients that report SQLSTATE see it).
FENCE_SQLSTATE = "SFM01"
#: The error number the fence's ``SIGNAL`` arrives with (``ER_SIGNAL_EXCEPTION``); the message
#: carries ``SFM01 shard=.. target=.. move=..`` for drivers that do not report the SQLSTATE
#: (mysqlclient; PyMySQL before 1.2).
FENCE_ERRNO = 1644
#: A session variable equal to the shard lets the mover's own sessions pass the fence (the
#: deletes of the shard's rows, and the copy onto a target an earlier move fenced). The fence
#: guards against stale routing, not against a session that means to bypass it.
FENCE_BYPASS_VARIABLE = "@sfdb_fence_bypass"
#: Seconds the fence's last attempt lasts at least, and at most while a second session has
#: not yet named the transactions it waits for (a busy server can take seconds to show them).
WATCHED_ATTEMPT_S, WATCHED_ATTEMPT_MAX_S = 1.0, 10.0
#: How often the fence's watcher reads InnoDB's lock views: InnoDB refreshes the cache behind
#: ``INNODB_TRX`` and ``INNODB_LOCK_WAITS`` only when nobody read it for 100 ms, so faster
#: polling reads one stale picture forever (measured; MySQL bug #48883).
_LOCK_VIEW_POLL_S = 0.15
#: Seconds a new session of the move waits for the move's lock on the target (held by every
#: session that writes the shard there: a mover killed mid-statement releases it when the
#: server has finished that statement), and for its lock on the source (held by every step that
#: creates or drops the move's objects there: see :meth:`MariaDBMoveBackend._ddl_lock`).
COPY_LOCK_WAIT_S = 10
#: The first and the longest pause between two attempts of a statement that creates or drops
#: one of the move's objects (each attempt takes the metadata lock at once or gives up).
_DDL_PAUSE_S, _DDL_MAX_PAUSE_S = 0.001, 0.025
#: The changelog's ``seq`` of the row marking the first verification pass (the capture's own
#: rows start at 2; the mark is also the only row in state ``_MARK``), and the changelog's
#: ``applied`` states.
_MARK_SEQ = 1
_PENDING, _APPLIED, _MARK = 0, 1, 2
_EVENTS = ("i", "u", "d")
_EVENT_NAMES = {"i": "INSERT", "u": "UPDATE", "d": "DELETE"}
#: What a bounded attempt's failure looks like: max_statement_time exceeded, lock wait timeout,
#: deadlock (InnoDB chose the fencer as the victim).
_GAVE_UP = frozenset({1969, 1205, 1213})
#: ``ER_QUERY_INTERRUPTED``: the fence's watched attempt ended by its watch.
_INTERRUPTED = 1317
#: ``ER_NO_SUCH_TABLE``: the copy's reads of the move's own tables find a missing one so, rather
#: than by a catalogue query first (each :meth:`MariaDBMoveBackend.advance` made three).
_NO_SUCH_TABLE = 1146
#: The largest INSERT the copy builds from many rows (a single wider row goes alone), and the
#: most a part of the copy asks the source to join (``group_concat_max_len``).
_MAX_STATEMENT_BYTES = 4 << 20
#: The parts a copy chunk is read in: each is inserted while the next is read.
_COPY_PARTS = 4
_ID_BATCH = 2000
_DRAIN_BATCHES = 8
_UTC = "+00:00"
#: The target's copy session: strict (a value that does not fit is an error, never a clamped
#: row), zero values kept in AUTO_INCREMENT columns, zero dates accepted as the source holds them.
_COPY_SQL_MODE = "STRICT_ALL_TABLES,NO_AUTO_VALUE_ON_ZERO,NO_ENGINE_SUBSTITUTION"
_BINARY_TYPES = frozenset({
    "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point",
    "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
    "geometrycollection",
})
_TEXT_TYPES = frozenset({
    "char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json",
})
_CASCADING = ("CASCADE", "SET NULL", "SET DEFAULT")
#: The unique indexes of a table (schema, name) that are one column (the ID) alone.
_ID_KEYS = """SELECT s.INDEX_NAME FROM information_schema.STATISTICS s
    WHERE s.TABLE_SCHEMA = %s AND s.TABLE_NAME = %s AND s.NON_UNIQUE = 0
    GROUP BY s.INDEX_NAME HAVING COUNT(*) = 1 AND MAX(s.COLUMN_NAME) = %s"""
_FENCE_MARK = re.compile(r"SFM01 shard=(\d+) target=(\S+) move=(\d+)")


def _q(name: str) -> str:
    """A quoted identifier."""
    return "`" + name.replace("`", "``") + "`"


def _errno(error: BaseException) -> int | None:
    args = getattr(error, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _object_name(prefix: str, table: str) -> str:
    """``<prefix>_<table>``, cut to MariaDB's 64 characters with a hash of the whole name."""
    name = f"{prefix}_{table}"
    if len(name) <= 64:
        return name
    return f"{name[:54]}_{zlib.crc32(table.encode()):08x}"[:64]


@dataclass(frozen=True)
class _Column:
    name: str
    data_type: str
    column_type: str
    charset: str | None
    collation: str | None
    generated: bool

    def describe(self) -> tuple[str, str, str | None, str | None, bool]:
        return (self.name, self.column_type, self.charset, self.collation, self.generated)

    def literal(self) -> str:
        """SQL giving this column's value as an SQL literal (``NULL`` when null), made by the
        server: the copy inserts it as is, and the checksum hashes it, on both sides alike."""
        column = _q(self.name)
        if self.data_type == "bit":
            return f"COALESCE(CAST({column} AS UNSIGNED), 'NULL')"
        if self.data_type in _BINARY_TYPES:
            return f"COALESCE(CONCAT('X''', HEX({column}), ''''), 'NULL')"
        if self.data_type in _TEXT_TYPES:
            return f"QUOTE(CONVERT({column} USING utf8mb4))"
        return f"QUOTE({column})"


@dataclass(frozen=True)
class _Table:
    """A moved table resolved on one server: its schema, name and the columns the move copies."""

    moved: MovedTable
    schema: str
    name: str
    columns: tuple[_Column, ...]
    #: the unique index that is the ID column alone (``PRIMARY`` when it is), if any
    key: str | None = None

    @property
    def sql(self) -> str:
        return f"{_q(self.schema)}.{_q(self.name)}"

    def by_keys(self) -> str:
        """This table joined to a list of IDs (:func:`_by_keys`)."""
        return _by_keys(self.sql, self.id, self.key)

    @property
    def id(self) -> str:
        return _q(self.moved.id_column)

    @property
    def copied(self) -> tuple[_Column, ...]:
        """Every column but generated ones (the server computes those on both sides)."""
        return tuple(c for c in self.columns if not c.generated)

    def row_literal(self) -> str:
        return "CONCAT('(', " + ", ',', ".join(c.literal() for c in self.copied) + ", ')')"

    def row_hash(self) -> str:
        return f"CAST(CONV(LEFT(MD5({self.row_literal()}), 16), 16, 10) AS UNSIGNED)"

    def column_list(self) -> str:
        return ", ".join(_q(c.name) for c in self.copied)


@dataclass(frozen=True)
class _Part:
    """Rows of one read of the copy: how many, the last ID, and their VALUES lists, joined
    by the source into one text or one literal per row (None: wider than the source's
    ``max_allowed_packet``)."""

    rows: int
    last_id: int | None
    joined: str | None = None
    literals: Sequence[str | None] = ()


def _rows(conn: Any, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(query, params)
        return list(cursor.fetchall())


def _one(conn: Any, query: str, params: Any = None) -> Any:
    found = _rows(conn, query, params)
    return found[0][0] if found else None


def _run(conn: Any, query: str, params: Any = None) -> int:
    with conn.cursor() as cursor:
        return int(cursor.execute(query, params))


@contextmanager
def _transaction(conn: Any, *, snapshot: bool = False) -> Iterator[None]:
    """One transaction on an autocommit session: committed, or rolled back on any error."""
    _run(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT" if snapshot else "BEGIN")
    try:
        yield
    except BaseException:
        if conn.open:
            with suppress(pymysql.MySQLError):
                conn.rollback()
        raise
    conn.commit()


@contextmanager
def _bypassing(conn: Any, shard: int) -> Iterator[None]:
    """The session passes the fences of ``shard`` for the block (then no longer)."""
    _run(conn, f"SET {FENCE_BYPASS_VARIABLE} = %s", (shard,))
    try:
        yield
    finally:
        if conn.open:
            with suppress(pymysql.MySQLError):
                _run(conn, f"SET {FENCE_BYPASS_VARIABLE} = NULL")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _batches(values: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _in_list(count: int) -> str:
    return ", ".join(["%s"] * count)


def _by_keys(table: str, column: str, key: str | None) -> str:
    """``table AS t`` joined to the values of one JSON array parameter, each row looked up in
    the unique index ``key`` on ``column``: what the move's ``UPDATE`` and ``DELETE`` of
    listed rows name.

    Never ``... WHERE column IN (...)`` for a write: on a small table the optimizer scans the
    whole table for it (MariaDB 10.11: a hint is ignored by a single-table ``DELETE``), and in
    REPEATABLE READ a locking scan locks every row it reads. It then waits for any open
    transaction's uncommitted row there (a changelog row of a write of the shard not committed
    yet: the apply stood until ``innodb_lock_wait_timeout`` and the step failed; another shard's
    new order) and holds up the table's writers until it ends. Joined to the list first
    (``STRAIGHT_JOIN``) through the index (``FORCE INDEX``: without it a table of a few rows
    is still scanned, measured), only the rows written are locked.
    """
    index = f" FORCE INDEX ({_q(key)})" if key else ""
    return (f"JSON_TABLE(%s, '$[*]' COLUMNS (k BIGINT PATH '$')) AS kl "
            f"STRAIGHT_JOIN {table} AS t{index} ON t.{column} = kl.k")


def _key_list(keys: Sequence[int]) -> str:
    """The parameter of :func:`_by_keys`: the keys as a JSON array (exact for any BIGINT)."""
    return json.dumps([int(key) for key in keys])


class MariaDBMoveBackend:
    """The steps of move ``move_id`` of logical shard ``shard`` from ``source`` to ``target``,
    two MariaDB 10.6+ servers.

    ``source`` and ``target`` are URLs (``mysql+pymysql://...``), SQLAlchemy engines (PyMySQL
    driver) or PyMySQL connections; unqualified table names are in each side's own database.
    ``target_name`` is the shard map's name of the target, written into the fence's error.
    List ``tables`` parents first: rows are deleted in the reverse order. ``chunk_rows`` bounds
    the rows one :meth:`advance` copies (one target transaction) and the changes it applies:
    20,000 by default, as each chunk costs round trips of its own (the measurements are in
    docs/design/shard-moves.md); ``lock_timeout_ms`` bounds
    each attempt to lock the fence row, retried ``fence_attempts`` times. A statement that
    creates or drops a trigger or a table of the move never waits for its table's metadata
    lock: it takes it at once or gives up, and is tried again for up to ``ddl_timeout_s``
    seconds (:meth:`_bounded_ddl` says why).
    """

    kind = "mariadb"
    backlog_unit = "rows"

    def __init__(
        self,
        *,
        source: MariaDBEndpoint,
        target: MariaDBEndpoint,
        layout: Layout,
        shard: int,
        move_id: int,
        target_name: str,
        tables: Sequence[MovedTable | str],
        lock_timeout_ms: int = 100,
        fence_attempts: int = 50,
        chunk_rows: int = 20_000,
        retry_pause_s: float = 0.05,
        ddl_timeout_s: float = 30.0,
    ) -> None:
        if not isinstance(ddl_timeout_s, int | float) or isinstance(ddl_timeout_s, bool) or not (
            0 < ddl_timeout_s <= 3600
        ):
            raise InvalidArgumentError(f"ddl_timeout_s {ddl_timeout_s!r} must be a number of "
                                       "seconds in (0, 3600]")
        self.tables = check_move_arguments(
            move_id=move_id, target_name=target_name, tables=tables,
            at_least_one={"lock_timeout_ms": lock_timeout_ms, "fence_attempts": fence_attempts,
                          "chunk_rows": chunk_rows})
        self.layout = layout
        self.shard = shard
        self.move_id = move_id
        self.target_name = target_name
        self.lock_timeout_ms = lock_timeout_ms
        self.fence_attempts = fence_attempts
        self.chunk_rows = chunk_rows
        self.retry_pause_s = retry_pause_s
        self.ddl_timeout_s = float(ddl_timeout_s)
        self.name = f"sfdb_move_{move_id}"
        self._source = MariaDBConnector(source, "source")
        self._target = MariaDBConnector(target, "target")
        self._resolved: dict[tuple[str, str], _Table] = {}
        self._defaults: dict[str, str] = {}
        self._marked = False
        self._locked_on: int | None = None
        #: Tables whose rows are too wide for the copy's joined parts: read row by row.
        self._wide: set[str] = set()

    @contextmanager
    def held(self, *, source: bool = True, target: bool = True) -> Iterator[None]:
        """Keep one session open on each side for every step run inside."""
        with self._source.held() if source else _nothing(), \
                self._target.held() if target else _nothing():
            yield

    # -- names and SQL pieces -----------------------------------------------------------------

    @property
    def mask(self) -> int:
        return self.layout.max_shard

    @property
    def changelog_name(self) -> str:
        return f"sfdb_changes_{self.move_id}"

    @property
    def fence_table_name(self) -> str:
        return f"sfdb_fence_{self.move_id}"

    @property
    def progress_name(self) -> str:
        return f"sfdb_copy_{self.move_id}"

    @property
    def _lock_name(self) -> str:
        """The move's lock on the target (``GET_LOCK`` names are server-wide: the target's
        database is part of it)."""
        return _object_name(f"sfdb_move_{self.move_id}", self._home("target"))

    @property
    def _ddl_lock_name(self) -> str:
        """The move's lock on the source, held by each step that creates or drops its objects
        there (the source's database is part of the name, as for :attr:`_lock_name`)."""
        return _object_name(f"sfdb_ddl_{self.move_id}", self._home("source"))

    def fence_trigger_names(self, table: str) -> list[str]:
        return [_object_name(f"sfdb_fence_{self.move_id}_{e}", table) for e in _EVENTS]

    def capture_trigger_names(self, table: str) -> list[str]:
        return [_object_name(f"sfdb_capture_{self.move_id}_{e}", table) for e in _EVENTS]

    def _in_shard(self, table: _Table, row: str | None = None) -> str:
        column = f"{row}.{table.id}" if row else table.id
        return f"(({column} & {self.mask}) = {self.shard})"

    def _home(self, side: str) -> str:
        """The schema holding the move's own tables on ``side``: the first moved table's
        (known once :meth:`_resolve` ran on that side)."""
        parts = self.tables[0].name.split(".")
        return parts[0] if len(parts) == 2 else self._defaults[side]

    def _changelog(self) -> str:
        return f"{_q(self._home('source'))}.{_q(self.changelog_name)}"

    def _fence_table(self) -> str:
        return f"{_q(self._home('source'))}.{_q(self.fence_table_name)}"

    def _progress(self) -> str:
        return f"{_q(self._home('target'))}.{_q(self.progress_name)}"

    # -- reading the catalogue ---------------------------------------------------------------

    def _resolve(self, conn: Any, side: str, *, required: bool = True) -> list[_Table]:
        """The moved tables on ``side`` (cached for this backend); missing ones are an error
        when ``required``, else left out."""
        found: list[_Table] = []
        if side not in self._defaults:
            default = _one(conn, "SELECT DATABASE()")
            if default is None and any("." not in t.name for t in self.tables):
                raise ShardMoveError(
                    f"the {side} session has no default database; name one in its URL or "
                    "qualify the tables (schema.table)")
            self._defaults[side] = "" if default is None else str(default)
        for moved in self.tables:
            key = (side, moved.name)
            if key in self._resolved:
                found.append(self._resolved[key])
                continue
            parts = moved.name.split(".")
            if len(parts) == 2:
                schema, name = parts
            else:
                schema, name = self._defaults[side], parts[0]
            columns = tuple(_Column(str(r[0]), str(r[1]).lower(), str(r[2]),
                                    None if r[3] is None else str(r[3]),
                                    None if r[4] is None else str(r[4]), r[5] != "NEVER")
                            for r in _rows(conn, """SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE,
                                CHARACTER_SET_NAME, COLLATION_NAME, IS_GENERATED
                                FROM information_schema.COLUMNS
                                WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
                                ORDER BY ORDINAL_POSITION""", (schema, name)))
            if not columns:
                if required:
                    where = "on the target" if side == "target" else "on the source"
                    raise ShardMoveError(
                        f"table {moved.name} does not exist {where} "
                        f"{self._connector(side).description} (schema {schema})")
                continue
            keys = sorted((str(index) for (index,) in _rows(conn, _ID_KEYS, (
                schema, name, moved.id_column))), key=lambda index: index != "PRIMARY")
            table = _Table(moved, str(schema), str(name), columns, keys[0] if keys else None)
            self._resolved[key] = table
            found.append(table)
        return found

    def _connector(self, side: str) -> MariaDBConnector:
        return self._source if side == "source" else self._target

    def _triggers(self, conn: Any, tables: Sequence[_Table], prefix: str) -> list[str]:
        """``table.trigger`` of this move's triggers named ``<prefix>_<move id>_...``."""
        found: list[str] = []
        for table in tables:
            for (name,) in _rows(conn, """SELECT TRIGGER_NAME FROM information_schema.TRIGGERS
                    WHERE EVENT_OBJECT_SCHEMA = %s AND EVENT_OBJECT_TABLE = %s
                    AND TRIGGER_NAME LIKE %s ORDER BY TRIGGER_NAME""",
                    (table.schema, table.name, f"{prefix}\\_{self.move_id}\\_%")):
                found.append(f"{table.name}.{name}")
        return found

    def _table_exists(self, conn: Any, side: str, name: str) -> bool:
        return _one(conn, "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                          "AND TABLE_NAME = %s", (self._home(side), name)) is not None

    # -- check -------------------------------------------------------------------------------

    def check(self) -> None:
        """Every pre-check of a move; the first failure is a :class:`ShardMoveError` naming the
        check and the fix. Reads only: nothing is created on either server."""
        if self.layout.shard_bits == 0:
            raise ShardMoveError(
                "check 'layout': the layout has no shard bits (shard_bits=0), so a shard is not "
                "id & mask and cannot be moved by its rows' IDs; moves need Layout(shard_bits>0)")
        if isinstance(self.shard, bool) or not isinstance(self.shard, int) or not (
            0 <= self.shard <= self.mask
        ):
            raise ShardMoveError(
                f"check 'shard': shard {self.shard!r} is not a logical shard of this layout "
                f"(0..{self.mask}, {self.layout.shard_bits} shard bits)")
        with self._source.session() as s:
            self._check_server(s, "source")
            try:
                source = self._resolve(s, "source")
            except ShardMoveError as error:
                raise ShardMoveError(f"check 'tables': {error}") from None
            for table in source:
                self._check_source_table(s, table)
            self._check_source_privileges(s, source)
        with self._target.session() as t:
            self._check_server(t, "target")
            try:
                target = self._resolve(t, "target")
            except ShardMoveError as error:
                raise ShardMoveError(
                    f"check 'tables': {error}; create it with the application's migrations "
                    "first") from None
            self._check_target(t, source, target)

    def _check_server(self, conn: Any, side: str) -> None:
        version = str(_one(conn, "SELECT VERSION()"))
        match = re.match(r"(\d+)\.(\d+)", version)
        if "mariadb" not in version.lower() or match is None or (
            (int(match[1]), int(match[2])) < (10, 6)
        ):
            raise ShardMoveError(
                f"check 'server': the {side} {self._connector(side).description} runs "
                f"{version}; MariaDB moves need MariaDB 10.6 or later (SET STATEMENT, "
                "max_statement_time, several triggers per event; tested on 10.11)")

    def _check_source_table(self, s: Any, table: _Table) -> None:
        where = f"on the source {self._source.description}"
        kinds = {c.name: c for c in table.columns}
        column = kinds.get(table.moved.id_column)
        if column is None or column.data_type != "bigint":
            raise ShardMoveError(
                f"check 'id column': {table.moved.name}.{table.moved.id_column} {where} is "
                f"{column.column_type if column else 'missing'}, not the bigint Snowflake ID the "
                "shard bits are read from; pass MovedTable(name, id_column=...)")
        engine = _one(s, "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                         "AND TABLE_NAME = %s", (table.schema, table.name))
        if str(engine).lower() != "innodb":
            raise ShardMoveError(
                f"check 'engine': {table.moved.name} {where} uses {engine}; the capture's "
                "changelog must commit and roll back with each write: ALTER TABLE ... "
                "ENGINE=InnoDB")
        if table.key is None:
            raise ShardMoveError(
                f"check 'primary key': no primary or unique key of {table.moved.name} {where} is "
                f"{table.moved.id_column} alone; the move finds, copies and deletes rows by it: "
                f"ALTER TABLE {table.moved.name} ADD PRIMARY KEY ({table.moved.id_column})")
        cascading = _rows(s, """SELECT CONSTRAINT_NAME, REFERENCED_TABLE_NAME, DELETE_RULE,
                UPDATE_RULE FROM information_schema.REFERENTIAL_CONSTRAINTS
            WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s
            AND (DELETE_RULE IN (%s, %s, %s) OR UPDATE_RULE IN (%s, %s, %s))""",
                          (table.schema, table.name, *_CASCADING, *_CASCADING))
        if cascading:
            name, parent, on_delete, on_update = cascading[0]
            raise ShardMoveError(
                f"check 'foreign keys': {table.moved.name} {where} has foreign key {name} to "
                f"{parent} (ON DELETE {on_delete}, ON UPDATE {on_update}); MariaDB fires no "
                "trigger for rows a cascade changes, so the capture and the fence would miss "
                "them: use RESTRICT or NO ACTION and change the child rows explicitly")

    def _check_source_privileges(self, s: Any, tables: Sequence[_Table]) -> None:
        where = f"on the source {self._source.description}"
        for table in tables:
            if not _has_privilege(s, "TRIGGER", table.schema, table.name):
                raise ShardMoveError(
                    f"check 'privileges': the mover's account has no TRIGGER privilege on "
                    f"{table.moved.name} {where}; the capture and the fence are triggers: "
                    f"GRANT TRIGGER ON {table.schema}.{table.name} TO <account>")
        home = self._home("source")
        for privilege in ("CREATE", "DROP"):
            if not _has_privilege(s, privilege, home, None):
                raise ShardMoveError(
                    f"check 'privileges': the mover's account has no {privilege} privilege on "
                    f"database {home} {where}; the move keeps its changelog and fence tables "
                    f"there: GRANT CREATE, DROP ON {home}.* TO <account>")
        log_bin, trusted = _rows(s, "SELECT @@log_bin, @@log_bin_trust_function_creators")[0]
        if log_bin and not trusted and not _has_privilege(s, "SUPER", None, None):
            raise ShardMoveError(
                f"check 'binlog': binary logging is on {where} and "
                "log_bin_trust_function_creators is OFF, so creating triggers needs the SUPER "
                "privilege, which the mover's account lacks: SET GLOBAL "
                "log_bin_trust_function_creators = 1 (dynamic; also in the server's "
                "configuration to survive a restart) or GRANT SUPER ON *.* TO <account>")

    def _check_target(self, t: Any, source: Sequence[_Table], target: Sequence[_Table]) -> None:
        where = f"on the target {self._target.description}"
        for s_table, t_table in zip(source, target, strict=True):
            s_cols = [c.describe() for c in s_table.columns]
            t_cols = [c.describe() for c in t_table.columns]
            if s_cols != t_cols:
                raise ShardMoveError(
                    f"check 'columns': {s_table.moved.name} differs between source and target "
                    f"(name, type, character set, collation, generated, in order): source "
                    f"{s_cols}, target {t_cols}; run the same migrations on both")
            # Other moves' fence and capture triggers act on their own shard only.
            others = [name for (name,) in _rows(
                t, """SELECT TRIGGER_NAME FROM information_schema.TRIGGERS
                      WHERE EVENT_OBJECT_SCHEMA = %s AND EVENT_OBJECT_TABLE = %s
                      AND TRIGGER_NAME NOT LIKE 'sfdb\\_fence\\_%%'
                      AND TRIGGER_NAME NOT LIKE 'sfdb\\_capture\\_%%'""",
                (t_table.schema, t_table.name))]
            if others:
                raise ShardMoveError(
                    f"check 'target triggers': {t_table.moved.name} {where} has triggers "
                    f"{others}; the copy inserts every row of the shard there and would fire "
                    "them once per row (MariaDB cannot turn triggers off for one session): drop "
                    "them for the move, or move without them")
            if _one(t, f"SELECT 1 FROM {t_table.sql} WHERE {self._in_shard(t_table)} LIMIT 1"):
                raise ShardMoveError(
                    f"check 'target rows': {t_table.moved.name} {where} already has rows of "
                    f"shard {self.shard} ({t_table.moved.id_column} & {self.mask} = "
                    f"{self.shard}); delete them (an aborted move's copy?) before moving the "
                    "shard there")
        home = self._home("target")
        for privilege in ("CREATE", "DROP", "INSERT", "DELETE"):
            if not _has_privilege(t, privilege, home, None):
                raise ShardMoveError(
                    f"check 'privileges': the mover's account has no {privilege} privilege on "
                    f"database {home} {where}: GRANT CREATE, DROP, INSERT, DELETE ON {home}.* "
                    "TO <account>")

    # -- capture -----------------------------------------------------------------------------

    def capture(self) -> dict[str, Any]:
        """Source: the fence table (its row not fenced), the changelog, then on every moved
        table the fence and capture triggers; rerunnable, returns the names to journal.

        ``CREATE TRIGGER`` takes the table's exclusive metadata lock, which no transaction
        that has used the table (readers too) may hold: each attempt takes it at once or gives
        up, retried for up to ``ddl_timeout_s`` (:meth:`_bounded_ddl`). The step runs under
        the move's lock on the source (:meth:`_ddl_lock`). Once a table's triggers exist, every
        change of the shard's rows commits with its changelog row; every change committed
        before is visible to the copy, which starts after this step.
        """
        with self._source.session() as s:
            tables = self._resolve(s, "source")
            with self._ddl_lock(s, "capture"):
                return self._capture(s, tables)

    def _capture(self, s: Any, tables: Sequence[_Table]) -> dict[str, Any]:
        # Once the triggers exist, every write of the moved tables opens both tables: a
        # rerun's CREATE TABLE IF NOT EXISTS takes their metadata lock too.
        self._ddl(s, f"""CREATE TABLE IF NOT EXISTS {self._fence_table()} (
            move_id BIGINT NOT NULL PRIMARY KEY, shard INT NOT NULL,
            target VARCHAR(63) NOT NULL, fenced TINYINT NOT NULL) ENGINE=InnoDB""",
                  step="capture", what=f"table {self.fence_table_name} not created",
                  table=self._fence_table())
        _run(s, f"INSERT IGNORE INTO {self._fence_table()} VALUES (%s, %s, %s, 0)",
             (self.move_id, self.shard, self.target_name))
        self._ddl(s, f"""CREATE TABLE IF NOT EXISTS {self._changelog()} (
            seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
            tbl VARCHAR(130) NOT NULL, id BIGINT NOT NULL,
            applied TINYINT NOT NULL DEFAULT {_PENDING}, KEY pending (applied, seq)
            ) ENGINE=InnoDB AUTO_INCREMENT={_MARK_SEQ + 1}""",
                  step="capture", what=f"table {self.changelog_name} not created",
                  table=self._changelog())
        present = set(self._triggers(s, tables, "sfdb\\_fence")
                      + self._triggers(s, tables, "sfdb\\_capture"))
        for table in tables:
            for name, statement in self._trigger_sql(table):
                if f"{table.name}.{name}" not in present:
                    self._ddl(s, statement, step="capture", what=f"trigger {name} not "
                              f"created on {table.moved.name}", table=table.sql)
        return {"changelog": f"{self._home('source')}.{self.changelog_name}",
                "fence_table": f"{self._home('source')}.{self.fence_table_name}",
                "triggers": len(tables) * 2 * len(_EVENTS)}

    def _trigger_sql(self, table: _Table) -> list[tuple[str, str]]:
        """(name, CREATE TRIGGER) for the fence's three BEFORE triggers and the capture's three
        AFTER triggers of ``table``."""
        shard, move = self.shard, self.move_id
        message = (f"shard {shard} of {table.name} moved (SFM01 shard={shard} "
                   f"target={self.target_name} move={move}): reload the shard map and retry "
                   "the transaction")
        refuse = f"""BEGIN
    DECLARE v_fenced TINYINT DEFAULT 1;
    IF {{when}} AND NOT ({FENCE_BYPASS_VARIABLE} <=> {shard}) THEN
        SELECT f.fenced INTO v_fenced FROM {self._fence_table()} AS f
            WHERE f.move_id = {move} LOCK IN SHARE MODE;
        IF v_fenced THEN
            SIGNAL SQLSTATE '{FENCE_SQLSTATE}' SET MESSAGE_TEXT = '{message}';
        END IF;
    END IF;
END"""
        new, old = self._in_shard(table, "NEW"), self._in_shard(table, "OLD")
        fence_when = {"i": new, "u": f"({old} OR {new})", "d": old}
        log = (f"INSERT INTO {self._changelog()} (tbl, id) VALUES "
               f"('{table.moved.name}', {{row}}.{table.id})")
        capture_body = {
            "i": f"IF {new} THEN {log.format(row='NEW')}; END IF;",
            "u": (f"IF {old} THEN {log.format(row='OLD')}; END IF; "
                  f"IF {new} AND NOT (NEW.{table.id} <=> OLD.{table.id}) THEN "
                  f"{log.format(row='NEW')}; END IF;"),
            "d": f"IF {old} THEN {log.format(row='OLD')}; END IF;",
        }
        statements = []
        for event, name in zip(_EVENTS, self.fence_trigger_names(table.name), strict=True):
            statements.append((name, f"CREATE TRIGGER {_q(table.schema)}.{_q(name)} BEFORE "
                                     f"{_EVENT_NAMES[event]} ON {table.sql} FOR EACH ROW "
                                     + refuse.format(when=fence_when[event])))
        for event, name in zip(_EVENTS, self.capture_trigger_names(table.name), strict=True):
            statements.append((name, f"CREATE TRIGGER {_q(table.schema)}.{_q(name)} AFTER "
                                     f"{_EVENT_NAMES[event]} ON {table.sql} FOR EACH ROW "
                                     f"BEGIN {capture_body[event]} END"))
        return statements

    def _bounded(self, conn: Any, statement: str) -> bool:
        """Run a statement that waits for a row lock (the fence row, in a table without
        triggers), each attempt bounded by ``lock_timeout_ms``; whether it ran within
        ``fence_attempts`` attempts."""
        bounded = (f"SET STATEMENT max_statement_time = {self.lock_timeout_ms / 1000:.3f} FOR "
                   f"{statement}")
        return self._attempts(conn, bounded, self.fence_attempts)

    def _bounded_ddl(self, conn: Any, statement: str) -> tuple[bool, int, float]:
        """Run a statement that creates or drops a trigger or a table of the move, each
        attempt taking the table's metadata lock at once or giving up (``lock_wait_timeout =
        0``), tried again after a short pause (1 ms growing to 25 ms) for up to
        ``ddl_timeout_s``: whether it ran, the attempts and the seconds spent.

        Never waiting in the lock's queue: a DDL statement waiting for a table's exclusive
        metadata lock holds up every later statement on the table, and a transaction that
        read the table and then writes it (any shard's) then waits for the DDL, which waits
        for that transaction: MariaDB's deadlock detector picks the data change, not the DDL,
        as the victim (error 1213; 137-237 victims in five capture-and-cleanup rounds beside
        four read-then-write clients with attempts of ``lock_wait_timeout = 1``, none with
        attempts that never wait). A statement that never waits also never outlives a mover
        that died: nothing of it runs on after the mover's client is gone.

        Never bounded by ``max_statement_time``: the statement opens the table, which parses
        every trigger of it, and an interruption during that parse leaves the opened table in
        the table cache with a trigger marked broken, so that the next statement given it (the
        application's writes, of any shard) fails with 'Trigger ... has an error in its body'
        (seen on MariaDB 10.11 under load; reproduced with 1 ms attempts). ``lock_wait_timeout``
        ends only the wait for the lock."""
        bounded = f"SET STATEMENT lock_wait_timeout = 0 FOR {statement}"
        start = time.monotonic()
        pause = _DDL_PAUSE_S
        attempts = 0
        while True:
            attempts += 1
            try:
                _run(conn, bounded)
                return True, attempts, time.monotonic() - start
            except pymysql.MySQLError as error:
                if _errno(error) not in _GAVE_UP:
                    raise
            spent = time.monotonic() - start
            if spent + pause > self.ddl_timeout_s:
                return False, attempts, spent
            time.sleep(pause)  # the application's statements on the table go on meanwhile
            pause = min(pause * 1.5, _DDL_MAX_PAUSE_S)

    def _ddl(self, conn: Any, statement: str, *, step: str, what: str, table: str,
             side: str = "source") -> None:
        """:meth:`_bounded_ddl`, or a :class:`FenceBlockedError` of ``step`` naming ``what``
        was not done, the ``table`` whose metadata lock was never free, the time tried and
        the open transactions on ``side``."""
        done, attempts, spent = self._bounded_ddl(conn, statement)
        if done:
            return
        blockers = self._open_transactions(conn)
        raise FenceBlockedError(
            f"{step}: {what}: the metadata lock of {table} on the {side} "
            f"{self._connector(side).description} was held by another session at each of "
            f"{attempts} attempts in {spent:.1f} s (ddl_timeout_s={self.ddl_timeout_s:g}; an "
            "attempt takes the lock at once or gives up, so that no transaction queues behind "
            "it); "
            f"open transactions there (any of them may hold it): {_describe(blockers)}; end "
            f"them or run {step} again at a quieter time", blockers=blockers)

    @contextmanager
    def _ddl_lock(self, conn: Any, step: str) -> Iterator[None]:
        """Hold the move's lock on the source (:attr:`_ddl_lock_name`) on session ``conn``
        for a step that creates or drops the move's objects there, waiting up to
        :data:`COPY_LOCK_WAIT_S` for it.

        A mover that died mid-step may leave its last statement running on the server (its
        session ends only when that statement has); the lock is that session's until then, so
        once a later step holds it, nothing the dead mover sent can still create an object
        after this step has looked (a capture trigger created after the cleanup listed the
        triggers stayed behind)."""
        name = self._ddl_lock_name
        got = _one(conn, "SELECT GET_LOCK(%s, %s)", (name, COPY_LOCK_WAIT_S))
        if got != 1:
            holder = _one(conn, "SELECT IS_USED_LOCK(%s)", (name,))
            raise ShardMoveError(
                f"{step}: the lock {name} on the source {self._source.description} is held by "
                f"connection {holder} for {COPY_LOCK_WAIT_S} s: another step of move "
                f"{self.move_id} is running there (stop its mover, or KILL {holder})")
        try:
            yield
        finally:
            if conn.open:
                with suppress(pymysql.MySQLError):
                    _run(conn, "DO RELEASE_LOCK(%s)", (name,))

    def _attempts(self, conn: Any, statement: str, attempts: int) -> bool:
        for _ in range(attempts):
            try:
                _run(conn, statement)
                return True
            except pymysql.MySQLError as error:
                if _errno(error) not in _GAVE_UP:
                    raise
            time.sleep(self.retry_pause_s)  # the statements queued behind the attempt go on
        return False

    def _capture_complete(self, s: Any, tables: Sequence[_Table]) -> bool:
        return (self._table_exists(s, "source", self.changelog_name)
                and len(self._triggers(s, tables, "sfdb\\_capture"))
                == len(tables) * len(_EVENTS))

    # -- copy and apply ----------------------------------------------------------------------

    def copy(self) -> dict[str, Any]:
        """Target: the copy's progress table, one row per table (nothing copied yet); the copy
        itself runs in :meth:`advance`. Refused unless the capture is complete."""
        with self._source.session() as s:
            if not self._capture_complete(s, self._resolve(s, "source")):
                raise ShardMoveError(f"copy: the capture of move {self.move_id} is not complete "
                                     "on the source; run capture first")
        with self._target.session() as t:
            self._resolve(t, "target")
            _run(t, f"""CREATE TABLE IF NOT EXISTS {self._progress()} (
                tbl VARCHAR(130) NOT NULL PRIMARY KEY, last_id BIGINT NULL,
                rows_copied BIGINT NOT NULL DEFAULT 0, done TINYINT NOT NULL DEFAULT 0
                ) ENGINE=InnoDB""")
            _run(t, f"INSERT IGNORE INTO {self._progress()} (tbl) VALUES "
                    f"{', '.join(['(%s)'] * len(self.tables))}",
                 tuple(table.name for table in self.tables))
        return {"progress_table": f"{self._home('target')}.{self.progress_name}"}

    def _read_progress(self, t: Any) -> dict[str, tuple[int | None, int, bool]] | None:
        """Per table: the last copied ID (None: not started), rows copied, done; None when the
        copy has not started (no progress table)."""
        try:
            found = _rows(t, f"SELECT tbl, last_id, rows_copied, done FROM {self._progress()}")
        except pymysql.MySQLError as error:
            if _errno(error) != _NO_SUCH_TABLE:
                raise
            return None
        return {str(tbl): (None if last is None else int(last), int(rows), bool(done))
                for tbl, last, rows, done in found}

    def _lock_target(self, t: Any) -> None:
        """Hold the move's lock on the target session: one writer of the shard there at a
        time, so a killed mover's last statement ends before a new one reads or writes."""
        thread = t.thread_id()
        if self._locked_on == thread:
            return
        got = _one(t, "SELECT GET_LOCK(%s, %s)", (self._lock_name, COPY_LOCK_WAIT_S))
        if got != 1:
            holder = _one(t, "SELECT IS_USED_LOCK(%s)", (self._lock_name,))
            raise ShardMoveError(
                f"the lock {self._lock_name} on the target {self._target.description} is held "
                f"by connection {holder} for {COPY_LOCK_WAIT_S} s: another mover of move "
                f"{self.move_id} is running (stop it, or KILL {holder})")
        self._locked_on = thread

    def advance(self) -> int:
        """One bounded unit of the copy, in the caller's process: apply up to ``chunk_rows``
        captured changes, then copy up to ``chunk_rows`` rows of the first table not copied;
        how many changes and rows that was (0: nothing to do now).

        Safe to kill at any point: the target's progress commits with each chunk, a captured
        change is deleted from the changelog only after its row was written, and rewriting a
        row is idempotent.
        """
        with self._target.session() as t, self._source.session() as s:
            tables = self._resolve(s, "source")
            self._resolve(t, "target")
            self._lock_target(t)
            progress = self._read_progress(t)
            if progress is None:
                raise ShardMoveError("advance: the copy has not started (no progress table on "
                                     "the target); run copy first")
            with _bypassing(t, self.shard):
                applied = self._apply_batch(s, t, tables, progress)
                return applied + self._copy_chunk(s, t, tables, progress)

    def _copy_chunk(self, s: Any, t: Any, tables: Sequence[_Table],
                    progress: dict[str, tuple[int | None, int, bool]]) -> int:
        """Copy the next chunk of the first table not done; rows copied (0: nothing left).
        A table whose last chunk is empty is marked done and the next one's chunk copied in
        the same call: a 0 would tell the mover's wait there was nothing to do, and it would
        pause before the next table.

        The chunk is read in ``_COPY_PARTS`` parts, each inserted on the target while the
        next is read on the source by a second thread (each session used by one thread at a
        time), as a dump piped into a load overlaps the two: reading the whole chunk, then
        inserting it, took 10-25% longer (docs/design/shard-moves.md). The target commits the
        chunk and its progress in one transaction.
        """
        part_rows = -(-self.chunk_rows // _COPY_PARTS)
        for table in tables:
            name = table.moved.name
            last, copied, done = progress.get(name, (None, 0, False))
            if done:
                continue
            t_table = self._resolved[("target", name)]
            rows, wanted = 0, min(part_rows, self.chunk_rows)
            with _transaction(t), ThreadPoolExecutor(1, self.name) as reader:
                part = self._read_part(s, table, last, wanted)
                while True:
                    rows += part.rows
                    last = part.last_id if part.rows else last
                    finished = part.rows < wanted
                    following = None
                    if not finished and rows < self.chunk_rows:
                        wanted = min(part_rows, self.chunk_rows - rows)
                        following = reader.submit(self._read_part, s, table, last, wanted)
                    if part.joined is not None:
                        _run(t, self._insert_head(t_table) + part.joined)
                    else:
                        self._insert(t, t_table, part.literals)
                    if following is None:
                        break
                    part = following.result()
                # An upsert: a copy step that died after creating the table may have left
                # a table's row out (recording nothing would copy the chunk again).
                _run(t, f"INSERT INTO {self._progress()} (tbl, last_id, rows_copied, done) "
                        "VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE last_id = "
                        "VALUES(last_id), rows_copied = rows_copied + VALUES(rows_copied), "
                        "done = VALUES(done)",
                     (name, last, rows, int(finished)))
            progress[name] = (last, copied + rows, finished)
            if rows:
                return rows
        return 0

    def _read_part(self, s: Any, table: _Table, after: int | None, limit: int) -> _Part:
        """Up to ``limit`` rows of the shard in ``table`` with an ID above ``after``, in ID
        order, as an INSERT's VALUES lists.

        The source joins them into one text (``GROUP_CONCAT``), so the mover parses one value
        per part, not one row per row: the driver's per-row work in Python was most of the
        mover's CPU, and beside the shop's writers on two cores the copy ran at 0.45x of
        ``mariadb-dump | mariadb`` (0.62-0.76x joined; docs/design/shard-moves.md). The join is
        checked whole (every row's length in it, no row's literal null), and a part wider than
        :data:`_MAX_STATEMENT_BYTES` is read again row by row, as is the rest of its table."""
        name = table.moved.name
        where = "" if after is None else f"{table.id} > %s AND "
        params = ((after,) if after is not None else ()) + (limit,)
        if name not in self._wide:
            [(rows, last, whole, joined)] = _rows(s, f"""SET STATEMENT time_zone = '{_UTC}',
                group_concat_max_len = {_MAX_STATEMENT_BYTES} FOR
                SELECT n, last_id, n = non_null AND LENGTH(j) = bytes + n - 1, j FROM (
                    SELECT COUNT(*) AS n, COUNT(l) AS non_null, MAX(i) AS last_id,
                        SUM(LENGTH(l)) AS bytes, GROUP_CONCAT(l ORDER BY i SEPARATOR ',') AS j
                    FROM (SELECT {table.id} AS i, {table.row_literal()} AS l FROM {table.sql}
                        WHERE {where}{self._in_shard(table)} ORDER BY {table.id} LIMIT %s
                    ) AS part) AS joined""", params)
            if not rows:
                return _Part(0, None)
            if whole:
                return _Part(int(rows), int(last), joined=joined)
            self._wide.add(name)
        found = _rows(s, f"""SET STATEMENT time_zone = '{_UTC}' FOR
            SELECT {table.id}, {table.row_literal()} FROM {table.sql}
            WHERE {where}{self._in_shard(table)} ORDER BY {table.id} LIMIT %s""", params)
        return _Part(len(found), int(found[-1][0]) if found else None,
                     literals=[literal for _, literal in found])

    @staticmethod
    def _insert_head(table: _Table) -> str:
        return (f"SET STATEMENT time_zone = '{_UTC}', sql_mode = '{_COPY_SQL_MODE}', "
                f"foreign_key_checks = 0 FOR INSERT INTO {table.sql} ({table.column_list()}) "
                "VALUES ")

    def _insert(self, t: Any, table: _Table, literals: Sequence[str | None]) -> None:
        """INSERT rows given as the server's literals, in statements of at most
        :data:`_MAX_STATEMENT_BYTES` (a row wider than that alone)."""
        if any(literal is None for literal in literals):
            raise ShardMoveError(f"a row of {table.moved.name} is larger than the source's "
                                 "max_allowed_packet: raise it on the source")
        head = self._insert_head(table)
        batch: list[str] = []
        size = 0
        for literal in literals:
            assert literal is not None
            if batch and size + len(literal) > _MAX_STATEMENT_BYTES:
                _run(t, head + ",".join(batch))
                batch, size = [], 0
            batch.append(literal)
            size += len(literal) + 1
        if batch:
            _run(t, head + ",".join(batch))

    def _apply_batch(self, s: Any, t: Any, tables: Sequence[_Table],
                     progress: dict[str, tuple[int | None, int, bool]]) -> int:
        """Apply up to ``chunk_rows`` captured changes; how many were consumed.

        A change of a row the copy has already passed (ID at or below its table's last copied
        ID, or a table done) is applied: the row is read again from the source and replaces
        the target's, or is deleted there when the source has it no more. A change of a row
        the copy has not reached yet is only consumed: the copy reads that row later, as it
        is then. The changelog rows are deleted (kept as applied once the first verification
        pass marked the log) only after the target committed.
        """
        try:
            pending = _rows(s, f"SELECT seq, tbl, id FROM {self._changelog()} WHERE applied = "
                               f"{_PENDING} ORDER BY seq LIMIT %s", (self.chunk_rows,))
        except pymysql.MySQLError as error:
            if _errno(error) != _NO_SUCH_TABLE:
                raise
            raise ShardMoveError(f"advance: no changelog {self.changelog_name} on the source; "
                                 "run capture first") from None
        if not pending:
            return 0
        by_name = {table.moved.name: table for table in tables}
        wanted: dict[str, set[int]] = {}
        for _, tbl, row_id in pending:
            table = by_name.get(str(tbl))
            if table is None:
                continue
            last, _, done = progress.get(table.moved.name, (None, 0, False))
            if done or (last is not None and int(row_id) <= last):
                wanted.setdefault(table.moved.name, set()).add(int(row_id))
        current: dict[str, list[str]] = {}
        for name, ids in wanted.items():
            table = by_name[name]
            current[name] = [literal for batch in _batches(sorted(ids), _ID_BATCH)
                             for (literal,) in _rows(
                                 s, f"""SET STATEMENT time_zone = '{_UTC}' FOR
                                 SELECT {table.row_literal()} FROM {table.sql}
                                 WHERE {table.id} IN ({_in_list(len(batch))})""", tuple(batch))]
        if wanted:
            with _transaction(t):
                for name, ids in wanted.items():
                    t_table = self._resolved[("target", name)]
                    for batch in _batches(sorted(ids), _ID_BATCH):
                        _run(t, f"SET STATEMENT foreign_key_checks = 0 FOR DELETE t FROM "
                                f"{t_table.by_keys()}", (_key_list(batch),))
                    self._insert(t, t_table, current[name])
        seqs = [int(seq) for seq, _, _ in pending]
        if not self._marked:
            self._marked = _one(s, f"SELECT 1 FROM {self._changelog()} WHERE seq = "
                                   f"{_MARK_SEQ} AND applied = {_MARK}") is not None
        for batch in _batches(seqs, _ID_BATCH):
            if self._marked:
                _run(s, f"UPDATE {_by_keys(self._changelog(), 'seq', 'PRIMARY')} SET "
                        f"t.applied = {_APPLIED}", (_key_list(batch),))
            else:
                _run(s, f"DELETE t FROM {_by_keys(self._changelog(), 'seq', 'PRIMARY')}",
                     (_key_list(batch),))
        return len(pending)

    def copy_lost(self, *, finished: bool = True) -> str | None:
        """``None``: not detected on MariaDB. A progress table lost on the target (a backup
        restored) stops the copy's next step (``advance``: "run copy first"); abort the move
        and start it again."""
        return None

    def copy_stranded(self) -> str | None:
        """``None``: the copy runs in the mover's process, whose errors stop it at once."""
        return None

    def copy_progress(self) -> CopyProgress:
        """Target: each table's copy state (``i`` not started, ``d`` copying, ``r`` done)."""
        with self._target.session() as t:
            self._resolve(t, "target", required=False)
            progress = self._read_progress(t)
        if progress is None:
            raise ShardMoveError(f"copy_progress: no progress table {self.progress_name} on "
                                 "the target; run copy first")
        return CopyProgress({name: "r" if done else ("i" if last is None else "d")
                             for name, (last, _, done) in progress.items()}, len(self.tables))

    def copy_synced(self) -> bool:
        """Target: whether every table's initial copy is done."""
        return self.copy_progress().synced

    def rows_copied(self) -> int:
        """Target: rows the chunked copy has written so far (0 before it started)."""
        with self._target.session() as t:
            self._resolve(t, "target")
            progress = self._read_progress(t)
        return sum(rows for _, rows, _ in (progress or {}).values())

    def backlog(self) -> int | None:
        """Source: captured changes not yet applied to the target (None before capture)."""
        with self._source.session() as s:
            self._resolve(s, "source")
            if not self._table_exists(s, "source", self.changelog_name):
                return None
            return int(_one(s, f"SELECT COUNT(*) FROM {self._changelog()} WHERE applied = "
                               f"{_PENDING}"))

    def flush(self, *, source: bool = True, target: bool = True) -> None:
        """Nothing to do: the move's writes commit synchronously in its own sessions."""

    # -- fence, drain ------------------------------------------------------------------------

    def fence(self, *, terminate_blockers: bool = False) -> FenceResult:
        """Source: set the move's fence row, each attempt bounded by ``lock_timeout_ms``,
        retried up to ``fence_attempts`` times.

        Every write of the shard takes a shared lock on that row (the fence triggers' locking
        read) until its transaction ends, so the update waits for every transaction that has
        written the shard and not ended, while writes of the shard that arrive meanwhile queue
        behind it; other shards never touch the row. Once it commits, every change of the
        shard is in the changelog and every later write of the shard is refused. When the
        budget is spent (its last attempt lasting at least :data:`WATCHED_ATTEMPT_S`, and
        until they are seen), the transactions holding the row are reported
        (:class:`FenceBlockedError`), or with ``terminate_blockers`` their sessions are killed
        (their transactions roll back: nothing acknowledged is lost) and the budget tried once
        more. The position is the changelog's highest sequence number at the fence.
        """
        with self._source.session() as s:
            self._resolve(s, "source")
            state = self._fence_state(s)
            if state is None:
                raise ShardMoveError(f"fence: no fence row of move {self.move_id} on the "
                                     "source; run capture first")
            if state:
                return FenceResult(position=self._position(s), attempts=0)
            attempts = 0
            terminated: tuple[int, ...] = ()
            for round_ in range(2 if terminate_blockers else 1):
                taken, tried, blockers = self._fence_attempts(s)
                attempts += tried
                if taken:
                    return FenceResult(position=self._position(s), attempts=attempts,
                                       terminated=terminated)
                if round_ == 0 and terminate_blockers and blockers:
                    terminated = tuple(sorted({b.pid for b in blockers}))
                    for pid in terminated:
                        with suppress(pymysql.MySQLError):  # ended meanwhile
                            _run(s, f"KILL CONNECTION {int(pid)}")
                    continue
                raise FenceBlockedError(
                    f"fence: the fence row was not locked in {attempts} attempts of "
                    f"{self.lock_timeout_ms} ms on the source {self._source.description}; "
                    f"transactions that wrote shard {self.shard} and are still open: "
                    f"{_describe(blockers)}; end them or rerun fence with "
                    "terminate_blockers=True (the fence is not up)", blockers=blockers)
        raise AssertionError("unreachable")  # pragma: no cover

    def _fence_state(self, s: Any) -> bool | None:
        if not self._table_exists(s, "source", self.fence_table_name):
            return None
        fenced = _one(s, f"SELECT fenced FROM {self._fence_table()} WHERE move_id = %s",
                      (self.move_id,))
        return None if fenced is None else bool(fenced)

    def _position(self, s: Any) -> str:
        if not self._table_exists(s, "source", self.changelog_name):
            return "changelog:none"
        return f"changelog:{int(_one(s, f'SELECT COALESCE(MAX(seq), 0) FROM {self._changelog()}'))}"

    def _fence_attempts(self, s: Any) -> tuple[bool, int, tuple[Blocker, ...]]:
        """Up to ``fence_attempts`` bounded updates of the fence row, the last one watched
        (:class:`_FenceWatch`): it lasts at least :data:`WATCHED_ATTEMPT_S` and until a second
        session has named the transactions it waits for. A fixed window was not enough: 100 ms
        is too short to be seen on a busy server, and on a loaded one so was a second (the
        report named nobody, and ``terminate_blockers`` had nobody to end)."""
        for attempt in range(1, self.fence_attempts):
            if self._fence_attempt(s, self.lock_timeout_ms / 1000):
                return True, attempt, ()
            time.sleep(self.retry_pause_s)  # the writes queued behind the attempt go on
        least_s = max(self.lock_timeout_ms / 1000, WATCHED_ATTEMPT_S)
        with _FenceWatch(self._source, waiter=int(s.thread_id()), least_s=least_s,
                         table=f"{self._home('source')}.{self.fence_table_name}") as watch:
            taken = self._fence_attempt(s, watch.bound_s, ended_by_watch=True)
        return taken, self.fence_attempts, () if taken else watch.blockers

    def _fence_attempt(self, s: Any, bound_s: float, *, ended_by_watch: bool = False) -> bool:
        """One update of the fence row, given up after ``bound_s`` (or when the watch ends
        it): whether it was made."""
        try:
            _run(s, f"SET STATEMENT max_statement_time = {bound_s:.3f} FOR UPDATE "
                    f"{self._fence_table()} SET fenced = 1 WHERE move_id = %s", (self.move_id,))
            return True
        except pymysql.MySQLError as error:
            if _errno(error) in _GAVE_UP or (ended_by_watch and _errno(error) == _INTERRUPTED):
                return False
            raise

    def _open_transactions(self, s: Any) -> tuple[Blocker, ...]:
        """Every open transaction of another session (one may hold a table's metadata lock)."""
        return tuple(Blocker(pid=int(r[0]), state=str(r[1]), xact_age_s=float(r[2]),
                             application_name=str(r[3]), table="")
                     for r in _rows(s, """SELECT t.trx_mysql_thread_id,
                            COALESCE(p.COMMAND, t.trx_state),
                            TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6,
                            COALESCE(CONCAT(p.USER, '@', p.HOST), '')
                        FROM information_schema.INNODB_TRX t
                        LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
                        WHERE t.trx_mysql_thread_id <> CONNECTION_ID()
                        ORDER BY t.trx_started LIMIT 20"""))

    def drained(self, position: str) -> bool:
        """Whether every change captured up to the fence is applied on the target (and the
        copy done). Applies up to a few batches itself (bounded), so polling it drains."""
        if not isinstance(position, str) or not position.startswith("changelog:"):
            raise InvalidArgumentError(f"position {position!r} is not a MariaDB fence position "
                                       "(changelog:<seq>)")
        with self._source.session() as s:
            self._resolve(s, "source")
            if not self._fence_state(s):
                raise ShardMoveError(f"drained: the fence of move {self.move_id} is not up on "
                                     "the source; run fence first")
        for _ in range(_DRAIN_BATCHES):
            if self.copy_synced() and not self.backlog():
                return True
            self.advance()
        return bool(self.copy_synced() and not self.backlog())

    def unfence(self) -> list[str]:
        """Source: lower this move's fence, then drop its triggers and its row's table (an
        abort, or an earlier move's fence on a server the shard comes back to). Each ``DROP``
        takes its table's metadata lock at once or gives up, retried like the capture's, under
        the move's lock on the source."""
        with self._source.session() as s:
            tables = self._resolve(s, "source", required=False)
            with self._ddl_lock(s, "unfence"):
                return self._unfence(s, tables)

    def _unfence(self, s: Any, tables: Sequence[_Table]) -> list[str]:
        present = self._triggers(s, tables, "sfdb\\_fence")
        has_table = self._table_exists(s, "source", self.fence_table_name)
        if has_table and self._fence_state(s) and not self._bounded(
            s, f"UPDATE {self._fence_table()} SET fenced = 0 WHERE move_id = "
               f"{self.move_id}"
        ):
            raise FenceBlockedError(
                f"unfence: the fence row of move {self.move_id} was not locked in "
                f"{self.fence_attempts} attempts of {self.lock_timeout_ms} ms",
                blockers=self._open_transactions(s))
        self._drop_triggers(s, tables, present, "unfence")
        if has_table:
            self._ddl(s, f"DROP TABLE IF EXISTS {self._fence_table()}", step="unfence",
                      what=f"table {self.fence_table_name} not dropped",
                      table=self._fence_table())
            present.append(f"{self.fence_table_name} (table)")
        return present

    def _drop_triggers(self, conn: Any, tables: Sequence[_Table], names: Sequence[str],
                       step: str) -> None:
        schema = {table.name: table.schema for table in tables}
        for label in names:
            table, _, trigger = label.partition(".")
            self._ddl(conn, f"DROP TRIGGER IF EXISTS {_q(schema[table])}.{_q(trigger)}",
                      step=step, what=f"trigger {trigger} not dropped from {table}",
                      table=f"{_q(schema[table])}.{_q(table)}")

    def shard_fences_on_target(self) -> list[str]:
        """Target: the fence triggers of this shard on the moved tables, left by an earlier
        move of the shard away from the target (found by the shard in their error message);
        ``sfdb_fence_<move id>_...`` names the move whose :meth:`unfence` drops them."""
        with self._target.session() as t:
            tables = self._resolve(t, "target", required=False)
            found = []
            for table in tables:
                for name, body in _rows(t, """SELECT TRIGGER_NAME, ACTION_STATEMENT
                        FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = %s
                        AND EVENT_OBJECT_TABLE = %s AND TRIGGER_NAME LIKE 'sfdb\\_fence\\_%%'
                        ORDER BY TRIGGER_NAME""", (table.schema, table.name)):
                    match = _FENCE_MARK.search(str(body))
                    if match and int(match[1]) == self.shard:
                        found.append(str(name))
        return found

    # -- verify ------------------------------------------------------------------------------

    def verify_before_fence(self, *, timeout_s: float = 120.0) -> Verification:
        """The first pass of the two-pass verification, while the shard is still written.

        With the copy done and no change being applied (this backend applies in the caller's
        process, and the move's lock on the target excludes another), a snapshot of the target
        then one of the source: every row of the shard whose ID the changelog does not name in
        the source's snapshot is the same on both sides (its last change was applied from a
        read of the source made before the snapshot, and any later change would be in the
        log), so those rows are compared, each side in its snapshot. Equal: a mark row in the
        changelog, after which applied changes are kept (flagged) instead of deleted, so
        :meth:`verify` can compare only the rows the log names. ``timeout_s`` bounds the wait
        for the copy to finish.
        """
        deadline = time.monotonic() + timeout_s
        while not self.copy_synced():
            if time.monotonic() > deadline:
                raise ShardMoveError(f"verify_before_fence: the copy did not finish in "
                                     f"{timeout_s:g} s")
            self.advance()
        with self._target.session() as t, self._source.session() as s:
            tables = self._resolve(s, "source")
            self._resolve(t, "target")
            self._lock_target(t)
            self._compare_columns(s, t, "verify_before_fence")
            with _transaction(t, snapshot=True), _transaction(s, snapshot=True):
                logged = self._logged(s)
                source, target = {}, {}
                for table in tables:
                    t_table = self._resolved[("target", table.moved.name)]
                    ids = sorted(logged.get(table.moved.name, set()))
                    source[table.moved.name] = _minus(self._checksum(s, table),
                                                      self._checksum(s, table, only=ids))
                    target[table.moved.name] = _minus(self._checksum(t, t_table),
                                                      self._checksum(t, t_table, only=ids))
            result = Verification(source=source, target=target, scope="before_fence",
                                  changed={tb.name: len(logged.get(tb.name, ()))
                                           for tb in self.tables})
            self._raise_if_different(result, "verify_before_fence")
            _run(s, f"INSERT IGNORE INTO {self._changelog()} (seq, tbl, id, applied) VALUES "
                    f"({_MARK_SEQ}, '*pass1', 0, {_MARK})")
            self._marked = True
        return result

    def verify(self) -> Verification:
        """Both sides, after the drain: columns, then per table the shard's row count, sum and
        bit_xor of a 64-bit hash of each row (MD5 of the server's literal of every column, in
        order, timestamps in UTC). Equal, or :class:`VerificationMismatchError`.

        When :meth:`verify_before_fence` marked the changelog and the capture is intact, only
        the rows the log names are compared (``scope "changed"``); otherwise every row.
        """
        with self._target.session() as t, self._source.session() as s:
            tables = self._resolve(s, "source")
            self._resolve(t, "target")
            self._lock_target(t)
            self._compare_columns(s, t, "verify")
            changelog = self._table_exists(s, "source", self.changelog_name)
            if changelog:
                pending = int(_one(s, f"SELECT COUNT(*) FROM {self._changelog()} WHERE "
                                      f"applied = {_PENDING}"))
                if pending:
                    raise ShardMoveError(f"verify: {pending} captured change(s) not applied "
                                         "to the target yet; drain first")
            marked = changelog and _one(
                s, f"SELECT 1 FROM {self._changelog()} WHERE seq = {_MARK_SEQ} "
                   f"AND applied = {_MARK}") is not None
            scoped = marked and self._capture_complete(s, tables)
            with _transaction(t, snapshot=True), _transaction(s, snapshot=True):
                logged = self._logged(s) if scoped else {}
                source, target = {}, {}
                for table in tables:
                    t_table = self._resolved[("target", table.moved.name)]
                    only = sorted(logged.get(table.moved.name, set())) if scoped else None
                    source[table.moved.name] = self._checksum(s, table, only=only)
                    target[table.moved.name] = self._checksum(t, t_table, only=only)
            result = (Verification(source=source, target=target, scope="changed",
                                   changed={tb.name: len(logged.get(tb.name, ()))
                                            for tb in self.tables})
                      if scoped else Verification(source=source, target=target))
        self._raise_if_different(result, "verify")
        return result

    def _logged(self, s: Any) -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for tbl, row_id in _rows(s, f"SELECT DISTINCT tbl, id FROM {self._changelog()} "
                                    f"WHERE applied <> {_MARK}"):
            found.setdefault(str(tbl), set()).add(int(row_id))
        return found

    def _checksum(self, conn: Any, table: _Table, *,
                  only: Sequence[int] | None = None) -> TableChecksum:
        """The shard's rows of ``table`` (only the IDs ``only`` when given, by the key)."""
        query = (f"SET STATEMENT time_zone = '{_UTC}' FOR SELECT COUNT(*), "
                 "CAST(COALESCE(SUM(h), 0) AS CHAR), COALESCE(BIT_XOR(h), 0) FROM "
                 f"(SELECT {table.row_hash()} AS h FROM {table.sql} WHERE "
                 f"{self._in_shard(table)}{{only}}) AS x")
        if only is None:
            row = _rows(conn, query.format(only=""))[0]
            return TableChecksum(rows=int(row[0]), hash_sum=str(row[1]), hash_xor=int(row[2]))
        total = TableChecksum(rows=0, hash_sum="0", hash_xor=0)
        for batch in _batches(list(only), _ID_BATCH):
            row = _rows(conn, query.format(
                only=f" AND {table.id} IN ({_in_list(len(batch))})"), tuple(batch))[0]
            total = TableChecksum(rows=total.rows + int(row[0]),
                                  hash_sum=str(int(total.hash_sum) + int(row[1])),
                                  hash_xor=total.hash_xor ^ int(row[2]))
        return total

    def _compare_columns(self, s: Any, t: Any, step: str) -> None:
        problems = []
        for table in self.tables:
            s_cols = [c.describe() for c in self._resolved[("source", table.name)].columns]
            t_cols = [c.describe() for c in self._resolved[("target", table.name)].columns]
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
                + "; ".join(different), verification=result)

    # -- cleanup and leftovers ---------------------------------------------------------------

    def cleanup(self) -> CleanupReport:
        """Drop the target's progress table, then the source's capture triggers and changelog.
        The fence (its triggers and row) stays: see :meth:`unfence`. A source that does not
        answer is reported as ``source_pending``; run cleanup again once it does."""
        report = CleanupReport()
        try:
            with self._target.session() as t:
                self._resolve(t, "target", required=False)
                if self._table_exists(t, "target", self.progress_name):
                    self._ddl(t, f"DROP TABLE IF EXISTS {self._progress()}", step="cleanup",
                              what=f"table {self.progress_name} not dropped",
                              table=self._progress(), side="target")
                    report.done.append(f"dropped {self.progress_name} on the target")
                with suppress(pymysql.MySQLError):
                    _run(t, "DO RELEASE_LOCK(%s)", (self._lock_name,))
                self._locked_on = None
        except MoveServerUnreachableError as error:
            report.done.append(f"target skipped: {error}")
        try:
            with self._source.session() as s:
                tables = self._resolve(s, "source", required=False)
                with self._ddl_lock(s, "cleanup"):
                    triggers = self._triggers(s, tables, "sfdb\\_capture")
                    self._drop_triggers(s, tables, triggers, "cleanup")
                    report.done.extend(f"dropped trigger {name} on the source"
                                       for name in triggers)
                    if self._table_exists(s, "source", self.changelog_name):
                        self._ddl(s, f"DROP TABLE IF EXISTS {self._changelog()}",
                                  step="cleanup", what=f"table {self.changelog_name} not "
                                  "dropped", table=self._changelog())
                        report.done.append(f"dropped {self.changelog_name} on the source")
                self._marked = False
        except MoveServerUnreachableError as error:
            report.source_pending = True
            report.source_error = str(error)
        return report

    def leftovers(self) -> Leftovers:
        """Everything of this move still present on either server (both must answer): the
        fence (triggers and its row's table) in ``fence_triggers``; the capture triggers,
        the changelog and the copy's progress table in ``verify_objects``."""
        with self._target.session() as t:
            self._resolve(t, "target", required=False)
            objects = ([f"target:{self.progress_name}"]
                       if self._table_exists(t, "target", self.progress_name) else [])
        with self._source.session() as s:
            tables = self._resolve(s, "source", required=False)
            fence = self._triggers(s, tables, "sfdb\\_fence")
            if self._table_exists(s, "source", self.fence_table_name):
                fence.append(f"{self.fence_table_name} (table)")
            objects += [f"source:{name}" for name in self._triggers(s, tables, "sfdb\\_capture")]
            if self._table_exists(s, "source", self.changelog_name):
                objects.append(f"source:{self.changelog_name}")
        return Leftovers(fence_triggers=tuple(fence), verify_objects=tuple(objects))

    # -- rows --------------------------------------------------------------------------------

    def measure(self) -> tuple[dict[str, int], int]:
        """Source: the shard's rows per table and their approximate bytes (rows times the
        table's average row length), for a plan."""
        rows: dict[str, int] = {}
        size = 0
        with self._source.session() as s:
            for table in self._resolve(s, "source"):
                count = int(_one(s, f"SELECT COUNT(*) FROM {table.sql} WHERE "
                                    f"{self._in_shard(table)}"))
                average = _one(s, "SELECT AVG_ROW_LENGTH FROM information_schema.TABLES WHERE "
                                  "TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                               (table.schema, table.name))
                rows[table.moved.name] = count
                size += count * int(average or 0)
        return rows, size

    def delete_source_rows(self, *, batch_size: int = 5000, pause_ratio: float = 1.0) -> int:
        """Source, after the flip and the barrier: delete the shard's rows in batches.

        Refused while the capture exists (its changelog would name every deleted row, and
        applying those would delete the target's rows) and unless the fence is up. The
        session passes the fence by :data:`FENCE_BYPASS_VARIABLE`.
        """
        with self._source.session() as s:
            tables = self._resolve(s, "source")
            if self._triggers(s, tables, "sfdb\\_capture") or self._table_exists(
                s, "source", self.changelog_name
            ):
                raise ShardMoveError(
                    f"delete_source_rows: the capture of move {self.move_id} still exists on "
                    "the source (its changelog would name the deleted rows); run cleanup first")
            if not (self._fence_state(s) and len(self._triggers(s, tables, "sfdb\\_fence"))
                    == len(tables) * len(_EVENTS)):
                raise ShardMoveError(
                    f"delete_source_rows: the fence of move {self.move_id} is not up on every "
                    "table of the source, which therefore may still serve the shard's writes")
            return self._delete_rows(s, tables, batch_size, pause_ratio)

    def delete_target_rows(self, *, batch_size: int = 5000, pause_ratio: float = 1.0) -> int:
        """Target, to abort: delete the shard's copied rows in batches (after cleanup)."""
        with self._target.session() as t:
            tables = self._resolve(t, "target")
            if self._table_exists(t, "target", self.progress_name):
                raise ShardMoveError(
                    f"delete_target_rows: the copy's progress table {self.progress_name} still "
                    "exists on the target and the copy could go on; run cleanup first")
            self._lock_target(t)
            return self._delete_rows(t, tables, batch_size, pause_ratio)

    def _delete_rows(self, conn: Any, tables: Sequence[_Table], batch_size: int,
                     pause_ratio: float) -> int:
        """Delete the shard's rows of every table, children first, in batches by ID.

        Each batch reads the next ``batch_size`` IDs of the shard after the last one deleted
        (one pass over the primary key in all) and deletes them in a short transaction; then
        the session sleeps ``pause_ratio`` times as long as the batch took, so the other
        shards' writes keep their rate. A last scan confirms nothing is left; it repeats if
        rows appeared, three passes at most.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size {batch_size!r} must be an int >= 1")
        if not isinstance(pause_ratio, int | float) or isinstance(pause_ratio, bool) or not (
            0 <= pause_ratio <= 100
        ):
            raise InvalidArgumentError(f"pause_ratio {pause_ratio!r} must be a number in "
                                       "[0, 100]")
        total = 0
        with _bypassing(conn, self.shard):
            for table in reversed(tables):  # children (listed after their parents) first
                for _pass in range(3):
                    found = 0
                    last: int | None = None
                    while True:
                        after = "" if last is None else f"{table.id} > %s AND "
                        ids = [int(r[0]) for r in _rows(
                            conn, f"SELECT {table.id} FROM {table.sql} WHERE {after}"
                                  f"{self._in_shard(table)} ORDER BY {table.id} LIMIT %s",
                            ((last,) if last is not None else ()) + (batch_size,))]
                        if not ids:
                            break
                        started = time.monotonic()
                        total += _run(conn, f"DELETE t FROM {table.by_keys()}",
                                      (_key_list(ids),))
                        found += len(ids)
                        last = ids[-1]
                        if pause_ratio:
                            time.sleep((time.monotonic() - started) * pause_ratio)
                    if not found:
                        break
                else:
                    raise ShardMoveError(
                        f"delete rows: {table.moved.name} still had rows of shard {self.shard} "
                        "after three passes: something keeps writing them; run the step again")
        return total


def _has_privilege(conn: Any, privilege: str, schema: str | None, table: str | None) -> bool:
    """Whether the session's account (or its current role) holds ``privilege`` globally, on
    ``schema`` (also through a wildcard database grant) or on ``schema.table``."""
    grantees = ("CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', "
                "SUBSTRING_INDEX(CURRENT_USER(), '@', -1), ''''), "
                "CONCAT('''', COALESCE(CURRENT_ROLE(), ''), '''')")
    query = (f"SELECT 1 FROM information_schema.USER_PRIVILEGES WHERE GRANTEE IN ({grantees}) "
             "AND PRIVILEGE_TYPE = %s")
    params: list[Any] = [privilege]
    if schema is not None:
        query += (f" UNION ALL SELECT 1 FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE "
                  f"IN ({grantees}) AND PRIVILEGE_TYPE = %s AND %s LIKE TABLE_SCHEMA")
        params += [privilege, schema]
    if schema is not None and table is not None:
        query += (f" UNION ALL SELECT 1 FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE "
                  f"IN ({grantees}) AND PRIVILEGE_TYPE = %s AND TABLE_SCHEMA = %s "
                  "AND TABLE_NAME = %s")
        params += [privilege, schema, table]
    return bool(_rows(conn, query + " LIMIT 1", tuple(params)))


def _minus(whole: TableChecksum, part: TableChecksum) -> TableChecksum:
    """The checksum of ``whole``'s rows that are not ``part``'s (count and sum subtract, xor
    cancels)."""
    return TableChecksum(rows=whole.rows - part.rows,
                         hash_sum=str(int(whole.hash_sum) - int(part.hash_sum)),
                         hash_xor=whole.hash_xor ^ part.hash_xor)


class _FenceWatch:
    """A second session beside the fence's watched attempt: it reads whom the attempt's
    session (``waiter``) waits for, and once it has named them and the attempt has lasted
    ``least_s``, ends the attempt (``KILL QUERY ID``: that statement only, never the session's
    next one). When the lock views cannot be read (no session, no ``PROCESS`` privilege) the
    attempt is bounded by ``least_s`` alone."""

    def __init__(self, endpoint: Any, *, waiter: int, least_s: float, table: str) -> None:
        self._endpoint, self._waiter, self._least_s, self._table = endpoint, waiter, least_s, table
        self.blockers: tuple[Blocker, ...] = ()
        self._readable = False
        self._ready, self._begun, self._ended = (threading.Event(), threading.Event(),
                                                 threading.Event())
        self._started = 0.0
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"sfdb-fence-watch-{waiter}")

    def __enter__(self) -> _FenceWatch:
        self._thread.start()
        self._ready.wait(CONNECT_TIMEOUT_S + WATCHED_ATTEMPT_MAX_S)
        self._started = time.monotonic()
        self._begun.set()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ended.set()
        self._thread.join(WATCHED_ATTEMPT_MAX_S)

    @property
    def bound_s(self) -> float:
        """The attempt's own bound: long while the watch can end it, else ``least_s``."""
        return max(self._least_s, WATCHED_ATTEMPT_MAX_S if self._readable else 0)

    def _watch(self) -> None:
        try:
            conn = self._endpoint.extra()
        except ShardMoveError:
            self._ready.set()
            return
        try:
            self._look(conn)  # proves the views readable before the attempt relies on it
            self._readable = True
            self._ready.set()
            self._begun.wait()
            while not self._ended.wait(_LOCK_VIEW_POLL_S):
                blockers, query_id = self._look(conn)
                if blockers:
                    self.blockers = blockers
                    if query_id is not None and (
                            time.monotonic() - self._started >= self._least_s):
                        with suppress(pymysql.MySQLError):  # the attempt ended meanwhile
                            _run(conn, f"KILL QUERY ID {int(query_id)}")
                        return
        except pymysql.MySQLError:
            pass  # the report names fewer blockers; the attempt ends at its own bound
        finally:
            self._ready.set()
            with suppress(Exception):
                conn.close()

    def _look(self, conn: Any) -> tuple[tuple[Blocker, ...], int | None]:
        rows = _rows(conn, """SELECT DISTINCT b.trx_mysql_thread_id,
                COALESCE(p.COMMAND, b.trx_state),
                TIMESTAMPDIFF(MICROSECOND, b.trx_started, NOW(6)) / 1e6,
                COALESCE(CONCAT(p.USER, '@', p.HOST), ''), q.QUERY_ID
            FROM information_schema.INNODB_LOCK_WAITS w
            JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id
            JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
            LEFT JOIN information_schema.PROCESSLIST p ON p.ID = b.trx_mysql_thread_id
            LEFT JOIN information_schema.PROCESSLIST q ON q.ID = r.trx_mysql_thread_id
            WHERE r.trx_mysql_thread_id = %s
            ORDER BY b.trx_mysql_thread_id""", (self._waiter,))
        blockers = tuple(Blocker(pid=int(r[0]), state=str(r[1]), xact_age_s=float(r[2]),
                                 application_name=str(r[3]), table=self._table) for r in rows)
        return blockers, next((int(r[4]) for r in rows if r[4] is not None), None)


def _describe(blockers: Sequence[Blocker]) -> str:
    if not blockers:
        return "none seen at the last attempt"
    return ", ".join(
        f"connection {b.pid} ({b.state}, transaction open {b.xact_age_s or 0:.1f} s, "
        f"account {b.application_name!r})" for b in blockers)


def _triple(checksum: TableChecksum) -> str:
    return f"({checksum.rows}, {checksum.hash_sum}, {checksum.hash_xor})"
