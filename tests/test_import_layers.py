"""Imports only point down (issue 16), checked on the source with ``ast``.

The layers, bottom up::

    envs            imports nothing of ours
    policies        envs
    scale_ray.live  envs, policies
    serve_apps      envs, policies, scale_ray.live
    scale_ray       any of these; only scale_ray.commands and scale_ray.cli (the command line, the
                    top layer) may import scale_ray.commands / scale_ray.cli

Every import counts: top-level and function-local, relative ones resolved. There is no import
cycle among our modules, and function-local imports in ``scale_ray`` are kept for the optional
heavy dependencies only (a lazy import keeps a light command light); any other import belongs at
the top of the module, where it shows the dependency graph.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("envs", "policies", "serve_apps", "scale_ray")

# Third-party dependencies a function-local import may defer (prefix match on the dotted name).
# tensorboardX is optional (RLlib brings it; train_metrics works without it).
HEAVY = ("torch", "ray", "matplotlib", "scipy", "gymnasium", "fastapi", "httpx", "tensorboardX",
         "pyarrow", "langgraph", "langchain_core",  # langgraph: the optional [agents] extra
         "grpc")  # Ray's transport: scale_ray.connect probes a cluster's GCS with it

# Cycles tolerated for now, each a frozenset of modules.
KNOWN_CYCLES: set[frozenset] = set()



@dataclass(frozen=True)
class Imp:
    source: str      # importing module
    target: str      # imported module (ours: the longest module that exists), or a 3rd-party name
    line: int
    local: bool      # inside a function body


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


MODULES = _modules()


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _known(name: str) -> str:
    """The longest prefix of ``name`` that is one of our modules."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports for annotations only, never run."""
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _walk(tree: ast.AST, local: bool = False):
    """(import node, whether it is inside a function) for every import in ``tree`` that runs
    (those under ``if TYPE_CHECKING:`` never do)."""
    for node in ast.iter_child_nodes(tree):
        if _type_checking(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, local
        yield from _walk(node, local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _imports(module: str) -> list[Imp]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node, local in _walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            # ``from pkg import mod`` imports pkg.mod when that is a module of ours
            names = [f"{full}.{a.name}" if f"{full}.{a.name}" in MODULES else full
                     for a in node.names]
        for name in dict.fromkeys(names):
            target = _known(name) if _ours(name) else name
            if target and target != module:
                out.append(Imp(module, target, node.lineno, local))
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> str:
    for layer in ("scale_ray.live", "scale_ray.commands", "scale_ray.cli"):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module.split(".")[0]


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _allowed(source: str, target: str) -> bool:
    layer = _layer(source)
    if layer == "envs":
        return _within(target, ("envs",))
    if layer == "policies":
        return _within(target, ("envs", "policies"))
    if layer == "scale_ray.live":
        return _within(target, ("envs", "policies", "scale_ray.live"))
    if layer == "serve_apps":
        return _within(target, ("envs", "policies", "scale_ray.live", "serve_apps"))
    if layer == "scale_ray.commands":
        return not _within(target, ("scale_ray.cli",))
    if layer == "scale_ray.cli":
        return True
    return not _within(target, ("scale_ray.commands", "scale_ray.cli"))


def _fmt(imps) -> str:
    return "\n".join(f"{MODULES[i.source].relative_to(REPO)}:{i.line}: {i.source} imports "
                     f"{i.target}{' (in a function)' if i.local else ''}" for i in imps)


def test_imports_only_point_down():
    bad = [i for imps in IMPORTS.values() for i in imps if _ours(i.target)
           and not _allowed(i.source, i.target)]
    assert not bad, "imports that point up a layer:\n" + _fmt(bad)


def _cycles() -> list[frozenset[str]]:
    """Strongly connected components (more than one module) of the graph of our imports."""
    graph = {m: sorted({i.target for i in IMPORTS[m] if _ours(i.target)}) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:  # Tarjan; our graph is small and shallow
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
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = [sorted(c) for c in _cycles() if c not in KNOWN_CYCLES]
    assert not cycles, f"import cycles: {cycles}"


def test_the_loaders_and_the_workload_model_form_no_cycle():
    # envs.loaders registered its families into envs.workload.SOURCES, which imported it back
    assert not [c for c in _cycles() if any(_within(m, ("envs.loaders",)) for m in c)]


def _heavy(name: str) -> bool:
    return _within(name, HEAVY)


def _gateways() -> set[str]:
    """Our modules whose import (top-level imports, transitively) loads a heavy dependency: a
    lazy import of one of them defers that dependency."""
    top = {m: [i.target for i in IMPORTS[m] if not i.local] for m in MODULES}
    heavy = {m for m, targets in top.items() if any(_heavy(t) for t in targets)}
    changed = True
    while changed:
        changed = False
        for m, targets in top.items():
            if m not in heavy and any(t in heavy for t in targets):
                heavy.add(m)
                changed = True
    return heavy


def test_function_local_imports_in_scale_ray_only_defer_heavy_dependencies():
    gateways = _gateways()
    bad = [i for m, imps in IMPORTS.items() for i in imps
           if i.local and _within(m, ("scale_ray",))
           and not _heavy(i.target) and i.target not in gateways]
    assert not bad, ("function-local imports of light modules (move them to the top of the "
                     "module):\n" + _fmt(bad))


def test_the_checker_sees_every_kind_of_import():
    # relative imports resolve, ``from pkg import module`` names the module, locals are marked
    imps = {(i.target, i.local) for i in IMPORTS["envs.loaders.dags"]}
    assert ("envs.config", False) in imps and ("envs.loaders.common", False) in imps
    assert ("yaml", True) in imps
    assert ("serve_apps.errors", False) in {(i.target, i.local) for i in IMPORTS["serve_apps.placement"]}
    assert any(i.target == "envs.loaders" for i in IMPORTS["envs.workload"])
