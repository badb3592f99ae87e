"""Bad allocator input is refused up front with one clear error naming the value and the limit,
never left to a driver's defaults or a later database error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from snowflake_db import InvalidArgumentError, Layout, MonotonicClock
from snowflake_db.worker import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS, TableWorkerAllocator
from snowflake_db.worker._engine import safe_url_text

from ..plugins.databases import ScratchDatabase


@pytest.fixture(autouse=True)
def _harmless_driver_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were a URL below accepted, libpq would fall back to these: a port nothing listens on,
    never the shared server."""
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")
    monkeypatch.setenv("PGDATABASE", "sfdb_nowhere")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://",
        "postgresql+psycopg:///",
        "postgresql+psycopg:///app",
        "postgresql+psycopg://postgres@/app",
        "mysql+pymysql://root@/app",
    ],
)
def test_a_url_without_host_or_socket_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match="names no host or socket") as caught:
        TableWorkerAllocator(url)
    assert safe_url_text(url) in str(caught.value)  # the value named


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://postgres@127.0.0.1:1",
        "postgresql+psycopg://postgres@127.0.0.1:1/",
        "postgresql+psycopg:///?host=/var/run/postgresql",
        "mysql+pymysql://root@127.0.0.1:1",
    ],
)
def test_a_url_without_a_database_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match="names no database"):
        TableWorkerAllocator(url)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///file:x?mode=memory&uri=true",
        "sqlite:///file:x?mode=memory&cache=shared&uri=true",
        "sqlite:///file::memory:?uri=true",
    ],
)
def test_in_memory_sqlite_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match="in-memory SQLite") as caught:
        TableWorkerAllocator(url)
    assert not isinstance(caught.value, TypeError)


def test_a_socket_in_the_query_names_the_server(postgres_db: ScratchDatabase) -> None:
    """``?host=`` is a host too: accepted (it then connects there, which may fail)."""
    url = postgres_db.url.set(host=None, port=None).update_query_dict({"host": "127.0.0.1"})
    with TableWorkerAllocator(url.set(port=postgres_db.url.port), lease_seconds=2) as alloc:
        assert alloc.workers() == []


def test_a_sqlite_file_uri_is_accepted(tmp_path: Path) -> None:
    with TableWorkerAllocator(f"sqlite:///file:{tmp_path}/w.db?uri=true") as alloc:
        assert alloc.workers() == []


@pytest.mark.parametrize("seconds", [MAX_LEASE_SECONDS + 1, 1e16])
def test_lease_seconds_above_the_maximum_is_refused(
    sqlite_db: ScratchDatabase, seconds: float
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"exceeds the maximum 86400 s") as caught:
        TableWorkerAllocator(sqlite_db.url_string, lease_seconds=seconds)
    assert f"lease_seconds={seconds}" in str(caught.value)


@pytest.mark.parametrize("seconds", [0.0004, 0.099])
def test_lease_seconds_below_the_minimum_is_refused_naming_it(
    sqlite_db: ScratchDatabase, seconds: float
) -> None:
    """The argument passed is named with its own limit, never the value derived from it
    (lease_seconds=0.0004 used to be refused as reserve_ahead_ms=0)."""
    with pytest.raises(InvalidArgumentError) as caught:
        TableWorkerAllocator(sqlite_db.url_string, lease_seconds=seconds)
    message = str(caught.value)
    assert message.startswith(f"lease_seconds={seconds} is below the minimum 0.1 s"), message
    assert "reserve_ahead_ms" not in message


def test_the_shortest_lease_is_accepted(sqlite_db: ScratchDatabase) -> None:
    with TableWorkerAllocator(sqlite_db.url_string, lease_seconds=MIN_LEASE_SECONDS) as alloc:
        assert alloc.reserve_ahead_ms == 100 and alloc.renew_every == pytest.approx(0.1 / 3)


def test_reserve_ahead_below_the_minimum_is_refused_naming_it(sqlite_db: ScratchDatabase) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^reserve_ahead_ms=0 is below the minimum 1"):
        TableWorkerAllocator(sqlite_db.url_string, reserve_ahead_ms=0)


def test_the_longest_lease_is_accepted_and_stored(sqlite_db: ScratchDatabase) -> None:
    with TableWorkerAllocator(sqlite_db.url_string, lease_seconds=MAX_LEASE_SECONDS) as alloc:
        lease = alloc.acquire(layout=Layout(), clock=MonotonicClock())
        row = alloc.workers()[0]
        assert row.expires_at_ms is not None
        assert row.expires_at_ms - row.db_now_ms > (MAX_LEASE_SECONDS - 60) * 1000
        lease.release()


def test_reserve_ahead_above_the_maximum_is_refused(sqlite_db: ScratchDatabase) -> None:
    with pytest.raises(InvalidArgumentError, match=r"reserve_ahead_ms=10000000000000000 exceeds"):
        TableWorkerAllocator(sqlite_db.url_string, reserve_ahead_ms=10**16)


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_platform_style_urls_use_the_installed_driver(
    backend: str, database_factory: Callable[[str], ScratchDatabase]
) -> None:
    """postgres://, mysql:// and mariadb:// as a platform's DATABASE_URL writes them."""
    database = database_factory(backend)
    url = database.url
    schemes = ["postgres", "postgresql"] if backend == "postgresql" else ["mysql", "mariadb"]
    for scheme in schemes:
        text = url.set(drivername=scheme).render_as_string(hide_password=False)
        with TableWorkerAllocator(text, lease_seconds=5) as allocator:
            assert "+" in allocator.url.drivername  # the installed driver, named
            lease = allocator.acquire(layout=Layout(), clock=MonotonicClock())
            assert 0 <= lease.worker_id <= Layout().max_worker_id


def test_an_unknown_database_or_driver_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown database 'oracle'"):
        TableWorkerAllocator("oracle://scott@db.example.com/orders")
    with pytest.raises(InvalidArgumentError, match="knows no postgresql driver 'nosuch'"):
        TableWorkerAllocator("postgresql+nosuch://u@db.example.com/orders")
