"""The demo's wait for its order processes ends, saying why, when they stall or end without
reporting their orders: it never waits for ever."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

from example_project import common


def stalling_child(_options: Any, _customers: Any, _count: int, seed: int, queue: Any) -> None:
    """Leases nothing, says nothing, never ends (stopped by the demo)."""
    time.sleep(600)


def silent_child(_options: Any, _customers: Any, _count: int, seed: int, queue: Any) -> None:
    """Ends at once without reporting its orders."""


def _options() -> common.Options:
    return common.Options(control_url="", shard_urls=[], processes=2, orders=10, customers=1,
                          quiet=True)


def test_stalled_order_processes_are_reported_and_stopped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(common, "STALL_S", 2.0)
    before = set(multiprocessing.active_children())
    placed, _ = common.place_orders_in_processes(_options(), [1], stalling_child)
    assert placed == []
    assert "error: no order process reported for 2 s" in capsys.readouterr().err
    assert not set(multiprocessing.active_children()) - before  # stopped, not left running


def test_order_processes_ending_without_their_orders_are_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    placed, _ = common.place_orders_in_processes(_options(), [1], silent_child)
    assert placed == []
    assert "ended without reporting all their orders" in capsys.readouterr().err
