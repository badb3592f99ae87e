"""The process-wide generator: ``configure()``, ``snowflake_default()``, the environment, forks.

``snowflake_default`` is what model columns hold as their default, so it is captured at import
time, long before anything is configured; every test here goes through it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from itertools import pairwise
from typing import Any

import pytest

import snowflake_db
from snowflake_db import (
    DEFAULT_LAYOUT,
    ClockStalledError,
    ForkedWorkerIdError,
    GeneratorClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Layout,
    NotConfiguredError,
    SnowflakeGenerator,
    snowflake_default,
)
from snowflake_db.testing import DEFAULT_FAKE_START_MS, FakeClock
from tests.plugins.core_support import run_in_fork

T0 = DEFAULT_FAKE_START_MS
decode = DEFAULT_LAYOUT.decode


pytestmark = pytest.mark.usefixtures("fresh_process_default")


# -- not configured ----------------------------------------------------------------------------


def test_unconfigured_use_says_how_to_configure() -> None:
    with pytest.raises(NotConfiguredError) as caught:
        snowflake_default()
    message = str(caught.value)
    assert "configure(worker_id=" in message
    assert "TableWorkerAllocator" in message
    assert "SNOWFLAKE_WORKER_ID" in message
    with pytest.raises(NotConfiguredError):
        snowflake_db.get_generator()
    with pytest.raises(NotConfiguredError):  # still nothing: no silent worker 0 after a failure
        snowflake_default()


def test_configure_without_arguments_and_without_environment() -> None:
    with pytest.raises(NotConfiguredError):
        snowflake_db.configure()


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_environment_variable_counts_as_unset(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", value)
    with pytest.raises(NotConfiguredError):
        snowflake_default()


# -- static worker ID --------------------------------------------------------------------------


def test_configure_static_worker_id() -> None:
    generator = snowflake_db.configure(worker_id=7)
    assert isinstance(generator, SnowflakeGenerator)
    assert snowflake_db.get_generator() is generator
    ids = [snowflake_default() for _ in range(1000)]
    assert all(earlier < later for earlier, later in pairwise(ids))
    assert {decode(i).worker_id for i in ids} == {7}


def test_default_captured_before_configure_follows_the_configuration() -> None:
    """Model columns hold the function itself, captured at import time."""
    default = snowflake_db.snowflake_default
    snowflake_db.configure(worker_id=3)
    assert decode(default()).worker_id == 3
    snowflake_db.configure(worker_id=4)
    assert decode(default()).worker_id == 4


def test_configure_passes_layout_clock_and_generator_options() -> None:
    layout = Layout(time_bits=40, worker_bits=11, sequence_bits=12)
    clock = FakeClock(T0)
    generator = snowflake_db.configure(
        worker_id=2000, layout=layout, clock=clock, rollback_tolerance_ms=5
    )
    assert generator.layout is layout
    assert generator.clock is clock
    assert generator.rollback_tolerance_ms == 5
    decoded = layout.decode(snowflake_default())
    assert (decoded.worker_id, decoded.timestamp_ms) == (2000, T0)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"worker_id": 1024}, InvalidArgumentError),
        ({"worker_id": -1}, InvalidArgumentError),
        ({"worker_id": True}, InvalidArgumentTypeError),
        ({"worker_id": "5"}, InvalidArgumentTypeError),
        ({"worker_id": 1, "layout": "default"}, InvalidArgumentTypeError),
        ({"worker_id": 1, "no_such_option": 1}, TypeError),
    ],
)
def test_failed_configure_keeps_the_previous_generator(
    arguments: dict[str, Any], error: type[Exception]
) -> None:
    previous = snowflake_db.configure(worker_id=9)
    before = snowflake_default()
    with pytest.raises(error):
        snowflake_db.configure(**arguments)
    assert snowflake_db.get_generator() is previous
    after = snowflake_default()
    assert after > before and decode(after).worker_id == 9


def test_replaced_generator_is_closed() -> None:
    first = snowflake_db.configure(worker_id=1)
    snowflake_default()
    snowflake_db.configure(worker_id=2)
    with pytest.raises(GeneratorClosedError):
        first.next_id()


def test_reset_closes_and_forgets() -> None:
    generator = snowflake_db.configure(worker_id=1)
    snowflake_default()
    snowflake_db.reset()
    with pytest.raises(GeneratorClosedError):
        generator.next_id()
    with pytest.raises(NotConfiguredError):
        snowflake_default()
    snowflake_db.reset()  # resetting twice is harmless


def test_reconfiguring_the_same_worker_id_never_reissues_ids() -> None:
    ids: list[int] = []
    for _ in range(200):  # the real clock: most replacements land in a tick already used
        snowflake_db.configure(worker_id=5)
        ids += [snowflake_default() for _ in range(50)]
    assert len(set(ids)) == len(ids)
    assert all(earlier < later for earlier, later in pairwise(ids))


def test_reconfiguring_on_a_frozen_clock_waits_instead_of_repeating() -> None:
    clock = FakeClock(T0)
    snowflake_db.configure(worker_id=5, clock=clock, max_wait_ms=10)
    issued = [snowflake_default() for _ in range(100)]
    snowflake_db.configure(worker_id=5, clock=clock, max_wait_ms=10)
    with pytest.raises(ClockStalledError):  # tick T0 belongs to the previous generator
        snowflake_default()
    clock.advance(1)
    following = snowflake_default()
    assert following > max(issued)
    assert decode(following).timestamp_ms == T0 + 1


def test_switching_worker_ids_back_and_forth_never_reissues_ids() -> None:
    """configure(5), configure(6), configure(5): the third generator must not repeat the first."""
    clock = FakeClock(T0)
    snowflake_db.configure(worker_id=5, clock=clock, max_wait_ms=10)
    issued = [snowflake_default() for _ in range(100)]
    snowflake_db.configure(worker_id=6, clock=clock, max_wait_ms=10)
    issued.append(snowflake_default())
    snowflake_db.configure(worker_id=5, clock=clock, max_wait_ms=10)
    try:
        following = snowflake_default()
    except ClockStalledError:
        clock.advance(1)
        following = snowflake_default()
    assert following not in issued
    assert following > max(i for i in issued if decode(i).worker_id == 5)


def test_reset_then_the_same_worker_id_never_reissues_ids() -> None:
    clock = FakeClock(T0)
    snowflake_db.configure(worker_id=5, clock=clock, max_wait_ms=10)
    issued = [snowflake_default() for _ in range(100)]
    snowflake_db.reset()
    snowflake_db.configure(worker_id=5, clock=clock, max_wait_ms=10)
    try:
        following = snowflake_default()
    except ClockStalledError:
        clock.advance(1)
        following = snowflake_default()
    assert following > max(issued)


def test_reconfiguring_while_other_threads_issue_never_duplicates() -> None:
    """configure() replaces the generator while requests keep calling snowflake_default()."""
    snowflake_db.configure(worker_id=5)
    stop = threading.Event()
    results: list[list[int]] = [[] for _ in range(3)]

    def issue(index: int) -> None:
        ids = results[index]
        while not stop.is_set():
            # A call racing the replacement may be refused; it must never repeat an ID.
            with contextlib.suppress(GeneratorClosedError):
                ids.append(snowflake_default())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so the replacement gets interleaved
    threads = [threading.Thread(target=issue, args=(i,)) for i in range(3)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            snowflake_db.configure(worker_id=5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(interval)
    every = [i for ids in results for i in ids]
    assert len(every) > 10_000
    duplicates = len(every) - len(set(every))
    assert duplicates == 0, f"{duplicates} duplicate IDs out of {len(every)}"


def test_snowflake_default_from_many_threads() -> None:
    snowflake_db.configure(worker_id=8)
    results: list[list[int]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)

    def work(index: int) -> None:
        barrier.wait()
        results[index] = [snowflake_default() for _ in range(20_000)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for ids in results for i in ids]
    assert len(every) == 160_000
    assert len(set(every)) == len(every)


# -- environment variable ----------------------------------------------------------------------


def test_environment_worker_id_is_read_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", " 9 ")  # set after import: read lazily
    first = snowflake_default()
    assert decode(first).worker_id == 9
    generator = snowflake_db.get_generator()
    assert generator.worker_id == 9
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "10")
    assert decode(snowflake_default()).worker_id == 9  # configured once, then kept
    assert snowflake_db.get_generator() is generator


def test_configure_without_arguments_uses_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "11")
    layout = Layout(time_bits=40, worker_bits=11, sequence_bits=12)
    generator = snowflake_db.configure(layout=layout)
    assert generator.worker_id == 11
    assert generator.layout is layout


def test_explicit_worker_id_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "9")
    snowflake_db.configure(worker_id=7)
    assert decode(snowflake_default()).worker_id == 7


def _first_requests(
    barrier: threading.Barrier, ids: list[int], errors: list[BaseException]
) -> None:
    """One server thread: wait for the others, then call the default like requests would."""
    barrier.wait()
    for _ in range(200):
        try:
            ids.append(snowflake_default())
        except GeneratorClosedError as error:
            errors.append(error)


def test_concurrent_first_use_configures_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A threaded server's first requests all reach snowflake_default() at once."""
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "9")
    duplicates = refused = 0
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads inside the lazy configuration
    try:
        for _ in range(300):
            snowflake_db.reset()
            barrier = threading.Barrier(4)
            results: list[list[int]] = [[] for _ in range(4)]
            errors: list[BaseException] = []
            threads = [
                threading.Thread(target=_first_requests, args=(barrier, ids, errors))
                for ids in results
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            every = [i for ids in results for i in ids]
            duplicates += len(every) - len(set(every))
            refused += len(errors)
    finally:
        sys.setswitchinterval(interval)
    assert (duplicates, refused) == (0, 0), (
        f"{duplicates} duplicate IDs and {refused} calls refused with GeneratorClosedError"
    )


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ("abc", ["SNOWFLAKE_WORKER_ID", "'abc'"]),
        ("5.0", ["SNOWFLAKE_WORKER_ID", "'5.0'"]),
        ("0x10", ["SNOWFLAKE_WORKER_ID", "'0x10'"]),
        ("-1", ["SNOWFLAKE_WORKER_ID=-1", "0"]),
        ("1024", ["1024", "1023"]),
    ],
)
def test_invalid_environment_worker_id(
    monkeypatch: pytest.MonkeyPatch, value: str, fragments: list[str]
) -> None:
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", value)
    for _ in range(2):  # a failure leaves nothing half-configured
        with pytest.raises(InvalidArgumentError) as caught:
            snowflake_default()
        for fragment in fragments:
            assert fragment in str(caught.value)


# -- fork rules --------------------------------------------------------------------------------


def test_forked_child_may_not_use_an_inherited_environment_worker_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parent imported snowflake_db but never configured it; gunicorn then forked."""
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "9")

    def child() -> dict[str, Any]:
        try:
            snowflake_default()
        except ForkedWorkerIdError as error:
            refused = str(error)
        else:
            refused = ""
        snowflake_db.configure(worker_id=10)  # the documented way out
        return {"refused": refused, "worker_id": decode(snowflake_default()).worker_id}

    outcome = run_in_fork(child)
    assert "result" in outcome, outcome
    message = outcome["result"]["refused"]
    assert "SNOWFLAKE_WORKER_ID=9" in message
    assert "forked" in message and "configure(worker_id=N)" in message
    assert outcome["result"]["worker_id"] == 10
    # The parent itself was not forked: it may use the variable.
    assert decode(snowflake_default()).worker_id == 9


def test_forked_child_of_an_env_configured_parent_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "9")
    parent_id = snowflake_default()
    outcome = run_in_fork(snowflake_default)
    assert outcome.get("error") == "ForkedWorkerIdError", outcome
    assert snowflake_default() > parent_id


def test_forked_child_without_configuration_is_still_not_configured() -> None:
    outcome = run_in_fork(snowflake_default)
    assert outcome.get("error") == "NotConfiguredError", outcome


def test_forked_child_of_a_configured_parent_is_refused() -> None:
    snowflake_db.configure(worker_id=12)
    parent_ids = [snowflake_default() for _ in range(10)]

    def child() -> dict[str, Any]:
        try:
            snowflake_default()
        except ForkedWorkerIdError:
            refused = True
        else:
            refused = False
        snowflake_db.configure(worker_id=13)
        return {"refused": refused, "ids": [snowflake_default() for _ in range(1000)]}

    outcome = run_in_fork(child)
    assert "result" in outcome, outcome
    assert outcome["result"]["refused"] is True
    child_ids = outcome["result"]["ids"]
    assert {decode(i).worker_id for i in child_ids} == {13}
    parent_ids += [snowflake_default() for _ in range(1000)]
    assert not set(child_ids) & set(parent_ids)


def test_environment_errors_name_the_variable_and_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process-wide generator configured from the environment, as a server's workers do."""
    monkeypatch.delenv("SNOWFLAKE_WORKER_URL", raising=False)
    monkeypatch.setenv("SNOWFLAKE_WORKER_ID", "5000")
    with pytest.raises(InvalidArgumentError, match=r"SNOWFLAKE_WORKER_ID=5000 exceeds the maximum "
                       r"1023 \(10 worker bits\)"):
        snowflake_db.configure()
    monkeypatch.delenv("SNOWFLAKE_WORKER_ID")
    monkeypatch.setenv("SNOWFLAKE_WORKER_URL", "oracle://scott@db.example.com/orders")
    with pytest.raises(InvalidArgumentError, match="unknown database 'oracle'"):
        snowflake_db.configure()
