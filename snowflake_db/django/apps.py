"""The Django app: ``INSTALLED_APPS = [..., "snowflake_db.django"]``."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.conf import settings

if TYPE_CHECKING:
    from ..generator import SnowflakeGenerator
    from .conf import SnowflakeSettings

# The SNOWFLAKE_DB value that ready() last set the process-wide generator up from, and the
# generator it made (None for the "manual" and "env" sources).
_configured_from: SnowflakeSettings | None = None
_configured: SnowflakeGenerator | None = None
_configure_lock = threading.Lock()


class SnowflakeDbConfig(AppConfig):
    """Registers the system checks and sets up ``snowflake_default()`` from ``SNOWFLAKE_DB``.

    ``ready()`` runs no query (Django warns against it:
    https://docs.djangoproject.com/en/stable/ref/applications/#django.apps.AppConfig.ready);
    a table lease is taken with the first ID. It may run many times in one process (Django's
    ``runtests.py``, ``override_settings(INSTALLED_APPS=...)`` and ``modify_settings`` build the
    app registry again): only the first run with a given ``SNOWFLAKE_DB`` configures anything,
    so a live generator and its lease survive. The worker admin pages are in ``admin.py``, found
    by the admin's autodiscovery like every app's.
    """

    name = "snowflake_db.django"
    label = "snowflake_db"
    verbose_name = "Snowflake IDs"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: ModuleType | None) -> None:
        super().__init__(app_name, app_module)
        # Before any models module loads a database backend (Django's first app-loading
        # phase), so a MariaDB user without mysqlclient reads how to use PyMySQL instead of
        # "Did you install mysqlclient?".
        require_mysqldb(settings.DATABASES)

    def ready(self) -> None:
        from django.core.exceptions import ImproperlyConfigured
        from django.db.models.signals import post_migrate

        from . import checks  # noqa: F401 - registers the checks (once: an import)
        from .auto_field_keys import database_keys_after_migrate
        from .widening import widen_after_migrate

        # Auto-created many-to-many keys are widened after every migrate (see .widening);
        # dispatch_uid keeps one receiver per app config however often ready() runs.
        post_migrate.connect(widen_after_migrate, sender=self, dispatch_uid=__name__)
        # AUTO_FIELD_DATABASE_KEYS: after the widening, which may alter the same keys.
        post_migrate.connect(database_keys_after_migrate, sender=self,
                             dispatch_uid=f"{__name__}.database_keys")
        from .conf import get_settings
        from .public_ids._settings import apply_public_id_keys
        from .worker import explain_invalid_settings

        try:
            conf = get_settings()
        except ImproperlyConfigured as error:
            # Reported by check E001; processes that run no checks (shell, gunicorn, Celery)
            # learn it from the first ID's NotConfiguredError.
            explain_invalid_settings(error)
            return
        apply_public_id_keys(conf)
        configure_once(conf)
        # Lookups with a value beyond a key field's range raise instead of finding nothing.
        from .key_columns import key_field_instances
        from .lookups import install_key_lookups

        plain, generic = key_field_instances()
        install_key_lookups(plain, with_in=True)
        install_key_lookups(generic, with_in=False)


#: Django's backends that import MySQLdb (mysqlclient, or PyMySQL installed under its name).
MYSQLDB_BACKENDS = ("django.db.backends.mysql", "django.contrib.gis.db.backends.mysql")


def require_mysqldb(databases: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ``ImproperlyConfigured`` saying what to do when a database uses Django's MySQL
    backend and ``MySQLdb`` cannot be imported; nothing otherwise."""
    aliases = [alias for alias, entry in databases.items()
               if entry.get("ENGINE") in MYSQLDB_BACKENDS]
    if not aliases or "MySQLdb" in sys.modules or importlib.util.find_spec("MySQLdb"):
        return
    from django.core.exceptions import ImproperlyConfigured

    uses = f"DATABASES[{aliases[0]!r}] uses Django's MySQL backend, which imports MySQLdb"
    if importlib.util.find_spec("pymysql") is None:
        raise ImproperlyConfigured(
            f"{uses}: install PyMySQL (pip install 'snowflake-db[mysql]') or mysqlclient"
        )
    raise ImproperlyConfigured(
        f"{uses}, and mysqlclient is not installed: to use PyMySQL (the 'mysql' extra), put "
        "'import pymysql; pymysql.install_as_MySQLdb()' at the top of settings.py (Django "
        "quick start, 'On MariaDB or MySQL')"
    )


def configure_once(conf: SnowflakeSettings) -> bool:
    """Set up the process-wide generator from ``conf`` unless ``ready()`` already did from an
    equal value; return whether it configured.

    Configuring again would close the generator in use (its lease released, a new one taken
    with the next ID) and undo a ``snowflake_db.configure()`` made since. A changed
    ``SNOWFLAKE_DB`` is applied (the generator it replaces is closed and releases its lease).
    """
    global _configured_from, _configured  # noqa: PLW0603 - one process-wide generator
    from ..process import current_generator
    from .worker import DjangoTableWorkerAllocator, configure_from_settings

    with _configure_lock:
        if _configured_from is not None and _configured_from == conf:
            return False
        previous, ours = current_generator(), _configured
        _configured = configure_from_settings(conf)
        _configured_from = conf
    # The table allocator configure_from_settings() made for the generator it replaced is owned
    # by nobody else: close its engines now rather than when garbage collection gets to them
    # (an open connection stops PostgreSQL from dropping the database).
    allocator = getattr(ours, "_allocator", None)
    replaced = previous is ours and current_generator() is not ours
    if replaced and isinstance(allocator, DjangoTableWorkerAllocator):
        allocator.close()
    return True
