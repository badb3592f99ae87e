"""The core's promise, checked literally: its modules import only the standard library.

The core is every module at the package's top level except the integrations that need a
third-party package by design (``pydantic``) and the test helper that offers a pytest fixture
when pytest is there (``testing``). Imports inside functions count too: a lazy
``from .worker import ...`` would break the promise as surely as a top-level one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "snowflake_db"
NOT_CORE = {"pydantic", "testing"}
CORE = sorted(
    path.stem for path in PACKAGE.glob("*.py") if path.stem not in NOT_CORE | {"__init__"}
)


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(level, module)`` of every import in the file; ``from . import x`` gives ``(1, "x")``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module is None:
                found += [(node.level, alias.name) for alias in node.names]
            else:
                found.append((node.level, node.module))
    return found


@pytest.mark.parametrize("module", ["__init__", *CORE])
def test_core_module_imports_only_the_standard_library(module: str) -> None:
    bad = []
    for level, name in _imports(PACKAGE / f"{module}.py"):
        top = name.split(".")[0]
        if level == 0 and top != "__future__" and top not in sys.stdlib_module_names:
            bad.append(name)
        elif level > 0 and top not in CORE:
            bad.append("." * level + name)
    assert not bad, f"snowflake_db/{module}.py imports {bad}, outside the stdlib core"


#: The framework-free sharding modules (``django``/``sqlalchemy`` there only forward old paths).
SHARDING = ["__init__", "ddl", "ddl_steps", "engines", "partitioning", "routing", "rules"]


@pytest.mark.parametrize("module", SHARDING)
def test_sharding_routing_imports_no_framework(module: str) -> None:
    bad = []
    for level, name in _imports(PACKAGE / "sharding" / f"{module}.py"):
        top = name.split(".")[0]
        if level == 0 and top != "__future__" and top not in sys.stdlib_module_names:
            bad.append(name)
        elif (level == 1 and top not in SHARDING) or (level == 2 and top not in CORE):
            bad.append("." * level + name)
    assert not bad, f"snowflake_db/sharding/{module}.py imports {bad}, outside stdlib and core"


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from .worker import TableWorkerAllocator\n")
    assert _imports(source) == [(1, "worker")]
