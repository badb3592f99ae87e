"""Run a move's steps in order without a journal: for tests, scripts and a first look.

The production mover journals each step in the control database and flips the shard map
between ``verify`` and ``cleanup``; this driver does neither. It proves the path: check,
capture, copy, wait until the copy is ready, wait until the backlog is small, fence, wait for
the first pass of the verification (before the fence), drain, verify (the second pass: only the
rows written since the first), cleanup. Every wait calls the backend's ``advance`` on each
poll, as the mover does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...errors import ShardMoveError
from ._backend import MoveBackend

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
    backend: MoveBackend,
    *,
    timeout_s: float = 60.0,
    max_backlog: int = 1 << 20,
    stop_after: str | None = None,
    terminate_blockers: bool = False,
    on_step: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """Run :data:`MOVE_STEPS` in order (up to ``stop_after``); each wait is bounded by
    ``timeout_s``; the copy catches up to ``max_backlog`` (in the backend's
    ``backlog_unit``) before the fence. Returns each step's result by name;
    ``on_step(name, result)`` is called after each one."""
    if stop_after is not None and stop_after not in MOVE_STEPS:
        raise ShardMoveError(f"stop_after {stop_after!r} is not one of {MOVE_STEPS}")
    results: dict[str, Any] = {}
    fence_position: list[str] = []

    def fence() -> object:
        fenced = backend.fence(terminate_blockers=terminate_blockers)
        fence_position.append(fenced.position)
        return fenced

    def advancing(predicate: Callable[[], bool]) -> Callable[[], bool]:
        def reached() -> bool:
            backend.advance()
            return predicate()
        return reached

    def caught_up() -> int | None:
        wait_until(advancing(lambda: (backend.backlog() or 0) <= max_backlog),
                   timeout_s=timeout_s,
                   what=f"backlog below {max_backlog} {backend.backlog_unit}",
                   describe=backend.backlog)
        return backend.backlog()

    actions: dict[str, Callable[[], object]] = {
        "check": backend.check,
        "capture": backend.capture,
        "copy": backend.copy,
        "synced": lambda: wait_until(advancing(lambda: backend.copy_progress().synced),
                                     timeout_s=timeout_s, what="initial copy ready",
                                     describe=backend.copy_progress),
        "caught_up": caught_up,
        "pre_verify": lambda: backend.verify_before_fence(timeout_s=timeout_s),
        "fence": fence,
        "drained": lambda: wait_until(advancing(lambda: backend.drained(fence_position[0])),
                                      timeout_s=timeout_s,
                                      what=f"drain to the fence position {fence_position[0]}"),
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
