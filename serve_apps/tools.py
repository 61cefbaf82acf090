"""The functions HTTP clients of the scheduler service may name: by capability, not by module.

A function is callable over HTTP only if the operator's own code marks it,
``@primitive(http=True)`` (:class:`scale_ray.live.workflow.Primitive`), *and* the service's
``primitives`` allow-list names it. Entries (``SchedulerArgs.primitives``), resolved at deploy
(:class:`AllowList` imports the listed modules, the operator's own code):

* ``module:function``: that function; refused at deploy (a ValueError naming ``primitives[i]``
  and the entry) if it is not a marked function defined in that module, or if the module path or
  the name is private (a part starting with ``_``).
* ``module:*``: every marked public function defined in that module; refused at deploy if it has
  none (``json:*``, ``numpy:*``: nothing there is marked).

A request naming anything else (an unmarked or private function, even of a ``module:*`` module,
or a module not listed) is a 422 ``not_allowed`` naming the field; a request imports nothing.
Standard-library and third-party functions are offered only by wrapping them in a marked function
of the operator's module. There is no deny-list of modules any more (it could not be complete:
``timeit:timeit``, ``yaml:unsafe_load`` passed it); the mark is the only way in. Values between
HTTP-submitted tasks must be JSON (:class:`JsonOnly`), so no callable or object travels from one
task to the next. What a marked function must be safe against: docs/serving.md "The allow-list".
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from typing import Any, Sequence

from scale_ray.live.workflow import Primitive

from .decisions import RequestError

__all__ = ["AllowList", "JsonOnly", "json_violation"]

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")
_HOW = ("offer a function by writing it in a module of your own, marked @primitive(http=True) "
        "(scale_ray.live.workflow), that takes and returns JSON values (docs/serving.md)")


def _private(mod: str, name: str = "") -> bool:
    return any(p.startswith("_") for p in (*mod.split("."), name) if p)


def _marked_function(obj: Any, mod: str) -> Primitive | None:
    """``obj`` if it is a primitive marked ``http=True`` whose body is a Python function defined
    in module ``mod``; None otherwise."""
    if not isinstance(obj, Primitive) or getattr(obj, "http", False) is not True:
        return None
    fn = obj.fn
    if not inspect.isfunction(fn) or getattr(fn, "__module__", None) != mod:
        return None
    return obj


class AllowList:
    """The functions HTTP clients may name, resolved at deploy (see the module docstring): an
    entry that offers nothing marked is a ValueError naming ``primitives[i]``; :meth:`resolve`
    answers a request from what was resolved, never importing anything."""

    def __init__(self, entries: Sequence[str]):
        self.entries = tuple(entries)
        self._fns: dict[str, JsonOnly] = {}  # one object per path: Ray caches by it
        for i, e in enumerate(self.entries):
            where = f"primitives[{i}]: {e!r}"
            mod, sep, name = e.partition(":") if isinstance(e, str) else ("", "", "")
            if not sep or not _MODULE.match(mod) or not (name == "*" or _NAME.match(name)):
                raise ValueError(f"{where} is not module:function or module:*")
            if _private(mod, "" if name == "*" else name):
                raise ValueError(f"{where} is refused: a private name (a part starting with _) "
                                 f"is never offered over HTTP; {_HOW}")
            try:
                module = importlib.import_module(mod)
            except Exception as ex:  # noqa: BLE001 - any import failure fails the deploy
                raise ValueError(f"{where}: module {mod!r} cannot be imported on the service: "
                                 f"{type(ex).__name__}: {ex}") from None
            if name == "*":
                found = {n: fn for n, obj in sorted(vars(module).items())
                         if not n.startswith("_")
                         and (fn := _marked_function(obj, module.__name__))}
                if not found:
                    raise ValueError(f"{where} is refused: module {mod!r} defines no function "
                                     f"marked @primitive(http=True); {_HOW}")
            else:
                fn = _marked_function(getattr(module, name, None), module.__name__)
                if fn is None:
                    what = ("does not exist" if not hasattr(module, name) else
                            "is not a function marked @primitive(http=True) defined there")
                    raise ValueError(f"{where} is refused: {mod}.{name} {what}; {_HOW}")
                found = {name: fn}
            for n, fn in found.items():
                path = f"{mod}:{n}"
                if path not in self._fns:
                    self._fns[path] = JsonOnly(fn, path)

    @property
    def names(self) -> tuple[str, ...]:
        """Every ``module:function`` a request may name."""
        return tuple(self._fns)

    def resolve(self, path: str, loc: Sequence[Any]) -> "JsonOnly":
        fn = self._fns.get(path)
        if fn is None:
            offered = ", ".join(self._fns) or "none: only emulated tasks"
            raise RequestError(loc, f"{path!r} is not a function this service offers over HTTP "
                                    f"(its primitives allow-list: {offered})", "not_allowed")
        return fn


class JsonOnly:
    """An allowed primitive as HTTP-submitted workflows run it: its result must be a JSON value
    (null, bool, int, finite float, str, and lists / string-keyed dicts of those), checked when
    it returns, so no callable or other object can travel to the next task."""

    def __init__(self, prim: Primitive, path: str):
        self.fn, self.path = prim.fn, path
        self.__name__ = getattr(self.fn, "__name__", path)
        # what the marked primitive says of its runs: defaults of a request's task
        self.ray_options, self.emulate = dict(prim.ray_options), prim.emulate

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = self.fn(*args, **kwargs)
        bad = json_violation(value)
        if bad is not None:
            raise TypeError(f"{self.path} returned {bad}: HTTP-submitted primitives may only "
                            f"return JSON values")
        return value


def json_violation(value: Any, depth: int = 0) -> str | None:
    """What in ``value`` is not a JSON value (None when it all is)."""
    if depth > 64:
        return "a value nested deeper than 64 levels"
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"a non-finite float {value!r}"
    if isinstance(value, list):
        for v in value:
            bad = json_violation(v, depth + 1)
            if bad is not None:
                return bad
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"a dict key of type {type(k).__name__}"
            bad = json_violation(v, depth + 1)
            if bad is not None:
                return bad
        return None
    return f"a {type(value).__name__}"
