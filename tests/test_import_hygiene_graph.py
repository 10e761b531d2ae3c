"""Issue 26: no import cycle between evalsnap's packages, computed from the source.

A node is a package of evalsnap (``evalsnap.adk``, ``evalsnap.pipeline``…), a top-level
module of it (``evalsnap.api``, ``evalsnap.errors``…) or one of the repository's other
packages (``storage``, ``tasks``, ``flows``). An edge is any import statement in a module of
one node that names another, at module level or inside a function (a deferred import is
still a dependency). A cycle is a strongly connected component of more than one node.

The framework lanes are siblings (issue 26 item 4): neither ``evalsnap.adk`` nor
``evalsnap.langgraph`` imports the other; what both need is in ``evalsnap.agents``, which
finds them by module name (:data:`evalsnap.agents.lanes.LANES`).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

TOPS = ("evalsnap", "storage", "tasks", "flows")
LANES = ("evalsnap.adk", "evalsnap.langgraph")


def _node(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "evalsnap" and len(parts) > 1 else parts[0]


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """Every module ``path`` imports (absolute names), with its line."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from evalsnap import errors` imports the module evalsnap.errors
            names = [f"{base}.{alias.name}" for alias in node.names] if base == "evalsnap" \
                else [base]
            found += [(name, node.lineno) for name in names]
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """node → node it imports → where (``module:line``)."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for name, line in _imports(path, module):
                if name.split(".")[0] in TOPS and _node(name) != _node(module):
                    edges[_node(module)][_node(name)].append(f"{module}:{line}")
    return edges


def cycles(edges: dict[str, dict[str, list[str]]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    nodes = sorted(set(edges) | {b for a in edges for b in edges[a]})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_the_graph_sees_imports_at_module_level_and_inside_functions(tmp_path):
    """The finder itself can fail: a planted two-package cycle is found."""
    for top in TOPS:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    (tmp_path / "evalsnap" / "a").mkdir()
    (tmp_path / "evalsnap" / "a" / "__init__.py").write_text("from evalsnap.b import x\n")
    (tmp_path / "evalsnap" / "b").mkdir()
    (tmp_path / "evalsnap" / "b" / "__init__.py").write_text(
        "def f():\n    from ..a import y\n")
    (tmp_path / "evalsnap" / "c.py").write_text("from evalsnap import a\n")
    assert cycles(import_graph(tmp_path)) == [frozenset({"evalsnap.a", "evalsnap.b"})]


def test_no_import_cycle_between_packages():
    edges = import_graph()
    found = cycles(edges)
    where = {tuple(sorted(c)): {f"{a} -> {b}": edges[a][b][:3] for a in c for b in c
                                if b in edges.get(a, {})} for c in found}
    assert not found, f"import cycles between packages: {where}"


def test_the_framework_lanes_do_not_import_each_other():
    """Not even one way: a lane reaches another only through evalsnap.agents' table."""
    edges = import_graph()
    assert all(lane in edges for lane in LANES), "a lane package is gone: update LANES"
    crossing = {f"{a} -> {b}": edges[a][b][:3] for a in LANES for b in LANES
                if a != b and b in edges.get(a, {})}
    assert not crossing, f"the framework lanes import each other: {crossing}"
    assert "evalsnap.agents" in edges["evalsnap.adk"] and "evalsnap.agents" in edges["evalsnap.langgraph"]
    assert not set(LANES) & set(edges.get("evalsnap.agents", {})), \
        f"evalsnap.agents imports a lane: {dict(edges['evalsnap.agents'])}"
