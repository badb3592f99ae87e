"""Database URLs as users write them (``DATABASE_URL`` style), checked before any connection.

``postgres://`` and ``postgresql://`` map to the installed PostgreSQL driver (psycopg 3, else
psycopg2), ``mysql://`` and ``mariadb://`` to the installed MySQL driver (PyMySQL, else
mysqlclient), so a URL copied from a platform's ``DATABASE_URL`` works as it is. A URL naming no
host (or socket) or no database is refused: libpq and the MySQL drivers would otherwise fill in
their own defaults and silently open some other server's database.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CommandError, InvalidArgumentError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


def resolve_url(text: str, origin: str) -> URL:
    """The SQLAlchemy URL to connect to, or a :class:`CommandError` naming ``origin``.

    ``origin`` is how the user gave it, written before the URL in messages (``"--url "`` or
    ``"SNOWFLAKE_WORKER_URL="``). The refusals are the allocator's own (one URL normaliser,
    :func:`snowflake_db.worker._engine.normalise_url`).
    """
    try:
        from ..worker._engine import normalise_url
    except ImportError:
        raise CommandError(
            "this command needs SQLAlchemy and a driver: pip install 'snowflake-db[postgres]' "
            "(or [mysql])"
        ) from None
    try:
        return normalise_url(text, origin=origin)
    except InvalidArgumentError as error:
        raise CommandError(str(error)) from None


def require_sqlite_file(url: URL, origin: str, hint: str = "") -> None:
    """Refuse a SQLite URL whose file does not exist, before anything connects: ``sqlite3``
    would create an empty file there (a typo in the path left behind as a new database)."""
    if url.get_backend_name() != "sqlite":
        return
    path = url.database or ""
    if path.startswith("file:"):  # a URI filename (?uri=true): file:PATH or file:///PATH
        path = path[len("file:"):].split("?", 1)[0]
        if path.startswith("//"):
            path = "/" + path[2:].partition("/")[2]
    if not Path(path).exists():
        raise CommandError(
            f"{origin.rstrip(' =')}: no such SQLite file {Path(path).absolute()}; check the "
            f"path{hint} (nothing was created)"
        )
