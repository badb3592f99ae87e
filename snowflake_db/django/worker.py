"""Worker IDs for Django: set up the process-wide generator from ``SNOWFLAKE_DB``.

With ``WORKER_SOURCE = "table"`` the worker ID is leased through
:class:`snowflake_db.worker.TableWorkerAllocator` from the tables that this app's migrations
create on the control database. The SQLAlchemy engine is built from that alias's Django
``DATABASES`` entry the first time an ID is needed (never at import or in ``AppConfig.ready``),
so ``manage.py`` commands that issue no ID never touch the control database, and the test
runner's renamed test database is the one used.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from ..generator import SnowflakeGenerator
from ..lease import WorkerLease
from ..process import WORKER_ID_ENV, WORKER_URL_ENV, configure, set_not_configured_help
from .conf import SnowflakeSettings, get_settings

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from ..clock import Clock
    from ..layout import Layout

__all__ = [
    "DjangoTableWorkerAllocator",
    "configure_from_settings",
    "control_allocator",
    "explain_invalid_settings",
    "sqlalchemy_url",
]

#: Where the docs explain the setting (named in NotConfiguredError and check hints).
README_SECTION = 'the docs page "Django: the SNOWFLAKE_DB setting" (docs/reference/settings.md)'
_NOT_CONFIGURED = "snowflake_db is not configured in this Django process: "

# Django OPTIONS keys that are Django's own, not driver connect arguments.
_DJANGO_ONLY_OPTIONS = {
    "postgresql": {"isolation_level", "server_side_binding", "pool", "assume_role", "pool_size"},
    "mysql": {"isolation_level"},
}


def _mysql_driver() -> str:
    # Django's MySQL backend imports MySQLdb: mysqlclient, or PyMySQL installed under that name
    # (pymysql.install_as_MySQLdb()). SQLAlchemy must use the same real driver.
    try:
        import MySQLdb  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        return "pymysql"
    return "pymysql" if MySQLdb.__name__ == "pymysql" else "mysqldb"


def _postgres_driver() -> str:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg2"
    return "psycopg"


def sqlalchemy_url(alias: str) -> URL:
    """A SQLAlchemy URL for a Django database alias (from its current ``settings_dict``)."""
    from sqlalchemy.engine import URL

    connection = connections[alias]
    params = connection.settings_dict
    vendor = connection.vendor
    options = {
        key: value
        for key, value in (params.get("OPTIONS") or {}).items()
        if key not in _DJANGO_ONLY_OPTIONS.get(vendor, set())
    }
    if vendor == "sqlite":
        # Django's SQLite OPTIONS are sqlite3.connect() arguments the allocator sets itself.
        return URL.create("sqlite", database=str(params["NAME"]))
    if vendor == "postgresql":
        drivername = f"postgresql+{_postgres_driver()}"
    elif vendor == "mysql":
        drivername = f"mysql+{_mysql_driver()}"
    else:
        raise NotImplementedError(
            f"database alias {alias!r} uses vendor {vendor!r}; set SNOWFLAKE_DB['ENGINE_URL'] "
            "to a SQLAlchemy URL for it"
        )
    # Only string and integer OPTIONS fit a URL (e.g. sslmode, options, charset, init_command);
    # for others (such as a MySQL "ssl" dict) set SNOWFLAKE_DB["ENGINE_URL"].
    port = params.get("PORT")
    host = params.get("HOST") or None
    query = {k: str(v) for k, v in options.items() if isinstance(v, str | int)}
    if host is None and not {"host", "unix_socket"} & set(query):
        # An empty HOST is Django's way to say "the local server": the worker URL must name it
        # (worker._engine.check_supported refuses driver defaults), so take the one Django's
        # own connection uses.
        if vendor == "postgresql":
            query["host"] = _postgres_socket_dir(connection)
        else:
            host = "localhost"  # what MySQLdb and PyMySQL connect to when no host is given
    return URL.create(
        drivername,
        username=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=host,
        port=int(port) if port else None,
        database=params.get("NAME") or None,
        query=query,
    )


def _postgres_socket_dir(connection: Any) -> str:
    """The host or socket directory Django's connection reached (libpq's default, PGHOST)."""
    connection.ensure_connection()
    return str(connection.connection.info.host)


#: Allocators that have built their table allocator (and so may hold database connections).
_open_allocators: weakref.WeakSet[DjangoTableWorkerAllocator] = weakref.WeakSet()


class DjangoTableWorkerAllocator:
    """A :class:`~snowflake_db.lease.WorkerAllocator` that builds its table allocator lazily.

    :class:`~snowflake_db.worker.TableWorkerAllocator` is created on the first ``acquire`` (the
    first ID) from the control alias's URL, with ``create_tables=False``: this app's migrations
    own the tables. It makes its own small engines (heartbeat on a separate connection, driver
    timeouts, SQLite locking) and renews them in forked children.
    """

    def __init__(self, alias: str | None = None, **options: Any) -> None:
        self.alias = alias
        self.options = options
        self._lock = threading.Lock()
        self._allocator: Any = None

    @property
    def allocator(self) -> Any:
        """The underlying ``TableWorkerAllocator`` (built on first use)."""
        with self._lock:
            if self._allocator is None:
                from ..worker import TableWorkerAllocator

                conf = get_settings()
                options = dict(conf.allocator_options)
                if conf.lease_seconds is not None:
                    options.setdefault("lease_seconds", conf.lease_seconds)
                options.update(self.options)
                options.setdefault("create_tables", False)
                url = conf.engine_url or sqlalchemy_url(self.alias or conf.control_database)
                self._allocator = TableWorkerAllocator(url, **options)
                _open_allocators.add(self)
            return self._allocator

    def acquire(self, *, layout: Layout, clock: Clock) -> WorkerLease:
        lease: WorkerLease = self.allocator.acquire(layout=layout, clock=clock)
        return lease

    @property
    def metrics_recorder(self) -> Any:
        """The table allocator's lease figures (None before it is built): see
        :mod:`snowflake_db.metrics`."""
        allocator = self._allocator
        return None if allocator is None else allocator.metrics_recorder

    def slot_counts(self, layout: Layout | None = None) -> Any:
        """The control database's slots by state (:class:`snowflake_db.metrics.SlotCounts`)."""
        return self.allocator.slot_counts(layout)

    def close(self) -> None:
        """Release this process's leases and close the allocator's connections.

        The generator notices the released lease at its next tick and leases again through
        this object, which then builds a new table allocator from the current settings.
        """
        with self._lock:
            allocator, self._allocator = self._allocator, None
        _open_allocators.discard(self)
        if allocator is not None:
            allocator.close()

    def __repr__(self) -> str:
        alias = self.alias or get_settings().control_database
        return f"<DjangoTableWorkerAllocator alias={alias!r}>"


def control_allocator(alias: str | None = None) -> Any:
    """A :class:`~snowflake_db.worker.TableWorkerAllocator` on the control database (or
    ``alias``) with ``SNOWFLAKE_DB``'s tables and options, for inspection and maintenance
    (``manage.py snowflake``, the admin): it creates no table and must be closed by the caller."""
    from ..worker import TableWorkerAllocator

    conf = get_settings()
    alias = alias or conf.control_database
    if conf.engine_url and alias == conf.control_database:
        url: Any = conf.engine_url
    else:
        url = sqlalchemy_url(alias)
    options = {**conf.allocator_options, "create_tables": False}
    if conf.lease_seconds is not None:
        options.setdefault("lease_seconds", conf.lease_seconds)
    return TableWorkerAllocator(url, **options)


@receiver(connection_created)
def _release_before_test_databases_change(*, connection: Any, **kwargs: Any) -> None:
    """Close table allocators before Django creates, clones or drops a test database.

    Django connects without a database (alias ``NO_DB_ALIAS``) only for that
    (django.db.backends.base.base.BaseDatabaseWrapper._nodb_cursor). PostgreSQL refuses to drop
    or copy a database another session is connected to, and MySQL's DROP DATABASE waits for
    open transactions: the allocator's own connections and heartbeat must be gone first.
    """
    if connection.alias != NO_DB_ALIAS:
        return
    for allocator in list(_open_allocators):
        allocator.close()


def configure_from_settings(conf: SnowflakeSettings | None = None) -> SnowflakeGenerator | None:
    """Set up ``snowflake_default()`` as ``SNOWFLAKE_DB`` says; return the generator, if any.

    Called by ``AppConfig.ready()``. Touches no database: a table lease is taken with the first
    ID, and again in every forked child (the generator notices the new process ID).
    ``"manual"`` leaves ``snowflake_db.configure()`` to you; ``"env"`` without the environment
    variables leaves the core's own fallback in place (the first ID then raises
    ``NotConfiguredError`` saying what to set).
    """
    conf = conf or get_settings()
    options = dict(conf.generator_options)
    if conf.worker_source == "manual":
        set_not_configured_help(
            f"{_NOT_CONFIGURED}settings.SNOWFLAKE_DB has WORKER_SOURCE 'manual', so call "
            "snowflake_db.configure(...) in every process (in each child after a fork) before "
            f"the first ID, or choose WORKER_SOURCE 'table'; see {README_SECTION}"
        )
        return None
    if conf.worker_source == "static":
        return configure(worker_id=conf.worker_id, layout=conf.layout, **options)
    if conf.worker_source == "table":
        return configure(allocator=DjangoTableWorkerAllocator(), layout=conf.layout, **options)
    if os.environ.get(WORKER_URL_ENV, "").strip() or os.environ.get(WORKER_ID_ENV, "").strip():
        return configure(layout=conf.layout, **options)
    set_not_configured_help(
        f"{_NOT_CONFIGURED}settings.SNOWFLAKE_DB has WORKER_SOURCE 'env' (the default) but "
        f"neither {WORKER_URL_ENV} nor {WORKER_ID_ENV} is set: set one, or set SNOWFLAKE_DB = "
        '{"WORKER_SOURCE": "table"} so each process leases a worker ID from the database; '
        f"see {README_SECTION}"
    )
    return None


def explain_invalid_settings(error: Exception) -> None:
    """Make the first ID's ``NotConfiguredError`` say that ``SNOWFLAKE_DB`` is invalid."""
    set_not_configured_help(
        f"{_NOT_CONFIGURED}{error} (manage.py check reports it as snowflake_db.E001); "
        f"see {README_SECTION}"
    )
