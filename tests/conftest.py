import os

pytest_plugins = ["tests.plugins.databases", "tests.plugins.process_default"]

# `make test` runs pytest -n 6 -m "not timing" (pytest-xdist: tests in parallel processes), then
# pytest -m timing in one process: those tests judge lease timings (fencing before a deadline,
# renewals across an outage) or start dozens of processes, so they run after the others, one at
# a time. Every test has its own database and tmp_path.

# Run only in its own subprocess (tests/test_sharding_django.py), with its own Django settings:
# the main run does not collect it at all rather than report it skipped.
collect_ignore = (
    [] if os.environ.get("DJANGO_SETTINGS_MODULE") == "example_project.settings"
    else ["sharding_django_scenario.py"]
)


def pytest_configure(config: object) -> None:
    config.addinivalue_line(  # type: ignore[attr-defined]
        "markers",
        "timing: judges lease timings or loads the machine (make test runs these after the "
        "others, one at a time)",
    )
