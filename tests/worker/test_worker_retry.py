"""The worker package's one retry loop: bounded, only for the failures it is told to retry."""

from __future__ import annotations

import pytest

from snowflake_db.worker._engine import retry


def test_retries_until_success_within_the_bound() -> None:
    calls: list[int] = []
    pauses: list[int] = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("busy")
        return "done"

    result = retry(
        attempt,
        attempts=3,
        retryable=lambda error: isinstance(error, TimeoutError),
        pause=lambda number: pauses.append(number) or 0.0,
    )
    assert result == "done" and len(calls) == 3 and pauses == [1, 2]


def test_the_last_failure_and_other_failures_propagate() -> None:
    calls: list[int] = []

    def busy() -> None:
        calls.append(1)
        raise TimeoutError(f"busy {len(calls)}")

    with pytest.raises(TimeoutError, match="busy 4"):
        retry(busy, attempts=4, retryable=lambda error: True, pause=lambda _: 0.0)

    def broken() -> None:
        calls.append(1)
        raise KeyError("not a race")

    calls.clear()
    with pytest.raises(KeyError):
        retry(
            broken,
            attempts=4,
            retryable=lambda error: isinstance(error, TimeoutError),
            pause=lambda _: 0.0,
        )
    assert len(calls) == 1
