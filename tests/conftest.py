import os

pytest_plugins = ["tests.plugins.databases", "tests.plugins.process_default"]

# Run only in its own subprocess (tests/test_sharding_django.py), with its own Django settings:
# the main run does not collect it at all rather than report it skipped.
collect_ignore = (
    [] if os.environ.get("DJANGO_SETTINGS_MODULE") == "example_project.settings"
    else ["sharding_django_scenario.py"]
)
