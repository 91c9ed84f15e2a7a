"""The package's shape: no import cycle (module-level and in-function imports alike), no module
over 600 lines. Both read the source with ``ast``; nothing is imported."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opensearch_lsr"
MAX_LINES = 600


def package_modules(root: Path = PACKAGE) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of the package (``__init__`` = the package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{importer: {imported package module: line}}`` over every import statement, wherever it sits
    (module level, inside functions, under ``if TYPE_CHECKING``); ``from pkg import sub`` counts as an
    import of ``pkg.sub`` when that is a module."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    edges[name].setdefault(target, node.lineno)
    return edges


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {t for targets in edges.values() for t in targets}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle_through_an_in_function_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("import pkg.a\nx = 1\n")
    (pkg / "d.py").write_text("from . import a\n")
    modules = package_modules(pkg)
    assert find_cycles(import_edges(modules)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_no_import_cycle_in_the_package():
    edges = import_edges(package_modules())
    cycles = find_cycles(edges)
    detail = [" -> ".join(c) + "  (" + ", ".join(f"{a}:{edges[a][b]}->{b}" for a in c for b in edges.get(a, {})
                                             if b in c) + ")" for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(detail)


def test_no_module_over_600_lines():
    too_long = {name: n for name, path in package_modules().items()
                if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them at their seams): {too_long}"
