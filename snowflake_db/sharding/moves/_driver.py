"""Run a move's steps in order without a journal: for tests, scripts and a first look.

The production mover journals each step in the control database and flips the shard map
between ``verify`` and ``cleanup``; this driver does neither. It proves the path: check,
capture, copy, wait until the copy is ready, wait until the lag is small, fence, wait for the
first pass of the verification (before the fence), drain, verify (the second pass: only the
rows written since the first), cleanup.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...errors import ShardMoveError
from ._postgres import PostgresMoveBackend

#: The steps of :func:`run_move_steps`, in order (``stop_after`` takes one of them).
MOVE_STEPS = ("check", "capture", "copy", "synced", "caught_up", "pre_verify", "fence",
              "drained", "verify", "cleanup")


def wait_until(predicate: Callable[[], bool], *, timeout_s: float, what: str,
               describe: Callable[[], object] | None = None, poll_s: float = 0.05) -> float:
    """Poll ``predicate`` until true; the seconds it took, or :class:`ShardMoveError`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            state = f" ({describe()})" if describe is not None else ""
            raise ShardMoveError(f"{what} not reached in {timeout_s} s{state}")
        time.sleep(poll_s)
    return time.monotonic() - start


def run_move_steps(
    backend: PostgresMoveBackend,
    *,
    timeout_s: float = 60.0,
    max_lag_bytes: int = 1 << 20,
    stop_after: str | None = None,
    terminate_blockers: bool = False,
    on_step: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """Run :data:`MOVE_STEPS` in order (up to ``stop_after``); each wait is bounded by
    ``timeout_s``. Returns each step's result by name; ``on_step(name, result)`` is called
    after each one."""
    if stop_after is not None and stop_after not in MOVE_STEPS:
        raise ShardMoveError(f"stop_after {stop_after!r} is not one of {MOVE_STEPS}")
    results: dict[str, Any] = {}
    fence_lsn: list[str] = []

    def fence() -> object:
        fenced = backend.fence(terminate_blockers=terminate_blockers)
        fence_lsn.append(fenced.position)
        return fenced

    def caught_up() -> int | None:
        wait_until(lambda: (backend.lag() or 0) <= max_lag_bytes, timeout_s=timeout_s,
                   what=f"lag below {max_lag_bytes} bytes", describe=backend.lag)
        return backend.lag()

    actions: dict[str, Callable[[], object]] = {
        "check": backend.check,
        "capture": backend.capture,
        "copy": backend.copy,
        "synced": lambda: wait_until(lambda: backend.copy_progress().synced,
                                     timeout_s=timeout_s, what="initial copy ready",
                                     describe=backend.copy_progress),
        "caught_up": caught_up,
        "pre_verify": lambda: backend.verify_before_fence(timeout_s=timeout_s),
        "fence": fence,
        "drained": lambda: wait_until(lambda: backend.drained(fence_lsn[0]),
                                      timeout_s=timeout_s,
                                      what=f"drain to the fence LSN {fence_lsn[0]}"),
        "verify": backend.verify,
        "cleanup": backend.cleanup,
    }
    for name in MOVE_STEPS:
        results[name] = actions[name]()
        if on_step is not None:
            on_step(name, results[name])
        if name == stop_after:
            break
    return results
