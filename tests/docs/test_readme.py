"""The non-Python code blocks of README.md and of the documentation site (``docs/``): every
console command is run or checked, YAML is parsed and its probe commands are run.

The Python blocks are run by pytest-markdown-docs (``--markdown-docs`` in the pytest options,
set up by ``tests/plugins/readme.py``). Here:

* ``snowflake-db`` commands run, as written, in the test venv; the placeholder control database
  ``postgresql+psycopg://app@db/control`` is a scratch PostgreSQL database holding a live, an
  expired and a reserved worker slot, as in the README's sample output. Output shown under a
  command must match what it prints (``parse`` exactly, others after digits are normalised;
  for a move, which prints progress as it goes, each shown line in order among what it prints).
* ``export NAME=URL`` sets a variable for the block's later commands (``$NAME``); the URL must be
  a placeholder this test stands in for: the control database above, or the shard-move
  examples' control database and two servers (``SHARD_SERVER_URLS``), which are throwaway
  PostgreSQL clusters with ``wal_level = logical`` or throwaway ``mariadbd`` servers (the
  source with a row-based binary log), started only when a block exports them.
* Other commands are checked: make targets exist, extras and the wheel name match
  ``pyproject.toml``, the options given to gunicorn, uvicorn and Celery are in their ``--help``,
  Django management sub-commands exist, environment variables are the library's.
* YAML is parsed: each container's command and variables are checked, and its probes run
  against the sample control database.
* A block in any other language (``docs/`` may also draw diagrams in ``text`` blocks), or a
  Python block marked ``notest``, fails the test.
* The README's links resolve: its own sections, files of the repository, and the headings of
  the ``docs/`` pages it links to (the site's own links are checked by ``zensical build --strict``).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown_it import MarkdownIt

from snowflake_db import Layout, MonotonicClock
from snowflake_db.process import WORKER_ID_ENV, WORKER_URL_ENV

from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import allocator, expire_lease

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: The README and every page of the documentation site.
DOCUMENTS = [README, *sorted((REPO / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent
PLACEHOLDER_URL = "postgresql+psycopg://app@db/control"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Variables a README command may set: the library's, and the examples' own.
KNOWN_VARIABLES = {
    WORKER_URL_ENV, WORKER_ID_ENV, "DATABASE_URL", "CONTROL_URL", "SNOWFLAKE_DB_PUBLIC_ID_KEYS",
    "PG_A", "PG_B", "MARIA_A", "MARIA_B",
}
#: The shard-move examples' control database and servers (docs/sharding/growing.md), and the
#: fixture and database each stands for: ``control`` (with the worker table), and ``shop`` on two
#: throwaway servers with the tables ``orders`` and ``order_items``: PostgreSQL clusters
#: (``wal_level = logical``, :func:`shard_servers`) or mariadbd servers
#: (:func:`mariadb_shard_servers`).
SHARD_SERVER_URLS = {
    "postgresql+psycopg://app@ctl/control": ("shard_servers", "control"),
    "postgresql+psycopg://app@pg-a/shop": ("shard_servers", "pg_a"),
    "postgresql+psycopg://app@pg-b/shop": ("shard_servers", "pg_b"),
    "mysql+pymysql://app@ctl/control": ("mariadb_shard_servers", "control"),
    "mysql+pymysql://app@maria-a/shop": ("mariadb_shard_servers", "maria_a"),
    "mysql+pymysql://app@maria-b/shop": ("mariadb_shard_servers", "maria_b"),
}
#: Commands whose output changes from run to run: compare after digits are normalised.
VARYING = ("generate", "bench", "workers", "doctor", "--version", "layout", "public")
#: Commands printing progress as they go (a slow step adds a line every few seconds): each
#: shown line must be printed, in that order, after digits and WAL positions are normalised.
PROGRESSING = ("move",)


@dataclass
class Command:
    line: int
    text: str
    output: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    options: set[str]
    content: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def commands(self) -> list[Command]:
        commands: list[Command] = []
        for offset, line in enumerate(self.content.splitlines()):
            if line.startswith("$ "):
                commands.append(Command(self.line + 1 + offset, line[2:]))
            elif line.strip():
                assert commands, f"{self.where}: output before any '$ ' command"
                commands[-1].output.append(line)
        return commands


def document_blocks(path: Path) -> list[Block]:
    blocks = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type == "fence" and token.map:
            lang, *options = token.info.split() or [""]
            blocks.append(Block(path, token.map[0] + 1, lang, set(options), token.content))
    return blocks


BLOCKS = [block for path in DOCUMENTS for block in document_blocks(path)]


def test_every_block_is_python_console_or_yaml_and_none_is_skipped() -> None:
    assert {block.path for block in BLOCKS} >= {README, REPO / "docs/reference/cli.md"}
    for block in BLOCKS:
        languages = ("python", "console", "yaml") + (("text",) if block.path != README else ())
        assert block.lang in languages, f"{block.where}: {block.lang}"
        assert "notest" not in block.options, f"{block.where}: a block that never runs"
        if block.lang == "text":
            assert "$ " not in block.content, f"{block.where}: a command in a text block"
    for block in BLOCKS:
        if block.lang == "console":
            assert block.commands, f"{block.where}: a console block with no '$ ' line"


def _words(line: str, *, varying: bool) -> list[str]:
    words = line.split()
    if not varying:
        return words
    # A WAL position (LSN, such as 0/1EEE000) is hexadecimal: one N, as any number.
    return [re.sub(r"\d+", "N", re.sub(r"\b[0-9A-F]+/[0-9A-F]+\b", "N", word)) for word in words]


def _split_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    environment = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        environment[name] = value
    return environment, words


@cache
def _help(*command: str) -> str:
    result = subprocess.run([str(BIN / command[0]), *command[1:], "--help"], capture_output=True,
                            text=True, timeout=60, check=False, env=dict(os.environ, COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    return result.stdout


def _check_options(words: list[str], help_text: str, where: str) -> None:
    for word in words:
        if word.startswith("-"):
            option = word.split("=", 1)[0]
            assert re.search(rf"(^|[\s,]){re.escape(option)}\b", help_text), f"{where}: {option}"


def _makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.MULTILINE))


def _extras() -> set[str]:
    return set(PYPROJECT["project"]["optional-dependencies"])


#: Other apps' management commands the docs show, and the script that runs each for real.
THIRD_PARTY_COMMANDS = {"oscar_fork_app": "benchmarks/oscar_shop.py"}


def _check_other(words: list[str], where: str) -> None:
    """Commands that are not run here: check that what they name exists."""
    program, *rest = words
    if program == "make":
        assert set(rest) <= _makefile_targets(), f"{where}: no such make target {rest}"
    elif program == "source":
        assert rest == [".venv/bin/activate"], where
        assert "VENV ?= .venv" in (REPO / "Makefile").read_text()
    elif (program, *rest[:2]) == ("python", "-m", "pip") or (program, *rest[:1]) == (
        "pip", "install"
    ):
        packages = rest[rest.index("install") + 1:]
        for package in packages:
            if package.startswith("dist/"):
                name, _, extras = package.partition("[")
                version = PYPROJECT["project"]["version"]
                assert name == f"dist/snowflake_db-{version}-py3-none-any.whl", where
                assert set(extras.rstrip("]").split(",")) <= _extras(), where
            else:
                test_extra = " ".join(PYPROJECT["project"]["optional-dependencies"]["test"])
                assert package in test_extra, f"{where}: {package} is not a declared dependency"
    elif program == "python" and rest[:2] == ["-m", "build"]:
        _check_options(rest[2:], subprocess.run(
            [sys.executable, "-m", "build", "--help"], capture_output=True, text=True,
            timeout=60, check=True).stdout, where)
    elif program == "python" and rest[:1] == ["manage.py"]:
        command, *arguments = rest[1:]
        if command == "snowflake":
            source = (REPO / "snowflake_db/django/management/commands/snowflake.py").read_text()
            assert f'add_parser("{arguments[0]}"' in source, where
        elif command in THIRD_PARTY_COMMANDS:  # run where that app is installed
            runner = REPO / THIRD_PARTY_COMMANDS[command]
            assert f'"{command}"' in runner.read_text(), f"{where}: {runner} does not run it"
        else:
            assert command in ("migrate", "makemigrations", "check"), where
    elif program in ("uvicorn", "gunicorn"):
        _check_options(rest, _help(program), where)
    elif program == "celery":
        _check_options(rest[: rest.index("worker")], _help("celery"), where)
        _check_options(rest[rest.index("worker") + 1:], _help("celery", "worker"), where)
    else:
        pytest.fail(f"{where}: no rule to run or check {program!r}; add one to {__file__}")


@pytest.fixture(scope="module")
def control_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The README's sample control database: one live, one expired and one reserved slot."""
    from ..plugins.databases import create_database, drop_database

    database: ScratchDatabase = create_database("postgresql", tmp_path_factory.mktemp("control"))
    try:
        with allocator(database) as alloc:
            layout = Layout()
            alloc.acquire(layout=layout, clock=MonotonicClock())
            crashed = alloc.acquire(layout=layout, clock=MonotonicClock())
            crashed.abandon()  # a crashed holder
            alloc.reserve_worker_id("orders id function", layout=layout)
            expire_lease(database.url, crashed.worker_id)  # its lease is over
            yield database.url.render_as_string(hide_password=False)
    finally:
        drop_database(database)


@pytest.fixture(scope="module")
def shard_servers() -> Iterator[dict[str, str]]:
    """The shard-move examples' databases by ``SHARD_SERVER_URLS`` name: ``shop`` on a source
    and a target cluster (``tests/plugins/shard_moves_postgres.py``: one initdb,
    ``wal_level = logical``, stopped by PID at the end) with the same tables, rows only on the
    source, and a control database with the worker table, whose leases a move's barrier reads."""
    from snowflake_db.worker import TableWorkerAllocator

    from ..plugins.shard_moves_postgres import DDL, LOAD, start_clusters

    with start_clusters() as clusters:
        for cluster in (clusters.source, clusters.target):
            cluster.create_database("shop")
            cluster.execute(*DDL, database="shop")
        clusters.source.execute(*LOAD, database="shop")
        clusters.source.create_database("control")
        with TableWorkerAllocator(clusters.source.url("control")) as workers:
            workers.create_tables()
        yield {"control": clusters.source.url("control"), "pg_a": clusters.source.url("shop"),
               "pg_b": clusters.target.url("shop")}


@pytest.fixture(scope="module")
def mariadb_shard_servers() -> Iterator[dict[str, str]]:
    """The MariaDB shard-move example's databases by ``SHARD_SERVER_URLS`` name: ``shop`` on a
    source (row-based binary log, as production sources run) and a target mariadbd
    (``tests/plugins/shard_moves_mariadb.py``: one install, stopped by PID at the end) with the
    same tables, rows only on the source, and a control database with the worker table on the
    source."""
    from snowflake_db.worker import TableWorkerAllocator

    from ..plugins.shard_moves_mariadb import DDL, LOAD, start_servers

    with start_servers() as servers:
        for server in (servers.source, servers.target):
            server.create_database("shop")
            server.execute(*DDL, database="shop")
        servers.source.execute(*LOAD, database="shop")
        servers.source.create_database("control")
        with TableWorkerAllocator(servers.source.url("control")) as workers:
            workers.create_tables()
        yield {"control": servers.source.url("control"), "maria_a": servers.source.url("shop"),
               "maria_b": servers.target.url("shop")}


def _export(words: list[str], request: pytest.FixtureRequest, where: str) -> dict[str, str]:
    """``export NAME=URL ...``: each URL a placeholder, given as the database it stands for."""
    exported = {}
    for word in words[1:]:
        name, equals, value = word.partition("=")
        assert equals and name in KNOWN_VARIABLES, f"{where}: export {word!r}"
        if value == PLACEHOLDER_URL:
            exported[name] = request.getfixturevalue("control_database")
        elif value in SHARD_SERVER_URLS:
            fixture, database = SHARD_SERVER_URLS[value]
            exported[name] = request.getfixturevalue(fixture)[database]
        else:
            pytest.fail(f"{where}: {name}={value!r} is no placeholder this test can stand in for")
    return exported


def _run_snowflake_db(command: Command, control_url: Callable[[], str], where: str,
                      tmp_path: Path, exported: dict[str, str]) -> None:
    text = command.text
    if PLACEHOLDER_URL in text:
        text = text.replace(PLACEHOLDER_URL, control_url())
    used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", text))
    assert used <= set(exported), f"{where}: ${sorted(used - set(exported))} is not exported"
    environment = {key: value for key, value in os.environ.items()
                   if key not in (WORKER_URL_ENV, WORKER_ID_ENV)}
    environment.update(exported)
    environment["PATH"] = f"{BIN}{os.pathsep}{environment['PATH']}"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", text], capture_output=True,
                            text=True, timeout=120, check=False, env=environment, cwd=tmp_path)
    assert result.returncode == 0, f"{where}: {result.stderr}"
    assert "Traceback" not in result.stderr, where
    if not command.output:
        return
    actual = result.stdout.splitlines()
    words = shlex.split(text, comments=True)
    if any(word in words for word in PROGRESSING):
        printed = iter([_words(line, varying=True) for line in actual])
        for expected in command.output:
            assert _words(expected, varying=True) in printed, (
                f"{where}: the page shows {expected!r}, which the command did not print (in "
                f"this order, digits aside):\n" + "\n".join(actual)
            )
        return
    varying = any(word in words for word in VARYING)
    shown = command.output if not varying else command.output[:1]
    for expected, got in zip(shown, actual, strict=False):
        assert _words(expected, varying=varying) == _words(got, varying=varying), (
            f"{where}: the page shows {expected!r}, the command printed {got!r}"
        )
    assert len(actual) >= len(shown), where


def _console_blocks() -> list[Any]:
    return [pytest.param(block, id=block.where) for block in BLOCKS if block.lang == "console"]


@pytest.mark.parametrize("block", _console_blocks())
def test_console_block(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    exported: dict[str, str] = {}
    for command in block.commands:
        where = f"{block.path.relative_to(REPO)}:{command.line}: {command.text}"
        words = shlex.split(command.text, comments=True)
        environment, words = _split_environment(words)
        assert set(environment) <= KNOWN_VARIABLES, f"{where}: {set(environment)}"
        if words[0] == "snowflake-db":
            _run_snowflake_db(command, lambda: request.getfixturevalue("control_database"),
                              where, tmp_path, exported)
        elif words[0] == "export":
            assert not command.output and not environment, where
            exported.update(_export(words, request, where))
        else:
            assert not command.output, f"{where}: output shown for a command not run here"
            _check_other(words, where)


def _containers(document: Any) -> Iterator[dict[str, Any]]:
    if isinstance(document, dict):
        if "containers" in document:
            yield from document["containers"]
        for value in document.values():
            yield from _containers(value)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in BLOCKS
                                   if b.lang == "yaml"])
def test_yaml_block(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    containers = list(_containers(yaml.safe_load(block.content)))
    assert containers, f"{block.where}: no containers"
    for container in containers:
        names = {variable["name"] for variable in container.get("env", [])}
        assert names <= KNOWN_VARIABLES and WORKER_URL_ENV in names, names
        program, *rest = container["command"]
        _check_other([program, *rest], block.where)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            if probe is None:
                continue
            # The probe runs for real, with the container's SNOWFLAKE_WORKER_URL pointing at
            # the README's control database, and must pass.
            command = probe["exec"]["command"]
            assert command[0] == "snowflake-db", f"{block.where}: {kind} {command}"
            environment = {key: value for key, value in os.environ.items()
                           if key not in (WORKER_URL_ENV, WORKER_ID_ENV)}
            environment[WORKER_URL_ENV] = request.getfixturevalue("control_database")
            result = subprocess.run([str(BIN / command[0]), *command[1:]], capture_output=True,
                                    text=True, timeout=60, check=False, env=environment,
                                    cwd=tmp_path)
            assert result.returncode == 0, f"{block.where}: {kind}: {result.stderr}"
            assert probe["timeoutSeconds"] >= 5, f"{block.where}: {kind} timeout"


def _anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub (and MkDocs, for these) makes them."""
    anchors = set()
    for heading, inline in itertools.pairwise(MarkdownIt("commonmark").parse(path.read_text())):
        if heading.type == "heading_open":
            text = re.sub(r"[^\w\- ]", "", inline.content.strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_link_inside_the_readme_resolves() -> None:
    """Links to sections (GitHub's anchors), to files of the repository and to their headings."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if link.startswith("#"):
            assert link[1:] in _anchors(README), f"README.md links to a missing section {link}"
        elif not link.startswith("http"):
            path, _, anchor = link.partition("#")
            assert (REPO / path).exists(), f"README.md links to a missing file {link}"
            if anchor:
                assert anchor in _anchors(REPO / path), f"README.md links to a missing {link}"
