"""The import graph of certeval/ (docs/architecture.md §2): built from every import statement in every module —
function-level and ``TYPE_CHECKING`` imports included — it has no cycle, and the library packages never import the
command line (``certeval.cli``): the CLI calls them with typed values and prints what they return."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "certeval"
LIBRARY = ("certeval.backtests", "certeval.estimators", "certeval.runs", "certeval.flows", "certeval.hosting")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package by dotted name: (file, is a package's __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _owner(name: str, modules: dict) -> str | None:
    """The module ``name`` refers to: itself, or the longest enclosing module (``a.b.func`` → ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module → the certeval modules its import statements name (anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        base = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    source = ".".join(parts + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # ``from pkg import sub`` names the submodule; ``from mod import func`` the module
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                           for alias in node.names]
            for target in targets:
                if target == "certeval" or target.startswith("certeval."):
                    owner = _owner(target, modules)
                    if owner is not None and owner != name:
                        graph[name].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert len(graph) > 100 and "certeval.engine" in graph
    # runs/run.py imports runs/results.py inside a method, and the CLI imports its commands inside functions
    assert "certeval.runs.results" in graph["certeval.runs.run"]
    assert "certeval.backtests.single" in graph["certeval.cli.backtest"]


def test_no_import_cycle_in_certeval():
    found = cycles(import_graph())
    assert not found, "import cycles (function-level imports included): " + "; ".join(" ↔ ".join(c) for c in found)


def test_the_library_never_imports_the_command_line():
    graph = import_graph()
    offenders = sorted(f"{module} → {target}" for module, targets in graph.items()
                       if module.startswith(LIBRARY) for target in targets
                       if target == "certeval.cli" or target.startswith("certeval.cli."))
    assert not offenders, "library modules importing certeval.cli: " + ", ".join(offenders)


def test_a_cycle_is_found_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
