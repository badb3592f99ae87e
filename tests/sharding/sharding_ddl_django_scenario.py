"""Run ``CreateShardedOrders`` forwards or backwards in a fresh process with its own settings.

``python -m tests.sharding.sharding_ddl_django_scenario forwards|backwards|sqlmigrate
< CONFIG_JSON``: the JSON (on stdin: it may hold passwords) gives ``databases`` (alias -> URL) and
``operations`` (``[alias, engine, shards]``).
Django settings are process-global, and the main test run's belong to tests/django, so
tests/sharding/test_sharding_ddl.py runs this as a subprocess. ``DEBUG=True``: Django logs and keeps
every query it runs, so the scenario prints what Django logged (the test checks no password is
in it). Prints one JSON object: the logged text and, for ``sqlmigrate``, the collected SQL.
"""

from __future__ import annotations

import io
import json
import logging
import sys


def main(mode: str) -> None:
    import django
    from django.conf import settings

    from example_project.settings import database_from_url

    config = json.load(sys.stdin)
    databases = {alias: database_from_url(url) for alias, url in config["databases"].items()}
    settings.configure(DEBUG=True, DATABASES=databases, INSTALLED_APPS=[], USE_TZ=True)
    django.setup()
    from django.db import connections

    from snowflake_db.django.operations import CreateShardedOrders

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    for name in ("django.db.backends", "django.db.backends.schema"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    collected: list[str] = []
    for alias, engine, shards in config["operations"]:
        operation = CreateShardedOrders(engine, shards)
        connection = connections[alias]
        collect = mode == "sqlmigrate"
        with connection.schema_editor(collect_sql=collect) as editor:
            if mode == "backwards":
                operation.database_backwards("shop", editor, None, None)
            else:
                operation.database_forwards("shop", editor, None, None)
            if collect:
                collected += editor.collected_sql
        log.write("\n".join(query["sql"] for query in connection.queries))
    print(json.dumps({"log": log.getvalue(), "collected": collected,
                      "describe": operation.describe(), "deconstruct": operation.deconstruct()}))


if __name__ == "__main__":
    main(sys.argv[1])
