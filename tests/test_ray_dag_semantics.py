"""Ray function DAGs give through the live scheduler what Ray gives (issue 44, item 1).

Each case, modelled on Ray's own ``python/ray/dag/tests/test_function_dag.py``,
``test_input_node.py``, ``test_output_node.py`` and the Ray DAG docs, runs twice: with plain Ray
(``ray.get(dag.execute(*args, **kwargs))``) and through ``LiveScheduler.submit(dag, *args,
**kwargs)``; both give the expected value, or, for a DAG Ray rejects, raise the same exception
type with Ray's message (Ray at execute, the scheduler at submit: nothing runs). Ray resolves a
DAG node nested anywhere in an argument (its ``_PyObjScanner`` pickles the arguments) to an
``ObjectRef`` the body ``ray.get``s; a top-level one to its value.
"""

from __future__ import annotations

import types
import warnings

import pytest
import ray
from processes import no_ray_connection
from ray.dag import InputNode, MultiOutputNode

from scale_ray.live.raydag import as_collected
from scale_ray.live.workflow import WorkflowError, WorkflowTypeError


@ray.remote
def one():
    return 1


@ray.remote
def two():
    return 2


@ray.remote
def ident(x):
    return x


@ray.remote
def double(x):
    return x * 2


@ray.remote
def inc(x):
    return x + 1


@ray.remote
def add(x, y):
    return x + y


@ray.remote
def func(src, inc=1):  # the Ray DAG docs' example
    return src + inc


@ray.remote
def kw_double(**kwargs):
    return kwargs["x"] * 2


@ray.remote
def kw_inc(**kwargs):
    return kwargs["x"] + 1


@ray.remote
def sum_dict_refs(nested):  # Ray's test_nested_args: nested nodes arrive as ObjectRefs
    return ray.get(nested["x"]) + ray.get(nested["y"])


@ray.remote
def sum_refs(refs):
    assert all(isinstance(r, ray.ObjectRef) for r in refs), refs
    return (type(refs).__name__, sum(ray.get(list(refs))))


@ray.remote
def deep(a, *, cfg):
    return a + ray.get(cfg["layers"][0]) * 10 + ray.get(cfg["layers"][1]["w"]) * 100


@ray.remote
def holder_sum(h):
    return ray.get(h.ref) + h.offset


@ray.remote
def value_and_ref(v, refs):
    return v + ray.get(refs[0])


@ray.remote
def plain_list(xs):
    return [type(x).__name__ for x in xs], xs


@ray.remote
def get_first(xs):
    return ray.get(xs[0])


@ray.remote
def combine(a, b, c=0, d=None):
    return a + b + c + (d["deep"]["nested"] if d else 0)


@ray.remote
def fmt(*args, **kwargs):
    def show(v):  # (local: the workers cannot import this module)
        if isinstance(v, ray.ObjectRef):
            return f"ref:{ray.get(v)}"
        if isinstance(v, (list, tuple)):
            return [show(x) for x in v]
        return {k: show(x) for k, x in v.items()} if isinstance(v, dict) else v
    return repr((show(args), show(kwargs)))


@ray.remote
def arrow(x):
    return f"{x} -> a"


@ray.remote
def arrow_b(x):
    return f"{x} -> b"


def _basic():  # test_basic_task_dag
    a = one.bind()
    a = double.bind(a)  # 2
    b, c = double.bind(a), inc.bind(a)
    d = add.bind(b, c)
    d1 = add.bind(d, d)
    d2 = add.bind(d1, d)
    return add.bind(d2, d), (), {}, 28


def _with_options():  # test_basic_task_dag_with_options
    a = one.options(name="a", num_cpus=1, max_retries=1).bind()
    return double.options(num_cpus=1).bind(a), (), {}, 2


def _with_options_as_ray():  # Ray's test_basic_task_dag_with_options itself: num_cpus=2
    a = two.bind()
    b = double.options(name="b", num_returns=1).bind(a)
    c = inc.options(name="c", max_retries=3).bind(a)
    return add.options(name="d", num_cpus=2).bind(b, c), (), {}, 7


def _twelve_gib():  # a 12-GiB task on a node with 16 GB of Ray memory (issue 46)
    return double.options(memory=12 * 1024 ** 3).bind(one.bind()), (), {}, 2


def _func_dag():  # test_input_node: test_func_dag
    with InputNode() as inp:
        a = ident.bind(inp)
        b, c = double.bind(a), inc.bind(a)
        d = add.bind(b, c)
        d1 = add.bind(d, d)
        dag = add.bind(add.bind(d1, d), d)
    return dag, (2,), {}, 28


def _multi_input():  # test_multi_input_func_dag
    with InputNode() as inp:
        dag = add.bind(double.bind(inp), inc.bind(inp))
    return dag, (3,), {}, 10


def _simple_str():  # test_simple_func
    with InputNode() as inp:
        dag = arrow_b.bind(arrow.bind(inp))
    return dag, ("input",), {}, "input -> a -> b"


def _kwargs_docs():  # the Ray DAG docs: func.bind(1, inc=2) ...
    a = func.bind(1, inc=2)
    b = func.bind(a, inc=3)
    return func.bind(b, inc=a), (), {}, 9


def _kwargs_only():  # test_nested_args' kwargs nodes
    a = double.bind(one.bind())
    return add.bind(kw_double.bind(x=a), y=kw_inc.bind(x=a)), (), {}, 7


def _nested_dict():  # test_nested_args
    a = double.bind(one.bind())
    return sum_dict_refs.bind({"x": kw_double.bind(x=a), "y": kw_inc.bind(x=a)}), (), {}, 7


def _nested_list():
    return sum_refs.bind([one.bind(), two.bind()]), (), {}, ("list", 3)


def _nested_tuple():
    return sum_refs.bind((one.bind(), two.bind(), two.bind())), (), {}, ("tuple", 5)


def _nested_deep_kwarg():
    return deep.bind(one.bind(), cfg={"layers": [two.bind(), {"w": inc.bind(two.bind())}]}), \
        (), {}, 321


def _nested_object():  # Ray's scanner pickles the arguments: a node in any object is found
    return holder_sum.bind(types.SimpleNamespace(ref=two.bind(), offset=5)), (), {}, 7


def _top_and_nested():  # the same node: its value at the top, its ObjectRef nested
    a = two.bind()
    return value_and_ref.bind(a, [a]), (), {}, 4


def _nested_inputs():  # an InputNode nested is its value, not a ref
    with InputNode() as inp:
        dag = plain_list.bind([inp[0], {"k": inp.k}])
    return dag, (5,), {"k": 6}, (["int", "dict"], [5, {"k": 6}])


def _formatting():  # test_dag_node formatting example: args, nested args, kwargs
    with InputNode() as inp:
        a = one.bind()
        dag = fmt.bind(inp, [a], 3, label=inp, other={"n": 7, "a": a})
    return dag, (4,), {}, repr(([4, ["ref:1"], 3], {"label": 4, "other": {"n": 7, "a": "ref:1"}}))


def _one_output():  # test_output_node: one output is a list of one
    with InputNode() as inp:
        dag = MultiOutputNode([ident.bind(inp)])
    return dag, (1,), {}, [1]


def _two_outputs_dict():  # the docs' MultiOutputNode example
    with InputNode() as inp:
        dag = MultiOutputNode([ident.bind(inp["x"]), ident.bind(inp["y"])])
    return dag, ({"x": 1, "y": 2},), {}, [1, 2]


def _two_outputs_args():
    with InputNode() as inp:
        dag = MultiOutputNode((ident.bind(inp[0]), ident.bind(inp[1])))
    return dag, (1, 2), {}, [1, 2]


def _same_output_twice():
    a = one.bind()
    return MultiOutputNode([a, a]), (), {}, [1, 1]


def _objectref_arg():  # a top-level ObjectRef is its value
    return inc.bind(ray.put(41)), (), {}, 42


def _objectref_kwarg():
    return add.bind(1, y=ray.put(2)), (), {}, 3


def _objectref_nested():  # a nested ObjectRef stays a ref
    return get_first.bind([ray.put(9)]), (), {}, 9


def _objectref_and_node_nested():
    return sum_refs.bind([ray.put(10), one.bind()]), (), {}, ("list", 11)


def _attr_partial_access():  # test_input_attr_partial_access 1): args and kwargs
    with InputNode() as inp:
        dag = combine.bind(ident.bind(inp[0]), double.bind(inp[1]), inp.m3, inp.m4)
    return dag, (1, 2), {"m3": 3, "m4": {"deep": {"nested": 4}}}, 12


def _attr_object():  # 2) one user object: attributes
    obj = types.SimpleNamespace(f0=1, f1=2, f3=3)
    with InputNode() as inp:
        dag = combine.bind(inp.f0, double.bind(inp.f1), inp.f3)
    return dag, (obj,), {}, 8


def _attr_list():  # 3) one list: indexed
    with InputNode() as inp:
        dag = combine.bind(inp[0], double.bind(inp[1]))
    return dag, ([1, 2],), {}, 5


def _attr_dict():  # 4) one dict: str keys
    with InputNode() as inp:
        dag = combine.bind(inp["a"], double.bind(inp["b"]))
    return dag, ({"a": 1, "b": 2},), {}, 5


def _attr_kwargs_only():
    with InputNode() as inp:
        dag = add.bind(inp.x, inp.y)
    return dag, (), {"x": "a", "y": "b"}, "ab"


_CONTEXT = "InputNode is a singleton instance that should be only used in context manager"


def _not_in_context():  # test_ensure_in_context_manager
    return ident.bind(InputNode()), (), {}, (AssertionError, _CONTEXT)


def _not_in_context_with_value():
    return ident.bind(InputNode()), (1,), {}, (AssertionError, _CONTEXT)


def _two_input_nodes():  # test_ensure_input_node_singleton
    with InputNode() as i1:
        a = ident.bind(i1)
    with InputNode() as i2:
        dag = add.bind(a, ident.bind(i2))
    return dag, (2,), {}, (AssertionError, "Each DAG should only have one unique InputNode")


def _index_out_of_range():
    with InputNode() as inp:
        dag = ident.bind(inp[5])
    return dag, (1, 2), {}, (IndexError, "index out of range")


def _missing_kwarg():
    with InputNode() as inp:
        dag = ident.bind(inp.nope)
    return dag, (1, 2), {"k": 3}, (KeyError, "nope")


def _missing_key():
    with InputNode() as inp:
        dag = ident.bind(inp["nope"])
    return dag, ({"a": 1},), {}, (KeyError, "nope")


def _missing_attribute():
    with InputNode() as inp:
        dag = ident.bind(inp.nope)
    return dag, (types.SimpleNamespace(a=1),), {}, (AttributeError, "nope")


@ray.remote
def input_data(d):  # dag.execute() with no or several values: the InputNode is DAGInputData
    return (type(d).__name__, d[0], d["k"]) if d._args else type(d).__name__


def _input_node_no_value():
    with InputNode() as inp:
        dag = input_data.bind(inp)
    return dag, (), {}, "DAGInputData"


def _input_node_several_values():
    with InputNode() as inp:
        dag = input_data.bind(inp)
    return dag, (1, 2), {"k": 3}, ("DAGInputData", 1, 3)


def _no_input_node_ignores_inputs():  # execute(5) on a DAG without InputNode: 5 is unused
    return inc.bind(1), (5,), {}, 2


def _empty_outputs():  # MultiOutputNode([]).execute(): [] without a task
    return MultiOutputNode([]), (), {}, []


def _empty_outputs_with_input():
    with InputNode():
        dag = MultiOutputNode([])
    return dag, (5,), {}, []


CASES = [_basic, _with_options, _with_options_as_ray, _twelve_gib, _func_dag, _multi_input, _simple_str, _kwargs_docs,
         _kwargs_only, _nested_dict, _nested_list, _nested_tuple, _nested_deep_kwarg,
         _nested_object, _top_and_nested, _nested_inputs, _formatting, _one_output,
         _two_outputs_dict, _two_outputs_args, _same_output_twice, _objectref_arg,
         _objectref_kwarg, _objectref_nested, _objectref_and_node_nested,
         _attr_partial_access, _attr_object, _attr_list, _attr_dict, _attr_kwargs_only,
         _not_in_context, _not_in_context_with_value, _two_input_nodes, _index_out_of_range,
         _missing_kwarg, _missing_key, _missing_attribute, _input_node_no_value,
         _input_node_several_values, _no_input_node_ignores_inputs, _empty_outputs,
         _empty_outputs_with_input]
IDS = [c.__name__.lstrip("_") for c in CASES]
# cases a server of the slot model (one CPU, scale_slot nodes) refuses: Ray's resource model only
NEEDS_RESOURCE_MODEL = {_with_options_as_ray}


@pytest.fixture(scope="module")
def local_ray():
    no_ray_connection()
    # one node as a laptop's: 2 CPUs, one (logical) GPU, 16 GB of Ray memory, a label
    ray.init(address="local", num_cpus=2, num_gpus=1, _memory=16 * 10 ** 9,
             labels={"zone": "local"}, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def sched(local_ray):
    from policies import get_policy
    from scale_ray.live import LiveScheduler

    with LiveScheduler(get_policy("eft"), config={"time_scale": 0.0}) as s:
        yield s


def _check(expected, run):
    if isinstance(expected, tuple) and len(expected) == 2 and isinstance(expected[0], type) \
            and issubclass(expected[0], BaseException):
        with pytest.raises(expected[0], match=expected[1]):
            run()
    else:
        got = run()
        assert got == expected and type(got) is type(expected)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_plain_ray(local_ray, case):
    dag, args, kwargs, expected = case()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DAGNode.execute() is deprecated
        _check(expected, lambda: ray.get(dag.execute(*args, **kwargs)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_live_scheduler(sched, case):
    dag, args, kwargs, expected = case()
    _check(expected, lambda: sched.submit(dag, *args, **kwargs).result(timeout=60))


@ray.remote
class Counter:
    def get(self, x):
        return x


@pytest.mark.parametrize("build, what", [
    (lambda: Counter.bind(), "ClassNode"),
    (lambda: Counter.bind().get.bind(1), "ClassMethodNode"),
    (lambda: ident.bind(Counter.bind().get.bind(1)), "ClassMethodNode"),
    (lambda: sum_refs.bind([Counter.bind()]), "ClassNode"),
    (lambda: MultiOutputNode([one.bind(), Counter.bind()]), "ClassNode"),
])
def test_actor_dags_are_refused_naming_the_node(build, what):
    with pytest.raises(WorkflowTypeError, match=f"{what}.*actor"):
        as_collected(build())


def test_rejections_are_workflow_errors_too_and_nothing_is_collected():
    """Ray's exception type, and the project's (the service maps WorkflowError to 4xx)."""
    dag, args, kwargs, _ = _two_input_nodes()
    with pytest.raises(AssertionError) as e:
        as_collected(dag, *args, **kwargs)
    assert isinstance(e.value, WorkflowError)
    for case, exc in ((_missing_key, KeyError), (_missing_attribute, AttributeError),
                      (_index_out_of_range, IndexError), (_not_in_context, AssertionError)):
        dag, args, kwargs, _ = case()
        with pytest.raises(exc) as e:
            as_collected(dag, *args, **kwargs)
        assert isinstance(e.value, WorkflowError)


def test_a_nested_node_is_one_task_and_a_dependency_and_pickles_for_the_service():
    from ray import cloudpickle

    a = two.bind()
    wf = as_collected(value_and_ref.bind(a, [a, {"b": a}]))
    assert len(wf.calls) == 2 and wf.spec.tasks[1].parents == (0,)
    body = wf.calls[1].primitive.fn
    assert body.__module__ == __name__ and body.__name__ == "value_and_ref"  # client by-value
    again = cloudpickle.loads(cloudpickle.dumps(wf))
    assert again.calls[1].primitive.fn.__name__ == "value_and_ref"


# ---------------------------------------------------------------- @primitive and Ray mixed
# (issue 44, items 2 and 4): scale hints on a Ray function, a @primitive in a Ray DAG with an
# InputNode, a Ray function fed by a @primitive; each a DAG as Ray would run it with the hints


def mixed_cases():
    from scale_ray.live.workflow import primitive

    hinted = primitive(compute_gflop=4)(add)  # the hint wrapper on a @ray.remote function
    out = [(hinted.bind(inc.bind(1), inc.bind(2)), (), {}, 5)]

    @primitive(compute_gflop=2)
    def halve(x):
        return x // 2

    with InputNode() as inp:
        dag = halve.bind(double.bind(inp))  # a @primitive over a Ray DAG with an InputNode
    out.append((dag, (21,), {}, 21))
    with InputNode() as inp:
        dag = add.bind(halve.bind(inp.x), inp.y)  # a Ray function over a @primitive
    out.append((dag, (), {"x": 10, "y": 1}, 6))
    shared = halve.bind(inc.bind(9))  # one call in two children stays one task
    out.append((MultiOutputNode([add.bind(shared, 1), hinted.bind(shared, shared)]), (), {},
                [6, 10]))
    out.append(([halve.bind(4), inc.bind(4)], (), {}, [2, 5]))  # a mixed list of outputs
    return out


def test_mixed_dags_are_one_workflow_with_the_hints():
    dag, _, _, _ = mixed_cases()[0]
    wf = as_collected(dag)
    assert len(wf.calls) == 3 and wf.spec.tasks[-1].parents == (0, 1)
    assert wf.calls[-1].primitive.compute_gflop == 4.0 and not wf.calls[-1].primitive.emulate
    dag, _, _, _ = mixed_cases()[3]
    assert len(as_collected(dag).calls) == 4


@pytest.mark.timeout(120)
def test_mixed_dags_run_through_the_live_scheduler(sched):
    for dag, args, kwargs, expected in mixed_cases():
        assert sched.submit(dag, *args, **kwargs).result(timeout=60) == expected


def test_a_primitive_refuses_a_ray_node_nested_in_a_container():
    from scale_ray.live.workflow import primitive

    p = primitive(lambda xs: xs, name="p")
    with pytest.raises(WorkflowError, match="nests a Call or a Ray DAG node"):
        p.bind([inc.bind(1)])


def test_an_empty_multi_output_node_has_nothing_to_collect_and_submit_answers_it():
    from scale_ray.live.ray_default import RayDefaultRunner

    with pytest.raises(WorkflowTypeError, match="empty MultiOutputNode has no task"):
        as_collected(MultiOutputNode([]))
    assert RayDefaultRunner().submit(MultiOutputNode([])).result() == []


@ray.remote(num_gpus=0.5, num_cpus=0)
def half_gpu(_x):
    import time
    t0 = time.time()
    time.sleep(1.0)
    return t0, time.time()


@pytest.mark.timeout(180)
def test_two_half_gpu_tasks_run_at_once_on_one_gpu_as_in_ray(local_ray):
    """Ray runs two num_gpus=0.5 tasks at once on one GPU; the scheduler (Ray's resource model,
    the default for a plain node: live.model auto -> nodes) starts both at once too: both
    starts come before the first finish, on the one server that is the whole node."""
    from policies import get_policy
    from scale_ray.live import LiveScheduler

    # plain Ray (as tasks: Ray 2.60's dag.execute() passes a GPU function's default max_calls
    # to .options(), which refuses it)
    (a0, a1), (b0, b1) = ray.get([half_gpu.remote(0), half_gpu.remote(0)])
    assert min(a1, b1) > max(a0, b0)  # they overlap
    events = []
    with LiveScheduler(get_policy("eft"), config={"time_scale": 0.0}, trace=events.append) as s:
        with InputNode() as inp:
            dag = MultiOutputNode([half_gpu.bind(inp), half_gpu.bind(inp)])
        assert len(s.submit(dag, 0).result(timeout=120)) == 2
        servers = s.status().result()["servers"]
    kinds = [e["event"] for e in events if e["event"] in ("start", "finish")]
    assert kinds[:2] == ["start", "start"], kinds
    assert len(servers) == 1 and len({e["server"] for e in events if e["event"] == "start"}) == 1


def test_a_task_no_node_could_hold_is_refused_naming_the_resource(sched):
    from scale_ray.live.config import Unschedulable

    with pytest.raises(Unschedulable, match=r"GPU=2 \(the most any node has: 1\)"):
        sched.submit(one.options(num_gpus=2).bind())
    with pytest.raises(Unschedulable, match="memory=20"):
        sched.submit(one.options(memory=20 * 10 ** 9).bind())
    with pytest.raises(Unschedulable, match="custom=1"):
        sched.submit(one.options(resources={"custom": 1}).bind())
    with pytest.raises(Unschedulable, match=r"label_selector \{zone: elsewhere\}"):
        sched.submit(one.options(label_selector={"zone": "elsewhere"}).bind())


def test_a_label_selector_runs_where_the_node_labels_match_as_in_ray(sched):
    """Ray's label_selector (the node is labelled zone=local): plain Ray and the scheduler both
    run the task; the scheduler's Ray task carries the selector, so Ray checks it too."""
    task = one.options(label_selector={"zone": "local"})
    assert ray.get(task.remote()) == sched.submit(task.bind()).result(timeout=60) == 1
    other = one.options(label_selector={"zone": "!elsewhere"})
    assert ray.get(other.remote()) == sched.submit(other.bind()).result(timeout=60) == 1
