"""The workflow API of the live scheduler: primitives, calls, DAG files.

A *primitive* is a plain Python function with resource hints::

    @primitive(compute_gflop=4.0, memory_gb=8.0, output_gb=0.1)
    def summarize(text): ...

Calling ``summarize.bind(x)`` does not run anything: it returns a :class:`Call`, a node of a DAG.
Passing one call's result into another (``report.bind(summarize.bind(fetch.bind(url)))``) adds a
dependency, in the spirit of Ray's ``.bind()``. Calls may appear as top-level positional or keyword
arguments (Ray resolves only top-level object refs); other arguments are passed as values.
A workflow is the set of calls reachable from its outputs; :func:`collect` turns it into a
validated :class:`envs.workload.WorkflowSpec` plus the calls in the same topological order.

Workflows also come from DAG files (:func:`load_dag_file`: the project's JSON/YAML format, parsed
by :func:`envs.loaders.livedag.parse_dag`, or any format ``envs.loaders`` detects) and from
any :class:`~envs.workload.WorkflowSpec` (:func:`from_spec`, so the real-DAG loaders in
``envs.loaders`` plug in); those get an emulated body (:func:`emulated_body`) whose return value
is checkable: ``index + 1 + sum(parent values)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from envs.config import ResourceMappingConfig
from envs.demands import DemandError, Request, parse_options
from envs.loaders import load_dags
from envs.loaders.livedag import parse_dag
from envs.runtime import kind_of_name
from envs.workload import TaskSpec, WorkflowError, WorkflowSpec

__all__ = ["Primitive", "Call", "primitive", "collect", "from_spec", "load_dag_file", "RAY_OPTIONS",
           "WorkflowTypeError",
           "emulated_body", "expected_emulated_values", "WorkflowError", "CollectedWorkflow"]


class WorkflowTypeError(WorkflowError, TypeError):
    """``submit`` got something that is not a workflow (the message says what is accepted)."""


def _check_hint(name: str, fname: str, value: Any, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value <= 0):
        rule = "> 0" if positive else ">= 0"
        raise WorkflowError(f"primitive {name!r}: {fname} must be a finite number {rule}, got {value!r}")
    return float(value)


class Primitive:
    """A function with resource hints; ``.bind(*args)`` makes a :class:`Call`.

    Args:
        fn: the body; runs as a Ray task on the node the policy chose. A ``@ray.remote``
            function is unwrapped: its body is used and its Ray options become ``ray_options``.
        compute_gflop: compute demand c (GFLOP), what the policy reads (an estimate of the
            body's work); with ``emulate`` the run on a server of capacity C first sleeps
            ``c / C * time_scale`` seconds (see :class:`scale_ray.live.config.LiveConfig`).
        memory_gb: memory demand m (GB); the task fits a server only if ``m <= M`` (Ray's
            ``memory`` option, in bytes, counts too: the larger of the two).
        output_gb: size of the result (GB), for the transfer-delay feature.
        name: label in traces and errors (default: the function name).
        ray_options: Ray's task options (:data:`RAY_OPTIONS`): ``num_cpus``, ``num_gpus``,
            ``memory``, ``resources``, ``accelerator_type``, ``label_selector`` are demands (the
            task only goes to a server that has them, and its Ray task asks Ray for them; label
            selectors in Ray's resource model only), ``runtime_env`` travels
            with the Ray task. Ray's retry options are accepted and ignored (this scheduler
            re-runs lost tasks); anything else is a :class:`WorkflowError`.
        emulate: sleep the emulated run time before the body (an emulated heterogeneous
            cluster, for benchmarks: ``run-workflows``, ``bench``, the emulated tasks of DAG
            files and of the service set it). Default False: the body runs for real, at once.
        kind: what the run-time estimator learns under (default: the name without an instance
            number, ``search_3`` -> ``search``).
        hedge: a straggling run may get a backup copy on an idle server, the first result wins
            (``LiveConfig.hedge``; :mod:`scale_ray.live.runs`). Only for a body that is safe
            to run twice; a real body may poll ``ray.get_runtime_context().is_canceled()`` to
            stop once the other run won.
        http: HTTP clients of the scheduler service may name it (``module:function``) when the
            service's ``primitives`` allow-list lists it or its module (``module:*``); the
            service accepts nothing else (:mod:`serve_apps.tools`, docs/serving.md "The
            allow-list"). Mark only a body that is safe for any JSON arguments from a stranger.
    """

    def __init__(self, fn: Callable[..., Any], compute_gflop: float = 1.0, memory_gb: float = 0.0,
                 output_gb: float = 0.0, name: str | None = None,
                 ray_options: Mapping[str, Any] | None = None, emulate: bool = False,
                 kind: str | None = None, hedge: bool = False, http: bool = False):
        remote = _remote_function_options(fn)
        if remote is not None:  # a @ray.remote function: its body, its options below ours
            fn, defaults = remote
            ray_options = {**defaults, **(ray_options or {})}
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "primitive")
        self.compute_gflop = _check_hint(self.name, "compute_gflop", compute_gflop, True)
        self.output_gb = _check_hint(self.name, "output_gb", output_gb, False)
        self.ray_options = _check_ray_options(self.name, ray_options)
        try:  # its Ray request, converted once with Ray's rules (envs.demands)
            self.request: Request = parse_options(
                self.ray_options, _check_hint(self.name, "memory_gb", memory_gb, False),
                f"primitive {self.name!r}: Ray option")
        except DemandError as e:
            raise WorkflowError(str(e)) from None
        self.memory_gb = self.request.memory_gb  # the larger of the hint and Ray's memory
        if not isinstance(emulate, bool):
            raise WorkflowError(f"primitive {self.name!r}: emulate must be true or false, got "
                                f"{emulate!r}")
        self.emulate = emulate
        # the primitive it calls (the run-time estimator learns per kind and tier; envs.runtime)
        if kind is not None and (not isinstance(kind, str) or not kind or len(kind) > 200):
            raise WorkflowError(f"primitive {self.name!r}: kind must be a non-empty string of at "
                                f"most 200 characters, got {kind!r}")
        self.kind = kind or kind_of_name(self.name) or self.name
        if not isinstance(hedge, bool):
            raise WorkflowError(f"primitive {self.name!r}: hedge must be true or false, got {hedge!r}")
        self.hedge = hedge
        if not isinstance(http, bool):
            raise WorkflowError(f"primitive {self.name!r}: http must be true or false, got {http!r}")
        self.http = http
        self.run_gflop = self.compute_gflop  # an emulated run's true compute (noise: from_spec)
        self.copy_gflop = self.compute_gflop  # that of a hedged copy (its own noise draw)

    @property
    def demands(self) -> tuple[tuple[str, float], ...]:
        """The demands its Ray options name beyond memory (``envs.demands.Request.named``)."""
        return self.request.named

    @property
    def ray_demands(self) -> tuple[tuple[str, float], ...]:
        """What its Ray task holds on a node in Ray's resource model: CPU (Ray's default 1
        unless num_cpus says otherwise), memory (GB), GPUs, custom resources, the accelerator
        marker, label terms (``envs.demands.Request.on_nodes``)."""
        return self.request.on_nodes()

    def bind(self, *args: Any, **kwargs: Any) -> "Call":
        """A DAG node calling this primitive; :class:`Call` arguments become dependencies."""
        for i, a in enumerate(list(args) + list(kwargs.values())):
            if not isinstance(a, Call) and ray_dag_class(a) is None and _contains_call(a):
                raise WorkflowError(f"primitive {self.name!r}: argument {i} nests a Call or a Ray "
                                    f"DAG node inside a container; pass each result as its own "
                                    f"argument")
        return Call(self, args, kwargs)

    def options(self, **hints: Any) -> "Primitive":
        """A copy with other resource hints or Ray options
        (``fetch.options(compute_gflop=8, num_gpus=1).bind(x)``)."""
        ray_opts = {**self.ray_options, **{k: v for k, v in hints.items() if k in RAY_OPTIONS}}
        kw = {"compute_gflop": self.compute_gflop, "memory_gb": self.memory_gb,
              "output_gb": self.output_gb, "name": self.name, "emulate": self.emulate,
              "kind": self.kind, "hedge": self.hedge, "http": self.http,
              **{k: v for k, v in hints.items() if k not in RAY_OPTIONS}}
        return Primitive(self.fn, ray_options=ray_opts, **kw)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body locally (plain Python; for tests and debugging)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        extra = f", ray_options={self.ray_options}" if self.ray_options else ""
        return (f"Primitive({self.name}, compute_gflop={self.compute_gflop}, "
                f"memory_gb={self.memory_gb}, output_gb={self.output_gb}{extra})")


# Ray task options a primitive accepts: demands and the runtime env (Primitive.ray_options).
RAY_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "label_selector",
               "runtime_env")
# Ray options accepted and ignored: the scheduler places, names and re-runs tasks itself.
_IGNORED_RAY_OPTIONS = ("max_retries", "retry_exceptions", "name", "max_calls", "_metadata",
                        "enable_task_events")


def _remote_function_options(fn: Any) -> tuple[Callable[..., Any], dict] | None:
    """(body, default options) of a ``@ray.remote`` function; None for anything else. Read
    without importing Ray (a Ray object exists only where Ray was imported)."""
    t = type(fn)
    if not t.__module__.startswith("ray."):
        return None
    if t.__name__ in ("RemoteFunction", "FuncWrapper"):  # FuncWrapper: f.options(...)
        node = fn.bind()  # its body and options are read off a bound node
        return function_node_body(node), node.get_options()
    return None


def ray_dag_class(obj: Any) -> str | None:
    """The class name of a Ray DAG node (``FunctionNode``, ``InputNode``...), else None (read
    without importing Ray)."""
    t = type(obj)
    if t.__module__.startswith("ray.dag.") and any(
            c.__name__ == "DAGNode" for c in t.__mro__):
        return t.__name__
    return None


def function_node_body(node: Any) -> Callable[..., Any]:
    """The Python function a Ray DAG ``FunctionNode`` runs (Ray offers no public accessor:
    the one read of its private ``_body``)."""
    return node._body


def _check_ray_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Ray options a primitive's Ray task carries (:data:`RAY_OPTIONS`; the retry options
    and the like are dropped: the scheduler places, names and re-runs tasks itself); the
    demands among them are checked by ``envs.demands.parse_options``."""
    opts: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key in _IGNORED_RAY_OPTIONS:
            continue
        if key == "num_returns" and value in (1, None):
            continue
        if key not in RAY_OPTIONS:
            raise WorkflowError(
                f"primitive {name!r}: Ray option {key}={value!r} is not supported (the scheduler "
                f"places the task itself); supported: {list(RAY_OPTIONS)}, ignored: "
                f"{list(_IGNORED_RAY_OPTIONS)}")
        if value is None:
            continue
        if key == "runtime_env":
            if not isinstance(value, Mapping):
                raise WorkflowError(f"primitive {name!r}: Ray option runtime_env must be a "
                                    f"mapping, got {type(value).__name__}")
            value = dict(value)
            _check_runtime_env(name, value)
        elif key in ("resources", "label_selector") and isinstance(value, Mapping):
            value = dict(value)
        opts[key] = value
    return opts


def _check_runtime_env(name: str, env: dict[str, Any]) -> None:
    """Ray's own check of a runtime env (``ray.runtime_env.RuntimeEnv``, what ``.options()``
    runs: each field's type; a local ``working_dir`` or ``py_modules`` path must exist where
    the primitive is made), so that a bad one is refused at submit, not on the scheduler
    thread."""
    from ray.runtime_env import RuntimeEnv

    try:
        RuntimeEnv(**env)
    except Exception as e:  # noqa: BLE001 - Ray raises TypeError, ValueError...
        raise WorkflowError(f"primitive {name!r}: Ray option runtime_env: {e}") from None


def _contains_call(value: Any, depth: int = 0) -> bool:
    if isinstance(value, Call) or ray_dag_class(value) is not None:
        return True
    if depth > 3:
        return False
    if isinstance(value, (list, tuple, set)):
        return any(_contains_call(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_contains_call(v, depth + 1) for v in value.values())
    return False


def primitive(fn: Callable[..., Any] | None = None, *, compute_gflop: float = 1.0,
              memory_gb: float = 0.0, output_gb: float = 0.0, name: str | None = None,
              emulate: bool = False, kind: str | None = None, hedge: bool = False,
              http: bool = False, **ray_options: Any) -> Any:
    """Decorator: mark a function (or a ``@ray.remote`` function) as a primitive with resource
    hints and Ray options (see :class:`Primitive`); ``http=True`` also offers it to the
    scheduler service's HTTP clients (``@primitive(http=True)`` or ``primitive(fn, http=True)``)."""
    def wrap(f: Callable[..., Any]) -> Primitive:
        return Primitive(f, compute_gflop, memory_gb, output_gb, name, ray_options, emulate,
                         kind, hedge, http)
    return wrap(fn) if fn is not None else wrap


class Call:
    """One invocation of a primitive inside a workflow (a DAG node). Identity matters: binding the
    same call into two children makes it one task with two children."""
    __slots__ = ("primitive", "args", "kwargs")

    def __init__(self, prim: Primitive, args: Sequence[Any], kwargs: Mapping[str, Any]):
        self.primitive = prim
        self.args = tuple(args)
        self.kwargs = dict(kwargs)

    def parents(self) -> list["Call"]:
        """Distinct calls this one depends on, in argument order."""
        out: list[Call] = []
        for a in list(self.args) + list(self.kwargs.values()):
            if isinstance(a, Call) and all(a is not p for p in out):
                out.append(a)
        return out

    def __repr__(self) -> str:
        return f"Call({self.primitive.name})"


@dataclass(frozen=True)
class CollectedWorkflow:
    """A validated workflow: the spec (topological order) and its calls in the same order."""
    spec: WorkflowSpec
    calls: tuple[Call, ...]
    outputs: tuple[int, ...]  # indices of the calls the user asked for
    expected: tuple[Any, ...] | None = field(default=None, compare=False)  # emulated values


def collect(outputs: Call | Sequence[Call], name: str = "") -> CollectedWorkflow:
    """Walk the DAG back from ``outputs``; validate it; order it topologically.

    Raises :class:`WorkflowError` for an empty output list, a non-Call output, or a cycle (only
    possible by mutating a Call's arguments after binding).
    """
    outs = [outputs] if isinstance(outputs, Call) else list(outputs)
    if not outs:
        raise WorkflowError(f"workflow {name!r}: no outputs given")
    for i, o in enumerate(outs):
        if not isinstance(o, Call):
            raise WorkflowTypeError(f"workflow {name!r}: output {i} is {type(o).__name__}, not a "
                                    f"Call (use primitive.bind(...))")
    # Iterative DFS with colours: finds cycles and gives a parents-first order.
    order: list[Call] = []
    colour: dict[int, int] = {}
    for root in outs:
        stack: list[tuple[Call, int]] = [(root, 0)]
        while stack:
            node, k = stack.pop()
            nid = id(node)
            if k == 0:
                if colour.get(nid) == 2:
                    continue
                if colour.get(nid) == 1:
                    continue
                colour[nid] = 1
            ps = node.parents()
            if k < len(ps):
                stack.append((node, k + 1))
                p = ps[k]
                c = colour.get(id(p))
                if c == 1:
                    raise WorkflowError(f"workflow {name!r}: contains a cycle through "
                                        f"{p.primitive.name!r} and {node.primitive.name!r}")
                if c is None:
                    stack.append((p, 0))
            else:
                colour[nid] = 2
                order.append(node)
    index = {id(c): i for i, c in enumerate(order)}
    tasks = tuple(TaskSpec(c.primitive.compute_gflop, c.primitive.memory_gb, c.primitive.output_gb,
                           tuple(sorted(index[id(p)] for p in c.parents())), c.primitive.name)
                  for c in order)
    spec = WorkflowSpec(tasks, name or order[-1].primitive.name)
    return CollectedWorkflow(spec, tuple(order), tuple(index[id(o)] for o in outs))


# ------------------------------------------------------------------------------------------------
# Emulated workflows (DAG files, WorkflowSpec from generators and loaders)
# ------------------------------------------------------------------------------------------------

def emulated_body(index: int, *parent_values: int) -> int:
    """The emulated primitive: returns ``index + 1 + sum(parent values)`` so that a test can check
    that data flowed through every dependency. Its run time comes from the scheduler's sleep."""
    return index + 1 + sum(parent_values)


def expected_emulated_values(spec: WorkflowSpec) -> list[int]:
    """What :func:`emulated_body` returns for each task of ``spec`` (computed in plain Python)."""
    vals: list[int] = []
    for i, t in enumerate(spec.tasks):
        vals.append(i + 1 + sum(vals[p] for p in t.parents))
    return vals


def from_spec(spec: WorkflowSpec, shown: Sequence[float] | None = None,
              factors: Sequence[float] | None = None,
              kinds: Sequence[str] | None = None) -> CollectedWorkflow:
    """Calls with the emulated body for every task of ``spec`` (same order, same hints, its Ray
    demands as options: ``num_cpus``, ``num_gpus``). ``shown``: the computes the scheduler is
    told (hints; default the spec's); ``factors``: run time noise, an emulated run takes
    ``compute_gflop * factors[i]`` and a hedged copy of it ``compute_gflop * factors[n + i]``
    (``envs.runtime.factors`` draws 2n; default: each task's own ``TaskSpec.factors``);
    ``kinds``."""
    calls: list[Call] = []
    n = len(spec.tasks)
    for i, t in enumerate(spec.tasks):
        d = dict(t.demands)
        opts = ({"num_cpus": d["CPU"]} if "CPU" in d else {}) | (
            {"num_gpus": d["GPU"]} if "GPU" in d else {})
        prim = Primitive(emulated_body, t.compute_gflop if shown is None else shown[i],
                         t.memory_gb, t.output_gb, t.name or f"t{i}", ray_options=opts,
                         emulate=True,
                         kind=kinds[i] if kinds is not None else (t.kind or None), hedge=t.hedge)
        f = (factors[i], factors[n + i] if len(factors) > n + i else factors[i]) \
            if factors is not None else t.factors
        if f is not None:  # a run's and a hedged copy's own draws (envs.runtime.factors)
            prim.run_gflop, prim.copy_gflop = (t.compute_gflop * float(x) for x in f)
        else:
            prim.run_gflop = prim.copy_gflop = t.compute_gflop
        calls.append(Call(prim, (i, *(calls[p] for p in t.parents)), {}))
    kids = spec.children()
    sinks = tuple(i for i, k in enumerate(kids) if not k)
    return CollectedWorkflow(spec, tuple(calls), sinks, tuple(expected_emulated_values(spec)))


def load_dag_file(path: str | Path, res: ResourceMappingConfig | None = None,
                  fmt: str = "auto", on_invalid: str = "raise") -> list[WorkflowSpec]:
    """Workflows from a DAG file in any format of :mod:`envs.loaders.dags` (detected from the
    content unless ``fmt`` names one): the live JSON/YAML format (:func:`parse_dag`) carries its
    demands; the others need the demand mapping ``res`` (``workload.resources``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such DAG file")
    loaded, _ = load_dags([p], res, fmt, on_invalid)  # type: ignore[arg-type]
    return loaded.workflows


def dag_record(spec: WorkflowSpec) -> dict[str, Any]:
    """The DAG-file record of ``spec`` (inverse of :func:`parse_dag` for one workflow)."""
    names = [t.name or f"t{i}" for i, t in enumerate(spec.tasks)]
    return {"name": spec.name, "tasks": [
        {"name": names[i], "compute_gflop": t.compute_gflop, "memory_gb": t.memory_gb,
         "output_gb": t.output_gb, "parents": [names[p] for p in t.parents]}
        | ({"kind": t.kind} if t.kind else {}) | ({"hedge": True} if t.hedge else {})
        for i, t in enumerate(spec.tasks)]}

