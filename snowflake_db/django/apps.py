"""The Django app: ``INSTALLED_APPS = [..., "snowflake_db.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class SnowflakeDbConfig(AppConfig):
    """Registers the system checks and the worker admin pages, and sets up
    ``snowflake_default()`` from ``SNOWFLAKE_DB``.

    ``ready()`` runs no query (Django warns against it:
    https://docs.djangoproject.com/en/stable/ref/applications/#django.apps.AppConfig.ready);
    a table lease is taken with the first ID.
    """

    name = "snowflake_db.django"
    label = "snowflake_db"
    verbose_name = "Snowflake IDs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        from . import checks  # noqa: F401 - registers the checks
        from .conf import get_settings
        from .worker import configure_from_settings, explain_invalid_settings

        _register_admin_pages()

        try:
            conf = get_settings()
        except ImproperlyConfigured as error:
            # Reported by check E001; processes that run no checks (shell, gunicorn, Celery)
            # learn it from the first ID's NotConfiguredError.
            explain_invalid_settings(error)
            return
        configure_from_settings(conf)


def _register_admin_pages() -> None:
    """The worker slot and registration pages, on the default admin site, when
    ``django.contrib.admin`` is installed and SQLAlchemy (which reads the leases) is there."""
    from importlib.util import find_spec

    from django.apps import apps

    if apps.is_installed("django.contrib.admin") and find_spec("sqlalchemy") is not None:
        from .worker_admin import register

        register()
