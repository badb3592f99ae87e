pytest_plugins = ["tests.plugins.databases"]
