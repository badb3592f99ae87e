"""One mover, several backends: the MoveBackend protocol, the registry choosing a backend by the
shard map, MariaDB sessions, and maps holding PostgreSQL and MariaDB targets at once.

A move runs between two servers of the same backend: asked for a move from a PostgreSQL to a
MariaDB target, the mover (and ``snowflake-db shards``, and ``manage.py snowflake shards``)
refuses with one error before anything changes. These tests use the shared servers (a map and
its targets are databases on 127.0.0.1:5432 and 127.0.0.1:3306, the control database on either)
and change nothing on them but their own scratch databases: no move starts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
from sqlalchemy import Engine, MetaData, select

from snowflake_db import Layout
from snowflake_db.cli import main
from snowflake_db.errors import (
    FenceBlockedError,
    InvalidArgumentError,
    MoveServerUnreachableError,
    ShardMoveError,
    VerificationMismatchError,
)
from snowflake_db.sharding.moves import (
    MOVE_BACKEND_MEMBERS,
    MoveBackend,
    PostgresMoveBackend,
    ShardMover,
    _backend,
    backend_class,
)
from snowflake_db.sharding.moves._connections import MariaDBConnector
from snowflake_db.sharding.shard_map import (
    add_target,
    create_shard_map_tables,
    init_shard_map,
    read_shard_map,
    shard_map_tables,
)
from snowflake_db.worker import worker_tables
from tests.plugins.databases import ScratchDatabase
from tests.plugins.shard_moves import manage_shards

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = Layout(sequence_bits=8, shard_bits=4)
CROSS = "a move runs between two servers of the same backend: source pg is postgresql, " \
        "target maria is mariadb"


def _postgres_backend() -> PostgresMoveBackend:
    """A backend object only (no connection is made until a step runs)."""
    conninfo = "host=127.0.0.1 port=5432 user=postgres dbname=test"
    return PostgresMoveBackend(source=conninfo, target=conninfo,
                               source_conninfo_for_target=conninfo, layout=LAYOUT, shard=1,
                               move_id=1, target_name="b", tables=["orders"])


# -- the protocol ----------------------------------------------------------------------------------


def test_the_member_list_is_the_protocols_and_postgres_has_every_member() -> None:
    declared = {name for name in vars(MoveBackend) if not name.startswith("_")}
    declared |= set(MoveBackend.__annotations__)
    assert declared == set(MOVE_BACKEND_MEMBERS)
    backend = _postgres_backend()
    missing = [name for name in MOVE_BACKEND_MEMBERS if not hasattr(backend, name)]
    assert missing == []
    assert isinstance(backend, MoveBackend)
    assert (backend.kind, backend.backlog_unit, backend.name) == ("postgresql", "bytes",
                                                                  "sfdb_move_1")
    assert backend_class("postgresql") is PostgresMoveBackend

    class WithoutAdvance:  # every member but one: not a MoveBackend
        pass

    for name in MOVE_BACKEND_MEMBERS:
        if name != "advance":
            setattr(WithoutAdvance, name, getattr(backend, name))
    assert not isinstance(WithoutAdvance(), MoveBackend)


_CONFORMS = """
from snowflake_db.sharding.moves import MoveBackend, PostgresMoveBackend

backend: type[MoveBackend] = PostgresMoveBackend
"""
_DOES_NOT = """
from snowflake_db.sharding.moves import MoveBackend, PostgresMoveBackend


class Drifted(PostgresMoveBackend):
    def drained(self, position: int) -> bool:  # type: ignore[override]
        return False


backend: type[MoveBackend] = Drifted
"""


def test_postgres_backend_satisfies_the_protocol_under_mypy(tmp_path: Path) -> None:
    """mypy --strict accepts the class where a MoveBackend is expected, and refuses one whose
    step drifted from the protocol (the check can fail)."""
    results = {}
    for name, source in (("conforms", _CONFORMS), ("does_not", _DOES_NOT)):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
             "--cache-dir", str(tmp_path / "mypy_cache"), str(path)],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        results[name] = done
    assert results["conforms"].returncode == 0, results["conforms"].stdout
    assert results["does_not"].returncode == 1
    assert 'variable has type "type[MoveBackend]"' in results["does_not"].stdout


def test_a_missing_mariadb_backend_module_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_backend, "_MARIADB_MODULE", "snowflake_db.sharding.moves._absent")
    with pytest.raises(ShardMoveError, match=r"^MariaDB moves need snowflake_db\.sharding"
                                             r"\.moves\._absent"):
        backend_class("mariadb")
    with pytest.raises(ShardMoveError, match="no online moves between sqlite servers"):
        backend_class("sqlite")


def test_the_move_errors_live_in_errors_and_are_still_importable_where_they_were() -> None:
    from snowflake_db.sharding import moves
    from snowflake_db.sharding.moves import _results

    for error in (FenceBlockedError, VerificationMismatchError):
        assert error.__module__ == "snowflake_db.errors"
        assert getattr(moves, error.__name__) is error
        assert getattr(_results, error.__name__) is error
        assert issubclass(error, ShardMoveError)


def test_the_mover_package_imports_without_psycopg() -> None:
    """A MariaDB shop installs the mysql extra, not psycopg: the mover and its commands load
    without it, and a PostgreSQL move says which extra it needs."""
    script = textwrap.dedent("""
        import sys
        sys.modules["psycopg"] = None  # as if not installed
        from snowflake_db.sharding.moves import ShardMover, backend_class
        from snowflake_db.cli import main
        try:
            backend_class("postgresql")
        except ImportError as error:
            print(type(error).__name__, error)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "MissingExtraError" in done.stdout and "snowflake-db[postgres]" in done.stdout


# -- MariaDB sessions ----------------------------------------------------------------------------


def test_mariadb_sessions_are_autocommit_held_and_named_when_lost(
    mariadb_db: ScratchDatabase
) -> None:
    url = mariadb_db.url_string
    connector = MariaDBConnector(url, "source")
    assert connector.description == f"127.0.0.1:3306/{mariadb_db.name}"
    assert "root" not in connector.description
    with connector.session() as conn, conn.cursor() as cursor:
        cursor.execute("SELECT @@autocommit, DATABASE()")
        assert cursor.fetchone() == (1, mariadb_db.name)
    with connector.held():
        with connector.session() as first, first.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            (held_id,) = cursor.fetchone()
        with connector.session() as second, second.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            assert cursor.fetchone() == (held_id,)  # one session for the block
        killer = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
        try:
            with killer.cursor() as cursor:
                cursor.execute(f"KILL {int(held_id)}")
        finally:
            killer.close()
        with pytest.raises(ShardMoveError,
                           match=rf"^lost the connection to the source 127\.0\.0\.1:3306/"
                                 rf"{mariadb_db.name}: \(2013"), \
                connector.session() as lost, lost.cursor() as cursor:
            cursor.execute("SELECT 1")
        with connector.session() as fresh, fresh.cursor() as cursor:  # a new one, not the lost
            cursor.execute("SELECT CONNECTION_ID()")
            assert cursor.fetchone() != (held_id,)


def test_mariadb_endpoints_refused_or_unreachable_say_which_and_why(
    mariadb_db: ScratchDatabase
) -> None:
    closed = mariadb_db.url.set(port=1).render_as_string(hide_password=False)
    with pytest.raises(ShardMoveError, match=r"^cannot connect to the target 127\.0\.0\.1:1/"), \
            MariaDBConnector(closed, "target").session():
        pass
    with pytest.raises(InvalidArgumentError, match="'nonsense', which is no PyMySQL connect"):
        MariaDBConnector(f"{mariadb_db.url_string}?nonsense=1", "source")
    with pytest.raises(InvalidArgumentError, match="is a postgresql URL, not MariaDB's"):
        MariaDBConnector("postgresql+psycopg://postgres@127.0.0.1:5432/test", "source")
    engine = mariadb_db.engine()
    with MariaDBConnector(engine, "target").session() as conn, conn.cursor() as cursor:
        cursor.execute("SELECT DATABASE()")
        assert cursor.fetchone() == (mariadb_db.name,)
    with engine.connect() as connection:  # the pooled connection went back transactional
        assert connection.exec_driver_sql("SELECT @@autocommit").scalar() == 0


class SilentServer:
    """A loopback port that accepts connections and never says a word (a server too busy to
    start a session); counts the connections made to it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        with suppress(OSError):  # closed by close()
            while True:
                self.accepted.append(self.listener.accept()[0])

    def close(self) -> None:
        self.listener.close()
        for connection in self.accepted:
            connection.close()


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_connect_that_times_out_is_made_again_then_names_the_server(
    backend: str, monkeypatch: pytest.MonkeyPatch,
    database_factory: Callable[[str], ScratchDatabase],
) -> None:
    """A session a server does not start within the timeout: connected again, three connects
    in all, then one clear error; a refused connect is not repeated."""
    from snowflake_db.sharding.moves import _connections

    monkeypatch.setattr(_connections, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    mariadb_url = database_factory("mariadb").url_string if backend == "mariadb" else ""
    silent = SilentServer()
    try:
        where = f"127.0.0.1:{silent.port}"
        if backend == "postgresql":
            connector: Any = _connections.Connector(
                f"host=127.0.0.1 port={silent.port} dbname=shop user=postgres", "target")
        else:
            connector = MariaDBConnector(f"mysql+pymysql://root@{where}/shop", "target")
        with pytest.raises(MoveServerUnreachableError,
                           match=rf"^cannot connect to the target {where}/shop: .*time"), \
                connector.session():
            pass
        assert len(silent.accepted) == _connections.CONNECT_ATTEMPTS == 3
    finally:
        silent.close()
    if backend == "mariadb":  # the greeting's bound is not the session's: a long read passes
        with MariaDBConnector(mariadb_url, "target").session() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT SLEEP(3)")
            assert cursor.fetchone() == (0,)
    closed = silent.port  # nothing listens there any more: refused at once, once
    refused = (_connections.Connector(f"host=127.0.0.1 port={closed} dbname=shop", "target")
               if backend == "postgresql" else
               MariaDBConnector(f"mysql+pymysql://root@127.0.0.1:{closed}/shop", "target"))
    with pytest.raises(MoveServerUnreachableError, match="refused"), refused.session():
        pass


# -- maps holding PostgreSQL and MariaDB targets --------------------------------------------------


@dataclass
class Mixed:
    """A map on ``control`` with every shard on ``pg`` (PostgreSQL) and ``maria`` (MariaDB)
    registered, empty."""

    control: ScratchDatabase
    pg: ScratchDatabase
    maria: ScratchDatabase
    engine: Engine

    @property
    def targets(self) -> dict[str, str]:
        return {"pg": self.pg.url_string, "maria": self.maria.url_string}

    def target_args(self) -> list[str]:
        return [a for name, url in self.targets.items() for a in ("--target", f"{name}={url}")]

    def init_args(self) -> list[str]:
        return ["shards", "init", "--control", self.control.url_string, *self.target_args(),
                "--assign", "pg", "--sequence-bits", "8", "--shard-bits", "4"]

    def counts(self) -> tuple[int, int, int]:
        """Moves, journal lines, map version: what a refused command must leave as it was."""
        tables = shard_map_tables(MetaData())
        with self.engine.connect() as connection:
            return (len(connection.execute(select(tables.moves.c.id)).all()),
                    len(connection.execute(select(tables.move_steps.c.seq)).all()),
                    read_shard_map(connection).version)


@pytest.fixture(params=["postgresql", "mariadb"])
def mixed(request: pytest.FixtureRequest,
          database_factory: Callable[[str], ScratchDatabase]) -> Iterator[Mixed]:
    control = database_factory(request.param)
    pg, maria = database_factory("postgresql"), database_factory("mariadb")
    engine = control.engine(worker_tables(MetaData()).slots.metadata)
    mixed = Mixed(control, pg, maria, engine)
    assert main(mixed.init_args()) == 0
    yield mixed


def test_a_map_holds_postgresql_and_mariadb_targets(
    mixed: Mixed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(mixed.init_args()) == 0  # again: nothing changes
    out = capsys.readouterr().out
    assert "shard map version 1, 16 logical shards" in out
    assert "pg (postgresql): 16 shard(s)" in out and "maria (mariadb): 0 shard(s): -" in out
    assert read_shard_map(mixed.engine).targets == {"pg": "postgresql", "maria": "mariadb"}
    assert main(["shards", "show", "--control", mixed.control.url_string, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["targets"]["maria"] == {"backend": "mariadb", "shards": []}
    assert shown["targets"]["pg"]["shards"] == list(range(16))
    # Balancing proposes moves only: it does not judge them (plan each one).
    assert main(["shards", "plan", "--control", mixed.control.url_string,
                 *mixed.target_args(), "--table", "orders", "--balance", "--json"]) == 0
    proposals = json.loads(capsys.readouterr().out)
    assert len(proposals) == 8 and {(p["source"], p["target"]) for p in proposals} == {
        ("pg", "maria")}
    # A second MariaDB target registers beside them (add_target, and init again).
    add_target(mixed.engine, "maria2", backend="mariadb")
    assert read_shard_map(mixed.engine).targets["maria2"] == "mariadb"


@pytest.mark.parametrize("verb", ["plan", "move", "dry-run"])
def test_a_cross_backend_move_exits_2_with_one_line_and_changes_nothing(
    mixed: Mixed, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    capsys.readouterr()
    before = mixed.counts()
    action = ["move", "--dry-run"] if verb == "dry-run" else [verb]
    argv = ["shards", *action, "--control", mixed.control.url_string, *mixed.target_args(),
            "--table", "orders", "--shard", "3", "--to", "maria"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and CROSS in err, err
    assert mixed.counts() == before
    assert read_shard_map(mixed.engine).rows[3].state == "serving"


def test_a_cross_backend_move_is_refused_in_python(mixed: Mixed) -> None:
    before = mixed.counts()
    with ShardMover(mixed.control.url_string, mixed.targets, layout=LAYOUT,
                    tables=["orders"]) as mover:
        for attempt in (lambda: mover.plan(3, "maria"), lambda: mover.move(3, "maria"),
                        lambda: mover.move(3, "maria", dry_run=True)):
            with pytest.raises(ShardMoveError, match=f"^{CROSS}$"):
                attempt()
    assert mixed.counts() == before


def test_a_target_given_by_another_backends_url_than_the_maps_is_refused(mixed: Mixed) -> None:
    add_target(mixed.engine, "pg2", backend="postgresql")
    before = mixed.counts()
    targets = {**mixed.targets, "pg2": mixed.maria.url_string}
    with ShardMover(mixed.control.url_string, targets, layout=LAYOUT, tables=["orders"]
                    ) as mover, pytest.raises(
            ShardMoveError, match=r"^the target 'pg2' is a postgresql server in the shard map, "
                                  r"but its URL is a mariadb URL"):
        mover.plan(3, "pg2")
    assert mixed.counts() == before


def test_a_mariadb_to_mariadb_plan_goes_to_the_mariadb_backend(
    mixed: Mixed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two MariaDB targets the registry's MariaDB backend is asked (here: its module
    made absent, so the one clear error, nothing changed)."""
    add_target(mixed.engine, "maria2", backend="mariadb")
    with mixed.engine.begin() as connection:  # shard 5 on maria (as if moved there earlier)
        tables = shard_map_tables(MetaData())
        connection.execute(tables.map.update().where(tables.map.c.logical_shard == 5)
                           .values(target="maria"))
    before = mixed.counts()
    monkeypatch.setattr(_backend, "_MARIADB_MODULE", "snowflake_db.sharding.moves._absent")
    targets = {**mixed.targets, "maria2": mixed.maria.url_string}
    with ShardMover(mixed.control.url_string, targets, layout=LAYOUT, tables=["orders"]
                    ) as mover, pytest.raises(ShardMoveError, match=r"^MariaDB moves need"):
        mover.plan(5, "maria2")
    assert mixed.counts() == before




@pytest.mark.parametrize("control_backend", ["postgresql", "mariadb"])
def test_manage_py_shards_takes_a_mysql_alias_and_refuses_a_cross_backend_move(
    database_factory: Callable[[str], ScratchDatabase], control_backend: str
) -> None:
    control = database_factory(control_backend)
    pg, maria = database_factory("postgresql"), database_factory("mariadb")
    engine = control.engine(worker_tables(MetaData()).slots.metadata)
    create_shard_map_tables(engine)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return manage_shards({"default": control.url_string, "shard_pg": pg.url_string,
                              "shard_maria": maria.url_string}, *args)

    done = manage("init", "--assign", "shard_pg")
    assert done.returncode == 0, done.stderr
    assert "shard_pg (postgresql): 16 shard(s)" in done.stdout
    assert "shard_maria (mariadb): 0 shard(s)" in done.stdout
    version = read_shard_map(engine).version
    done = manage("plan", "--shard", "2", "--to", "shard_maria", "--table", "orders")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert ("a move runs between two servers of the same backend: source shard_pg is "
            "postgresql, target shard_maria is mariadb") in done.stderr
    done = manage("move", "--shard", "2", "--to", "shard_maria", "--table", "orders")
    assert done.returncode == 2 and "same backend" in done.stderr
    with engine.connect() as connection:
        assert connection.execute(select(shard_map_tables(MetaData()).moves.c.id)).all() == []
    assert read_shard_map(engine).version == version
    done = manage("show")
    assert done.returncode == 0 and "shard_maria (mariadb): 0 shard(s)" in done.stdout


def test_init_shard_map_in_python_takes_mariadb_targets(
    database_factory: Callable[[str], ScratchDatabase]
) -> None:
    control = database_factory("mariadb")
    engine = control.engine()
    create_shard_map_tables(engine)
    current = init_shard_map(engine, layout=LAYOUT, assignment=["pg", "maria"],
                             backend={"pg": "postgresql", "maria": "mariadb"})
    assert current.targets == {"pg": "postgresql", "maria": "mariadb"}
    assert sorted(s for s, r in current.rows.items() if r.target == "maria") == list(
        range(1, 16, 2))
