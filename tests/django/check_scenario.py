"""Run Django's system checks for a throwaway project (a subprocess of test_django_checks.py).

Usage: ``python -m tests.django.check_scenario PROJECT_DIR DEFAULT_AUTO_FIELD [EXTRA]``.
PROJECT_DIR holds the app package ``demo`` that the test wrote; EXTRA is JSON:
``{"apps": [more INSTALLED_APPS], "path": [more sys.path], "settings": {more settings},
"migrate": true, "lookups": ["app.Model.field", ...]}``. Prints the messages as one JSON
line; with ``"migrate"``, what ``manage.py migrate`` (its system checks on) did instead:
``[succeeded, output]``; with ``"lookups"``, the lookup classes those fields answer with.
"""

from __future__ import annotations

import json
import sys

import django
from django.conf import settings


def main(project_dir: str, default_auto_field: str, extra: str = "{}") -> None:
    more = json.loads(extra)
    sys.path[:0] = [project_dir, *more.get("path", [])]
    settings.configure(**{
        "INSTALLED_APPS": ["django.contrib.contenttypes", "snowflake_db.django", "demo",
                           *more.get("apps", [])],
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        "DEFAULT_AUTO_FIELD": default_auto_field,
        "SNOWFLAKE_DB": {"WORKER_SOURCE": "manual"},
        **more.get("settings", {}),
    })
    django.setup()
    if more.get("lookups"):  # {"app.Model.field": {lookup name: class name}}
        from django.apps import apps

        fields = [apps.get_model(path.rsplit(".", 1)[0])._meta.get_field(path.rsplit(".", 1)[1])
                  for path in more["lookups"]]
        print(json.dumps({path: {name: field.get_lookup(name).__name__
                                 for name in ("exact", "lt", "in")}
                          for path, field in zip(more["lookups"], fields, strict=True)}))
        return
    if more.get("migrate"):
        from tests.django.scenario_support import manage

        print(json.dumps(manage("migrate", verbosity=0)))
        return
    from django.core.checks import run_checks

    messages = [
        {"id": message.id, "msg": message.msg, "hint": message.hint}
        for message in run_checks()
        if message.id and message.id.startswith("snowflake_db.")
    ]
    print(json.dumps(messages))


if __name__ == "__main__":
    main(*sys.argv[1:])
