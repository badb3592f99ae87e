import os

import pytest

pytest_plugins = ["tests.plugins.databases", "tests.plugins.process_default"]

# `make test` runs pytest -n 6 --dist loadgroup (pytest-xdist: tests in parallel processes).
# Tests marked `timing` judge lease timings (fencing before a deadline, renewals across an
# outage) or start dozens of processes: those of one module run one at a time, in one process,
# and first, as they take longest. Every test has its own database and tmp_path.

# Run only in its own subprocess (tests/test_sharding_django.py), with its own Django settings:
# the main run does not collect it at all rather than report it skipped.
collect_ignore = (
    [] if os.environ.get("DJANGO_SETTINGS_MODULE") == "example_project.settings"
    else ["sharding_django_scenario.py"]
)


def pytest_configure(config: object) -> None:
    config.addinivalue_line(  # type: ignore[attr-defined]
        "markers",
        "timing: judges lease timings or loads the machine (a module's run one at a time, "
        "first)",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module's `timing` tests form one group, run one at a time by one pytest-xdist worker
    while the others share the rest; first in the order, as they take longest."""
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.xdist_group(f"timing-{item.nodeid.split('::')[0]}"))
    items.sort(key=lambda item: item.get_closest_marker("timing") is None)
