"""The project's modules import one way: no import cycle among them (docs/contract.md, "Layout").

Every ``import`` counts, module-level or inside a function (an import deferred to run time hides a
cycle from Python, not from the design), except those under ``if TYPE_CHECKING:``, which never run.
Methods looked up by name (solvers/api.py's registry) are not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "profiler", "solvers", "runtime")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _known(name: str, modules) -> str | None:
    """The longest prefix of ``name`` that is a project module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _runtime_imports(tree: ast.Module):
    """The Import/ImportFrom nodes of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        pending.extend(ast.iter_child_nodes(node))


def imported_modules(name: str, path: Path, modules) -> set[str]:
    """The project modules ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, modules) for alias in node.names)
            continue
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            found.add(submodule if submodule in modules else _known(base, modules))
    found.discard(None)
    found.discard(name)
    return found


def import_graph() -> nx.DiGraph:
    modules = project_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in imported_modules(name, path, modules))
    return graph


def test_the_import_graph_sees_imports():
    graph = import_graph()
    assert graph.has_edge("planner.api", "profiler")  # a plain import of a package
    assert graph.has_edge("solvers.api", "solvers.simulate")  # a relative import of a module


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph()
    cycles = [sorted(component) for component in nx.strongly_connected_components(graph) if len(component) > 1]
    described = ["; ".join(f"{a} -> {b}" for a, b in graph.subgraph(c).edges) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)
