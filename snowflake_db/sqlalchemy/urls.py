"""``engine_url``: a platform's ``DATABASE_URL`` as a URL that :func:`sqlalchemy.create_engine`
accepts.

Platforms spell it ``postgres://`` (SQLAlchemy 1.4 dropped that alias: ``NoSuchModuleError``) or
``mysql://`` (which SQLAlchemy takes to mean mysqlclient, not the PyMySQL of the ``mysql``
extra). The worker allocator maps these forms to the installed driver with its URL normaliser
(:mod:`snowflake_db.worker._engine`); this gives the application's own engines the same
mapping and the same refusals, so both open the same database through the same driver.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from ..errors import InvalidArgumentTypeError

__all__ = ["engine_url"]


def engine_url(url: str | URL) -> URL:
    """``url`` with the installed driver named: ``postgres://`` and ``postgresql://`` become
    ``postgresql+psycopg://`` (else ``+psycopg2``), ``mysql://`` and ``mariadb://`` become
    ``+pymysql`` (else ``+mysqldb``). A URL naming its driver is checked and kept; SQLite is
    returned as given. Raises :class:`~snowflake_db.errors.InvalidArgumentError` naming the URL
    (password hidden) for an unparsable URL, another database or a driver not installed.
    """
    from ..worker._engine import parse_url, with_installed_driver

    if isinstance(url, str):
        return parse_url(url)
    if isinstance(url, URL):
        return with_installed_driver(url)
    raise InvalidArgumentTypeError(
        f"engine_url needs a database URL (str or sqlalchemy URL), got {type(url).__name__}"
    )
