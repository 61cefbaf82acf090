"""The live scheduler on the Ray cluster a user already has, with the Ray code they write (issue 27).

Fast tests: Ray DAGs become workflows (scale_ray.live.raydag), Ray options become demands
(Primitive), servers from what Ray reports (scale_ray.live.discovery), demands in the decision
core, the refusal messages. The slow ones run a real cluster with no scale resources: a head
without CPUs, a 2-CPU node and a 1-CPU node with one (logical) GPU.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import ray
from processes import cpuless_head_cluster
from ray.dag import InputNode, MultiOutputNode

from envs.config import ConfigError, FeatureConfig, TierConfig, build
from envs.decision import READY, DecisionCore, Rules
from envs.encoding import PaperEncoder, TaskFacts
from envs.nodes import NodeTable
from scale_ray.live.cluster import NodeInfo, server_spec
from scale_ray.live.config import LiveConfig, NoServers, Unschedulable
from scale_ray.live.discovery import default_compute, discover, node_shape
from scale_ray.live.raydag import accept, as_collected
from scale_ray.live.refusals import check_fits
from scale_ray.live.workflow import Call, WorkflowError, WorkflowTypeError, primitive


@ray.remote
def inc(x):
    return x + 1


@ray.remote
def add(a, b=0):
    return a + b


@ray.remote
def env_var(name):
    return os.environ.get(name)


@ray.remote
def gpu_ids():
    return ray.get_gpu_ids()


# ------------------------------------------------------------------------------- Ray DAGs
def _run(wf):
    """Evaluate a collected workflow in plain Python (parents first)."""
    vals: dict[int, object] = {}
    for c in wf.calls:
        args = [vals[id(a)] if isinstance(a, Call) else a for a in c.args]
        kwargs = {k: vals[id(v)] if isinstance(v, Call) else v for k, v in c.kwargs.items()}
        vals[id(c)] = c.primitive.fn(*args, **kwargs)
    outs = [vals[id(wf.calls[i])] for i in wf.outputs]
    return outs[0] if len(outs) == 1 else outs


def test_a_ray_dag_is_a_workflow_with_one_task_per_node():
    shared = inc.bind(1)
    wf = as_collected(add.bind(inc.bind(shared), shared))
    assert len(wf.calls) == 3  # the node bound twice is one task
    assert [t.parents for t in wf.spec.tasks] == [(), (0,), (0, 1)]
    assert _run(wf) == 5
    prim = wf.calls[0].primitive
    assert prim.fn is inc._function and not prim.emulate and prim.demands == ()


def test_input_node_attributes_and_multi_output_node_follow_dag_execute():
    with InputNode() as inp:
        a = inc.bind(inp)
        dag = MultiOutputNode([a, inc.bind(a)])
    assert _run(as_collected(dag, 10)) == [11, 12]
    with InputNode() as inp:
        dag2 = add.bind(inp[0], b=inp.k)
    assert _run(as_collected(dag2, 5, k=2)) == 7
    with InputNode() as inp:
        dag3 = add.bind(inp[1], b=inp[0])  # one input value: indexed itself, as Ray does
    assert _run(as_collected(dag3, [3, 4])) == 7
    with InputNode() as inp:  # (one built outside `with` is Ray's AssertionError)
        no_value = inc.bind(inp)
    # no value, or several, for the InputNode itself: Ray's DAGInputData of them, as execute()
    from ray.dag.input_node import DAGInputData
    for given in ((), (1, 2), ((), {"k": 3})):
        args, kw = given if given and isinstance(given[-1], dict) else (given, {})
        arg = as_collected(no_value, *args, **kw).calls[0].args[0]
        assert type(arg) is DAGInputData and arg._args == list(args) and arg._kwargs == kw
    assert _run(as_collected(inc.bind(1), 5)) == 2  # a DAG without InputNode ignores inputs
    # for anything but a Ray DAG one string positional is the name (the older form)
    assert accept(inc.bind(1), ("named",), {}).spec.name != "named"  # for a DAG: an input
    c = primitive(lambda: 1, name="p").bind()
    assert accept(c, ("named",), {}).spec.name == "named"
    with pytest.raises(WorkflowTypeError, match="input values are for a Ray DAG"):
        as_collected(c, 1, 2)


def test_ray_options_become_demands_and_task_options():
    opts = inc.options(num_gpus=1, num_cpus=2, memory=3e9, resources={"tpu": 2},
                       accelerator_type="A100", runtime_env={"env_vars": {"A": "1"}},
                       max_retries=5)
    prim = as_collected(opts.bind(1)).calls[0].primitive
    assert dict(prim.demands) == {"GPU": 1.0, "CPU": 2.0, "tpu": 2.0,
                                  "accelerator_type:A100": 0.001}
    assert prim.memory_gb == pytest.approx(3.0)
    assert prim.ray_options["runtime_env"] == {"env_vars": {"A": "1"}}
    assert "max_retries" not in prim.ray_options  # the scheduler re-runs lost tasks itself
    # primitive() over a remote function: its body and options, plus the hints
    p = primitive(compute_gflop=4.0)(inc.options(num_gpus=1))
    assert p.fn is inc._function and p.compute_gflop == 4.0 and dict(p.demands) == {"GPU": 1.0}
    assert p(1) == 2 and not p.emulate


@pytest.mark.parametrize("opts, field", [
    ({"scheduling_strategy": "SPREAD"}, "scheduling_strategy"),
    ({"num_gpus": -1}, "num_gpus"),
    ({"resources": {"GPU": 1}}, "num_gpus"),
    ({"resources": ["x"]}, "resources"),
    ({"runtime_env": "conda"}, "runtime_env"),
    ({"num_returns": 2}, "num_returns"),
    ({"accelerator_type": 3}, "accelerator_type"),
])
def test_bad_ray_options_name_the_option(opts, field):
    with pytest.raises(WorkflowError, match=field):
        primitive(lambda x: x, name="p", **opts)


def test_unsupported_ray_dag_options_name_the_option():
    with pytest.raises(WorkflowError, match="scheduling_strategy"):
        as_collected(inc.options(scheduling_strategy="SPREAD").bind(1))


@ray.remote
class Counter:
    def get(self, x):
        return x


@pytest.mark.parametrize("thing, what", [
    (ray.ObjectRef.nil(), "ObjectRef"),
    (inc, "remote function itself"),
    (inc.options(num_cpus=1), "remote function itself"),
    (42, "int"),
    ([inc.bind(1), 3], "int"),
    (Counter.bind().get.bind(1), "ClassMethodNode"),
    (primitive(lambda: 1, name="p"), "primitive 'p' itself"),
])
def test_anything_else_is_a_type_error_naming_what_is_accepted(thing, what):
    with pytest.raises(TypeError, match=what) as e:
        as_collected(thing)
    assert "accepted" in str(e.value) and isinstance(e.value, WorkflowError)


# (an ObjectRef argument: the slow test below passes ray.put(41) and gets 42)


# ------------------------------------------------------------------------------- discovery
def _raw(nid, res, labels=None, alive=True):
    return {"NodeID": nid, "Alive": alive, "Resources": res, "Labels": labels or {}}


TIERS = (TierConfig("small", 1.0, 8.0, ratio=2), TierConfig("large", 4.0, 80.0, ratio=2))


def test_plain_nodes_become_servers_from_what_ray_reports():
    raw = [_raw("head", {"memory": 4e9}),  # no CPU: no server
           _raw("a", {"CPU": 4, "memory": 16e9}),
           _raw("g", {"CPU": 2, "GPU": 2, "accelerator_type:A100": 1, "memory": 8e9, "tpu": 4}),
           _raw("dead", {"CPU": 8}, alive=False)]
    # by default (live.model auto -> nodes: Ray's resource model) a node is one server, whole
    nodes, source = discover(raw, TIERS, LiveConfig())
    assert source == "ray" and [n.node_id for n in nodes] == ["a", "g"]
    a, g = nodes
    assert (a.slots, a.tier, a.memory_gb, a.compute) == (1, "cpu4", 16.0, default_compute(TIERS))
    assert dict(g.caps) == {"CPU": 2.0, "GPU": 2.0, "accelerator_type:A100": 1.0, "tpu": 4.0}
    # the slot model (live.model: slots): one server per CPU, the node's share of each resource
    nodes, source = discover(raw, TIERS, build(LiveConfig, {"model": "slots"}))
    assert source == "ray" and [n.node_id for n in nodes] == ["a", "g"]
    a, g = nodes
    assert (a.slots, a.tier, a.memory_gb, a.compute) == (4, "cpu4", 4.0, default_compute(TIERS))
    assert default_compute(TIERS) == 2.5
    assert g.tier == "cpu2-gpu2-A100" and dict(g.caps) == {
        "CPU": 1.0, "GPU": 1.0, "accelerator_type:A100": 1.0, "tpu": 2.0}
    cfg = build(LiveConfig, {"server_compute": 10.0, "tier_speeds": {"cpu2-gpu2-A100": 3.0},
                             "slots_per_node": 1, "model": "slots"})
    a, g = discover(raw, TIERS, cfg)[0]
    assert (a.compute, g.compute, a.slots, a.memory_gb) == (10.0, 30.0, 1, 16.0)
    assert node_shape({"CPU": 8}) == "cpu8"


def test_scale_nodes_are_the_explicit_override():
    raw = [_raw("plain", {"CPU": 4, "memory": 16e9}),
           _raw("s", {"CPU": 2, "scale_slot": 2, "scale_compute": 4.0, "scale_memory_gb": 80.0},
                {"scale.tier": "large"})]
    nodes, source = discover(raw, TIERS, LiveConfig())
    assert source == "scale" and [(n.node_id, n.tier, n.slots) for n in nodes] == [("s", "large", 2)]
    assert dict(nodes[0].caps) == {"CPU": 1.0}
    nodes, source = discover(raw, TIERS, build(LiveConfig, {"servers": "ray"}))
    assert source == "ray" and {n.node_id for n in nodes} == {"plain", "s"}
    assert discover(raw[:1], TIERS, build(LiveConfig, {"servers": "scale"}))[0] == []


@pytest.mark.parametrize("data, key", [({"tier_speeds": {"cpu4": 0}}, "tier_speeds.cpu4"),
                                       ({"servers": "all"}, "servers"),
                                       ({"server_compute": -1}, "server_compute")])
def test_bad_server_settings_name_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        build(LiveConfig, data, "live")


# ------------------------------------------------------------------------------- the core
class _T:
    def __init__(self, memory_gb=0.0, demands=()):
        self.memory_gb, self.state, self.waits = memory_gb, READY, 0
        self.demands = tuple(sorted(dict(demands, slot=1.0).items()))  # a slot server's
        self.key = (0,)


def _servers(caps):
    """Servers of one slot (8 GB) with their share of their node's resources."""
    return [NodeInfo(f"n{i}", 1, 1.0, 8.0, "t", caps=tuple(sorted(c.items())))
            for i, c in enumerate(caps)]


def _core(caps, busy=()):
    table = NodeTable([server_spec(nd, False) for nd in _servers(caps)])
    for i in busy:
        table.start(i, f"busy{i}", (("slot", 1.0),), 9.0)
    return DecisionCore(table, Rules(False, ask_only_startable=True, mask_infeasible=True))


def test_the_core_checks_demands_wherever_it_checks_memory():
    caps = [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]
    core = _core(caps)
    gpu = _T(demands=(("GPU", 1.0),))
    core.queue.push(gpu.key, 0, gpu)
    t, _ = core.next_task()
    assert t is gpu
    obs = PaperEncoder(FeatureConfig(), 2, True).observe(core.table, gpu, TaskFacts(1.0, 0.0),
                                                         0.0)
    assert obs["action_mask"].tolist() == [0.0, 1.0]
    assert not core.resolve(gpu, 0) and gpu.waits == 1  # the CPU-only server: a wait
    # no server covers it: set aside; its only server busy: a forced wait
    core = _core([{"CPU": 1.0}])
    t2 = _T(demands=(("GPU", 1.0),))
    core.queue.push(t2.key, 1, t2)
    assert core.next_task()[0] is None and core.queue.blocked
    core = _core(caps, busy=(1,))
    t3 = _T(demands=(("GPU", 1.0),))
    core.queue.push(t3.key, 2, t3)
    assert core.next_task()[0] is None and core.forced_waits == 1 and not core.queue.blocked


def test_refusal_messages_say_what_is_missing_and_how_to_add_it():
    class S:
        node = _servers([{"CPU": 1.0}])[0]
    wf = as_collected(inc.options(num_gpus=1).bind(1))
    with pytest.raises(Unschedulable) as e:
        check_fits(wf, [S()], [], LiveConfig(), "ray")
    msg = str(e.value)
    assert "GPU=1 (the most any node has: 0)" in msg and "--num-gpus" in msg
    with pytest.raises(NoServers, match="no servers"):
        check_fits(wf, [], [], LiveConfig(), "ray")


def test_serve_maps_no_servers_to_503_and_unschedulable_to_422():
    import asyncio

    from serve_apps.errors import _request_error
    from serve_apps.registry import refusal

    for err, status, kind in [(NoServers("none"), 503, "no_servers"),
                              (Unschedulable("gpu"), 422, "does_not_fit")]:
        e = refusal(err)
        assert (e.status, e.kind, e.msg) == (status, kind, str(err))
        assert asyncio.run(_request_error(None, e)).status_code == status


# ------------------------------------------------------------------------------- live
@pytest.fixture(scope="module")
def plain_cluster():
    """No scale resources: a head without CPUs, a 2-CPU node, a 1-CPU node with a GPU."""
    c, _ = cpuless_head_cluster("scl_")
    cpu = c.add_node(num_cpus=2)
    gpu = c.add_node(num_cpus=1, num_gpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    try:
        yield {"cpu": cpu.node_id, "gpu": gpu.node_id, "cluster": c}
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_live_scheduler_runs_ray_dags_on_a_plain_cluster(plain_cluster):
    from policies import get_policy
    from scale_ray.live import LiveScheduler

    # the slot model (live.model: slots): a server per CPU, one CPU each: num_cpus=2 is refused
    with LiveScheduler(get_policy("eft"), config={"model": "slots"}) as sched:
        assert sorted(s.node.tier for s in sched.alive_servers) == ["cpu1-gpu1", "cpu2", "cpu2"]
        with pytest.raises(Unschedulable, match="num_cpus|CPU"):
            sched.submit(inc.options(num_cpus=2).bind(1))
    # by default (Ray's resource model) a server is a whole node, as Ray runs tasks
    with LiveScheduler(get_policy("eft")) as sched:
        tiers = sorted(s.node.tier for s in sched.alive_servers)
        assert tiers == ["cpu1-gpu1", "cpu2"]
        assert sched.submit(inc.bind(inc.bind(1))).result(timeout=60) == 3
        with InputNode() as inp:
            a = inc.bind(inp)
            dag = MultiOutputNode([a, add.bind(a, b=inp)])
        assert sched.submit(dag, 10).result(timeout=60) == [11, 21]
        assert sched.submit(inc.bind(ray.put(41))).result(timeout=60) == 42
        h = sched.submit(env_var.options(runtime_env={"env_vars": {"SCALE_T": "yes"}})
                         .bind("SCALE_T"))
        assert h.result(timeout=120) == "yes"
        # GPU tasks go to the GPU node only, and Ray gives them the GPU
        hs = [sched.submit(gpu_ids.options(num_gpus=1).bind()) for _ in range(3)]
        assert all(h.result(timeout=60) == [0] for h in hs)
        assert {h.task_nodes[0] for h in hs} == {plain_cluster["gpu"]}
        with pytest.raises(Unschedulable, match="tpu"):
            sched.submit(inc.options(resources={"tpu": 1}).bind(1))
        h = sched.submit(inc.options(num_cpus=2).bind(1))  # the 2-CPU node runs it
        assert h.result(timeout=60) == 2 and h.task_nodes[0] != plain_cluster["gpu"]
        with pytest.raises(Unschedulable, match=r"CPU=3 \(the most any node has: 2\)"):
            sched.submit(inc.options(num_cpus=3).bind(1))
        # a node that joins is picked up from what Ray reports, one that leaves is dropped
        extra = plain_cluster["cluster"].add_node(num_cpus=1)
        deadline = time.time() + 60
        while len(sched.alive_servers) < 3 and time.time() < deadline:
            time.sleep(0.2)
        assert len(sched.alive_servers) == 3
        plain_cluster["cluster"].remove_node(extra)
        while len(sched.alive_servers) > 2 and time.time() < deadline + 60:
            time.sleep(0.2)
        assert len(sched.alive_servers) == 2
        assert sched.submit(inc.bind(inc.bind(1))).result(timeout=60) == 3
    with LiveScheduler(get_policy("eft"), config={"servers": "scale"}) as sched:
        with pytest.raises(NoServers, match="scale_slot"):
            sched.submit(inc.bind(1))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fair_share_lets_a_second_tenant_past_a_flood(plain_cluster):
    """Tenant a floods 60 one-task workflows, then tenant b submits one. Read from the trace
    (so the test does not depend on when b's submit reached the scheduler): with the fair share
    at most one of a's queued tasks (a tie goes to the older workflow) starts between b's
    arrival and b's start; without it, oldest first, every a task queued at b's arrival does."""
    from envs.workflow import TaskSpec, WorkflowSpec
    from policies import get_policy
    from scale_ray.live import LiveScheduler

    one = WorkflowSpec((TaskSpec(1.0, 0.0, 0.0, ()),), "one")
    for fair in (True, False):
        events: list[dict] = []
        with LiveScheduler(get_policy("eft"), config={"fair_share": fair, "time_scale": 0.2},
                           trace=events.append) as sched:
            flood = [sched.submit(one, tenant="a") for _ in range(60)]
            late = sched.submit(one, tenant="b")
            assert sched.drain(timeout=180)
        arrived = {e["workflow"]: e for e in events if e["event"] == "arrival"}
        starts = {e["task"]: e["t"] for e in events if e["event"] == "start"}
        b = arrived[late.id]
        b_start = starts[b["tasks"][0]["task"]]
        queued = [starts[tk["task"]] for h in flood for tk in arrived[h.id]["tasks"]
                  if starts[tk["task"]] >= b["t"]]
        assert len(queued) >= 6, len(queued)  # a backlog of a's was waiting when b arrived
        overtook = sum(1 for t in queued if t < b_start)
        if fair:  # b's workflow starts with the next free server, ahead of a's backlog
            assert overtook <= 1, (overtook, len(queued))
        else:  # oldest first: it waits for the whole flood
            assert overtook == len(queued), (overtook, len(queued))
