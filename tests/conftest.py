pytest_plugins = ["tests.plugins.databases", "tests.plugins.process_default"]
