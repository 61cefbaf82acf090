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
``dag.execute(*args, **kwargs)`` would. Arguments are resolved as Ray resolves them: a node
or ``ObjectRef`` given as an argument is its value; one nested in a list, tuple, dict or any
other object (Ray's own scan, which pickles the arguments) stays an ``ObjectRef`` the body
``ray.get``s (:class:`RayBody`), a nested input is its value. ``MultiOutputNode([a])`` gives
``[a's value]``. What ``dag.execute`` refuses (an InputNode built outside ``with``, two
InputNodes, an input it cannot index) is refused at submit with Ray's exception type and reason.
Scale hints for a Ray function: wrap it, ``primitive(compute_gflop=4)(f).bind(...)``. Actor
nodes (``ClassNode``, ``ClassMethodNode``) are refused.

Ray is imported only where a Ray DAG exists (a process that imported Ray) and in its tasks.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from envs.workload import WorkflowSpec

from .workflow import (Call, CollectedWorkflow, Primitive, WorkflowTypeError, collect, from_spec,
                       function_node_body)
from .workflow import ray_dag_class as _ray_dag_class

__all__ = ["accept", "as_collected", "from_ray_dag", "is_ray_dag", "ACCEPTED", "RayBody",
           "RayDagAssertion"]

ACCEPTED = ("a Call (primitive.bind(...)) or a list of Calls; a Ray DAG: a FunctionNode "
            "(@ray.remote f.bind(...), with InputNode values given to submit), a MultiOutputNode "
            "or a list of FunctionNodes (Calls and Ray nodes may mix); a WorkflowSpec; a "
            "CollectedWorkflow")


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


# What dag.execute() raises, in Ray's words (ray/dag/input_node.py, ray/dag/dag_node.py).
RAY_NOT_IN_CONTEXT = ("InputNode is a singleton instance that should be only used in context "
                      "manager for dag building and execution. See the docstring of class "
                      "InputNode for examples.")
RAY_ONE_INPUT_NODE = "Each DAG should only have one unique InputNode."


class RayDagAssertion(WorkflowTypeError, AssertionError):
    """A Ray DAG that ``dag.execute()`` refuses with an ``AssertionError``, refused at submit."""


class _InputKeyError(WorkflowTypeError, KeyError):
    __str__ = Exception.__str__


class _InputIndexError(WorkflowTypeError, IndexError):
    pass


class _InputAttributeError(WorkflowTypeError, AttributeError):
    pass


_AS_RAY = {KeyError: _InputKeyError, IndexError: _InputIndexError,
           AttributeError: _InputAttributeError, TypeError: WorkflowTypeError}


def _scanner(source_type: Any = None) -> Any:
    """Ray's own walk of a node's arguments (what ``dag.execute`` resolves): it pickles them and
    finds every ``source_type`` (default: DAG nodes) in lists, tuples, dicts (keys too) and any
    other object, as Ray does."""
    from ray.dag.py_obj_scanner import _PyObjScanner

    return _PyObjScanner() if source_type is None else _PyObjScanner(source_type)


_ATOMIC = (str, bytes, int, float, complex, bool, type(None))


class _Ref:
    """In a task's arguments: where Ray would put the ObjectRef of a nested node (``k``-th)."""
    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k

    def __reduce__(self) -> tuple:
        return _Ref, (self.k,)


class RayBody:
    """The body of a task whose Ray node nests FunctionNodes in its arguments, or of a
    ``MultiOutputNode``'s one output. Ray resolves top-level arguments only: the body gets a
    nested node's ObjectRef. The scheduler passes the nested nodes' values first (``refs`` of
    them: dependencies); they are put back in the object store and their refs placed where the
    nodes were (``at``: the argument positions and keywords holding them). ``listed``: the value
    is ``[value]``, as ``ray.get(MultiOutputNode([node]).execute())``."""

    def __init__(self, fn: Callable[..., Any], refs: int = 0, at: tuple = (), listed: bool = False):
        self.fn, self.refs, self.at, self.listed = fn, refs, at, listed
        self.__name__ = self.__qualname__ = getattr(fn, "__name__", "task")
        self.__module__ = getattr(fn, "__module__", None)  # the client pickles by value by it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.refs:
            import ray

            refs, args = [ray.put(v) for v in args[:self.refs]], list(args[self.refs:])
            where = [("a", i) if isinstance(i, int) else ("k", i) for i in self.at]
            scanner = _scanner(_Ref)
            try:
                found = scanner.find_nodes([args[i] if w == "a" else kwargs[i] for w, i in where])
                new = scanner.replace_nodes({r: refs[r.k] for r in found})
            finally:
                scanner.clear()
            for (w, i), v in zip(where, new):
                if w == "a":
                    args[i] = v
                else:
                    kwargs[i] = v
        value = self.fn(*args, **kwargs)
        return [value] if self.listed else value


def _refusal(obj: Any, where: str) -> WorkflowTypeError:
    kind = _ray_dag_class(obj)
    if kind is not None and (kind.startswith("Class") or kind == "CollectiveOutputNode"):
        why = "an actor DAG: not supported (the scheduler places tasks, not actors)"
    elif kind == "MultiOutputNode":
        why = "a MultiOutputNode: only the DAG's output may be one"
    elif kind is not None:
        why = "not supported"
    else:
        return WorkflowTypeError(f"{where} is {_what(obj)}; accepted: {ACCEPTED}")
    return WorkflowTypeError(f"{where} is a Ray {kind}, {why}; accepted: {ACCEPTED}")


class _Converter:
    """FunctionNodes -> Calls (one Call per node: a node bound into two children is one task),
    resolving arguments as ``dag.execute`` does."""

    def __init__(self, args: Sequence[Any], kwargs: dict[str, Any]):
        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.memo: dict[int, Call] = {}
        self.prims: dict[tuple, Primitive] = {}
        self.used_input = False
        self.input_uuid: str | None = None

    def check_input(self, node: Any) -> None:
        """Ray's checks where ``dag.execute`` reaches an InputNode."""
        if not node.get_other_args_to_resolve().get("__in_context_manager__", False):
            raise RayDagAssertion(RAY_NOT_IN_CONTEXT)
        uuid = node.get_stable_uuid()
        if self.input_uuid is None:
            self.input_uuid = uuid
        elif uuid != self.input_uuid:
            raise RayDagAssertion(RAY_ONE_INPUT_NODE)

    def input_value(self, node: Any) -> Any:
        """The InputNode's value, as Ray's ``InputNode._execute_impl``: the one positional
        value given, else Ray's ``DAGInputData`` of all of them (none, several, keywords)."""
        self.check_input(node)
        self.used_input = True
        if len(self.args) == 1 and not self.kwargs:
            return self.args[0]
        from ray.dag.input_node import DAGInputData

        return DAGInputData(*self.args, **self.kwargs)

    def attribute(self, node: Any) -> Any:
        other = node.get_other_args_to_resolve()
        key, how = node.key, other["accessor_method"]
        self.check_input(other["dag_input_node"])
        self.used_input = True
        if len(self.args) == 1 and not self.kwargs:  # one value: index or read it, as Ray does
            v = self.args[0]
            try:
                return v[key] if how == "__getitem__" else getattr(v, key)
            except (KeyError, IndexError, TypeError, AttributeError) as e:
                raise _AS_RAY[next(t for t in _AS_RAY if isinstance(e, t))](
                    f"InputNode[{key!r}] of the input value {type(v).__name__}: {e}") from None
        if isinstance(key, int):
            if not 0 <= key < len(self.args):
                raise _InputIndexError(f"list index out of range: the Ray DAG reads inp[{key}] "
                                       f"but submit got {len(self.args)} positional input values")
            return self.args[key]
        if key not in self.kwargs:
            raise _InputKeyError(f"the Ray DAG reads inp.{key} but submit got no keyword input "
                                 f"{key!r}")
        return self.kwargs[key]

    def value(self, obj: Any, where: str) -> Any:
        """A top-level argument's value: a FunctionNode's or a Call's is its result (a
        dependency)."""
        if isinstance(obj, Call):
            return self.from_call(obj)
        kind = _ray_dag_class(obj)
        if kind == "FunctionNode":
            return self.call(obj)
        if kind == "InputNode":
            return self.input_value(obj)
        if kind == "InputAttributeNode":
            return self.attribute(obj)
        raise _refusal(obj, where)

    def nested(self, obj: Any, refs: list[Call], where: str) -> tuple[Any, bool]:
        """``obj`` with the DAG nodes nested in it replaced as ``dag.execute`` does: an input by
        its value, a FunctionNode by a :class:`_Ref` to its result (its Call joins ``refs``);
        and whether it holds a ``_Ref``."""
        scanner = _scanner()
        try:
            found = scanner.find_nodes(obj)
            if not found:
                return obj, False
            table: dict[Any, Any] = {}
            for node in found:
                if node in table:
                    continue
                if _ray_dag_class(node) == "FunctionNode":
                    c = self.call(node)
                    k = next((i for i, r in enumerate(refs) if r is c), len(refs))
                    if k == len(refs):
                        refs.append(c)
                    table[node] = _Ref(k)
                elif _ray_dag_class(node) in ("InputNode", "InputAttributeNode"):
                    table[node] = self.value(node, where)
                else:
                    raise _refusal(node, f"a node nested in {where}")
            return scanner.replace_nodes(table), any(isinstance(v, _Ref) for v in table.values())
        finally:
            scanner.clear()

    def call(self, node: Any, listed: bool = False) -> Call:
        c = self.memo.get(id(node))
        if c is not None:
            return c
        fn, opts = function_node_body(node), node.get_options()
        name = getattr(fn, "__name__", "task")
        where = f"an argument of {name}"
        refs: list[Call] = []
        at: list[int | str] = []
        args, kwargs = list(node.get_args()), dict(node.get_kwargs())
        for i, a in [*enumerate(args), *kwargs.items()]:
            if _ray_dag_class(a) is not None or isinstance(a, Call):
                v = self.value(a, where)
            elif isinstance(a, _ATOMIC) or type(a).__name__ == "ObjectRef":
                continue
            else:
                v, with_refs = self.nested(a, refs, where)
                if with_refs:
                    at.append(i)
            if isinstance(i, int):
                args[i] = v
            else:
                kwargs[i] = v
        key = (id(fn), repr(sorted(opts.items())), len(refs), tuple(at), listed)
        prim = self.prims.get(key)
        if prim is None:
            body = RayBody(fn, len(refs), tuple(at), listed) if refs or listed else fn
            prim = self.prims[key] = Primitive(body, name=name, ray_options=opts, emulate=False)
        c = self.memo[id(node)] = prim.bind(*refs, *args, **kwargs)
        return c

    def from_call(self, call: Call) -> Call:
        """A ``@primitive``'s Call whose arguments may hold Ray DAG nodes (a Ray function's
        ``.bind()``, the InputNode): those replaced as in a FunctionNode's arguments; the Call
        itself when none of its ancestors holds one (one Call per call: identity is kept)."""
        done = self.memo.get(id(call))
        if done is not None:
            return done
        where = f"an argument of {call.primitive.name}"
        args = [self.value(a, where) if isinstance(a, Call) or _ray_dag_class(a) is not None
                else a for a in call.args]
        kwargs = {k: self.value(a, where) if isinstance(a, Call) or _ray_dag_class(a)
                  is not None else a for k, a in call.kwargs.items()}
        same = all(x is y for x, y in zip(args, call.args)) and all(
            kwargs[k] is a for k, a in call.kwargs.items())
        out = self.memo[id(call)] = call if same else Call(call.primitive, args, kwargs)
        return out


def _outputs(dag: Any) -> list[Any]:
    if _ray_dag_class(dag) == "MultiOutputNode":
        return list(dag.get_args())
    return list(dag) if isinstance(dag, (list, tuple)) else [dag]


def from_ray_dag(dag: Any, *args: Any, name: str = "", **kwargs: Any) -> CollectedWorkflow:
    """A Ray DAG (module docstring), with or without ``@primitive`` calls in it, as a collected
    workflow; ``args``/``kwargs`` are the InputNode's values (ignored by a DAG without one, as
    ``dag.execute`` ignores them). What ``dag.execute`` refuses is refused here with Ray's
    exception type and reason (also a :class:`WorkflowTypeError`)."""
    conv = _Converter(args, kwargs)
    multi = _ray_dag_class(dag) == "MultiOutputNode"
    outs = _outputs(dag)
    if not outs:
        raise WorkflowTypeError("an empty MultiOutputNode has no task to schedule (submit "
                                "answers it as Ray does: [] at once; see nothing_to_run)")
    calls = []
    for i, o in enumerate(outs):
        if isinstance(o, Call):
            calls.append(conv.from_call(o))
        elif _ray_dag_class(o) == "FunctionNode":
            # a MultiOutputNode's one output: the result is a list of one, as Ray's
            calls.append(conv.call(o, listed=multi and len(outs) == 1))
        else:
            raise _refusal(o, f"output {i} of the Ray DAG")
    one = not multi and not isinstance(dag, (list, tuple))
    return collect(calls[0] if one else calls, name)


def nothing_to_run(workflow: Any) -> bool:
    """Whether ``workflow`` is ``MultiOutputNode([])``: Ray's ``execute`` gives ``[]`` without
    running a task; ``submit`` returns a :class:`~scale_ray.live.handles.NothingToRun`."""
    return _ray_dag_class(workflow) == "MultiOutputNode" and not workflow.get_args()


def holds_ray_nodes(workflow: Any) -> bool:
    """Whether ``workflow`` is a Ray DAG, or ``@primitive`` calls with a Ray DAG node (a Ray
    function's ``.bind()``, an InputNode) among their arguments or their ancestors'."""
    if is_ray_dag(workflow):
        return True
    stack = [workflow] if isinstance(workflow, Call) else (
        [o for o in workflow if isinstance(o, Call)] if isinstance(workflow, (list, tuple))
        else [])
    if isinstance(workflow, (list, tuple)) and any(
            _ray_dag_class(o) is not None for o in workflow):
        return True
    seen: set[int] = set()
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        for a in (*c.args, *c.kwargs.values()):
            if isinstance(a, Call):
                stack.append(a)
            elif _ray_dag_class(a) is not None:
                return True
    return False


def as_collected(workflow: Any, *inputs: Any, name: str = "", **kw_inputs: Any
                 ) -> CollectedWorkflow:
    """What ``submit`` accepts (:data:`ACCEPTED`), as a collected workflow: calls are collected
    (``name`` names the workflow), a spec gets emulated bodies
    (:func:`~scale_ray.live.workflow.from_spec`), a Ray DAG is converted (:func:`from_ray_dag`;
    ``inputs`` are its InputNode values). Anything else is a :class:`WorkflowTypeError` saying
    what is accepted."""
    return _as_collected(workflow, inputs, kw_inputs, name, holds_ray_nodes(workflow))


def _as_collected(workflow: Any, inputs: Sequence[Any], kw_inputs: dict[str, Any], name: str,
                  ray_nodes: bool) -> CollectedWorkflow:
    if ray_nodes:
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
        bad = next(o for o in workflow if not isinstance(o, Call))
        raise WorkflowTypeError(f"submit: a list holding {_what(bad)}; accepted: {ACCEPTED}")
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
    ray_nodes = holds_ray_nodes(workflow)  # (one walk of the workflow)
    if len(inputs) == 1 and isinstance(inputs[0], str) and not kw_inputs and not name \
            and not ray_nodes:
        name, inputs = inputs[0], ()
    return _as_collected(workflow, inputs, kw_inputs, name, ray_nodes)
