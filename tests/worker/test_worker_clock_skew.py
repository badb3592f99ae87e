"""A process clock off from the control database's clock: warned about beyond the warning bound,
refused at acquisition beyond the rollback tolerance, only warned about at renewal (a held lease
is never fenced for it). Custom ``clock=`` offset from real time; PostgreSQL, MariaDB, SQLite."""

from __future__ import annotations

import logging
import re
import time

import pytest

from snowflake_db import (
    DEFAULT_ROLLBACK_TOLERANCE_MS,
    ClockError,
    ClockSkewError,
    InvalidArgumentError,
    Layout,
    SnowflakeGenerator,
)
from snowflake_db.worker import TableLease
from snowflake_db.worker._clock_skew import DEFAULT_CLOCK_SKEW_WARNING_MS

from ..plugins.databases import ScratchDatabase
from ..plugins.worker_support import OffsetClock, allocator, read_slots

LOGGER = "snowflake_db.worker"


def _skew_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER
        and record.levelno == logging.WARNING
        and "clock" in record.getMessage()
    ]


@pytest.mark.parametrize("offset_ms", [5_000, -5_000])
def test_a_clock_beyond_the_tolerance_is_refused_at_acquisition(
    any_db: ScratchDatabase, offset_ms: int
) -> None:
    with allocator(any_db) as alloc:
        alloc.create_tables()
        with pytest.raises(ClockSkewError) as refused:
            alloc.acquire(layout=Layout(), clock=OffsetClock(offset_ms))
        error = refused.value
        assert isinstance(error, ClockError)
        assert error.bound_ms == DEFAULT_ROLLBACK_TOLERANCE_MS == 2000
        # ``skew_ms`` is the least the clock is off: the measurement minus its uncertainty (half
        # the round trip, which the message gives), so it lies within twice that below the
        # offset (on a loaded machine 4,948 ± 56 ms gave 4,892).
        uncertainty_ms = int(re.search(r"\(± (\d+) ms\)", str(error))[1])  # type: ignore[index]
        assert abs(error.skew_ms) <= 5_000 and (error.skew_ms > 0) == (offset_ms > 0)
        assert abs(error.skew_ms) + 2 * uncertainty_ms >= 4_900, str(error)
        direction = "ahead of" if offset_ms > 0 else "behind"
        assert f"ms) {direction} the database clock" in str(error)
        assert "more than the 2000 ms allowed" in str(error)
        # Refused before anything was written: no slot, no layout record.
        assert read_slots(any_db.url) == {}
        assert alloc.recorded_layout() is None
        # The generator raises it from its first ID, and issues nothing.
        generator = SnowflakeGenerator(allocator=alloc, clock=OffsetClock(offset_ms))
        with pytest.raises(ClockSkewError):
            generator.next_id()


def test_a_clock_beyond_the_warning_bound_is_leased_with_a_warning(
    any_db: ScratchDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    with allocator(any_db) as alloc:
        alloc.acquire(layout=Layout(), clock=OffsetClock(0))
        assert _skew_warnings(caplog) == []
        alloc.acquire(layout=Layout(), clock=OffsetClock(700))
        (warning,) = _skew_warnings(caplog)
        assert "ahead of the database clock" in warning
        assert f"more than the {DEFAULT_CLOCK_SKEW_WARNING_MS} ms warning bound" in warning
        assert "refused beyond 2000 ms" in warning
        skew = alloc.measure_clock_skew(OffsetClock(-700))
        # The true offset lies within the measurement's uncertainty (half its round trip plus
        # the clocks' resolution), which a loaded machine widens on either side.
        assert abs(skew.offset_ms + 700) <= skew.uncertainty_ms
        assert skew.at_least_ms > DEFAULT_CLOCK_SKEW_WARNING_MS


def test_the_bounds_are_options(any_db: ScratchDatabase, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    with allocator(any_db, clock_skew_warning_ms=1_000, max_clock_skew_ms=10_000) as alloc:
        alloc.acquire(layout=Layout(), clock=OffsetClock(700))  # within the warning bound now
        assert _skew_warnings(caplog) == []
        alloc.acquire(layout=Layout(), clock=OffsetClock(-5_000))  # tolerated, with a warning
        assert len(_skew_warnings(caplog)) == 1
        with pytest.raises(ClockSkewError, match="more than the 10000 ms allowed"):
            alloc.acquire(layout=Layout(), clock=OffsetClock(12_000))
    for options, fragment in (
        ({"clock_skew_warning_ms": 3_000}, "must not be above the refusal bound"),
        ({"max_clock_skew_ms": -1}, "max_clock_skew_ms=-1 is below the minimum 0"),
        ({"max_clock_skew_ms": 86_400_001}, "exceeds the maximum 86400000"),
        ({"clock_skew_warning_ms": 1.5}, "must be an int"),
    ):
        with pytest.raises(InvalidArgumentError, match=fragment):
            allocator(any_db, **options)


def test_skew_at_renewal_is_logged_once_per_change_and_never_fences(
    any_db: ScratchDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    clock = OffsetClock(0)
    with allocator(any_db, lease_seconds=1.0) as alloc:  # renewals every ~0.33 s
        generator = SnowflakeGenerator(allocator=alloc, clock=clock)
        generator.next_id()
        lease = generator.lease
        assert isinstance(lease, TableLease)

        def renewals_after(count: int) -> None:
            start = lease.renewals
            deadline = time.monotonic() + 20
            while lease.renewals < start + count and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lease.renewals >= start + count

        clock.offset_ms = 600  # drifting ahead: past the warning bound
        renewals_after(3)
        warnings = _skew_warnings(caplog)
        assert len(warnings) == 1 and "more than 100 ms" in warnings[0], warnings
        clock.offset_ms = 3_000  # past the refusal bound: warned, but the lease is kept
        renewals_after(3)
        warnings = _skew_warnings(caplog)
        assert len(warnings) == 2 and "more than 2000 ms" in warnings[1], warnings
        assert "a new lease would be refused" in warnings[1]
        assert not lease.lost
        assert generator.next_id() > 0  # still issuing
        clock.offset_ms = 0
        renewals_after(2)
        back = [r.getMessage() for r in caplog.records if "back within" in r.getMessage()]
        assert len(back) == 1 and len(_skew_warnings(caplog)) == 2
