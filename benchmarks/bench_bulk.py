"""Bulk loads of orders with their items: ``snowflake_db.django.bulk.bulk_load`` vs Django's
``bulk_create``, and vs the database's own limit, same run.

Run it with ``.venv/bin/python benchmarks/bench_bulk.py`` (200,000 orders with 3 items each per
path and backend; ``--rows 20000`` for a quicker run, ``--backend postgresql`` or ``mariadb``
for one, ``--check`` to exit 1 when a target is missed). It creates scratch databases on the
servers of ``SNOWFLAKE_TEST_POSTGRES_URL`` / ``SNOWFLAKE_TEST_MARIADB_URL`` (default: the local
servers) and drops them afterwards.

Paths, each into its own pair of tables (``orders``, ``items`` with a foreign key to its order):

* ``BigAutoField bulk_create``: orders with ``RETURNING`` of their keys, then the items;
* ``SnowflakeAutoField bulk_create``: the same with Snowflake keys (made by the field);
* ``bulk_load``: ``bulk_load(orders, items)``, every key made up front (COPY on PostgreSQL,
  ``LOAD DATA LOCAL INFILE`` on MariaDB; ``bulk_load INSERT`` is MariaDB's fallback);
* ``raw COPY`` / ``raw LOAD DATA`` (the floor): the same rows as tuples prepared by hand with
  their keys, sent by psycopg ``COPY`` (or a hand-written file and ``LOAD DATA``), no Django.

Model instances (and the floor's tuples) are built before the clock starts, followed by a
``gc.collect()`` so that no path pays for the garbage collector's first scan of objects it was
handed; each path runs in one transaction per round, committed; the path that goes first
rotates every round.

Targets (issue 20): on PostgreSQL ``bulk_load`` >= 4x ``BigAutoField bulk_create`` and >= 0.8x
the raw COPY floor; on MariaDB >= 2x ``BigAutoField bulk_create``. The table gives each path
against ``BigAutoField bulk_create`` and against the floor, and on PostgreSQL the CPU seconds of
the server backend that served it (from ``/proc``, when the server runs on this machine): what
no client can take away. The floor's own ratio is printed too: a loader that reads model
instances cannot beat it. A report, never a unit test: on a busy machine absolute numbers move
between runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ITEMS_PER_ORDER = 3
TARGETS = {"postgresql": 4.0, "mariadb": 2.0}
FLOOR_TARGET = 0.8
PLACED_AT = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)


class Router:
    """Every query to the backend being measured (items follow their unsaved orders there)."""

    alias = "default"

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return Router.alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return Router.alias

    def allow_relation(self, *objs: Any, **hints: Any) -> bool:
        return True


def _databases(backends: list[str]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    from sqlalchemy import create_engine, text

    from tests.plugins.databases import server_url

    settings: dict[str, Any] = {}
    made = []
    for backend in backends:
        url = server_url(backend)
        name = f"sfdb_bench_bulk_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            quoted = f'"{name}"' if backend == "postgresql" else f"`{name}` CHARACTER SET utf8mb4"
            conn.execute(text(f"CREATE DATABASE {quoted}"))
        made.append((backend, admin, name))
        settings[backend] = {
            "ENGINE": "django.db.backends."
            + ("postgresql" if backend == "postgresql" else "mysql"),
            "NAME": name, "USER": url.username or "", "PASSWORD": url.password or "",
            "HOST": url.host or "", "PORT": str(url.port or ""),
            **({"OPTIONS": {"charset": "utf8mb4", "local_infile": True}}
               if backend == "mariadb" else {}),
        }
    return settings, made


def _drop(made: list[tuple[str, Any, str]]) -> None:
    from sqlalchemy import text

    for backend, admin, name in made:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            quoted = f'"{name}"' if backend == "postgresql" else f"`{name}`"
            conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}{force}"))
        admin.dispose()


def _models() -> dict[str, tuple[Any, Any]]:
    from django.db import models

    from snowflake_db.django import SnowflakeAutoField

    def pair(label: str, key: Any) -> tuple[Any, Any]:
        order_attrs = {
            "__module__": __name__,
            "id": key(primary_key=True),
            "customer_id": models.BigIntegerField(),
            "total_cents": models.IntegerField(),
            "status": models.CharField(max_length=16),
            "placed_at": models.DateTimeField(),
            "Meta": type("Meta", (), {"app_label": "snowflake_db",
                                      "db_table": f"bench_{label}_orders"}),
        }
        order = type(f"{label.title()}Order", (models.Model,), order_attrs)
        item_attrs = {
            "__module__": __name__,
            "id": key(primary_key=True),
            "order": models.ForeignKey(order, on_delete=models.CASCADE),
            "customer_id": models.BigIntegerField(),
            "sku": models.CharField(max_length=32),
            "quantity": models.IntegerField(),
            "price_cents": models.IntegerField(),
            "Meta": type("Meta", (), {"app_label": "snowflake_db",
                                      "db_table": f"bench_{label}_items"}),
        }
        item = type(f"{label.title()}Item", (models.Model,), item_attrs)
        return order, item

    return {
        "big": pair("big", models.BigAutoField),
        "snow": pair("snow", SnowflakeAutoField),
        "fast": pair("fast", SnowflakeAutoField),
        "raw": pair("raw", SnowflakeAutoField),
    }


def _objects(pair: tuple[Any, Any], start: int, count: int) -> tuple[list[Any], list[Any]]:
    order_model, item_model = pair
    orders = [order_model(customer_id=(start + i) % 5000, total_cents=start + i, status="new",
                          placed_at=PLACED_AT) for i in range(count)]
    items = [item_model(order=order, customer_id=order.customer_id, sku=f"sku-{j}",
                        quantity=j + 1, price_cents=199) for order in orders
             for j in range(ITEMS_PER_ORDER)]
    return orders, items


def _tuples(start: int, count: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    from snowflake_db import get_generator

    keys = get_generator().next_ids(count * (1 + ITEMS_PER_ORDER))
    orders = [(keys[i], (start + i) % 5000, start + i, "new", PLACED_AT) for i in range(count)]
    items = [(keys[count + i * ITEMS_PER_ORDER + j], keys[i], (start + i) % 5000, f"sku-{j}",
              j + 1, 199) for i in range(count) for j in range(ITEMS_PER_ORDER)]
    return orders, items


def _raw_copy(connection: Any, pair: tuple[Any, Any], rows: tuple[list[Any], list[Any]]) -> None:
    raw = connection.connection
    for model, table_rows in zip(pair, rows, strict=True):
        columns = ", ".join(f.column for f in model._meta.concrete_fields)
        with raw.cursor() as cursor, cursor.copy(
            f"COPY {model._meta.db_table} ({columns}) FROM STDIN"
        ) as copy:
            for row in table_rows:
                copy.write_row(row)


def _raw_load_data(
    connection: Any, pair: tuple[Any, Any], rows: tuple[list[Any], list[Any]]
) -> None:
    raw = connection.connection
    for model, table_rows in zip(pair, rows, strict=True):
        columns = ", ".join(f.column for f in model._meta.concrete_fields)
        handle, path = tempfile.mkstemp(suffix=".tsv")
        with os.fdopen(handle, "w") as out:
            out.write("\n".join(
                "\t".join(v.strftime("%Y-%m-%d %H:%M:%S") if isinstance(v, dt.datetime)
                          else str(v) for v in row)
                for row in table_rows
            ))
        try:
            with raw.cursor() as cursor:
                cursor.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE {model._meta.db_table} "
                               f"({columns})", (path,))
        finally:
            os.unlink(path)


def _server_process(connection: Any) -> Path | None:
    """``/proc`` entry of the PostgreSQL backend serving ``connection``, when the server runs
    on this machine and it is readable (else None: no server CPU column)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        stat = Path(f"/proc/{cursor.fetchone()[0]}/stat")
    try:
        _cpu_seconds(stat)
    except (OSError, ValueError, IndexError):
        return None
    return stat


def _cpu_seconds(stat: Path | None) -> float:
    """User plus system CPU seconds of a process, from its ``/proc/PID/stat``."""
    if stat is None:
        return 0.0
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(
    path: str, alias: str, pairs: dict[str, Any], start: int, count: int
) -> tuple[float, float]:
    """Seconds of wall time for one round of ``path``, and the server backend's CPU seconds
    in it (0 when not measurable)."""
    from django.db import connections, transaction

    from snowflake_db.django.bulk import bulk_load

    connection = connections[alias]
    connection.ensure_connection()
    server = _server_process(connection)
    if path in ("raw COPY", "raw LOAD DATA"):
        rows = _tuples(start, count)
        gc.collect()  # the rows' own garbage-collection cost stays outside the clock
        cpu = _cpu_seconds(server)
        began = time.perf_counter()
        with transaction.atomic(using=alias):
            (_raw_copy if path == "raw COPY" else _raw_load_data)(connection, pairs["raw"], rows)
        return time.perf_counter() - began, _cpu_seconds(server) - cpu
    key = {"BigAutoField bulk_create": "big", "SnowflakeAutoField bulk_create": "snow"}.get(
        path, "fast")
    orders, items = _objects(pairs[key], start, count)
    gc.collect()  # as for the raw rows: building the objects is not what is measured
    cpu = _cpu_seconds(server)
    began = time.perf_counter()
    if key == "fast":
        method = "insert" if path == "bulk_load INSERT" else "auto"
        bulk_load(orders, items, using=alias, mariadb_method=method)
    else:
        with transaction.atomic(using=alias):
            pairs[key][0].objects.using(alias).bulk_create(orders, batch_size=1000)
            pairs[key][1].objects.using(alias).bulk_create(items, batch_size=1000)
    return time.perf_counter() - began, _cpu_seconds(server) - cpu


def _paths(backend: str) -> list[str]:
    common = ["BigAutoField bulk_create", "SnowflakeAutoField bulk_create", "bulk_load"]
    if backend == "postgresql":
        return [*common, "raw COPY"]
    return [*common, "bulk_load INSERT", "raw LOAD DATA"]


def _bench(
    backend: str, pairs: dict[str, Any], rows: int, per_round: int
) -> dict[str, tuple[float, float]]:
    from django.db import connections

    paths = _paths(backend)
    for path in paths:  # warm-up: connections, statements, the generator's first tick
        _run(path, backend, pairs, 0, 200)
    with connections[backend].cursor() as cursor:
        for order, item in pairs.values():
            cursor.execute(f"DELETE FROM {item._meta.db_table}")
            cursor.execute(f"DELETE FROM {order._meta.db_table}")
    totals = dict.fromkeys(paths, (0.0, 0.0))
    done = number = 0
    while done < rows:
        count = min(per_round, rows - done)
        turn = number % len(paths)
        for path in paths[turn:] + paths[:turn]:
            seconds, server = _run(path, backend, pairs, done, count)
            totals[path] = (totals[path][0] + seconds, totals[path][1] + server)
        done += count
        number += 1
    return totals


def _report(
    backend: str, totals: dict[str, tuple[float, float]], rows: int, version: str
) -> bool:
    """Print the table (ratios against the same run's baselines) and the verdicts; True if
    every target of ``backend`` is met."""
    loaded = rows * (1 + ITEMS_PER_ORDER)
    rate = {path: loaded / seconds for path, (seconds, _) in totals.items()}
    base = rate["BigAutoField bulk_create"]
    floor = "raw COPY" if backend == "postgresql" else "raw LOAD DATA"
    measured = any(server for _, server in totals.values())
    print(f"\n{backend} {version}: {rows:,} orders + {rows * ITEMS_PER_ORDER:,} items per path")
    print(f"| {'path':<32} | {'rows/s':>10} | {'vs BigAutoField':>15} | {'vs ' + floor:>17} "
          f"| {'seconds':>8} | {'server CPU s':>12} |")
    print(f"|{'-' * 34}|{'-' * 11}:|{'-' * 16}:|{'-' * 18}:|{'-' * 9}:|{'-' * 13}:|")
    for path, value in rate.items():
        seconds, server = totals[path]
        shown = f"{server:.2f}" if measured else "n/a"
        print(f"| {path:<32} | {value:>10,.0f} | {value / base:>15.2f} | "
              f"{value / rate[floor]:>17.2f} | {seconds:>8.2f} | {shown:>12} |")
    ratio = rate["bulk_load"] / base
    ok = ratio >= TARGETS[backend]
    print(f"bulk_load / BigAutoField bulk_create = {ratio:.2f} "
          f"(target >= {TARGETS[backend]:.1f}): {'PASS' if ok else 'FAIL'}")
    share = rate["bulk_load"] / rate[floor]
    if backend == "postgresql":
        ok_floor = share >= FLOOR_TARGET
        ok = ok and ok_floor
        print(f"bulk_load / {floor} = {share:.2f} (target >= {FLOOR_TARGET}): "
              f"{'PASS' if ok_floor else 'FAIL'}")
    else:
        print(f"bulk_load / {floor} = {share:.2f} (information)")
    print(f"{floor} / BigAutoField bulk_create = {rate[floor] / base:.2f} (information: the "
          "database's own limit for these rows)")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="orders per path and backend")
    parser.add_argument("--round", type=int, default=10_000, help="orders per path per round")
    parser.add_argument("--backend", choices=["postgresql", "mariadb", "both"], default="both")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    backends = ["postgresql", "mariadb"] if args.backend == "both" else [args.backend]

    import pymysql

    pymysql.install_as_MySQLdb()
    databases, made = _databases(backends)
    ok = True
    try:
        from django.conf import settings

        settings.configure(
            DEBUG=False, USE_TZ=True, INSTALLED_APPS=["snowflake_db.django"],
            DATABASES={"default": databases[backends[0]], **databases},
            SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 1},
            DATABASE_ROUTERS=[f"{__name__}.Router"],
        )
        import django

        django.setup()
        from django.db import connections

        pairs = _models()
        print(f"Django {django.get_version()}, CPython {platform.python_version()}, rounds of "
              f"{args.round:,} orders, bulk_create batch_size=1000")
        for backend in backends:
            Router.alias = backend
            connection = connections[backend]
            with connection.schema_editor() as editor:
                for order, item in pairs.values():
                    editor.create_model(order)
                    editor.create_model(item)
            with connection.cursor() as cursor:
                cursor.execute("SELECT version()")
                version = str(cursor.fetchone()[0]).split(" on ")[0]
            totals = _bench(backend, pairs, args.rows, args.round)
            ok = _report(backend, totals, args.rows, version) and ok
        for connection in connections.all():
            connection.close()
    finally:
        _drop(made)
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
