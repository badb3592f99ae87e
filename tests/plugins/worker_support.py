"""Helpers shared by tests/worker and the other areas that lease from a real table: short
leases, direct reads of the tables."""

from __future__ import annotations

import io
import os
import subprocess
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from sqlalchemy import case, column, create_engine, select, table, text, update
from sqlalchemy.engine import URL

from snowflake_db import MonotonicClock
from snowflake_db.worker import TableWorkerAllocator
from snowflake_db.worker._store import SlotRow, WorkerStore, db_now_ms

from .databases import ScratchDatabase

#: Short leases keep the tests fast; timing margins stay generous for a busy 2-core machine.
LEASE_SECONDS = 2.0
#: A lease that stays live with no renewal for the length of a test whose subject is not
#: renewal (a 2 s lease needs its heartbeat on time, which a loaded machine does not promise).
STILL_LIVE_LEASE_S = 60.0


def allocator(database: ScratchDatabase, **options: Any) -> TableWorkerAllocator:
    options.setdefault("lease_seconds", LEASE_SECONDS)
    return TableWorkerAllocator(database.url_string, **options)


def read_slots(url: URL | str) -> dict[int, SlotRow]:
    """The slot rows as another client sees them (own engine: only committed data)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {row.worker_id: row for row in WorkerStore().slots(connection)}
    finally:
        engine.dispose()


def database_now_ms(url: URL | str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(select(db_now_ms())).scalar_one())
    finally:
        engine.dispose()


def expire_lease(
    url: URL | str, worker_id: int, *, slots_table: str = "snowflake_worker_slots"
) -> None:
    """Put a lease where waiting it out would: its expiry and its high-water mark 1 ms before the
    database's now (a mark already below stays), as if its holder had stopped a lease length and
    a reserve ago. Exact and instant, where sleeping is neither; for a holder that no longer
    renews (``abandon()``, a killed process). A test whose subject is the lapse in real time
    waits it out instead."""
    slots = table(slots_table, column("worker_id"), column("expires_at_ms"),
                  column("high_water_ms"))
    # Every ID its holder issued has a tick at or before now: let the clock pass two more
    # milliseconds (the database shares this machine's clock), so that `past` is after them all
    # and the next holder of the slot, which starts after `past`, cannot repeat one.
    called_ms = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 < called_ms + 2:
        time.sleep(0.0005)
    past = db_now_ms() - 1
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            ended = connection.execute(
                update(slots)
                .where(slots.c.worker_id == worker_id, slots.c.expires_at_ms.is_not(None))
                .values(
                    expires_at_ms=past,
                    high_water_ms=case(
                        (slots.c.high_water_ms > past, past), else_=slots.c.high_water_ms
                    ),
                )
            )
            assert ended.rowcount == 1, f"worker {worker_id} holds no expiring lease"
    finally:
        engine.dispose()


def set_next_registration_id(database: ScratchDatabase, next_id: int) -> None:
    """Move the registrations table's auto-increment so the next key is ``next_id``."""
    table = "snowflake_worker_registrations"
    engine = create_engine(database.url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            if database.backend == "postgresql":
                connection.execute(
                    text("SELECT setval(pg_get_serial_sequence(:t, 'id'), :v, false)"),
                    {"t": table, "v": next_id},
                )
            elif database.backend == "mariadb":
                # ALTER TABLE takes no bind parameters; next_id is an int we computed.
                connection.execute(text(f"ALTER TABLE {table} AUTO_INCREMENT = {int(next_id)}"))
            else:
                connection.execute(
                    text("UPDATE sqlite_sequence SET seq = :v WHERE name = :t"),
                    {"t": table, "v": next_id - 1},
                )
    finally:
        engine.dispose()


def delete_registrations(database: ScratchDatabase) -> None:
    engine = create_engine(database.url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM snowflake_worker_registrations"))
    finally:
        engine.dispose()


def wait_for(condition: Callable[[], object], seconds: float, poll: float = 0.05) -> bool:
    """Whether ``condition()`` became true within ``seconds`` (checked every ``poll``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return bool(condition())


class OffsetClock:
    """Real (monotonic, wall-anchored) time shifted by ``offset_ms``, changeable while running:
    a host whose clock is off."""

    def __init__(self, offset_ms: int) -> None:
        self._base = MonotonicClock()
        self.offset_ms = offset_ms

    def __call__(self) -> int:
        return self._base() + self.offset_ms


def run_cli(
    *args: str, env: dict[str, str | None] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``snowflake-db ARGS`` as ``main()`` in this process, with its status and its captured
    stdout and stderr as a finished process would give them (a SystemExit, as argparse's usage
    errors raise, is a status too): for tests whose subject is not the process boundary (each
    interpreter costs about a second of CPU). ``env``: variables set (None: removed) while it
    runs; ``cwd``: the directory it runs in. Both are restored afterwards."""
    from snowflake_db.cli import main

    changes = {"SNOWFLAKE_WORKER_URL": None, **(env or {})}
    saved = {name: os.environ.get(name) for name in changes}
    here = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        for name, value in changes.items():
            _set_env(name, value)
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(here)
        for name, value in saved.items():
            _set_env(name, value)
    return subprocess.CompletedProcess(["snowflake-db", *args], status, out.getvalue(),
                                       err.getvalue())


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
