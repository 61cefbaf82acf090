"""What ``submit`` accepts, and Ray's own DAG API turned into a workflow.

A Ray DAG built the Ray way is a workflow as it is::

    @ray.remote
    def f(x): return x + 1

    sched.submit(f.bind(f.bind(1)))                   # -> 3
    with InputNode() as inp:
        dag = g.options(num_gpus=1).bind(f.bind(inp))
    sched.submit(dag, 5)                              # InputNode = 5, as dag.execute(5)
    sched.submit(MultiOutputNode([a, b]))             # result: [a's value, b's value]

Every ``FunctionNode`` (an ``@ray.remote`` function's ``.bind()``) becomes one task: its body
runs as is (no emulated sleep), its Ray options (``num_cpus``, ``num_gpus``, ``memory``,
``resources``, ``accelerator_type``, ``runtime_env``) are its demands
(:class:`~scale_ray.live.workflow.Primitive`), and a FunctionNode argument is a dependency.
``InputNode`` and its attributes (``inp[0]``, ``inp.key``) take the values given to ``submit``, as
``dag.execute(*args, **kwargs)`` would. An ``ObjectRef`` argument is passed to the task as Ray
passes it (resolved to its value). Scale hints for a Ray function: wrap it,
``primitive(compute_gflop=4)(f).bind(...)``. Actor nodes (``ClassNode``, ``ClassMethodNode``)
are refused.

Ray is never imported here: a Ray DAG object exists only in a process that imported Ray.
"""

from __future__ import annotations

from typing import Any, Sequence

from envs.workload import WorkflowSpec

from .workflow import (Call, CollectedWorkflow, Primitive, WorkflowTypeError, collect, from_spec,
                       function_node_body)

__all__ = ["accept", "as_collected", "from_ray_dag", "is_ray_dag", "ACCEPTED"]

ACCEPTED = ("a Call (primitive.bind(...)) or a list of Calls; a Ray DAG: a FunctionNode "
            "(@ray.remote f.bind(...), with InputNode values given to submit), a MultiOutputNode "
            "or a list of FunctionNodes; a WorkflowSpec; a CollectedWorkflow")


def _ray_dag_class(obj: Any) -> str | None:
    """The class name of a Ray DAG node (``FunctionNode``...), else None."""
    t = type(obj)
    if t.__module__.startswith("ray.dag.") and any(
            c.__name__ == "DAGNode" for c in t.__mro__):
        return t.__name__
    return None


def is_ray_dag(obj: Any) -> bool:
    """Whether ``obj`` is a Ray DAG node or a non-empty list of them."""
    if isinstance(obj, (list, tuple)):
        return bool(obj) and all(_ray_dag_class(o) is not None for o in obj)
    return _ray_dag_class(obj) is not None


def _what(obj: Any) -> str:
    t = type(obj)
    if t.__name__ == "ObjectRef":
        return ("an ObjectRef (the result of f.remote(): the task already runs under Ray's "
                "placement; build the DAG with f.bind(...) instead, and pass ObjectRefs as "
                "arguments)")
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__name__


class _Converter:
    """FunctionNodes -> Calls (one Call per node: a node bound into two children is one task)."""

    def __init__(self, args: Sequence[Any], kwargs: dict[str, Any]):
        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.memo: dict[int, Call] = {}
        self.prims: dict[tuple, Primitive] = {}
        self.used_input = False

    def input_value(self) -> Any:
        self.used_input = True
        if len(self.args) == 1 and not self.kwargs:
            return self.args[0]
        if not self.args and not self.kwargs:
            raise WorkflowTypeError("the Ray DAG reads an InputNode but submit got no input "
                                    "value: submit(dag, value) (as dag.execute(value))")
        raise WorkflowTypeError("the Ray DAG uses the InputNode itself, but submit got several "
                                "input values: read them as inp[0], inp[1] or inp.key")

    def attribute(self, node: Any) -> Any:
        key, how = node.key, node.get_other_args_to_resolve()["accessor_method"]
        self.used_input = True
        if len(self.args) == 1 and not self.kwargs:  # one value: index or read it, as Ray does
            v = self.args[0]
            try:
                return v[key] if how == "__getitem__" else getattr(v, key)
            except (KeyError, IndexError, TypeError, AttributeError) as e:
                raise WorkflowTypeError(f"InputNode[{key!r}] of the input value "
                                        f"{type(v).__name__}: {e}") from None
        if isinstance(key, int):
            if not 0 <= key < len(self.args):
                raise WorkflowTypeError(f"the Ray DAG reads inp[{key}] but submit got "
                                        f"{len(self.args)} positional input values")
            return self.args[key]
        if key not in self.kwargs:
            raise WorkflowTypeError(f"the Ray DAG reads inp.{key} but submit got no keyword "
                                    f"input {key!r}")
        return self.kwargs[key]

    def value(self, obj: Any, where: str) -> Any:
        kind = _ray_dag_class(obj)
        if kind is None:
            if isinstance(obj, (list, tuple, dict)) and _nested_dag(obj):
                raise WorkflowTypeError(f"{where} nests a Ray DAG node inside a container; pass "
                                        f"each node as its own argument")
            return obj
        if kind == "FunctionNode":
            return self.call(obj)
        if kind == "InputNode":
            return self.input_value()
        if kind == "InputAttributeNode":
            return self.attribute(obj)
        raise WorkflowTypeError(f"{where} is a Ray {kind}: not supported (actors are not "
                                f"scheduled); accepted: {ACCEPTED}")

    def call(self, node: Any) -> Call:
        c = self.memo.get(id(node))
        if c is not None:
            return c
        fn, opts = function_node_body(node), node.get_options()
        name = getattr(fn, "__name__", "task")
        key = (id(fn), repr(sorted(opts.items())))
        prim = self.prims.get(key)
        if prim is None:
            prim = self.prims[key] = Primitive(fn, name=name, ray_options=opts, emulate=False)
        where = f"an argument of {name}"
        args = [self.value(a, where) for a in node.get_args()]
        kwargs = {k: self.value(v, where) for k, v in node.get_kwargs().items()}
        c = self.memo[id(node)] = prim.bind(*args, **kwargs)
        return c


def _nested_dag(obj: Any, depth: int = 0) -> bool:
    if _ray_dag_class(obj) is not None:
        return True
    if depth > 3:
        return False
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return any(_nested_dag(v, depth + 1) for v in items)


def from_ray_dag(dag: Any, *args: Any, name: str = "", **kwargs: Any) -> CollectedWorkflow:
    """A Ray DAG (module docstring) as a collected workflow; ``args``/``kwargs`` are the
    InputNode's values."""
    conv = _Converter(args, kwargs)
    kind = _ray_dag_class(dag)
    if kind == "MultiOutputNode":
        bound = dag.get_args()
        outs = list(bound[0] if len(bound) == 1 and isinstance(bound[0], (list, tuple))
                    else bound)
    elif isinstance(dag, (list, tuple)):
        outs = list(dag)
    else:
        outs = [dag]
    calls = []
    for i, o in enumerate(outs):
        k = _ray_dag_class(o)
        if k != "FunctionNode":
            raise WorkflowTypeError(f"output {i} of the Ray DAG is "
                                    f"{k and 'a Ray ' + k or _what(o)}; accepted: {ACCEPTED}")
        calls.append(conv.call(o))
    if (args or kwargs) and not conv.used_input:
        raise WorkflowTypeError("submit got input values but the Ray DAG has no InputNode")
    return collect(calls[0] if kind not in ("MultiOutputNode",) and not isinstance(
        dag, (list, tuple)) else calls, name)


def as_collected(workflow: Any, *inputs: Any, name: str = "", **kw_inputs: Any
                 ) -> CollectedWorkflow:
    """What ``submit`` accepts (:data:`ACCEPTED`), as a collected workflow: calls are collected
    (``name`` names the workflow), a spec gets emulated bodies
    (:func:`~scale_ray.live.workflow.from_spec`), a Ray DAG is converted (:func:`from_ray_dag`;
    ``inputs`` are its InputNode values). Anything else is a :class:`WorkflowTypeError` saying
    what is accepted."""
    if is_ray_dag(workflow):
        return from_ray_dag(workflow, *inputs, name=name, **kw_inputs)
    if inputs or kw_inputs:
        raise WorkflowTypeError(f"input values are for a Ray DAG with an InputNode; got "
                                f"{_what(workflow)} with {len(inputs) + len(kw_inputs)} inputs")
    if isinstance(workflow, CollectedWorkflow):
        return workflow
    if isinstance(workflow, WorkflowSpec):
        return from_spec(workflow)
    if isinstance(workflow, Call) or (isinstance(workflow, (list, tuple)) and workflow
                                      and all(isinstance(c, Call) for c in workflow)):
        return collect(workflow, name)
    if isinstance(workflow, (list, tuple)) and workflow:
        bad = next((o for o in workflow if not isinstance(o, Call)
                    and _ray_dag_class(o) is None), None)
        what = _what(bad) if bad is not None else "both Calls and Ray DAG nodes (use one kind)"
        raise WorkflowTypeError(f"submit: a list holding {what}; accepted: {ACCEPTED}")
    if isinstance(workflow, Primitive):
        raise WorkflowTypeError(f"submit: primitive {workflow.name!r} itself; bind it first "
                                f"({workflow.name}.bind(...)); accepted: {ACCEPTED}")
    if type(workflow).__name__ in ("RemoteFunction", "FuncWrapper"):
        raise WorkflowTypeError(f"submit: a @ray.remote function itself; bind it first "
                                f"(f.bind(...)); accepted: {ACCEPTED}")
    raise WorkflowTypeError(f"submit: got {_what(workflow)}; accepted: {ACCEPTED}")


def accept(workflow: Any, inputs: Sequence[Any], kw_inputs: dict[str, Any], name: str = ""
           ) -> CollectedWorkflow:
    """``submit(workflow, *inputs, name=, **kw_inputs)`` of the scheduler, the Ray-default runner
    and the client: :func:`as_collected`, where for anything but a Ray DAG a single string
    positional is the workflow's name (``submit(call, "name")``, the older form)."""
    if (len(inputs) == 1 and isinstance(inputs[0], str) and not kw_inputs and not name
            and not is_ray_dag(workflow)):
        name, inputs = inputs[0], ()
    return as_collected(workflow, *inputs, name=name, **kw_inputs)
