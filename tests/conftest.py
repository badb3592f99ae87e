import os

import pytest
from hypothesis import settings

# No wall-clock deadline per example (Hypothesis's default is 200 ms): a loaded machine (load 25
# on 2 cores) took 675 ms for one layout example, and test_layout.py failed twice in one day on
# DeadlineExceeded. The suite judges no unit test by the clock; slow examples still show in
# Hypothesis's statistics.
settings.register_profile("snowflake_db", deadline=None)
settings.load_profile("snowflake_db")

pytest_plugins = [
    "tests.plugins.databases",
    "tests.plugins.process_default",
    "tests.plugins.scheduler_delay",
    "tests.plugins.shard_moves",  # the move tests' throwaway servers, one pair per process
]

# `make test` runs pytest -n 6 --dist loadgroup -m "not timing" (pytest-xdist: tests in
# parallel processes), then pytest -n 4 --dist loadgroup -m timing: those tests judge lease
# timings (fencing before a deadline, renewals across an outage) or start dozens of processes,
# so they run after the others, four tests at a time (a test's backends one at a time, the
# longest first).
# Every test has its own database and tmp_path.

# Run only in its own subprocess (tests/sharding/test_sharding_django.py), with its own Django
# settings: the main run does not collect it at all rather than report it skipped.
collect_ignore = (
    [] if os.environ.get("DJANGO_SETTINGS_MODULE") == "example_project.settings"
    else ["sharding/sharding_django_scenario.py", "sharding/shard_map_django_scenario.py"]
)


def pytest_configure(config: object) -> None:
    config.addinivalue_line(  # type: ignore[attr-defined]
        "markers",
        "timing(seconds=N, apart=(names,)): judges lease timings or loads the machine (make "
        "test runs these after the others, four at a time, the longest first; N: about how long "
        "one backend takes alone; a test's backends run one at a time, the parameters named in "
        "apart in groups of their own)",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `timing` test's parameters (one per backend) form one group, run one at a time by
    one pytest-xdist worker; the parameters its ``apart`` names (``timing(apart=("fake_time",))``)
    split it into groups that run beside each other. Timing tests come first in the order, the
    longest first (their ``seconds``: about how long one backend takes alone), then the `slow`
    ones, so that the workers finish at about the same time."""
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.xdist_group(f"timing-{_timing_group(item)}"))
    items.sort(key=_order)


def _timing_group(item: pytest.Item) -> str:
    """The test's node ID without its parameters, then the values of those it keeps apart."""
    name = item.nodeid.split("[")[0]
    marker = item.get_closest_marker("timing")
    apart = () if marker is None else marker.kwargs.get("apart", ())
    params = getattr(getattr(item, "callspec", None), "params", {})
    values = [str(params[key]) for key in apart if key in params]
    return f"{name}[{'-'.join(values)}]" if values else name


def _order(item: pytest.Item) -> tuple[bool, float, bool]:
    timing = item.get_closest_marker("timing")
    seconds = float(timing.kwargs.get("seconds", 0)) if timing is not None else 0.0
    return timing is None, -seconds, item.get_closest_marker("slow") is None


#: Why the tests must not run here (set when --dist loadgroup ignores the groups).
_refusal: list[str] = []


@pytest.hookimpl(trylast=True)  # after pytest-xdist marked the groups in the node IDs
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run when --dist loadgroup silently ignores the groups (pytest 9.2 with
    pytest-xdist 3.8, pytest-dev/pytest-xdist#1386): a group's tests would then run at once in
    several processes, beside each other's load and servers. Every test fails saying so."""
    if not session.config.getoption("loadgroup", default=False):
        return
    ungrouped = [
        item.nodeid for item in session.items
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
    ]
    if ungrouped:
        _refusal.append(
            f"--dist loadgroup ignores xdist_group here ({len(ungrouped)} tests, e.g. "
            f"{ungrouped[0]}): pytest {pytest.__version__} with this pytest-xdist does not "
            "group tests (pytest-dev/pytest-xdist#1386); install the versions pyproject.toml "
            "pins (make test does)"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _refusal:
        pytest.fail(_refusal[0], pytrace=False)
