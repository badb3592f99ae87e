"""The core's promise, checked literally: its modules import only the standard library.

The core is every module at the package's top level except the integrations that need a
third-party package by design (``pydantic``) and the test helper that offers a pytest fixture
when pytest is there (``testing``), and every module of the core's own packages
(``metrics``). Imports inside functions count too: a lazy ``from .worker import ...`` would
break the promise as surely as a top-level one.

The same parse checks the layering of the whole package: no module imports itself back through
others (:func:`test_no_import_cycle_inside_the_package`).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "snowflake_db"
NOT_CORE = {"pydantic", "testing"}
#: Subpackages that belong to the core: every module in them is held to the same promise.
CORE_PACKAGES = ["metrics"]
CORE = sorted(
    [path.stem for path in PACKAGE.glob("*.py") if path.stem not in NOT_CORE | {"__init__"}]
    + CORE_PACKAGES
)
#: The files checked, as paths below the package without ``.py`` (``metrics/_figures``).
CORE_FILES = sorted(
    [name for name in CORE if name not in CORE_PACKAGES]
    + [
        path.relative_to(PACKAGE).with_suffix("").as_posix()
        for package in CORE_PACKAGES
        for path in (PACKAGE / package).glob("*.py")
    ]
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


def _top_level_target(module: str, level: int, name: str) -> str:
    """The module of ``snowflake_db`` at the top level that a relative import in ``module``
    (``metrics/_figures``) reaches: ``from ..layout import`` there reaches ``layout``."""
    folders = module.split("/")[:-1]
    return folders[0] if level <= len(folders) else name.partition(".")[0]


@pytest.mark.parametrize("module", ["__init__", *CORE_FILES])
def test_core_module_imports_only_the_standard_library(module: str) -> None:
    bad = []
    for level, name in _imports(PACKAGE / f"{module}.py"):
        top = name.split(".")[0]
        if level == 0 and top != "__future__" and top not in sys.stdlib_module_names:
            bad.append(name)
        elif level > 0 and _top_level_target(module, level, name) not in CORE:
            bad.append("." * level + name)
    assert not bad, f"snowflake_db/{module}.py imports {bad}, outside the stdlib core"


#: The sharding modules, framework-free (the frameworks' glue is in their own packages) except
#: the shard map, which keeps its tables in the control database and reads them through
#: SQLAlchemy Core, as snowflake_db.worker does; routers import it only when one follows the map.
SHARDING = sorted(path.stem for path in (PACKAGE / "sharding").glob("*.py"))
CONTROL_DATABASE_MODULES = {"shard_map"}


@pytest.mark.parametrize("module", sorted(set(SHARDING) - CONTROL_DATABASE_MODULES))
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


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking_block(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_import_nodes(nodes: Iterable[ast.AST]) -> list[ast.Import | ast.ImportFrom]:
    """Every import that can run: at any depth (functions too), but not under
    ``if TYPE_CHECKING:`` (its ``else`` branch does run)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking_block(node):
            found += _runtime_import_nodes(node.orelse)
        else:
            found += _runtime_import_nodes(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for the package at ``root``.

    ``from .x import name`` depends on ``x.name`` when that is a module, else on ``x``.
    """
    modules = {_module_name(path, root): path for path in root.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name not in modules:
            if "." not in name:
                return None
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        targets: list[str] = []
        for node in _runtime_import_nodes([ast.parse(path.read_text(), str(path))]):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets += [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        graph[module] = {t for t in map(owner, targets) if t is not None and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (strongly
    connected components of more than one module, Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_inside_the_package() -> None:
    """No module of ``snowflake_db`` imports itself back through others.

    Imports inside functions count: a lazy import only postpones the circle to the first call
    (the circle generator -> metrics -> process -> generator went through ``snapshot()``).
    Imports under ``if TYPE_CHECKING:`` do not: they never run, and annotations may name a
    sibling's types both ways. A package's ``__init__`` is not a cycle with its submodules
    unless a submodule imports a name from it.
    """
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(group) for group in cycles)


def test_the_cycle_check_sees_a_lazy_circle_and_ignores_type_checking(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import A\n")
    (package / "a.py").write_text("from . import b\nA = 1\n")
    (package / "b.py").write_text("def f():\n    from .sub.c import C\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..b import f\n"
        "else:\n    from .. import a\nC = 1\n"
    )
    (package / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    graph = import_graph(package)
    assert graph["pkg.b"] == {"pkg.sub.c"} and graph["pkg.d"] == set()
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
