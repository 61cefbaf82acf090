"""Private names stay private (issue 30), checked on the source with ``ast`` as
tests/test_import_layers.py checks imports.

Counted, outside tests: ``obj._name`` where ``obj`` is not ``self``/``cls`` or a class of the
same module and ``_name`` is not defined in that module (a def, a class, a name, an assignment
to ``self._name``, a ``__slots__`` entry or a string naming it), and every
``from m import _name``. Neither the simulator nor the live scheduler has mixins: their parts
(``envs/sim_*.py``, ``envs/slots.py``, ``envs/hedging.py``; ``scale_ray/live/admission.py``,
``completions.py``, ``runs.py``, ``durability.py``) are objects with their own state, and
``envs/fork.py`` / ``envs/sim_snapshot.py`` are functions of the simulator's public attributes,
so a private name read across them counts. The named tuple API
(``_replace``, ``_asdict``, ``_fields``, ``_make``) is public despite its underscore.

What is left is Ray's (9): a Ray DAG node's body, the session directory, the internal KV store
Serve uses too, and the local learner of an RLlib LearnerGroup; each has no public accessor.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envs", "policies", "scale_ray", "serve_apps")
LIMIT = 9
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_accesses(path: Path) -> list[str]:
    """``line: what`` for each private access across modules in ``path`` (module docstring)."""
    tree = ast.parse(path.read_text())
    own: set[str] = set()
    classes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
            own.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            own.add(node.attr)  # writing another object's private name does not make it ours
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
            own.add(node.value)  # __slots__ entries
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            v = node.value
            if isinstance(v, ast.Name) and (v.id in ("self", "cls") or v.id in classes):
                continue
            if node.attr in own or node.attr in NAMEDTUPLE_API:
                continue
            out.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if _private(a.name)]
    return out


def all_accesses() -> dict[str, list[str]]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            hits = private_accesses(path)
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    return found


def test_private_access_across_modules_is_at_most_9():
    found = all_accesses()
    total = sum(len(v) for v in found.values())
    table = "\n".join(f"  {f}: {', '.join(h)}" for f, h in found.items())
    assert total <= LIMIT, f"{total} private accesses across modules (at most {LIMIT}):\n{table}"


def test_the_counter_sees_an_access(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from a import _hidden, shown\n"
                   "class C:\n    _own = 1\n    def f(self, other):\n"
                   "        other._z = 1\n"
                   "        return self._x, other._y, other._own, C._own, t._replace(a=1)\n")
    assert sorted(private_accesses(src)) == ["1: import _hidden", "5: ._z", "6: ._y"]
