"""``snowflake_db.testing``: what users' own test suites rely on for deterministic IDs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

import snowflake_db
from snowflake_db import (
    DEFAULT_LAYOUT,
    ClockStalledError,
    GeneratorClosedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Layout,
    NotConfiguredError,
    snowflake_default,
)
from snowflake_db.testing import DEFAULT_FAKE_START_MS, FakeClock, deterministic_ids

from ..plugins.scheduler_delay import SchedulerDelay

pytest_plugins = ["pytester"]

T0 = DEFAULT_FAKE_START_MS


pytestmark = pytest.mark.usefixtures("fresh_process_default")


# -- FakeClock ---------------------------------------------------------------------------------


def test_fake_clock_starts_at_a_fixed_time() -> None:
    assert datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1000 == T0
    clock = FakeClock()
    assert clock() == clock() == T0
    assert FakeClock(123)() == 123


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(1000)
    clock.advance(5)
    assert clock() == 1005
    clock.advance(-10)  # a rollback
    assert clock() == 995
    clock.set(2000)
    assert clock() == 2000
    stepping = FakeClock(1000, step_ms=3)
    assert [stepping() for _ in range(4)] == [1000, 1003, 1006, 1009]


def test_fake_clock_validates_its_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="start_ms=-1"):
        FakeClock(-1)
    with pytest.raises(InvalidArgumentTypeError):
        FakeClock(1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError):
        FakeClock(1000, step_ms=True)
    clock = FakeClock(1000)
    with pytest.raises(InvalidArgumentTypeError):
        clock.advance(1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="now_ms=-5"):
        clock.set(-5)
    with pytest.raises(InvalidArgumentTypeError):
        clock.set("2000")  # type: ignore[arg-type]
    assert clock() == 1000  # failed calls did not move it


def test_fake_clock_is_thread_safe() -> None:
    clock = FakeClock(0, step_ms=1)
    readings: list[list[int]] = [[] for _ in range(8)]

    def read(index: int) -> None:
        readings[index] = [clock() for _ in range(10_000)]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = sorted(value for values in readings for value in values)
    assert every == list(range(80_000))  # no reading lost or repeated


# -- deterministic_ids ---------------------------------------------------------------------------


def take(count: int) -> list[int]:
    return [snowflake_default() for _ in range(count)]


def test_deterministic_ids_are_the_same_on_every_run() -> None:
    with deterministic_ids():
        first_run = take(5)
    with deterministic_ids():
        second_run = take(5)
    assert first_run == second_run
    expected = [
        DEFAULT_LAYOUT.encode(timestamp_ms=T0, worker_id=1, sequence=sequence)
        for sequence in range(5)
    ]
    assert first_run == expected


def test_deterministic_ids_advance_with_the_clock() -> None:
    with deterministic_ids() as clock:
        assert isinstance(clock, FakeClock)
        before = take(2)
        clock.advance(1000)
        after = take(2)
    decoded = DEFAULT_LAYOUT.decode(after[0])
    assert (decoded.timestamp_ms, decoded.sequence) == (T0 + 1000, 0)
    assert before[-1] < after[0]


def test_deterministic_ids_options() -> None:
    layout = Layout(time_bits=40, worker_bits=11, sequence_bits=12)
    with deterministic_ids(worker_id=2000, start_ms=T0 + 42, layout=layout):
        decoded = layout.decode(snowflake_default())
    assert (decoded.worker_id, decoded.timestamp_ms, decoded.sequence) == (2000, T0 + 42, 0)
    with pytest.raises(InvalidArgumentError), deterministic_ids(worker_id=1024):
        pass


def test_deterministic_ids_frozen_tick_fails_fast_instead_of_hanging(
    scheduler_delay: SchedulerDelay,
) -> None:
    with deterministic_ids():
        take(DEFAULT_LAYOUT.ids_per_tick)
        started = time.monotonic()
        with pytest.raises(ClockStalledError):
            snowflake_default()
        ended = time.monotonic()
        assert ended - started < scheduler_delay.widen(5, started, ended)


def test_deterministic_ids_restores_an_unconfigured_process() -> None:
    with deterministic_ids():
        inner = snowflake_db.get_generator()
        snowflake_default()
    with pytest.raises(NotConfiguredError):
        snowflake_default()
    with pytest.raises(GeneratorClosedError):
        inner.next_id()


def test_deterministic_ids_restores_the_previous_generator() -> None:
    previous = snowflake_db.configure(worker_id=3)
    before = snowflake_default()
    with deterministic_ids():
        assert DEFAULT_LAYOUT.decode(snowflake_default()).worker_id == 1
    assert snowflake_db.get_generator() is previous
    after = snowflake_default()
    assert DEFAULT_LAYOUT.decode(after).worker_id == 3
    assert after > before


def test_deterministic_ids_restores_after_an_exception() -> None:
    previous = snowflake_db.configure(worker_id=3)
    with pytest.raises(RuntimeError, match="boom"), deterministic_ids():
        snowflake_default()
        raise RuntimeError("boom")
    assert snowflake_db.get_generator() is previous
    assert DEFAULT_LAYOUT.decode(snowflake_default()).worker_id == 3


# -- the pytest plugin -------------------------------------------------------------------------


def test_snowflake_ids_fixture_as_documented(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's conftest enables the plugin; the fixture gives fixed IDs, then restores."""
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)  # set by tests/django
    pytester.makeconftest('pytest_plugins = ["snowflake_db.testing"]\n')
    expected = [
        DEFAULT_LAYOUT.encode(timestamp_ms=T0, worker_id=1, sequence=sequence)
        for sequence in range(2)
    ]
    later = DEFAULT_LAYOUT.encode(timestamp_ms=T0 + 5, worker_id=1, sequence=0)
    pytester.makepyfile(
        f"""
        import pytest
        import snowflake_db
        from snowflake_db.testing import FakeClock

        def test_fixed_ids(snowflake_ids):
            assert isinstance(snowflake_ids, FakeClock)
            assert [snowflake_db.snowflake_default() for _ in range(2)] == {expected!r}
            snowflake_ids.advance(5)
            assert snowflake_db.snowflake_default() == {later}

        def test_same_ids_again(snowflake_ids):
            assert snowflake_db.snowflake_default() == {expected[0]}

        def test_restored_afterwards():
            with pytest.raises(snowflake_db.NotConfiguredError):
                snowflake_db.snowflake_default()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_deterministic_ids_start_at_a_later_layout_epoch() -> None:
    """A layout whose epoch lies after the default fake start still gets a usable clock."""
    from snowflake_db import Layout, snowflake_default
    from snowflake_db.testing import DEFAULT_FAKE_START_MS, deterministic_ids

    layout = Layout(epoch_ms=DEFAULT_FAKE_START_MS + 86_400_000)
    with deterministic_ids(layout=layout) as clock:
        first = snowflake_default()
        assert layout.decode(first).timestamp_ms == layout.epoch_ms == clock.now_ms
