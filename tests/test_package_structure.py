"""The package's shape: no import cycle and no import running up the layer map (module-level and
in-function imports alike), no module over 600 lines, engines as peers (no engine package imports
another; code outside them reaches an engine through the registry in ``engines/``). All read the source
with ``ast``; nothing is imported."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "opensearch_lsr"
MAX_LINES = 600

#: The layers, low to high: a module may import its own layer and lower ones, never a higher one.
#: Entries are module paths relative to the package ("" = the package's ``__init__``); the longest
#: matching entry places a module (``encoding.job`` is indexing, the rest of ``encoding`` encoders).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: errors, configs, the engine contract", ("", "errors", "config", "resources", "contract", "pruning",
                                                    "corpus")),
    ("text, vocabulary and models: IDF, nori/BM25, tokenizer transfer, multilingual bridge models",
     ("idf", "lexical", "transfer", "multilingual")),
    ("encoders", ("encoding", "inference_free", "source_vocab")),
    ("engine-neutral pieces: the protocol, the registry, what engines share", ("engines",)),
    ("engines", ("local", "opensearch", "elasticsearch")),
    ("indexing into an engine", ("encoding.indexing", "encoding.job", "encoding.job_config", "encoding.job_state",
                                 "encoding.writers",
                                 "encoding.ray_job", "encoding.ray_workers")),
    ("evaluation", ("evaluation",)),
    ("training and the quickstart", ("training", "quickstart")),
    ("command line", ("cli",)),
]


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


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS, root: str = PACKAGE.name) -> int:
    """Index in ``layers`` of the longest entry that is ``module`` or a parent package of it."""
    rel = module[len(root) + 1:] if module.startswith(root + ".") else ("" if module == root else module)
    best, best_len = None, -1
    for level, (_, entries) in enumerate(layers):
        for entry in entries:
            matches = rel == entry or (entry and rel.startswith(entry + "."))
            if matches and len(entry) > best_len:
                best, best_len = level, len(entry)
    if best is None:
        raise KeyError(f"{module} is in no layer of the map: add its package to LAYERS")
    return best


def upward_edges(edges: dict[str, dict[str, int]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS,
                 root: str = PACKAGE.name) -> list[str]:
    """``importer:line -> imported`` for every import of a higher layer."""
    return sorted(f"{a}:{line} -> {b}  ({layers[layer_of(a, layers, root)][0]} -> {layers[layer_of(b, layers, root)][0]})"
                  for a, targets in edges.items() for b, line in targets.items()
                  if layer_of(b, layers, root) > layer_of(a, layers, root))


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


def test_the_layer_check_finds_an_upward_in_function_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "job.py").write_text("from ..mid import m\n")          # indexing: may import mid
    (pkg / "low" / "a.py").write_text("def f():\n    from ..top import t\n")
    (pkg / "mid.py").write_text("from .low import a\nm = 1\n")
    (pkg / "top.py").write_text("import pkg.mid\nt = 1\n")
    layers = [("low", ("", "low")), ("mid", ("mid",)), ("indexing", ("low.job",)), ("top", ("top",))]
    edges = import_edges(package_modules(pkg))
    assert [e.split("  (")[0] for e in upward_edges(edges, layers, root="pkg")] == ["pkg.low.a:2 -> pkg.top"]
    (pkg / "new.py").write_text("from .mid import m\n")
    try:
        upward_edges(import_edges(package_modules(pkg)), layers, root="pkg")
    except KeyError as err:
        assert "pkg.new" in str(err)
    else:
        raise AssertionError("a module outside the layer map must be reported")


def test_no_import_runs_up_the_layer_map():
    modules = package_modules()
    for module in modules:
        layer_of(module)  # every module is placed (KeyError names the one that is not)
    up = upward_edges(import_edges(modules))
    assert not up, "imports of a higher layer (move the importer up, or the imported code down):\n" + "\n".join(up)


def test_no_module_over_600_lines():
    too_long = {name: n for name, path in package_modules().items()
                if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them at their seams): {too_long}"


#: The engine packages: peers, none imports another.
ENGINE_PACKAGES: tuple[str, ...] = ("local", "opensearch", "elasticsearch")


def engine_of(module: str, engines: tuple[str, ...] = ENGINE_PACKAGES, root: str = PACKAGE.name) -> str | None:
    """The engine package ``module`` belongs to, or ``None``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == root and parts[1] in engines else None


def engine_import_violations(edges: dict[str, dict[str, int]], engines: tuple[str, ...] = ENGINE_PACKAGES,
                             root: str = PACKAGE.name) -> list[str]:
    """``importer:line -> imported`` for every import of an engine package that is not allowed.

    An engine package imports no other engine package. Outside them, a module reaches an engine through
    the registry (``engines``) only; the one exception is a module named after its engine (``cli.opensearch``,
    ``cli.elasticsearch``, ``evaluation.elasticsearch``: that engine's own commands or runner), which may
    import that engine and no other.
    """
    out = []
    for importer, targets in edges.items():
        own = engine_of(importer, engines, root)
        for target, line in targets.items():
            wanted = engine_of(target, engines, root)
            if wanted is None or wanted == own:
                continue
            if own is None and importer.rpartition(".")[2] == wanted:
                continue  # that engine's own command-line or evaluation module
            why = "engine -> another engine" if own else "not through the registry"
            out.append(f"{importer}:{line} -> {target}  ({why})")
    return sorted(out)


def test_the_engine_check_finds_a_peer_import_and_a_bypass_of_the_registry(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("reg", "alpha", "beta", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "reg" / "shared.py").write_text("x = 1\n")
    (pkg / "alpha" / "engine.py").write_text("from ..reg import shared\n")                     # allowed
    (pkg / "beta" / "engine.py").write_text("def f():\n    from ..alpha import engine\n")     # peer import
    (pkg / "cli" / "search.py").write_text("from ..beta.engine import f\n")                    # bypass
    (pkg / "cli" / "alpha.py").write_text("from ..alpha import engine\n")                      # alpha's own commands
    edges = import_edges(package_modules(pkg))
    found = [v.split("  (")[0] for v in engine_import_violations(edges, ("alpha", "beta"), root="pkg")]
    assert found == ["pkg.beta.engine:2 -> pkg.alpha.engine", "pkg.cli.search:1 -> pkg.beta.engine"]


def test_engines_are_peers_reached_through_the_registry():
    bad = engine_import_violations(import_edges(package_modules()))
    assert not bad, ("imports of an engine package from another engine, or from code that should use the "
                     "registry (opensearch_lsr.engines):\n" + "\n".join(bad))


def test_the_registry_names_each_engine_package_adapter():
    tree = ast.parse((PACKAGE / "engines" / "__init__.py").read_text(encoding="utf-8"))
    registry = next(node.value for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
                    and getattr(node.target, "id", None) == "ENGINES")
    entries = ast.literal_eval(registry)
    assert sorted(entries) == sorted(ENGINE_PACKAGES)
    for kind, target in entries.items():
        module, _, cls = target.partition(":")
        assert module == f"{PACKAGE.name}.{kind}.engine", f"{kind}: the adapter lives in {kind}/engine.py"
        source = (PACKAGE / kind / "engine.py").read_text(encoding="utf-8")
        assert f"class {cls}" in source, f"{module} defines no {cls}"
