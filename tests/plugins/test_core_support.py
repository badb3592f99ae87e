"""The suite's wait for a forked child is bounded: a child that never ends fails the test."""

from __future__ import annotations

import faulthandler
import os
import time

import pytest

from .core_support import wait_forked


def test_a_forked_child_that_never_ends_fails_the_test_instead_of_hanging_it() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            faulthandler.disable()  # its SIGABRT expected: no stacks in the run's output
            time.sleep(300)
        finally:
            os._exit(0)
    with pytest.raises(pytest.fail.Exception, match=f"forked child {pid} still ran after 0.5 s"):
        wait_forked(pid, 0.5)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped


def test_a_forked_childs_exit_code_is_returned() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(3)
    assert wait_forked(pid) == 3
