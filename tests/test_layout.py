"""The folder tree's one-way imports: ``benchmarks`` may import the package, never the reverse, and no module
of either imports itself back through others. Imports inside functions count too: they must not hide a cycle."""

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGES = {"rmsnorm_kernel": ROOT / "src" / "rmsnorm_kernel", "benchmarks": ROOT / "benchmarks"}


def _module_name(path: Path, package: str, folder: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names an import statement of ``module`` names (modules, or names inside modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module
    return [stem] + [f"{stem}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the two packages it imports anywhere in its text."""
    files = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            files[_module_name(path, package, folder)] = path
    graph = {}
    for module, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, module, path.name == "__init__.py"):
                if name in files and name != module:
                    edges.add(name)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_of_three_and_none_in_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_relative_and_function_level_imports():
    graph = import_graph()
    assert "rmsnorm_kernel.ops.reference" in graph["rmsnorm_kernel.ops.op"]  # from .reference import ...
    # checkpoint_audit imports the network inside a function (the import may fail and is reported)
    assert "rmsnorm_kernel.training.network" in graph["rmsnorm_kernel.checks.checkpoint_audit"]


def test_no_module_of_the_package_or_the_benchmarks_imports_itself_back():
    assert cycles(import_graph()) == []


def test_the_package_never_imports_the_benchmarks():
    graph = import_graph()
    offenders = {m: sorted(e for e in edges if e.startswith("benchmarks")) for m, edges in graph.items()}
    assert {m: e for m, e in offenders.items() if m.startswith("rmsnorm_kernel") and e} == {}


def test_training_never_imports_the_check_commands():
    graph = import_graph()
    upward = {
        m: sorted(e for e in edges if e.startswith("rmsnorm_kernel.checks"))
        for m, edges in graph.items()
        if m.startswith("rmsnorm_kernel.training")
    }
    assert {m: e for m, e in upward.items() if e} == {}
