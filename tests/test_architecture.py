"""The shape of the code: what imports what inside mithril/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "mithril"

# Packages that are one layer each; every other module directly under mithril/ is a layer of its own.
# The intended order: errors/dtypes <- onnx_bridge <- backends <- compile/validate/export <- frontend.
PACKAGE_LAYERS = ("mithril.onnx_bridge", "mithril.backends", "mithril.frontend", "mithril.models", "mithril.testing")


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module under mithril/ (a package is its __init__.py)."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement, at module level or inside functions and classes alike; those under
    ``if TYPE_CHECKING:`` never run and are left out."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _is_type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """Module -> the mithril modules it imports. ``from . import x`` is an import of the submodule
    x when x is a module; ``from a.b import name`` of a.b otherwise."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    parts = package.split(".")
                    stem = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
            for target in targets:
                while target and target not in modules:  # import a.b.c.name: the module a.b.c
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _layer(module: str) -> str:
    return next((p for p in PACKAGE_LAYERS if module == p or module.startswith(p + ".")), module)


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between layers: the packages of PACKAGE_LAYERS and the top-level modules."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(_layer(a), set()).update(_layer(b) for b in targets if _layer(b) != _layer(a))
    return out


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
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
                    found.append(component)
    return found


def _shortest_path(graph: dict[str, set[str]], members: set[str], start: str, goal: str) -> list[str]:
    """A shortest import path ``start -> ... -> goal`` inside one strongly connected component."""
    paths = {start: [start]}
    frontier = [start]
    while goal not in paths:
        reached = []
        for v in frontier:
            for w in sorted(graph.get(v, set()) & members):
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    reached.append(w)
        frontier = reached
    return paths[goal]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles as paths ``a -> b -> ... -> a``: for each import inside a strongly connected
    component, the shortest cycle through it (so every import that closes a cycle is named)."""
    cycles = {}
    for members in _components(graph):
        for a in sorted(members):
            for b in sorted(graph[a] & members):
                cycle = [a] + _shortest_path(graph, members, b, a)[:-1]
                start = cycle.index(min(cycle))
                key = tuple(cycle[start:] + cycle[:start])
                cycles[key] = [*key, key[0]]
    return sorted(cycles.values())


def _explain(cycles: list[list[str]], graph: dict[str, set[str]]) -> str:
    lines = []
    for cycle in cycles:
        lines.append(" -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            culprits = sorted(f"{x} imports {y}" for x in graph for y in graph[x] if _layer(x) == a and _layer(y) == b)
            if culprits and culprits != [f"{a} imports {b}"]:
                lines.append(f"    {a} -> {b}: " + "; ".join(culprits))
    return "\n".join(lines)


def test_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_reads_relative_and_function_level_imports():
    graph = import_graph()
    assert "mithril.errors" in graph["mithril.onnx_bridge.load"]  # from ..errors import ...
    assert "mithril.backends.kernels" in graph["mithril.backends.specialize"]  # from . import kernels
    assert "mithril.frontend.onnx_export" in graph["mithril.frontend.model"]  # inside Model.to_onnx_model


def test_no_import_cycle_between_modules():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between modules of mithril/:\n" + _explain(cycles, graph)


def test_no_import_cycle_between_layers():
    """onnx_bridge, backends and frontend, and the top-level modules (compile, validate...), import
    one another in one direction only."""
    graph = import_graph()
    cycles = find_cycles(layer_graph(graph))
    assert not cycles, "import cycles between mithril's packages and top-level modules:\n" + _explain(cycles, graph)


def test_lower_layers_import_no_higher_one():
    """onnx_bridge (loading, checks, graph-only passes) needs only errors and dtypes; backends
    (kernels, plans, lowering, folding) need onnx_bridge below them and nothing above."""
    allowed = {
        "mithril.onnx_bridge": {"mithril.errors", "mithril.dtypes"},
        "mithril.backends": {"mithril.errors", "mithril.dtypes", "mithril.onnx_bridge"},
    }
    graph = import_graph()
    wrong = sorted(f"{a} imports {b}" for a in graph for b in graph[a]
                   if _layer(a) in allowed and _layer(b) != _layer(a) and _layer(b) not in allowed[_layer(a)])
    assert not wrong, "imports from a lower layer into a higher one:\n" + "\n".join(wrong)
