"""Django ``bulk_create`` on PostgreSQL: ``BigAutoField`` vs ``SnowflakeAutoField``, same run.

Run it with ``.venv/bin/python benchmarks/bench_django.py`` (200,000 orders per key kind;
``--rows 50000`` for a quicker run, ``--check`` to exit 1 when the target is missed). It creates a
scratch database on the server at ``--url`` (default ``SNOWFLAKE_BENCH_POSTGRES_URL``, else
``SNOWFLAKE_TEST_POSTGRES_URL``, else the local server) and drops it afterwards.

Two tables with the same columns differ only in the primary key: a ``BigAutoField`` (identity
column; PostgreSQL returns the generated keys with ``RETURNING``) and a ``SnowflakeAutoField``
(plain ``BIGINT``; like an ``AutoField`` an unsaved object has no key, and ``bulk_create`` asks
the field for one per object as it prepares the rows, so making the keys is timed too). Each
round builds ``--round`` model instances per kind and saves them with
``bulk_create(batch_size=--batch)``; the kind that goes first alternates every round, so
background load hits both alike.

A third table, ``EagerSnowflakeAutoField``, gives every object its key when it is made (before
the clock): the floor for any key the application makes (one more column through Django and
psycopg than ``BigAutoField``, whose keys come back by ``RETURNING`` in C).

Target (DESIGN.md, issue 20): ``SnowflakeAutoField`` ``bulk_create`` rows/s >= 0.95 x
``EagerSnowflakeAutoField`` in the same run, i.e. making the keys at insert costs at most 5%.
The ratio to ``BigAutoField`` is printed as information. This is a report, never a unit test:
on a busy machine absolute numbers move between runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TARGET_RATIO = 0.95


def _setup_django(url: Any) -> tuple[Any, Any, Any]:
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        INSTALLED_APPS=["snowflake_db.django"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.database,
                "USER": url.username or "",
                "PASSWORD": url.password or "",
                "HOST": url.host or "",
                "PORT": str(url.port or ""),
            }
        },
        SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 1},
    )
    import django

    django.setup()
    from django.db import connection, models

    from snowflake_db.django import EagerSnowflakeAutoField, SnowflakeAutoField

    class Columns(models.Model):
        customer_id = models.BigIntegerField()
        total_cents = models.IntegerField()
        status = models.CharField(max_length=16)

        class Meta:
            abstract = True

    # The tables are created with the schema editor below, so they borrow this app's label.
    class BigAutoOrder(Columns):
        id = models.BigAutoField(primary_key=True)

        class Meta:
            app_label = "snowflake_db"
            db_table = "bench_order_bigauto"

    class SnowflakeOrder(Columns):
        id = SnowflakeAutoField(primary_key=True)

        class Meta:
            app_label = "snowflake_db"
            db_table = "bench_order_snowflake"

    class EagerOrder(Columns):
        id = EagerSnowflakeAutoField(primary_key=True)

        class Meta:
            app_label = "snowflake_db"
            db_table = "bench_order_eager"

    with connection.schema_editor() as editor:
        for model in (BigAutoOrder, SnowflakeOrder, EagerOrder):
            editor.create_model(model)
    return connection, BigAutoOrder, SnowflakeOrder, EagerOrder


def _round(model: Any, start: int, count: int, batch: int) -> float:
    began = time.perf_counter()
    objects = [
        model(customer_id=(start + i) % 5000, total_cents=start + i, status="new")
        for i in range(count)
    ]
    model.objects.bulk_create(objects, batch_size=batch)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="orders per key kind")
    parser.add_argument("--round", type=int, default=10_000, help="orders per kind per round")
    parser.add_argument("--batch", type=int, default=1000, help="bulk_create batch_size")
    parser.add_argument("--url", default=os.environ.get(
        "SNOWFLAKE_BENCH_POSTGRES_URL", os.environ.get("SNOWFLAKE_TEST_POSTGRES_URL", DEFAULT_URL)
    ))
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args(argv)

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    server = make_url(args.url)
    name = f"sfdb_bench_django_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        connection, big_model, snow_model, eager_model = _setup_django(
            server.set(database=name)
        )
        import django

        from snowflake_db import get_generator

        kinds = [("BigAutoField", big_model), ("SnowflakeAutoField", snow_model),
                 ("EagerSnowflakeAutoField", eager_model)]
        totals = dict.fromkeys([label for label, _ in kinds], 0.0)
        # Warm-up: connection, statement paths, the generator's first tick.
        for _, model in kinds:
            _round(model, 0, 1000, args.batch)
            model.objects.all().delete()
        done, number = 0, 0
        while done < args.rows:
            count = min(args.round, args.rows - done)
            order = kinds[number % 3:] + kinds[:number % 3]  # each kind goes first in turn
            for label, model in order:
                totals[label] += _round(model, done, count, args.batch)
            done += count
            number += 1
        with connection.cursor() as cursor:
            sizes = {}
            for label, model in kinds:
                table = model._meta.db_table
                cursor.execute("SELECT pg_indexes_size(%s), count(*) FROM " + table, [table])
                index_bytes, rows = cursor.fetchone()
                sizes[label] = (index_bytes, rows)
            cursor.execute("SHOW server_version")
            server_version = cursor.fetchone()[0]
        connection.close()
        get_generator().close()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    rate = {label: args.rows / seconds for label, seconds in totals.items()}
    ratio = rate["SnowflakeAutoField"] / rate["EagerSnowflakeAutoField"]
    print(f"Django {django.get_version()} bulk_create on PostgreSQL {server_version}, "
          f"CPython {platform.python_version()}: {args.rows:,} orders per kind, rounds of "
          f"{args.round:,}, batch_size={args.batch}")
    print()
    print(f"| {'primary key':<24} | {'rows/s':>10} | {'ratio':>6} | {'seconds':>8} | "
          f"{'PK index MiB':>12} | {'rows':>8} |")
    print(f"|{'-' * 26}|{'-' * 12}|{'-' * 8}|{'-' * 10}|{'-' * 14}|{'-' * 10}|")
    for label, _ in kinds:
        index_bytes, rows = sizes[label]
        print(f"| {label:<24} | {rate[label]:>10,.0f} | "
              f"{rate[label] / rate['BigAutoField']:>6.3f} | {totals[label]:>8.2f} | "
              f"{index_bytes / 2**20:>12.1f} | {rows:>8,} |")
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print()
    print(f"SnowflakeAutoField / EagerSnowflakeAutoField (keys given before bulk_create) = "
          f"{ratio:.3f} (target >= {TARGET_RATIO:.2f}): {verdict}")
    # Information: what the extra key column costs against keys made by the database.
    for label in ("SnowflakeAutoField", "EagerSnowflakeAutoField"):
        print(f"{label} / BigAutoField = {rate[label] / rate['BigAutoField']:.3f} (information)")
    return 1 if args.check and ratio < TARGET_RATIO else 0


if __name__ == "__main__":
    sys.exit(main())
