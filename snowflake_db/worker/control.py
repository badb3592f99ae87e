"""The control database as an allocator uses it: its private engine, and tables made on demand.

Work runs on one of the engine's connections. Until the worker tables are known to exist, a
database error from the work triggers a check: missing tables are created (``create_tables``,
then the work runs again) or reported. Checking only after a failure keeps the inspection off
the common path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from ..errors import AllocatorUnavailableError
from .connection import make_engine, safe_url_text
from .retry import jitter, retry
from .store import WorkerStore
from .timeouts import is_timeout

_T = TypeVar("_T")

#: CREATE TABLE attempts when other processes race to create the tables.
_CREATE_ATTEMPTS = 5


class ControlDatabase:
    """An allocator's engine on the control database and its worker tables."""

    def __init__(
        self,
        url: URL,
        store: WorkerStore,
        *,
        create_tables: bool,
        timeout_seconds: float,
        idle_transaction_seconds: float | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.store = store
        self.create_tables_on_demand = create_tables
        try:
            self.engine = make_engine(
                url,
                timeout_seconds=timeout_seconds,
                idle_transaction_seconds=idle_transaction_seconds,
                engine_options=engine_options,
            )
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"the database driver for {safe_url_text(url)} is not installed "
                f"({error}); install it, e.g. pip install 'snowflake-db[postgres]' (psycopg) "
                "or 'snowflake-db[mysql]' (PyMySQL)",
                name=error.name,
            ) from error
        self._tables_ready = False

    def run(self, work: Callable[[Connection], _T], *, transaction: bool = False) -> _T:
        """Run ``work`` on one of the engine's connections (tables created on demand), inside
        one transaction with ``transaction``."""
        if transaction:
            work = partial(_in_transaction, work)
        with self.engine.connect() as connection:
            if self._tables_ready:
                return work(connection)
            try:
                result = work(connection)
            except DBAPIError as error:
                if error.connection_invalidated or is_timeout(error):
                    raise  # the database did not answer: no second wait for it
                if connection.in_transaction():
                    connection.rollback()
                with connection.begin():
                    missing = self.store.missing_tables(connection)
                if missing and not self.create_tables_on_demand:
                    raise AllocatorUnavailableError(
                        f"the worker tables {', '.join(missing)} do not exist in "
                        f"{safe_url_text(self.url)}: create them with a migration "
                        "(snowflake_db.alembic / the snowflake_db Django app) or pass "
                        "create_tables=True"
                    ) from None
                if missing:
                    self.create_tables(connection)
                # Once more, with the tables in place (perhaps just created by another
                # process, which is also why none may be missing now); a second failure is real.
                result = work(connection)
            self._tables_ready = True
            return result

    def create_tables(self, connection: Connection) -> None:
        """CREATE TABLE for missing tables, tolerating processes that race to do the same.

        A racing process may have created one table and not yet the other, so after a failure
        the check (``checkfirst``) and creation run again, a bounded number of times.
        """

        def attempt() -> None:
            try:
                with connection.begin():
                    self.store.create_tables(connection)
            except DBAPIError:
                with connection.begin():
                    if not self.store.missing_tables(connection):
                        return  # another process finished the job
                raise

        retry(
            attempt,
            attempts=_CREATE_ATTEMPTS,
            retryable=lambda error: isinstance(error, DBAPIError),
            pause=jitter(0.01, 0.05),
        )
        self._tables_ready = True


def _in_transaction(work: Callable[[Connection], _T], connection: Connection) -> _T:
    with connection.begin():
        return work(connection)
