"""Database URLs as users write them (``DATABASE_URL`` style), checked before any connection.

``postgres://`` and ``postgresql://`` map to the installed PostgreSQL driver (psycopg 3, else
psycopg2), ``mysql://`` and ``mariadb://`` to the installed MySQL driver (PyMySQL, else
mysqlclient), so a URL copied from a platform's ``DATABASE_URL`` works as it is. A URL naming no
host (or socket) or no database is refused: libpq and the MySQL drivers would otherwise fill in
their own defaults and silently open some other server's database.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from ..errors import CommandError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

#: Shown in ``--help`` and in every refusal.
URL_FORMS = (
    "postgresql://USER@HOST/DB (or postgres://), mysql:// or mariadb://USER@HOST/DB, "
    "or sqlite:///PATH"
)
#: (backend, driver modules in order of preference as (module, SQLAlchemy driver name), extra)
_DRIVERS = {
    "postgresql": ((("psycopg", "psycopg"), ("psycopg2", "psycopg2")), "postgres"),
    "mysql": ((("pymysql", "pymysql"), ("MySQLdb", "mysqldb")), "mysql"),
    "mariadb": ((("pymysql", "pymysql"), ("MySQLdb", "mysqldb")), "mysql"),
}
_ALIASES = {"postgres": "postgresql"}
#: Query parameters that name a local socket instead of a host.
_SOCKET_PARAMETERS = {
    "postgresql": ("host",),
    "mysql": ("unix_socket",),
    "mariadb": ("unix_socket",),
}


def resolve_url(text: str, origin: str) -> URL:
    """The SQLAlchemy URL to connect to, or a :class:`CommandError` naming ``origin``.

    ``origin`` is how the user gave it, written before the URL in messages (``"--url "`` or
    ``"SNOWFLAKE_WORKER_URL="``).
    """
    try:
        from sqlalchemy.engine import make_url
    except ImportError:
        raise CommandError(
            "this command needs SQLAlchemy and a driver: pip install 'snowflake-db[postgres]' "
            "(or [mysql])"
        ) from None
    try:
        url = make_url(text.strip())
    except Exception:
        raise CommandError(f"{origin}{text!r} is not a database URL; use {URL_FORMS}") from None
    shown = url.render_as_string(hide_password=True)
    backend, _, driver = url.drivername.partition("+")
    backend = _ALIASES.get(backend, backend)
    if backend == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise CommandError(
                f"{origin}{shown} names no SQLite file; use sqlite:///PATH (an in-memory "
                "database is private to one connection)"
            )
        return url
    if backend not in _DRIVERS:
        raise CommandError(f"{origin}{shown}: unknown database {backend!r}; use {URL_FORMS}")
    candidates, extra = _DRIVERS[backend]
    if not driver:
        installed = [name for module, name in candidates if importlib.util.find_spec(module)]
        if not installed:
            raise CommandError(
                f"{origin}{shown}: no {backend} driver is installed; "
                f"pip install 'snowflake-db[{extra}]'"
            )
        driver = installed[0]
    url = url.set(drivername=f"{backend}+{driver}")
    try:
        url.get_dialect()
    except Exception:
        raise CommandError(
            f"{origin}{shown}: SQLAlchemy knows no {backend} driver {driver!r}; leave it out "
            f"({backend}://USER@HOST/DB picks the installed one)"
        ) from None
    socket = any(url.query.get(name) for name in _SOCKET_PARAMETERS[backend])
    if not url.host and not socket:
        raise CommandError(
            f"{origin}{shown} names no host; write it out (e.g. {backend}://USER@127.0.0.1/DB) "
            "rather than relying on the driver's defaults"
        )
    if not url.database:
        raise CommandError(f"{origin}{shown} names no database; add /DBNAME after the host")
    return url
