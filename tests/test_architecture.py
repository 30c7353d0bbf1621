"""The shape of the code: what imports what inside mithril/ and models_zoo/."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "mithril"
# The packages whose import graph must have no cycle: the library and the models built on it.
ROOTS = (ROOT, ROOT.parent / "models_zoo")

# Packages that are one layer each; every other module directly under mithril/ is a layer of its own.
# The intended order: errors/dtypes <- onnx_bridge <- backends <- compile/validate/export <- frontend.
PACKAGE_LAYERS = ("mithril.onnx_bridge", "mithril.backends", "mithril.frontend", "mithril.models", "mithril.testing")


def _modules(roots: tuple[Path, ...] = (ROOT,)) -> dict[str, Path]:
    """Dotted name -> file, for every module under ``roots`` (a package is its __init__.py)."""
    modules = {}
    for root, path in ((root, p) for root in roots for p in root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
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


def _import_stem(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module ``from ... import`` names, with relative imports resolved against ``name``."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    return ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.lru_cache(maxsize=None)  # read-only: every test takes the same graph
def import_graph(roots: tuple[Path, ...] = ROOTS) -> dict[str, set[str]]:
    """Module -> the modules under ``roots`` it imports. ``from . import x`` is an import of the
    submodule x when x is a module; ``from a.b import name`` of a.b otherwise. Imports inside
    functions count: one placed there to dodge a cycle is still a cycle."""
    modules = _modules(roots)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in _imports(_parse(path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                stem = _import_stem(name, path, node)
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


def test_import_graph_spans_mithril_and_models_zoo():
    graph = import_graph()
    assert "mithril.models" in graph["models_zoo.classic"]  # from mithril.models import MLP, ...
    assert "models_zoo.resnet" in graph["models_zoo"]  # from .resnet import resnet18, ...


def test_no_import_cycle_between_modules():
    """No cycle through mithril/ and models_zoo/, counting imports inside functions."""
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between modules of mithril/ and models_zoo/:\n" + _explain(cycles, graph)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(roots: tuple[Path, ...] = ROOTS) -> list[str]:
    """Private names one module takes from another: ``from a.b import _f``, and ``b._f`` where
    ``b`` names a module imported (``from a import b``, ``import a.b as b``)."""
    modules = _modules(roots)
    packages = tuple(root.name for root in roots)
    found = []
    for name, path in sorted(modules.items()):
        where = path.relative_to(roots[packages.index(name.partition(".")[0])].parent)
        tree = _parse(path)
        aliases = {}  # local name -> the module it is bound to
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                aliases.update({a.asname or a.name: a.name for a in node.names if a.name.startswith(packages)})
                continue
            stem = _import_stem(name, path, node)
            if not stem.startswith(packages):
                continue
            for a in node.names:
                if f"{stem}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{stem}.{a.name}"
                elif _private(a.name) and stem != name:
                    found.append(f"{where}:{node.lineno} imports {a.name} from {stem}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                owner = ".".join([aliases[base.id], *reversed(chain)])
                if owner in modules and owner != name:
                    found.append(f"{where}:{node.lineno} uses {owner}.{node.attr}")
    return sorted(set(found))


def test_private_import_finder_finds_both_forms(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def _f(): pass\ndef g(): pass\n")
    (pkg / "b.py").write_text("from .a import _f, g\nfrom . import a\na._f()\na.g()\n__all__ = [g.__name__]\n")
    assert private_imports((pkg,)) == ["pkg/b.py:1 imports _f from pkg.a", "pkg/b.py:3 uses pkg.a._f"]


def test_no_module_imports_a_private_name_of_another():
    """A name another module needs is public (no underscore, a docstring), or lives where both use it."""
    found = private_imports()
    assert not found, "private names used across modules:\n" + "\n".join(found)


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


def test_compile_knows_no_frontend():
    """ml.compile takes a frontend model through its export_for_compile hook, never by importing it."""
    graph = import_graph()
    wrong = sorted(f"{a} imports {b}" for a in ("mithril.compile", "mithril.physical_model") for b in graph[a]
                   if _layer(b) in ("mithril.frontend", "mithril.models"))
    assert not wrong, "compile reaches into the frontend:\n" + "\n".join(wrong)


# -- backends: one folder each, one table -------------------------------------------------------
def _framework_owners() -> dict[str, str]:
    """Top-level module of a framework (torch, jax, jaxlib, mlx, ggml, and gguf, ggml's file
    format) -> the backend folder allowed to import it."""
    from mithril.backends.table import BACKENDS

    owners = {module: name for name, entry in BACKENDS.items()
              for module in (*entry.array_modules, entry.framework) if module not in (None, "numpy")}
    return {**owners, "gguf": "ggml"}


def test_frameworks_are_imported_only_in_their_backend_folder():
    """jax, torch, mlx and ggml are imported (at module or function level) only under
    mithril/backends/<that framework>/, and not by that folder's __init__.py."""
    owners = _framework_owners()
    offenders = []
    for name, path in sorted(_modules().items()):
        for node in _imports(_parse(path)):
            if isinstance(node, ast.Import):
                tops = [alias.name.partition(".")[0] for alias in node.names]
            else:
                tops = [node.module.partition(".")[0]] if node.level == 0 and node.module else []
            for top in tops:
                owner = owners.get(top)
                if owner is None:
                    continue
                folder = f"mithril.backends.{owner}"
                if not name.startswith(folder + ".") or path.name == "__init__.py":
                    offenders.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} imports {top}")
    assert not offenders, "frameworks imported outside their backend folder:\n" + "\n".join(offenders)


def test_import_mithril_imports_no_framework():
    import subprocess
    import sys

    code = "import mithril, sys; print([m for m in ('jax', 'jaxlib', 'torch', 'mlx') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_table_row_has_its_folder_and_class():
    import mithril
    from mithril.backends.backend import Backend
    from mithril.backends.table import BACKENDS

    for name, entry in BACKENDS.items():
        folder = ROOT / "backends" / name
        missing = [f for f in ("__init__.py", "backend.py", "arrays.py", "overrides.py") if not (folder / f).is_file()]
        assert not missing, f"mithril/backends/{name}/ lacks {missing}"
        cls = entry.load()
        assert issubclass(cls, Backend) and cls.name == name, (name, cls)
        assert getattr(mithril, entry.class_name) is cls, f"mithril.{entry.class_name} is not {entry.module}'s"
    # every backend folder has its row; segmented/ is the layer C and GGML build on, no backend itself
    folders = {p.parent.name for p in (ROOT / "backends").glob("*/backend.py")} - {"segmented"}
    assert folders == set(BACKENDS), f"folders {sorted(folders)} against table rows {sorted(BACKENDS)}"


def test_cli_and_conformance_take_their_backends_from_the_table():
    import pytest

    from mithril import cli, conformance
    from mithril.backends.table import BACKENDS
    from mithril.errors import MithrilError

    assert cli.available_backends() == {k: e.load() for k, e in BACKENDS.items() if e.installed()}
    commands = next(a for a in cli.build_parser()._actions if isinstance(a.choices, dict)).choices
    backend_flag = next(a for a in commands["validate"]._actions if "--backend" in a.option_strings)
    assert all(name in backend_flag.help for name in BACKENDS)
    with pytest.raises(MithrilError, match=", ".join(BACKENDS)):
        cli.make_backends("no-such-backend")
    with pytest.raises(MithrilError, match=", ".join(BACKENDS)):
        conformance.make_backend("no-such-backend")
    assert type(conformance.make_backend("numpy")) is BACKENDS["numpy"].load()


def test_no_second_list_of_backend_classes():
    """Outside mithril/backends/ and mithril/__init__.py, no code names a backend class in a
    string (a dict of backend names to class names is a second table)."""
    from mithril.backends.table import BACKENDS

    class_names = {entry.class_name for entry in BACKENDS.values()}
    offenders = []
    for name, path in sorted(_modules().items()):
        if name == "mithril" or name.startswith("mithril.backends."):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Constant) and node.value in class_names:
                offenders.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.value!r}")
    assert not offenders, "backend classes named outside the table:\n" + "\n".join(offenders)
