"""The project's import graph: no circles, and packages import only downward.

Every import of a project module counts — at the top of a file, inside a function, or under
`TYPE_CHECKING` — because a lazy import that closes a circle is still a circle a reader must
untangle. The graph is read from the source with `ast` (nothing is imported), so this test is
cheap and does not depend on which optional packages are installed.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("meg", "storage", "engines", "tasks", "workloads", "policies", "flows", "bench")

# Lower layers first: a module may import its own package and any package listed before it.
# `workloads` (built-in MEGs, rewards, datasets) sits above the engines it trains with and
# below the tasks that score and sample with it; `policies` (what each rollout and selection
# policy does) above both, below the tasks and the orchestrator that ask it; `bench` drives
# everything.
LAYERS = ("meg", "storage", "engines", "workloads", "policies", "tasks", "flows", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to: itself, or the package it lives in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    base = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - node.level + 1]
                prefix = ".".join(anchor)
                stem = f"{prefix}.{node.module}" if node.module else prefix
            else:
                stem = node.module or ""
            # `from pkg import mod` imports the submodule when there is one.
            names = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
        else:
            continue
        for name in names:
            target = resolve(name, modules)
            if target is not None and target != module:
                targets.add(target)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that reach each other (size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_scan_sees_real_edges() -> None:
    graph = import_graph()
    # A scan that resolved nothing would pass the circle test trivially.
    assert "meg.registry" in graph["storage.backends"]
    assert "flows.cli.command_registry" in graph["flows.cli.commands"]
    assert sum(len(v) for v in graph.values()) > 300


def test_no_import_circles() -> None:
    circles = strongly_connected(import_graph())
    assert circles == [], f"import circles: {circles}"


def test_tarjan_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter(graph).static_order())


def test_packages_import_only_downward() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
        (src, dst)
        for src, targets in import_graph().items()
        for dst in targets
        if rank[dst.split(".")[0]] > rank[src.split(".")[0]]
    )
    assert upward == [], f"imports that climb a layer: {upward}"
