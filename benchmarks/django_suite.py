"""Django's own test suite under ``BigAutoField``, under ``SnowflakeAutoField``, and with the
app installed, compared.

Run it with ``python benchmarks/django_suite.py`` (or ``make django-suite``; not part of
``make test``). It downloads the Django sdist from PyPI (which ships ``tests/`` and
``runtests.py``) into ``--work-dir`` (default ``.venv/django-suite``), builds a venv there with
that Django, psycopg, PyMySQL and this checkout, then runs the apps below on SQLite, PostgreSQL
and MariaDB three times (``RUNS``): ``big`` (``BigAutoField``), ``snowflake``
(``SnowflakeAutoField`` as ``DEFAULT_AUTO_FIELD``, the field alone) and ``app`` (the same field
with ``snowflake_db.django`` in ``INSTALLED_APPS`` and ``SNOWFLAKE_DB`` leasing worker IDs from
its table, as the docs recommend, and ``AUTO_FIELD_DATABASE_KEYS`` on). It prints, per backend,
how many tests failed in each run, which fail only with Snowflake keys (and only with
BigAutoField), and which fail only with the app installed.

Targets: no test that passes with ``BigAutoField`` fails with ``SnowflakeAutoField`` (issue 10),
and none that passes with the field alone fails with the app installed (issue 17), except the
ones in ``EXPECTED`` and ``EXPECTED_APP`` below, each with the reason. ``--check`` exits 1 on any
other difference.

``runtests.py`` sets ``INSTALLED_APPS`` and ``SILENCED_SYSTEM_CHECKS`` itself, so the ``app`` run
uses a copy of it (``runtests_snowflake_app.py`` beside it) that adds ``snowflake_db.django`` to
its always-installed apps and silences only ``snowflake_db.E012`` and ``E014`` (Django's test
models keep generic-relation object IDs and some keys, such as ``lookup.Freebie.stock_id``, in
32-bit columns). Like every project's, its second
``apps.set_installed_apps()`` runs the app's ``ready()`` again.

Django 6 needs Python 3.12+: ``--django 6.1 --python python3.12``. Databases are created under
names unique to the run on the servers at ``SNOWFLAKE_TEST_POSTGRES_URL`` and
``SNOWFLAKE_TEST_MARIADB_URL`` (the defaults are the local servers) and dropped by Django's test
runner. Snowflake keys come from a table allocator on a SQLite file, so Django's forked parallel
workers each lease their own worker ID.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]

APPS = (
    "basic", "bulk_create", "model_fields", "many_to_one", "many_to_many", "one_to_one",
    "model_inheritance", "model_inheritance_regress", "queries", "get_or_create", "update",
    "delete", "select_related", "prefetch_related", "serializers", "fixtures", "fixtures_regress",
    "model_formsets", "admin_views", "generic_relations", "custom_pk", "aggregation",
    "expressions", "migrations", "contenttypes_tests", "auth_tests",
    # the admin and forms, where the installed app (admin pages, a non-editable key) shows
    "admin_docs", "admin_inlines", "model_forms", "apps",
)

_BIG = "django.db.models.BigAutoField"
_SNOWFLAKE = "snowflake_db.django.fields.SnowflakeAutoField"
#: run name -> (DEFAULT_AUTO_FIELD, snowflake_db.django installed)
RUNS = {"big": (_BIG, False), "snowflake": (_SNOWFLAKE, False), "app": (_SNOWFLAKE, True)}
APP = "snowflake_db.django"
BACKENDS = ("sqlite", "postgresql", "mariadb")

_RETURNING = "asserts AutoField's SQL: the key read back with RETURNING"
#: Tests that differ by design, with the reason (each is listed on docs/benchmarks.md).
#: Not differences: Django's own tests that pass or fail by chance in any run of the field (a
#: timing test on a loaded machine, with BigAutoField too; an order that follows the keys'
#: hashes), so they may turn up in either comparison.
UNSTABLE: dict[str, str] = {
    "serializers.test_deserialization.TestDeserializer.test_crafted_xml_performance": (
        "timing-sensitive (fails under BigAutoField too when the machine is busy)"
    ),
    "fixtures.tests.ForwardReferenceTests.test_forward_reference_m2m_natural_key": (
        "asserts the order of an m2m's rows, which Django inserts in the order of a Python set "
        "of the target keys: 2 and 3 iterate in order, two 64-bit keys in their hashes' order "
        "(either way round, by the keys' low bits: failed in one of two Snowflake runs)"
    ),
}

EXPECTED: dict[str, str] = {
    "queries.test_db_returning.ReturningValuesTests.test_insert_returning": _RETURNING,
    "queries.test_db_returning.ReturningValuesTests.test_insert_returning_multiple": _RETURNING,
    "bulk_create.tests.BulkCreateTests.test_explicit_batch_size_respects_max_batch_size": (
        "asserts AutoField's SQL: SQLite batches are sized for rows without the key column"
    ),
    "bulk_create.tests.BulkCreateTransactionTests.test_objs_with_and_without_pk": (
        "asserts AutoField's SQL: objects without a key go in a second INSERT (Django 6.1)"
    ),
    **dict.fromkeys(
        [
            "migrations.test_commands.MakeMigrationsTests.test_makemigrations_check_no_changes",
            "migrations.test_commands.MakeMigrationsTests."
            "test_makemigrations_model_rename_interactive",
            "migrations.test_commands.MakeMigrationsTests.test_makemigrations_no_changes",
            "model_inheritance.test_abstract_inheritance.AbstractInheritanceTests."
            "test_abstract_model_with_regular_python_mixin_mro",
        ],
        "asserts the automatic key's class: the test app's migrations or expected fields name "
        "BigAutoField (Django 6.1; under Django 5.2 they fail with BigAutoField too)",
    ),
    **dict.fromkeys(
        [
            "apps.tests.QueryPerformingAppTests.test_query_many_default_database_using_cursor",
            "apps.tests.QueryPerformingAppTests.test_query_many_other_database_using_cursor",
        ],
        "a raw SQL INSERT without the key (cursor.executemany in an AppConfig.ready()) into "
        "models keyed by DEFAULT_AUTO_FIELD: the field alone gives the column no database "
        "key, so the INSERT fails instead of taking a small number (PostgreSQL, MariaDB; "
        "SQLite's rowid fills it in). They pass in the app run, whose SNOWFLAKE_DB sets "
        "AUTO_FIELD_DATABASE_KEYS (docs/reference/django-key-functions.md)",
    ),
    **UNSTABLE,
}

#: Tests that fail with the app installed but pass with the field alone, by design.
EXPECTED_APP: dict[str, str] = {}

#: A failure whose error is one of these stored a 64-bit key in a column of 32 bits or fewer
#: that the test's own model declares (an IntegerField or a GenericForeignKey's
#: PositiveIntegerField object ID; check snowflake_db.E012 flags the latter).
_NARROW_COLUMN_ERRORS = ("integer out of range", "Out of range value for column")
NARROW_COLUMN = "the test's model keeps a 64-bit key in an integer column of 32 bits or fewer"

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"

SETTINGS = '''\
"""Written by benchmarks/django_suite.py: one backend, one auto field, from the environment."""
import os

import pymysql

pymysql.install_as_MySQLdb()

_backend = os.environ["SUITE_BACKEND"]
_run = os.environ["SUITE_RUN"]
SECRET_KEY = "django_tests_secret_key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
USE_TZ = False
DEFAULT_AUTO_FIELD = os.environ["SUITE_AUTO_FIELD"]


def _server(engine, alias):
    name = f"{_run}_{alias}"
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": os.environ["SUITE_DB_USER"],
        "PASSWORD": os.environ.get("SUITE_DB_PASSWORD", ""),
        "HOST": os.environ["SUITE_DB_HOST"],
        "PORT": os.environ["SUITE_DB_PORT"],
        "TEST": {"NAME": f"test_{name}"},
        **({"OPTIONS": {"charset": "utf8mb4"}} if "mysql" in engine else {}),
    }


if _backend == "sqlite":
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3"},
        "other": {"ENGINE": "django.db.backends.sqlite3"},
    }
else:
    _engine = {
        "postgresql": "django.db.backends.postgresql",
        "mariadb": "django.db.backends.mysql",
    }[_backend]
    DATABASES = {alias: _server(_engine, alias) for alias in ("default", "other")}

if os.environ.get("SUITE_APP"):
    # As the README recommends: the app leases each process's worker ID from its table on the
    # control database (its migration makes the table in every test database). Django's SQLite
    # test databases live in memory, which the allocator's own connection cannot share: there
    # the table is in a file named by ENGINE_URL.
    # Raw INSERTs without the key (the apps tests) get keys from the database, as with
    # BigAutoField (PostgreSQL, MariaDB; nothing to do on SQLite).
    SNOWFLAKE_DB = {"WORKER_SOURCE": "table", "AUTO_FIELD_DATABASE_KEYS": True}
    if _backend == "sqlite":
        SNOWFLAKE_DB["ENGINE_URL"] = f"sqlite:///{os.environ['SUITE_WORKER_DB']}"
        SNOWFLAKE_DB["ALLOCATOR_OPTIONS"] = {"create_tables": True}
elif "Snowflake" in DEFAULT_AUTO_FIELD:
    import snowflake_db
    from snowflake_db.worker import TableWorkerAllocator

    snowflake_db.configure(
        allocator=TableWorkerAllocator(f"sqlite:///{os.environ['SUITE_WORKER_DB']}")
    )
'''

_RESULT_LINE = re.compile(r"^(?:ERROR|FAIL|UNEXPECTED SUCCESS): (\S+) \((\S+?)\)", re.MULTILINE)
_SEPARATOR = re.compile(r"^={50,}$", re.MULTILINE)
_UNFINISHED = "<the run did not finish"


def _run(command: list[str], **kwargs: object) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)  # type: ignore[call-overload]


def prepare(work_dir: Path, django_spec: str, python: str) -> tuple[Path, Path]:
    """Download the sdist, build the venv; return (venv python, the sdist's tests folder)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^0-9.]", "", django_spec) or "latest"
    sdist_dir = work_dir / f"sdist-{tag}"
    sdists = sorted(sdist_dir.glob("[dD]jango-*.tar.gz"))
    if not sdists:
        _run([python, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
              f"django=={django_spec}.*", "-d", str(sdist_dir)])
        sdists = sorted(sdist_dir.glob("[dD]jango-*.tar.gz"))
    sdist = sdists[-1]
    source = sdist_dir / sdist.name.removesuffix(".tar.gz")
    if not (source / "tests" / "runtests.py").exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(sdist_dir, filter="data")
    venv_python = build_venv(python, work_dir, source.name, [
        str(sdist), "psycopg[binary]", "PyMySQL", "tblib", "PyYAML", "Pillow", "-e",
        f"{ROOT}[sqlalchemy]"])
    (work_dir / "suite_settings.py").write_text(SETTINGS)
    return venv_python, source / "tests"


def build_venv(python: str, work_dir: Path, name: str, packages: list[str]) -> Path:
    """A venv ``venv-NAME-pyX.Y`` in ``work_dir`` with ``packages`` (built again when this
    checkout's pyproject.toml is newer); its python."""
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    venv = work_dir / f"venv-{name}-py{version}"
    venv_python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        _run([python, "-m", "venv", str(venv)])
        _run([str(venv_python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
        _run([str(venv_python), "-m", "pip", "install", "--quiet", *packages])
        stamp.touch()
    return venv_python


#: (text in runtests.py, its replacement) for the ``app`` run's copy.
_APP_PATCHES = (
    ('    "django.contrib.staticfiles",\n]', f'    "django.contrib.staticfiles",\n    "{APP}",\n]'),
    ('        "fields.W342",  # ForeignKey(unique=True) -> OneToOneField\n',
     '        "fields.W342",  # ForeignKey(unique=True) -> OneToOneField\n'
     '        "snowflake_db.E012",  # 32-bit generic-relation object IDs in the test models\n'
     '        "snowflake_db.E014",  # keys in 32-bit integer fields (lookup.Freebie.stock_id)\n'),
)


def app_runtests(tests_dir: Path) -> str:
    """Write ``runtests.py`` with the app installed (see the module docstring); its name."""
    text = (tests_dir / "runtests.py").read_text()
    for old, new in _APP_PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"runtests.py changed: {old!r} is not there once")
        text = text.replace(old, new)
    name = "runtests_snowflake_app.py"
    (tests_dir / name).write_text(text)
    return name


def _server_env(backend: str) -> dict[str, str]:
    if backend == "sqlite":
        return {}
    variable, default = {
        "postgresql": ("SNOWFLAKE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        "mariadb": ("SNOWFLAKE_TEST_MARIADB_URL", DEFAULT_MARIADB_URL),
    }[backend]
    url = urlsplit(os.environ.get(variable, default))
    return {
        "SUITE_DB_USER": url.username or "",
        "SUITE_DB_PASSWORD": url.password or "",
        "SUITE_DB_HOST": url.hostname or "127.0.0.1",
        "SUITE_DB_PORT": str(url.port or (5432 if backend == "postgresql" else 3306)),
    }


def run_suite(venv_python: Path, tests_dir: Path, work_dir: Path, *, backend: str, field: str,
              apps: list[str], parallel: int) -> tuple[dict[str, str], str, float]:
    """Run the apps once; return the failing test ids, the log's path and the seconds taken."""
    auto_field, installed = RUNS[field]
    runtests = app_runtests(tests_dir) if installed else "runtests.py"
    run = f"djsuite_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    worker_db = work_dir / f"{run}_workers.sqlite3"
    env = {
        **os.environ,
        **_server_env(backend),
        "PYTHONPATH": str(work_dir),
        "SUITE_BACKEND": backend,
        "SUITE_RUN": run,
        "SUITE_AUTO_FIELD": auto_field,
        "SUITE_WORKER_DB": str(worker_db),
        "SUITE_APP": "1" if installed else "",
    }
    env.pop("SNOWFLAKE_WORKER_ID", None)
    env.pop("SNOWFLAKE_WORKER_URL", None)
    log = work_dir / f"{tests_dir.parent.name}-{backend}-{field}.log"
    started = time.monotonic()
    with log.open("w") as out:
        subprocess.run(
            [str(venv_python), runtests, "--settings=suite_settings", "--noinput",
             f"--parallel={parallel}", *apps],
            cwd=tests_dir, env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
        )
    seconds = time.monotonic() - started
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{worker_db}{suffix}").unlink(missing_ok=True)
    return failing_tests(log.read_text(errors="replace"), log), str(log), seconds


def failing_tests(text: str, log: Path) -> dict[str, str]:
    """The failing test ids of a runtests.py log, each with its report (plus a marker when the
    run did not finish)."""
    failing: dict[str, str] = {}
    for block in _SEPARATOR.split(text):
        match = _RESULT_LINE.search(block.lstrip("\n"))
        if match is not None and match.start() == 0:
            name, where = match.groups()
            failing[where if where.endswith(name) else f"{where}.{name}"] = block
    if not re.search(r"^Ran \d+ tests? in", text, re.MULTILINE):
        failing[f"{_UNFINISHED}: see {log}>"] = ""
    return failing


def expected_reason(name: str, report: str) -> str | None:
    """Why a test may fail with Snowflake keys only, or None if it must not."""
    if name in EXPECTED:
        return EXPECTED[name]
    if any(error in report for error in _NARROW_COLUMN_ERRORS):
        return NARROW_COLUMN
    return None


def compare(failing: dict[str, dict[str, str]], run: str, baseline: str,
            expected: Callable[[str, str], str | None]) -> dict[str, str | None]:
    """The tests failing in ``run`` but not in ``baseline``, each with its expected reason
    (None: unexpected)."""
    extra = sorted(name for name in set(failing[run]) - set(failing[baseline])
                   if not name.startswith(_UNFINISHED))  # counted on their own
    return {name: expected(name, failing[run][name]) for name in extra}


def _expected_app(name: str, report: str) -> str | None:
    return EXPECTED_APP.get(name) or UNSTABLE.get(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--django", default="5.2", help="Django release series (default 5.2)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venv")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--apps", default=" ".join(APPS), help="space-separated test apps")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"comma-separated runs among {', '.join(RUNS)} (default: all)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=ROOT / ".venv" / "django-suite")
    parser.add_argument("--check", action="store_true", help="exit 1 on unexpected differences")
    parser.add_argument("--reuse-baseline", action="store_true",
                        help="take the BigAutoField results from the last run's log, if any")
    parser.add_argument("--reanalyse", action="store_true",
                        help="run nothing: compare the last run's logs again")
    args = parser.parse_args(argv)
    runs = args.runs.split(",")
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        parser.error(f"unknown run(s) {', '.join(unknown)}; known: {', '.join(RUNS)}")

    work_dir = args.work_dir.resolve()
    venv_python, tests_dir = prepare(work_dir, args.django, args.python)
    apps = args.apps.split()
    unexpected_total = 0
    rows = []
    for backend in args.backends.split(","):
        failing: dict[str, dict[str, str]] = {}
        for field in runs:
            reuse = args.reanalyse or (field == "big" and args.reuse_baseline)
            previous = work_dir / f"{tests_dir.parent.name}-{backend}-{field}.log"
            if reuse and previous.exists():
                failing[field] = failing_tests(previous.read_text(errors="replace"), previous)
                print(f"{backend:10} {field:9} {len(failing[field]):4} failing  "
                      f"(reused {previous})")
                continue
            failing[field], log, seconds = run_suite(
                venv_python, tests_dir, work_dir, backend=backend, field=field,
                apps=apps, parallel=args.parallel)
            print(f"{backend:10} {field:9} {len(failing[field]):4} failing  "
                  f"{seconds:6.0f} s  {log}", flush=True)
        row: dict[str, object] = {"backend": backend, **{f: len(failing[f]) for f in failing}}
        unexpected = 0
        if {"big", "snowflake"} <= set(failing):
            reasons = compare(failing, "snowflake", "big", expected_reason)
            for name, reason in reasons.items():
                print(f"  only with Snowflake: {name}  ({reason or 'UNEXPECTED'})")
            for name in sorted(set(failing["big"]) - set(failing["snowflake"])):
                print(f"  only with BigAutoField: {name}")
            row["differ"] = len(reasons)
            row["32-bit"] = sum(reason == NARROW_COLUMN for reason in reasons.values())
            unexpected += sum(reason is None for reason in reasons.values())
        if {"snowflake", "app"} <= set(failing):
            reasons = compare(failing, "app", "snowflake", _expected_app)
            for name, reason in reasons.items():
                print(f"  only with the app installed: {name}  ({reason or 'UNEXPECTED'})")
            for name in sorted(set(failing["snowflake"]) - set(failing["app"])):
                print(f"  only without the app: {name}")
            row["app only"] = len(reasons)
            unexpected += sum(reason is None for reason in reasons.values())
        unexpected += unfinished_runs(failing)
        row["unexpected"] = unexpected
        unexpected_total += unexpected
        rows.append(row)

    return report(
        f"Django suite ({tests_dir.parent.name}, {len(apps)} apps): failing tests per run",
        ["backend", *runs, "differ", "32-bit", "app only", "unexpected"], rows,
        "big: BigAutoField; snowflake: SnowflakeAutoField alone; app: the field with "
        "snowflake_db.django installed. differ: failing only with snowflake, of which 32-bit: "
        "the test's model keeps keys in 32-bit columns; app only: failing only with the app; "
        "the rest are listed in EXPECTED and EXPECTED_APP with their reasons",
        unexpected_total, check=args.check)


def unfinished_runs(failing: dict[str, dict[str, str]]) -> int:
    """Print every run that did not finish (each one unexpected); how many there are."""
    unfinished = [name for run in failing.values() for name in run
                  if name.startswith(_UNFINISHED)]
    for name in unfinished:
        print(f"  {name}  (UNEXPECTED)")
    return len(unfinished)


def report(title: str, columns: list[str], rows: list[dict[str, object]], legend: str,
           unexpected_total: int, *, check: bool) -> int:
    """Print the table of failing tests per run and the verdict; the exit status (1 on an
    unexpected difference, with ``--check``)."""
    columns = [c for c in columns if any(c in row for row in rows)]
    print(f"\n{title}")
    print("  ".join(f"{c:>10}" for c in columns))
    for row in rows:
        print("  ".join(f"{row.get(c, '-')!s:>10}" for c in columns))
    print(f"({legend})")
    verdict = "PASS" if unexpected_total == 0 else "FAIL"
    print(f"target: no unexpected difference -> {verdict} ({unexpected_total} unexpected)")
    return 1 if check and unexpected_total else 0


if __name__ == "__main__":
    sys.exit(main())
