"""A fresh project with the app installed, for the admin tests (a subprocess of
test_django_app_ready.py: which admin app a project installs is fixed at start-up).

Usage: ``python -m tests.django.admin_scenario ADMIN_APP URLCONF PATH...``. ADMIN_APP is
``django.contrib.admin`` (autodiscovery) or ``django.contrib.admin.apps.SimpleAdminConfig``.
Migrates an in-memory SQLite database, logs a superuser in with Django's test ``Client``, asks
for each PATH and prints one JSON line: the status of each path, the models on the default
``admin.site``, and the error of any page that raised.
"""

from __future__ import annotations

import json
import sys

import django
from django.conf import settings


def main(admin_app: str, urlconf: str, paths: list[str]) -> None:
    settings.configure(
        SECRET_KEY="snowflake-db-tests-not-secret",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=urlconf,
        INSTALLED_APPS=[
            admin_app,
            "django.contrib.admindocs",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "snowflake_db.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="snowflake_db.django.fields.SnowflakeAutoField",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        USE_TZ=True,
        SNOWFLAKE_DB={"WORKER_SOURCE": "static", "WORKER_ID": 3},
    )
    django.setup()
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    import snowflake_db.django.admin  # noqa: F401 - a project importing the helpers

    call_command("migrate", verbosity=0)
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    statuses: dict[str, int] = {}
    errors: dict[str, str] = {}
    for path in paths:
        response = client.get(path)
        statuses[path] = response.status_code
        if response.status_code >= 500:
            errors[path] = repr(getattr(response, "exc_info", (None, None))[1])
    registered = sorted(model._meta.label for model in admin.site._registry)
    print(json.dumps({"statuses": statuses, "default_site": registered, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
