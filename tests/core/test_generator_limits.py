"""``next_ids(n)`` has a documented maximum, refused before the generator's lock is taken."""

from __future__ import annotations

import threading

import pytest

from snowflake_db import MAX_IDS_PER_CALL, InvalidArgumentError, SnowflakeGenerator
from snowflake_db.testing import FakeClock


@pytest.mark.parametrize("n", [MAX_IDS_PER_CALL + 1, 10**10, 2**63])
def test_too_many_ids_are_refused_without_the_lock(n: int) -> None:
    generator = SnowflakeGenerator(3, clock=FakeClock())
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            generator.next_ids(n)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    with generator._lock:  # held elsewhere: a refusal must not wait for it
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(10)
    assert not caller.is_alive(), "next_ids waited for the generator's lock"
    [error] = outcome
    assert isinstance(error, InvalidArgumentError)
    assert f"n={n} exceeds the maximum {MAX_IDS_PER_CALL}" in str(error)

