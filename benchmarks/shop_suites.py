"""django-oscar's and django-taggit's own test suites on PostgreSQL, with ``AutoField`` keys and
with Snowflake keys and the app installed, compared (issue 34, part 6: the proof as users run it).

Run it with ``python benchmarks/shop_suites.py --oscar-source DIR --taggit-source DIR`` (not part
of ``make test``). The test suites are not on PyPI (neither project ships ``tests/`` in its wheel
or sdist), and this script downloads nothing but packages, so it takes them from checkouts of
the two repositories, made once by hand, e.g.::

    git clone https://github.com/django-oscar/django-oscar && cd django-oscar
    git archive 4.2.0 tests setup.cfg | tar x -C /tmp/oscar-tests     # or the tag of --oscar
    git clone https://github.com/jazzband/django-taggit && cd django-taggit
    git archive 6.1.0 tests | tar x -C /tmp/taggit-tests

Each source needs only its ``tests/`` folder (Oscar's ``setup.cfg`` too, for pytest's settings);
the code under test is the release installed from PyPI (``--oscar``, ``--taggit``), so the tests
of a tag run against that tag's release (Oscar 4.2.1 has no tag in the repository snapshot this
was written with: its tests are those of 4.2.0). The script builds a venv in ``--work-dir``
(default ``.venv/shop-suites``) with those releases, Django, the suites' test requirements and
this checkout (editable: run it from a tree with other library changes merged and it tests
those), then runs each suite twice on the PostgreSQL server at ``SNOWFLAKE_TEST_POSTGRES_URL``
(default: the local server):

- ``auto``: ``DEFAULT_AUTO_FIELD = "django.db.models.AutoField"`` (the suites' default);
- ``snowflake``: ``DEFAULT_AUTO_FIELD = "snowflake_db.django.fields.SnowflakeAutoField"``,
  ``snowflake_db.django`` installed and ``SNOWFLAKE_DB = {"WORKER_SOURCE": "table"}``, as
  docs/getting-started/django.md recommends (each process, every pytest-xdist worker too,
  leases its worker ID from the table the app's migration makes in its test database).

Before the ``snowflake`` run the script runs ``check`` in that configuration, then migrates a
scratch database and runs ``check --database default``, and prints every ``snowflake_db``
finding: the columns the library reports before the first test, to hold against the failures.
It then prints, per suite, the failing tests of each run and those failing only with Snowflake
keys, each with its reason from ``EXPECTED`` (tests that assume small or sequential keys) or
``UNEXPECTED``. ``--check`` exits 1 on any unexpected difference.

Oscar's test site forks three apps (catalogue, customer, partner) and has a user app of its own
(myauth), whose migrations are older than Oscar's keys following ``DEFAULT_AUTO_FIELD`` and
spell out ``AutoField``: left so, ``migrate`` makes their keys ``integer`` whatever the setting
says, and ``check --database`` reports 84 such columns (E010). Both runs use copies of them,
written into the work dir, that take the key's class from the setting as Oscar 4.2's own
migrations (and the copies ``oscar_fork_app`` makes of them) do: the shop a user starts with
Oscar 4.2 and Snowflake keys.

Three of Oscar's test modules freeze time with freezegun, which patches ``time.monotonic``.
Before snowflake_db read real time through its own clock (``snowflake_db/clock.py``), the worker
lease then looked expired and that process's generator issued no key for the rest of the run
(LeaseExpiredError, ClockSkewError). ``--freezegun-ignore`` (``freezegun.configure(
extend_ignore_list=["snowflake_db"])``) is kept to compare; by default the script runs the
suites as users would.

Oscar runs under pytest with pytest-xdist (``--parallel``, default 2) and pytest-timeout; taggit
under Django's test runner. Every run is bounded by ``--timeout`` seconds; databases are named
per run and dropped afterwards, leftovers of a killed run too. taggit's test app ("tests") has
migrations that spell out ``AutoField`` keys whatever ``DEFAULT_AUTO_FIELD`` says, so the taggit
``snowflake`` run uses migrations ``makemigrations`` writes for it into the work dir, as a
project's own models get theirs; and Django's test runner runs the system checks, so the taggit
``snowflake`` run silences ``snowflake_db.E012`` (taggit's ``TaggedItem.object_id`` is 32-bit:
the check prints it first, and the tests show what it costs).

``--taggit-through MODULE.Model`` names a through model with a 64-bit ``object_id``: in the
``snowflake`` run every ``TaggableManager()`` of taggit's test models that names no ``through``
gets that one, as a project would write ``TaggableManager(through=...)``, and the app holding
it is installed. ``suite`` (the default) is a model this script writes into the work dir from
the base snowflake_db ships, ``snowflake_db.django.taggit.SnowflakeTaggedItemBase``, as
docs/converting/django.md tells a project to; ``none`` runs with taggit's own ``TaggedItem``.

``--oscar-converted`` runs Oscar's suite on its test site converted as docs/converting/django.md
says for an Oscar shop ("Converting a django-oscar shop"), in a copy of the source in the work
dir: the test site's catalogue fork and a fork of Oscar's order app (made by ``oscar_fork_app``)
declare the 64-bit fields ``check`` reports (``oscar_shop.OSCAR_64BIT_FIELDS``), and
``makemigrations`` writes their migrations. Oscar's test modules import models from Oscar's own
modules (``from oscar.apps.order.models import OrderDiscount``), where a model a fork declares
is not defined: the forks set theirs there too (only in this copy; ``oscar_shop.py``'s don't).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit
from xml.etree import ElementTree

from django_suite import (
    _UNFINISHED,
    DEFAULT_POSTGRES_URL,
    build_venv,
    failing_tests,
    report,
    unfinished_runs,
)

ROOT = Path(__file__).resolve().parents[1]

_AUTO = "django.db.models.AutoField"
_SNOWFLAKE = "snowflake_db.django.fields.SnowflakeAutoField"
#: run name -> (DEFAULT_AUTO_FIELD, snowflake_db.django installed with a leased worker ID)
RUNS = {"auto": (_AUTO, False), "snowflake": (_SNOWFLAKE, True)}
SUITES = ("oscar", "taggit")

#: The through model with a 64-bit object_id for taggit's test models ("none": taggit's own).
TAGGIT_THROUGH_DEFAULT = "suite"
#: ``--taggit-through suite``: the through model this script writes (see the docstring).
SUITE_THROUGH = "shop_suite_through.models.BigTaggedItem"

#: Tests that may fail only with Snowflake keys, with the reason (docs/benchmarks.md lists
#: them). Keys: "oscar:<pytest node id>" or "taggit:<unittest id>". No test of either suite
#: assumes small or sequential keys (measured 2026-11-27); what remains is not by design.
EXPECTED: dict[str, str] = dict.fromkeys(
    [
        "oscar:tests/functional/dashboard/test_catalogue.py::TestAStaffUser::"
        "test_can_delete_a_child_product",
        "oscar:tests/functional/dashboard/test_catalogue.py::TestAStaffUser::"
        "test_can_delete_a_parent_product",
    ],
    "not the keys: pytest-xdist workers share Oscar's one whoosh index folder "
    "(FileNotFoundError in whoosh's commit); each was seen failing in one run or the other",
)
#: Any Oscar test failing in whoosh's index, or in whoosh's code (the same race, another
#: test): this reason.
_WHOOSH_RACE = EXPECTED[next(iter(EXPECTED))]
_WHOOSH_ERRORS = ("whoosh.index.EmptyIndexError", "FileNotFoundError")
#: With ``--oscar-converted``: tests whose subject is Oscar's unforked order app, not keys.
EXPECTED_CONVERTED: dict[str, str] = {
    "oscar:tests/integration/core/test_customisation.py::test_creates_models_and_admin_file": (
        "asserts what oscar_fork_app writes for Oscar's own order app ('from "
        "oscar.apps.order.models import *'); the converted site's order app is a fork already, "
        "so a fork of it imports the fork's models"),
}

_TAGGIT_DEFAULT_THROUGH = (
    "asserts on taggit's own TaggedItem (or a taggit feature hard-wired to it: the "
    "tagged_object_list view, the admin's tag merging, the deduplicate_tags and "
    "remove_orphaned_tags commands), which --taggit-through replaces for the test models"
)
#: With ``--taggit-through``: tests whose subject is taggit's default TaggedItem, not keys.
EXPECTED_THROUGH: dict[str, str] = dict.fromkeys(
    [
        "tests.test_admin.AdminTest.test_tag_merging",
        *(f"tests.test_deduplicate_tags.DeduplicateTagsTests.{name}" for name in (
            "test_deduplicate_tags", "test_no_duplicates",
            "test_taggit_case_insensitive_not_enabled")),
        *(f"tests.test_remove_orphaned_tags.RemoveOrphanedTagsTests.{name}" for name in (
            "test_no_orphaned_tags", "test_remove_orphaned_tags")),
        "tests.tests.TagListViewTests.test_list_view_returns_single",
        "tests.tests.TagListViewTests.test_url_request_returns_view",
        *(f"tests.tests.{case}.{name}"
          for case in ("TaggableManagerTestCase", "TaggableManagerInitializationTestCase")
          for name in (
              "test_add_existing_tag_sends_m2m_changed_signals",
              "test_add_new_tag_sends_m2m_changed_signals",
              "test_add_second_tag_sends_m2m_changed_signals_with_correct_new_pks",
              "test_clear_sends_m2m_changed_signal", "test_prefetch_no_extra_join",
              "test_remove_tag_sends_m2m_changed_signals", "test_set_sends_m2m_changed_signal",
              "test_set_with_clear_true_sends_m2m_changed_signal", "test_taggeditem_str")),
    ],
    _TAGGIT_DEFAULT_THROUGH,
)

#: Text of a failure report that says a 64-bit key met a 32-bit column: PostgreSQL's error, or
#: the lookup snowflake_db refuses instead of finding nothing.
_NARROW_COLUMN_ERRORS = ("integer out of range", "KeyLookupOutOfRangeError")
#: With ``--taggit-through`` the only 32-bit object IDs left are the test app's own.
TAGGIT_TEST_MODELS_NARROW = (
    "a 32-bit object_id the test itself declares or writes (its own through models "
    "ArticleTaggedItem, OfficialThroughModel, TenantTaggedItem, ThroughGFK, or taggit's "
    "TaggedItem used directly): snowflake_db.E012 reports each before the run"
)

#: The settings module of a suite (``{suite}``): its own test settings, then this run's
#: database, keys and app, from the environment the script sets.
_SETTINGS_HEAD = '''\
"""Written by benchmarks/shop_suites.py: {suite}'s test settings, one run's keys and database."""
import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

_run = os.environ["SUITE_RUN"]
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _run,
        "USER": os.environ["SUITE_DB_USER"],
        "PASSWORD": os.environ["SUITE_DB_PASSWORD"],
        "HOST": os.environ["SUITE_DB_HOST"],
        "PORT": os.environ["SUITE_DB_PORT"],
        "TEST": {{"NAME": f"test_{{_run}}"}},
    }}
}}
DEFAULT_AUTO_FIELD = os.environ["SUITE_AUTO_FIELD"]
if os.environ.get("SUITE_FREEZEGUN_IGNORE"):
    # --freezegun-ignore: a test that freezes time leaves snowflake_db the real clock.
    import freezegun

    freezegun.configure(extend_ignore_list=["snowflake_db"])
'''
SETTINGS = {
    "oscar": _SETTINGS_HEAD.format(suite="Oscar") + '''\
# The test site's forked apps, their migrations' keys following DEFAULT_AUTO_FIELD.
MIGRATION_MODULES = {
    label: f"{os.environ['SUITE_OSCAR_MIGRATIONS']}.{label}"
    for label in os.environ["SUITE_OSCAR_FORKED"].split()
}
if os.environ.get("SUITE_OSCAR_ORDER_FORK"):
    # --oscar-converted: the order app forked (oscar_fork_app) with 64-bit discount keys.
    INSTALLED_APPS[INSTALLED_APPS.index("oscar.apps.order.apps.OrderConfig")] = (
        "tests._site.apps.order.apps.OrderConfig")
if os.environ.get("SUITE_APP"):
    INSTALLED_APPS = [*INSTALLED_APPS, "snowflake_db.django"]
    SNOWFLAKE_DB = {"WORKER_SOURCE": "table"}
''',
    "taggit": _SETTINGS_HEAD.format(suite="taggit") + '''\
if os.environ.get("SUITE_TAGGIT_MIGRATIONS"):
    # The test app's migrations spell out AutoField keys: this run's, made by makemigrations.
    MIGRATION_MODULES = {"tests": os.environ["SUITE_TAGGIT_MIGRATIONS"]}
if os.environ.get("SUITE_APP"):
    _apps = list(INSTALLED_APPS)
    _through = os.environ.get("SUITE_TAGGIT_THROUGH")
    if _through:
        # The through model's app, then the hook that makes it every TaggableManager's default,
        # both before the test app whose models use it.
        _apps[_apps.index("tests"):0] = [_through.rsplit(".", 2)[0], "shop_suite_taggit_hook"]
    INSTALLED_APPS = [*_apps, "snowflake_db.django"]
    SNOWFLAKE_DB = {"WORKER_SOURCE": "table"}
# The test run only (taggit.TaggedItem keeps object IDs in 32 bits: `check`, run first without
# this, reports it; the test runner's own checks would stop there).
SILENCED_SYSTEM_CHECKS = [name for name in os.environ.get("SUITE_SILENCE", "").split(",") if name]
''',
}

#: The hook app (``--taggit-through``): its models module runs after taggit's and before the
#: test app's, and gives every ``TaggableManager`` without a ``through`` the 64-bit one.
_TAGGIT_HOOK = '''\
"""Written by benchmarks/shop_suites.py: TaggableManager() defaults to SUITE_TAGGIT_THROUGH."""
import os

from django.utils.module_loading import import_string
from taggit.managers import TaggableManager

_through = import_string(os.environ["SUITE_TAGGIT_THROUGH"])
_init = TaggableManager.__init__


def _init_with_through(self, *args, through=None, **kwargs):
    _init(self, *args, through=through or _through, **kwargs)


TaggableManager.__init__ = _init_with_through
'''

#: ``--taggit-through suite``: a through model as docs/converting/django.md writes one, from
#: the base snowflake_db ships (the object ID in 64 bits).
_SUITE_THROUGH_MODELS = '''\
"""Written by benchmarks/shop_suites.py: taggit's TaggedItem with a 64-bit object_id."""
from snowflake_db.django.taggit import SnowflakeTaggedItemBase


class BigTaggedItem(SnowflakeTaggedItemBase):
    pass
'''

#: Oscar's test requirements (its ``test`` extra without the linters, tox and coverage), and
#: taggit's (djangorestframework, per its tox.ini).
_TEST_REQUIREMENTS = (
    "pytest-django>=4.9,<5", "pytest-xdist>=3.6,<4", "pytest-timeout", "Whoosh>=2.7,<2.8",
    "WebTest>=3,<4", "django-webtest>=1.9,<1.10", "psycopg2-binary>=2.8,<2.10",
    "freezegun>=1.5.1,<2", "pytz", "sorl-thumbnail>=12.10,<13", "easy-thumbnails>=2.9,<2.11",
    "django-environ>=0.4,<0.13", "whitenoise>=6.7,<6.12", "pycountry", "djangorestframework",
)

_FINDING = re.compile(r"^(.*\((snowflake_db\.[EW]\d+)\).*)$", re.MULTILINE)


def prepare(work_dir: Path, python: str, django: str, oscar: str, taggit: str) -> Path:
    """Build the venv (once per requirement set and pyproject.toml change); its python."""
    work_dir.mkdir(parents=True, exist_ok=True)
    venv_python = build_venv(python, work_dir, f"oscar{oscar}-taggit{taggit}-django{django}", [
        f"django=={django}.*", f"django-oscar=={oscar}", f"django-taggit=={taggit}",
        *_TEST_REQUIREMENTS, "-e", f"{ROOT}[sqlalchemy,postgres]"])
    for name, text in SETTINGS.items():
        (work_dir / f"shop_{name}_settings.py").write_text(text)
    hook = work_dir / "shop_suite_taggit_hook"
    hook.mkdir(exist_ok=True)
    (hook / "__init__.py").write_text("")
    (hook / "models.py").write_text(_TAGGIT_HOOK)
    through = work_dir / "shop_suite_through"
    through.mkdir(exist_ok=True)
    (through / "__init__.py").write_text("")
    (through / "models.py").write_text(_SUITE_THROUGH_MODELS)
    return venv_python


#: The apps Oscar's test site forks, and its user app (label -> migrations folder in the
#: source): their migrations predate keys following ``DEFAULT_AUTO_FIELD``, spelling out AutoField.
OSCAR_FORKED = {
    "catalogue": "tests/_site/apps/catalogue/migrations",
    "customer": "tests/_site/apps/customer/migrations",
    "partner": "tests/_site/apps/partner/migrations",
    "myauth": "tests/_site/myauth/migrations",
}
#: The package (in the work dir) of those copies; the converted site's own (it adds migrations).
OSCAR_MIGRATIONS = "shop_oscar_migrations"
OSCAR_CONVERTED_MIGRATIONS = "shop_oscar_converted_migrations"
#: The folder (in the work dir) of the converted copy of Oscar's tests.
OSCAR_CONVERTED_SOURCE = "oscar-converted-source"
_AUTO_FIELD_CALL = "models.AutoField(auto_created=True, primary_key=True"
_FOLLOW_SETTING = (
    "from django.conf import settings as _settings\n"
    "from django.utils.module_loading import import_string as _import_string\n"
    "models_AutoField = _import_string(_settings.DEFAULT_AUTO_FIELD)\n"
)


def oscar_migrations(source: Path, work_dir: Path, package_name: str = OSCAR_MIGRATIONS) -> None:
    """Copy ``OSCAR_FORKED``'s migrations into the work dir, their automatic keys made from
    ``DEFAULT_AUTO_FIELD`` at run time as Oscar's own migrations do (see the module docstring)."""
    package = work_dir / package_name
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir()
    (package / "__init__.py").write_text("")
    for label, folder in OSCAR_FORKED.items():
        target = package / label
        target.mkdir()
        for migration in sorted((source / folder).glob("*.py")):
            text = migration.read_text()
            if _AUTO_FIELD_CALL in text:
                head, _, body = text.partition("\nclass Migration")
                body = body.replace(_AUTO_FIELD_CALL, _AUTO_FIELD_CALL.replace(".", "_", 1))
                text = f"{head}\n{_FOLLOW_SETTING}\nclass Migration{body}"
            (target / migration.name).write_text(text)


#: Appended to the converted test site's forks: Oscar's test modules import models from
#: Oscar's own modules (``from oscar.apps.order.models import OrderDiscount``), which define
#: none that a fork declared; there they find the fork's.
_OSCAR_MODULE_ALIASES = """
import {module} as _oscar_models  # noqa: E402

{aliases}
"""


def oscar_converted_source(source: Path, copy: Path) -> None:
    """A fresh copy of the source's tests (and setup.cfg) to convert (``--oscar-converted``)."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copytree(source / "tests", copy / "tests")
    if (source / "setup.cfg").exists():
        shutil.copy2(source / "setup.cfg", copy / "setup.cfg")


def _server() -> dict[str, str]:
    url = urlsplit(os.environ.get("SNOWFLAKE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    return {
        "SUITE_DB_USER": url.username or "",
        "SUITE_DB_PASSWORD": url.password or "",
        "SUITE_DB_HOST": url.hostname or "127.0.0.1",
        "SUITE_DB_PORT": str(url.port or 5432),
        "SUITE_DB_MAINTENANCE": url.path.lstrip("/") or "postgres",
    }


_SQL = '''\
import os, sys
import psycopg2
conn = psycopg2.connect(dbname=os.environ["SUITE_DB_MAINTENANCE"], user=os.environ["SUITE_DB_USER"],
                        password=os.environ["SUITE_DB_PASSWORD"], host=os.environ["SUITE_DB_HOST"],
                        port=os.environ["SUITE_DB_PORT"])
conn.autocommit = True
cur = conn.cursor()
if sys.argv[1] == "create":
    cur.execute('CREATE DATABASE "%s"' % sys.argv[2])
else:
    cur.execute("SELECT datname FROM pg_database WHERE datname LIKE %s OR datname LIKE %s",
                (sys.argv[2] + "%", "test_" + sys.argv[2] + "%"))
    for (name,) in cur.fetchall():
        cur.execute('DROP DATABASE "%s" WITH (FORCE)' % name)
        print("dropped database", name)
'''


def _database(venv_python: Path, env: dict[str, str], action: str, name: str) -> None:
    """Create database ``name``, or drop every database made for run ``name``."""
    subprocess.run([str(venv_python), "-c", _SQL, action, name], env=env, check=True)


class Run:
    """One suite in one configuration: its environment, database names and log."""

    def __init__(self, suite: str, field: str, *, venv_python: Path, source: Path,
                 work_dir: Path, through: str | None, freezegun_ignore: bool = False,
                 subset: bool = False, converted: bool = False) -> None:
        auto_field, installed = RUNS[field]
        self.suite, self.field = suite, field
        self.venv_python, self.source, self.work_dir = venv_python, source, work_dir
        self.name = f"shop_{suite}_{field}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        variants = [name for name, used in (("through", through), ("freezegun", freezegun_ignore),
                                            ("converted", converted), ("subset", subset))
                    if used and installed]
        self.label = "-".join([suite, field, *variants])
        self.log = work_dir / f"{self.label}.log"
        self.junit = work_dir / f"{self.label}.xml"
        self.env = {
            **os.environ,
            **_server(),
            "PYTHONPATH": os.pathsep.join([str(source), str(work_dir)]),
            "DJANGO_SETTINGS_MODULE": f"shop_{suite}_settings",
            "SUITE_RUN": self.name,
            "SUITE_AUTO_FIELD": auto_field,
            "SUITE_APP": "1" if installed else "",
            "SUITE_TAGGIT_THROUGH": (through or "") if installed else "",
            "SUITE_OSCAR_FORKED": " ".join(OSCAR_FORKED),
            "SUITE_OSCAR_MIGRATIONS": OSCAR_CONVERTED_MIGRATIONS if converted else OSCAR_MIGRATIONS,
            "SUITE_FREEZEGUN_IGNORE": "1" if freezegun_ignore else "",
            "SUITE_TAGGIT_MIGRATIONS": (
                f"shop_taggit_migrations_{field}" if suite == "taggit" and installed else ""),
        }
        for variable in ("SNOWFLAKE_WORKER_ID", "SNOWFLAKE_WORKER_URL", "DATABASE_ENGINE",
                         "DATABASE_NAME"):
            self.env.pop(variable, None)

    def django_admin(self, *arguments: str, timeout: float = 900) -> str:
        """``django-admin`` (the suite's ``manage.py``) in this configuration; its output."""
        result = subprocess.run(
            [str(self.venv_python), "-m", "django", *arguments], cwd=self.source, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
            check=False)
        return f"$ manage.py {' '.join(arguments)}  (exit {result.returncode})\n{result.stdout}"

    def convert_oscar_site(self) -> None:
        """``--oscar-converted``: the test site converted as docs/converting/django.md says for
        an Oscar shop, in this run's copy of the source: the test site's catalogue fork and a
        fork of the order app (``oscar_fork_app``) declare the 64-bit fields of
        ``oscar_shop.OSCAR_64BIT_FIELDS``, and ``makemigrations`` writes their migrations."""
        from oscar_shop import OSCAR_64BIT_FIELDS, fork_models

        oscar_migrations(self.source, self.work_dir, OSCAR_CONVERTED_MIGRATIONS)
        site = self.source / "tests" / "_site" / "apps"
        catalogue = site / "catalogue" / "models.py"
        if "from oscar.apps.catalogue.models import *" not in catalogue.read_text():
            raise RuntimeError(f"{catalogue}: not the star import this conversion expects")
        outputs = [self.django_admin("oscar_fork_app", "order", "tests/_site/apps",
                                     "--skip-checks")]
        for label in ("catalogue", "order"):
            module = f"oscar.apps.{label}.models"
            names = re.findall(r"^class (\w+)\(", OSCAR_64BIT_FIELDS[label][1], re.MULTILINE)
            aliases = "\n".join(f"_oscar_models.{name} = {name}" for name in names)
            (site / label / "models.py").write_text(
                fork_models(label, module)
                + _OSCAR_MODULE_ALIASES.format(module=module, aliases=aliases))
        self.env["SUITE_OSCAR_ORDER_FORK"] = "1"
        outputs.append(self.django_admin("makemigrations", "order", "catalogue",
                                         "--skip-checks"))
        (self.work_dir / f"{self.label}-convert.log").write_text("\n".join(outputs))
        if any("(exit 0)" not in output.splitlines()[0] for output in outputs):
            raise RuntimeError("converting Oscar's test site failed:\n" + "\n".join(outputs))

    def make_migrations(self) -> None:
        """The taggit test app's migrations for this run's keys (see the module docstring)."""
        module = self.env["SUITE_TAGGIT_MIGRATIONS"]
        if not module:
            return
        folder = self.work_dir / module
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        (folder / "__init__.py").write_text("")
        apps = ["tests"]
        if self.env["SUITE_TAGGIT_THROUGH"] == SUITE_THROUGH:
            apps.append(SUITE_THROUGH.partition(".")[0])  # the script's own through model's app
            shutil.rmtree(self.work_dir / apps[-1] / "migrations", ignore_errors=True)
        output = self.django_admin("makemigrations", *apps, "--skip-checks")
        (self.work_dir / f"{self.label}-makemigrations.log").write_text(output)
        if "(exit 0)" not in output.splitlines()[0]:
            raise RuntimeError(f"makemigrations failed:\n{output}")

    def checks(self) -> list[str]:
        """``check``, then ``check --database default`` on a migrated scratch database: every
        snowflake_db finding (printed with the commands' full output into the log)."""
        scratch = f"{self.name}_chk"
        env = self.env
        self.env = {**env, "SUITE_RUN": scratch}
        outputs = [self.django_admin("check")]
        try:
            _database(self.venv_python, self.env, "create", scratch)
            # Skipping checks: a suite's test settings may fail some (Oscar's fail admin ones).
            outputs.append(
                self.django_admin("migrate", "--noinput", "--run-syncdb", "--skip-checks"))
            outputs.append(self.django_admin("check", "--database", "default"))
        finally:
            _database(self.venv_python, self.env, "drop", scratch)
            self.env = env
        text = "\n".join(outputs)
        (self.work_dir / f"{self.label}-check.log").write_text(text)
        findings: dict[str, list[str]] = {}
        for output in outputs:
            command = output.splitlines()[0].split("  (")[0].removeprefix("$ manage.py ")
            for line, _ in _FINDING.findall(output):
                findings.setdefault(line.strip(), []).append(command)
        return [f"[{', '.join(commands)}] {_clip(line)}" for line, commands in findings.items()]

    def command(self, parallel: int, tests: Sequence[str]) -> list[str]:
        if self.suite == "oscar":
            return [str(self.venv_python), "-m", "pytest", *(tests or ["tests"]), "-p",
                    "no:cacheprovider", f"-n{parallel}", "--timeout=600",
                    f"--junitxml={self.junit}", "-o", "junit_family=xunit1", "-q", "-rfE",
                    "--deprecation=none"]
        return [str(self.venv_python), "-m", "django", "test", "--noinput", "-v", "1", *tests]

    def run(self, parallel: int, timeout: float,
            tests: Sequence[str] = ()) -> tuple[dict[str, str], float]:
        """Run the suite; its failing tests (id -> report) and the seconds taken."""
        self.junit.unlink(missing_ok=True)
        silence = "snowflake_db.E012" if self.suite == "taggit" and self.env["SUITE_APP"] else ""
        started = time.monotonic()
        with self.log.open("w") as out:
            process = subprocess.Popen(self.command(parallel, tests), cwd=self.source,
                                       env={**self.env, "SUITE_SILENCE": silence},
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                out.write(f"\n{_UNFINISHED}: killed after {timeout:.0f} s>\n")
        seconds = time.monotonic() - started
        _database(self.venv_python, self.env, "drop", self.name)
        return self.failures(), seconds

    def failures(self) -> dict[str, str]:
        text = self.log.read_text(errors="replace")
        if self.suite == "taggit":
            return failing_tests(text, self.log)
        failing = junit_failures(self.junit) if self.junit.exists() else {}
        if not self.junit.exists() or _UNFINISHED in text:
            failing[f"{_UNFINISHED}: see {self.log}>"] = ""
        return failing


def _clip(line: str, limit: int = 240) -> str:
    return line if len(line) <= limit else f"{line[:limit]}..."


def junit_failures(path: Path) -> dict[str, str]:
    """Failing and erroring tests of a pytest junit file, as pytest node ids."""
    failing: dict[str, str] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        problems = [child for child in case if child.tag in ("failure", "error")]
        if not problems:
            continue
        # The class's own module (the "file" attribute names the module of a mixin's method)
        # ends where the capitalised class names begin.
        if not case.get("classname"):  # a module that failed to import: named by its path
            failing[case.get("name", "").replace(".", "/") + ".py"] = "\n".join(
                f"{p.get('message', '')}\n{p.text or ''}" for p in problems)
            continue
        parts = case.get("classname", "").split(".")
        first_class = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
        module_path = "/".join(parts[:first_class]) + ".py"
        node = "::".join([module_path, *parts[first_class:], case.get("name", "")])
        failing[node] = "\n".join(f"{p.get('message', '')}\n{p.text or ''}" for p in problems)
    return failing


def expected_reason(suite: str, name: str, failure: str, *, through: bool,
                    converted: bool = False) -> str | None:
    """Why a test may fail with Snowflake keys only, or None if it must not. Without a
    64-bit through model every taggit test that tags fails on taggit.TaggedItem's 32-bit
    object_id: a gap (E012 reports it), not expected."""
    if f"{suite}:{name}" in EXPECTED:
        return EXPECTED[f"{suite}:{name}"]
    if converted and f"{suite}:{name}" in EXPECTED_CONVERTED:
        return EXPECTED_CONVERTED[f"{suite}:{name}"]
    last = failure.strip().rsplit("\n", 1)[-1]
    if suite == "oscar" and ("/whoosh/" in last or (
            "whoosh" in failure and any(error in failure for error in _WHOOSH_ERRORS))):
        return _WHOOSH_RACE
    if suite == "taggit" and through:
        if name in EXPECTED_THROUGH:
            return EXPECTED_THROUGH[name]
        if any(error in failure for error in _NARROW_COLUMN_ERRORS):
            return TAGGIT_TEST_MODELS_NARROW
    return None


def differences(failing: dict[str, dict[str, str]]) -> list[str]:
    return sorted(name for name in set(failing["snowflake"]) - set(failing["auto"])
                  if not name.startswith(_UNFINISHED))


def _short(failure: str) -> str:
    """The failure's most telling line: the database's or the assertion's."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    for marker in (*_NARROW_COLUMN_ERRORS, "Error:", "assert", "Error"):
        for line in reversed(lines):
            if marker in line:
                return line[:160]
    return lines[-1][:160] if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oscar-source", type=Path, help="folder holding Oscar's tests/")
    parser.add_argument("--taggit-source", type=Path, help="folder holding taggit's tests/")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--oscar", default="4.2.1", help="django-oscar release (PyPI)")
    parser.add_argument("--taggit", default="6.1.0", help="django-taggit release (PyPI)")
    parser.add_argument("--django", default="5.2", help="Django release series")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venv")
    parser.add_argument("--parallel", type=int, default=2, help="pytest-xdist workers (Oscar)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per suite run")
    parser.add_argument("--taggit-through", default=TAGGIT_THROUGH_DEFAULT,
                        help="MODULE.Model: a through model with a 64-bit object_id for "
                        "taggit's test models in the snowflake run ('suite', the default: "
                        "the script's own from snowflake_db's base; 'none': taggit's own)")
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".venv" / "shop-suites")
    parser.add_argument("--tests", nargs="+", default=[],
                        help="only these tests (pytest node ids or unittest labels; one suite)")
    parser.add_argument("--freezegun-ignore", action="store_true",
                        help="snowflake run: freezegun.configure(extend_ignore_list="
                        "['snowflake_db']) (tests that freeze time otherwise poison the "
                        "process's leased generator)")
    parser.add_argument("--oscar-converted", action="store_true",
                        help="snowflake run: Oscar's test site converted as the docs say (order "
                        "and catalogue forked with 64-bit fields; see oscar_shop.py)")
    parser.add_argument("--skip-checks", action="store_true", help="run no `check` first")
    parser.add_argument("--checks-only", action="store_true",
                        help="run the `check` step of the snowflake run(s), no suite")
    parser.add_argument("--reanalyse", action="store_true",
                        help="run nothing: compare the last run's logs again")
    parser.add_argument("--check", action="store_true", help="exit 1 on unexpected differences")
    args = parser.parse_args(argv)
    suites, runs = args.suites.split(","), args.runs.split(",")
    if set(suites) - set(SUITES) or set(runs) - set(RUNS):
        parser.error(f"suites among {', '.join(SUITES)}; runs among {', '.join(RUNS)}")
    sources = {"oscar": args.oscar_source, "taggit": args.taggit_source}
    for suite in suites:
        source = sources[suite]
        if source is None or not (source / "tests" / "__init__.py").exists():
            parser.error(f"--{suite}-source must name a folder holding {suite}'s tests/ "
                         "(see this script's docstring for how to get it)")
    through = {"suite": SUITE_THROUGH, "none": None}.get(args.taggit_through,
                                                         args.taggit_through)

    work_dir = args.work_dir.resolve()
    venv_python = prepare(work_dir, args.python, args.django, args.oscar, args.taggit)
    unexpected_total = 0
    rows = []
    for suite in suites:
        source = sources[suite].resolve()
        if suite == "oscar":
            oscar_migrations(source, work_dir)
        failing: dict[str, dict[str, str]] = {}
        for field in runs:
            converted = args.oscar_converted and suite == "oscar" and RUNS[field][1]
            run_source = source
            if converted:
                run_source = work_dir / OSCAR_CONVERTED_SOURCE
                if not args.reanalyse:
                    oscar_converted_source(source, run_source)
            run = Run(suite, field, venv_python=venv_python, source=run_source,
                      work_dir=work_dir, through=through if suite == "taggit" else None,
                      freezegun_ignore=args.freezegun_ignore, subset=bool(args.tests),
                      converted=converted)
            if args.reanalyse:
                failing[field] = run.failures()
                print(f"{suite:7} {field:10} {len(failing[field]):4} failing  (reused {run.log})")
                continue
            run.make_migrations()
            if converted:
                run.convert_oscar_site()
            if RUNS[field][1] and not args.skip_checks:
                findings = run.checks()
                print(f"{suite:7} {field:10} check: {len(findings)} snowflake_db finding(s) "
                      "before the first test", flush=True)
                for finding in findings:
                    print(f"  {finding}")
            if args.checks_only:
                continue
            failing[field], seconds = run.run(args.parallel, args.timeout, args.tests)
            print(f"{suite:7} {field:10} {len(failing[field]):4} failing  {seconds:6.0f} s  "
                  f"{run.log}", flush=True)
        if args.checks_only:
            continue
        row: dict[str, object] = {"suite": suite, **{f: len(failing[f]) for f in failing}}
        unexpected = 0
        if set(RUNS) <= set(failing):
            extra = differences(failing)
            for name in extra:
                reason = expected_reason(suite, name, failing["snowflake"][name],
                                         through=through is not None,
                                         converted=args.oscar_converted)
                unexpected += reason is None
                print(f"  only with Snowflake: {name}  ({reason or 'UNEXPECTED'})\n"
                      f"      {_short(failing['snowflake'][name])}")
            for name in sorted(set(failing["auto"]) - set(failing["snowflake"])):
                print(f"  only with AutoField: {name}")
            row["differ"] = len(extra)
            row["32-bit"] = sum(any(error in failing["snowflake"][name]
                                    for error in _NARROW_COLUMN_ERRORS) for name in extra)
        unexpected += unfinished_runs(failing)
        row["unexpected"] = unexpected
        unexpected_total += unexpected
        rows.append(row)

    if args.checks_only:
        return 0
    return report(
        "Shop suites on PostgreSQL: failing tests per run",
        ["suite", *RUNS, "differ", "32-bit", "unexpected"], rows,
        "auto: AutoField; snowflake: SnowflakeAutoField with snowflake_db.django installed; "
        "differ: failing only with snowflake, of which 32-bit: 'integer out of range' or "
        "KeyLookupOutOfRangeError; "
        "those without a reason in EXPECTED are unexpected",
        unexpected_total, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
