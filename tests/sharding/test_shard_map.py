"""The shard map in the control database, on PostgreSQL, MariaDB and SQLite: its tables, the
map's functions, routers following it (also across processes), and the cleanup barrier."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, MetaData, insert, inspect, select
from sqlalchemy.exc import IntegrityError

from snowflake_db import Layout, SnowflakeGenerator
from snowflake_db.clock import monotonic
from snowflake_db.errors import (
    InvalidArgumentError,
    LayoutMismatchError,
    ShardingError,
    ShardMovedError,
    UnknownShardError,
)
from snowflake_db.sharding import ControlledShardRouter, ShardRouter
from snowflake_db.sharding.shard_map import (
    add_target,
    barrier_passed,
    barrier_waiting,
    create_shard_map_tables,
    flip_shard,
    init_shard_map,
    read_map_version,
    read_shard_map,
    set_shard_state,
    shard_map_tables,
)
from snowflake_db.worker import TableWorkerAllocator, worker_tables
from snowflake_db.worker._table_lease import TableLease
from tests.plugins.databases import ScratchDatabase

LAYOUT = Layout(sequence_bits=8, shard_bits=2)  # 4 logical shards
TABLES = (
    "snowflake_shard_targets", "snowflake_shard_map_version", "snowflake_shard_map",
    "snowflake_shard_moves", "snowflake_shard_move_steps", "snowflake_shard_map_seen",
)


def backend_of(database: ScratchDatabase) -> str:
    return "mariadb" if database.backend == "mariadb" else database.backend


@pytest.fixture
def control(any_db: ScratchDatabase) -> Iterator[Engine]:
    engine = any_db.engine(worker_tables(MetaData()).slots.metadata, sqlite_foreign_keys=True)
    create_shard_map_tables(engine)
    init_shard_map(engine, layout=LAYOUT, assignment=["a", "b"], backend=backend_of(any_db))
    yield engine


def test_tables_exist_with_the_sketchs_columns(control: Engine) -> None:
    names = set(inspect(control).get_table_names())
    assert set(TABLES) <= names
    moves = {c["name"] for c in inspect(control).get_columns("snowflake_shard_moves")}
    assert moves == {
        "id", "logical_shard", "active_shard", "source", "target", "backend", "state", "capture",
        "flipped_version", "mover_token", "mover_expires_at_ms", "created_at_ms", "updated_at_ms",
    }
    create_shard_map_tables(control)  # again: nothing to do, no error


def test_init_reads_back_and_is_idempotent(control: Engine) -> None:
    shard_map = read_shard_map(control)
    assert shard_map.version == 1
    assert shard_map.layout == LAYOUT
    assert shard_map.mapping == {0: "a", 1: "b", 2: "a", 3: "b"}
    assert {row.state for row in shard_map.rows.values()} == {"serving"}
    assert shard_map.changed_at_ms > 1_600_000_000_000  # the database clock, in ms
    again = init_shard_map(control, layout=LAYOUT, assignment=["z"])
    assert again.mapping == shard_map.mapping and again.version == 1


def test_init_with_another_layout_is_refused(control: Engine) -> None:
    other = Layout(sequence_bits=7, shard_bits=3)
    with pytest.raises(LayoutMismatchError, match=r"initialised for layout .*shard_bits.:2"):
        init_shard_map(control, layout=other, assignment=["a"])


def test_a_layout_without_shard_bits_is_refused(any_db: ScratchDatabase) -> None:
    engine = any_db.engine()
    create_shard_map_tables(engine)
    with pytest.raises(ShardingError, match="needs a layout with shard_bits > 0"):
        init_shard_map(engine, layout=Layout(), assignment=["a"])
    with pytest.raises(ShardingError, match="not initialised"):
        read_map_version(engine)


def test_changes_bump_the_version_in_their_transaction(control: Engine) -> None:
    assert set_shard_state(control, 2, "moving") == 2
    assert set_shard_state(control, 2, "cutover") == 3
    add_target(control, "c", backend=read_shard_map(control).targets["a"])
    assert read_map_version(control) == 3  # a new target alone changes no route
    assert flip_shard(control, 2, "c") == 4
    shard_map = read_shard_map(control)
    assert shard_map.mapping == {0: "a", 1: "b", 2: "c", 3: "b"}
    assert shard_map.rows[2].state == "serving" and shard_map.rows[2].since_version == 4
    assert shard_map.rows[0].since_version == 1


def test_bad_input_gives_one_clear_error_each(control: Engine) -> None:
    with pytest.raises(UnknownShardError, match=r"unknown logical shard 4; the map has 0\.\.3"):
        flip_shard(control, 4, "a")
    with pytest.raises(UnknownShardError, match="target 'nowhere'; known targets: a, b "):
        flip_shard(control, 1, "nowhere")
    with pytest.raises(InvalidArgumentError, match="state 'gone' is not one of serving"):
        set_shard_state(control, 1, "gone")
    with pytest.raises(InvalidArgumentError, match="looks like a URL"):
        add_target(control, "postgresql://u:secret@h/db")
    with pytest.raises(InvalidArgumentError, match="backend 'oracle' of shard target 'o'"):
        add_target(control, "o", backend="oracle")
    assert read_map_version(control) == 1  # every refused change left the map alone


def test_a_second_active_move_of_a_shard_is_refused_by_the_database(control: Engine) -> None:
    moves = shard_map_tables(MetaData()).moves
    row = {"logical_shard": 1, "active_shard": 1, "source": "b", "target": "a",
           "backend": "postgresql", "state": "planned", "created_at_ms": 0, "updated_at_ms": 0}
    with control.begin() as connection:
        move_id = connection.execute(insert(moves).values(**row)).inserted_primary_key[0]
    with pytest.raises(IntegrityError), control.begin() as connection:
        connection.execute(insert(moves).values(**row))
    assert flip_shard(control, 1, "a", move_id=move_id) == 2
    with control.connect() as connection:
        flipped = connection.execute(
            select(moves.c.flipped_version, moves.c.state).where(moves.c.id == move_id)
        ).one()
    assert tuple(flipped) == (2, "flipped")


# -- routers following the map -------------------------------------------------------------------


def test_a_router_follows_a_flip_made_from_another_connection(
    control: Engine, any_db: ScratchDatabase
) -> None:
    router = ShardRouter.from_control(any_db.url_string, layout=LAYOUT, refresh_s=0.1)
    assert isinstance(router, ControlledShardRouter)
    try:
        assert router.version == 1 and router.target_of_shard(2) == "a"
        assert router.known_targets == ("a", "b")
        other = any_db.engine()
        add_target(other, "c", backend=backend_of(any_db))
        flip_shard(other, 2, "c")
        # The router sees it within its refresh period, from routing calls alone.
        deadline = time.monotonic() + 10
        while router.target_of_shard(2) != "c" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert router.target_of_shard(2) == "c"
        assert router.version == 2 and router.mapping == {0: "a", 1: "b", 2: "c", 3: "b"}
        assert router.targets == ("a", "b", "c")
        set_shard_state(other, 3, "cutover")
        assert router.refresh() == 3 and router.state_of(3) == "cutover"
        assert router.target_of_shard(3) == "b"  # cutover: the source until the flip
    finally:
        router.close()


def test_a_fixed_router_is_untouched(control: Engine) -> None:
    router = ShardRouter(["a", "b"], layout=LAYOUT)
    flip_shard(control, 0, "b")
    assert router.target_of_shard(0) == "a" and not hasattr(router, "refresh")


def test_a_router_refuses_a_map_of_another_layout(control: Engine) -> None:
    with pytest.raises(LayoutMismatchError, match="this process uses"):
        ShardRouter.from_control(control, layout=Layout(sequence_bits=7, shard_bits=3))
    with pytest.raises(InvalidArgumentError, match=r"refresh_s=0\.001 is below the minimum"):
        ShardRouter.from_control(control, layout=LAYOUT, refresh_s=0.001)


def _child_routes(router: ControlledShardRouter, flipped: object, answer: object) -> None:
    """In a forked child: route with the inherited router, then after the flip."""
    answer.put(("ready", router.target_of_shard(1)))  # type: ignore[attr-defined]
    flipped.wait(30)  # type: ignore[attr-defined]
    answer.put(("after", router.refresh(), router.target_of_shard(1)))  # type: ignore[attr-defined]


def _spawned_routes(url: str, flipped: object, answer: object) -> None:
    """In a spawned process: build its own router from the URL."""
    router = ShardRouter.from_control(url, layout=LAYOUT, refresh_s=0.1)
    before = router.target_of_shard(1)
    answer.put(("ready", before))  # type: ignore[attr-defined]
    flipped.wait(30)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while router.target_of_shard(1) != "a" and time.monotonic() < deadline:
        time.sleep(0.02)
    answer.put(("after", router.version, router.target_of_shard(1)))  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_other_processes_see_a_flip(
    control: Engine, any_db: ScratchDatabase, method: str
) -> None:
    context = multiprocessing.get_context(method)
    flipped, answer = context.Event(), context.Queue()
    router = ShardRouter.from_control(any_db.url_string, layout=LAYOUT, refresh_s=0.1)
    assert isinstance(router, ControlledShardRouter)
    try:
        router.target_of_shard(1)  # the parent's pool holds a connection the child must not use
        if method == "fork":
            child = context.Process(target=_child_routes, args=(router, flipped, answer))
        else:
            child = context.Process(
                target=_spawned_routes, args=(any_db.url_string, flipped, answer)
            )
        child.start()
        assert answer.get(timeout=60) == ("ready", "b")
        flip_shard(control, 1, "a")
        flipped.set()
        result = answer.get(timeout=60)
        child.join(timeout=30)
        assert child.exitcode == 0
        assert result == ("after", 2, "a")
        assert router.refresh() == 2 and router.target_of_shard(1) == "a"
    finally:
        router.close()


# -- map_seen and the barrier, with real leases -----------------------------------------------


def test_the_barrier_waits_for_every_live_lease(control: Engine, any_db: ScratchDatabase) -> None:
    allocators = [TableWorkerAllocator(any_db.url_string, lease_seconds=30) for _ in range(2)]
    first = SnowflakeGenerator(allocator=allocators[0], layout=LAYOUT)
    second = SnowflakeGenerator(allocator=allocators[1], layout=LAYOUT)
    router = ShardRouter.from_control(
        control, layout=LAYOUT, refresh_s=0.1, generator=first, background=False
    )
    assert isinstance(router, ControlledShardRouter)
    try:
        first_id, second_id = first.ensure_worker(), second.ensure_worker()
        router.refresh()
        assert router.reported == (first_id, first.lease.token, 1)  # type: ignore[union-attr]
        assert barrier_waiting(control, 1) == [second_id]  # leased, never reported
        version = flip_shard(control, 3, "a")
        assert barrier_waiting(control, version) == sorted([first_id, second_id])
        router.refresh()
        assert barrier_waiting(control, version) == [second_id]
        second.close()  # a released slot is no longer waited for
        assert barrier_passed(control, version)
        seen = shard_map_tables(MetaData()).seen
        with control.connect() as connection:
            rows = connection.execute(select(seen.c.worker_id, seen.c.map_version)).all()
        assert [tuple(row) for row in rows] == [(first_id, version)]
    finally:
        router.close()
        first.close()
        second.close()
        for allocator in allocators:  # their heartbeat threads would outlive the test
            allocator.close()


def test_a_leased_process_confirms_routes_by_its_own_map_until_its_lease_lapses(
    control: Engine, any_db: ScratchDatabase
) -> None:
    """While the process's lease stays valid, confirming a transaction's routes reads the
    router's own map (no round trip): the old copy cannot have been deleted, as the barrier
    still waits for this lease. A lease whose local deadline passed may have been left out of
    a barrier though its renewal still succeeds: then the control database's map is read."""
    allocator = TableWorkerAllocator(any_db.url_string, lease_seconds=30)
    generator = SnowflakeGenerator(allocator=allocator, layout=LAYOUT)
    router = ShardRouter.from_control(
        control, layout=LAYOUT, refresh_s=600, generator=generator, background=False
    )
    assert isinstance(router, ControlledShardRouter)
    try:
        worker_id = generator.ensure_worker()
        lease = generator.lease
        assert isinstance(lease, TableLease)
        router.refresh()  # reported under the lease
        with router.recording_routes() as routes:
            source = router.target_of_shard(3)
            version = flip_shard(control, 3, "a" if source == "b" else "b")
            routes.confirm()  # the router's own map: the flip is not seen, nothing read
            assert router.version == version - 1
            assert barrier_waiting(control, version) == [worker_id]  # nothing deleted yet
            # Frozen past its local deadline, then renewed under the same token.
            lease._valid_until = monotonic() - 1  # the freeze, without waiting
            lease._renewer.renew(lease)
            assert lease.lapses == 1 and lease.token == routes.lease[0]  # type: ignore[index]
            with pytest.raises(ShardMovedError, match=rf"logical shard 3 moved from {source}"):
                routes.confirm()
            assert router.version == version
        with router.recording_routes() as routes:  # the lease, lapsed once, is the new stamp
            router.target_of_shard(3)
            routes.confirm()
            assert routes.lease == (lease.token, 1)
    finally:
        router.close()
        generator.close()
        allocator.close()


def test_fixed_routers_still_need_no_sqlalchemy() -> None:
    """The shard map reads the control database through SQLAlchemy; a fixed router must not
    import it (routing stays standard-library only)."""
    code = (
        "import sys\n"
        "from snowflake_db.sharding import ShardRouter, ControlledShardRouter\n"
        "from snowflake_db import Layout\n"
        "router = ShardRouter(['a', 'b'], layout=Layout(sequence_bits=8, shard_bits=2))\n"
        "assert router.target_of_shard(1) == 'b'\n"
        "assert 'sqlalchemy' not in sys.modules, sorted(sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
