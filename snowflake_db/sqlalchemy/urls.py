"""``engine_url``: a platform's ``DATABASE_URL`` as a URL that :func:`sqlalchemy.create_engine`
accepts.

Platforms spell it ``postgres://`` (SQLAlchemy 1.4 dropped that alias: ``NoSuchModuleError``) or
``mysql://`` (which SQLAlchemy takes to mean mysqlclient, not the PyMySQL of the ``mysql``
extra). The worker allocator maps these forms to the installed driver
(:func:`snowflake_db.worker._engine.with_installed_driver`); this gives the application's
own engines the same mapping, so both open the same database through the same driver.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["engine_url"]


def engine_url(url: str | URL) -> URL:
    """``url`` with the installed driver named: ``postgres://`` and ``postgresql://`` become
    ``postgresql+psycopg://`` (else ``+psycopg2``), ``mysql://`` and ``mariadb://`` become
    ``+pymysql`` (else ``+mysqldb``). A URL naming its driver is checked and kept; SQLite is
    returned as given. Raises :class:`~snowflake_db.errors.InvalidArgumentError` naming the URL
    (password hidden) for an unparsable URL, another database or a driver not installed.
    """
    from ..worker._engine import safe_url_text, with_installed_driver

    if isinstance(url, str):
        try:
            parsed = make_url(url.strip())
        except Exception:
            shown = url if "@" not in url else safe_url_text(url)  # no password to hide
            raise InvalidArgumentError(
                f"{shown!r} is not a database URL; use postgres://USER@HOST/DB, "
                "mysql://USER@HOST/DB or sqlite:///PATH"
            ) from None
    elif isinstance(url, URL):
        parsed = url
    else:
        raise InvalidArgumentTypeError(
            f"engine_url needs a database URL (str or sqlalchemy URL), got {type(url).__name__}"
        )
    return with_installed_driver(parsed)
