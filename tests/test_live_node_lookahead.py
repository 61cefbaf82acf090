"""The rollout planner of Ray's resource model in the live scheduler (``live.node_rule:
lookahead[:K]``, scale_ray/live/node_planning.py) without a cluster: the hand timeline of
tests/test_node_lookahead.py placed live, a burst placed live as the simulator's planner places
it, and a present with a hedged run and a draining run that every rollout finishes."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from live_replay import replay

from envs.agents import load_agents, node_specs, sample_request
from envs.config import EnvConfig, replace
from envs.config_files import read_yaml, resolve_config_path
from envs.node_sim import NodeSimulator
from policies import get_policy
from policies.node_learned import node_decider
from policies.node_rules import eft
from scale_ray.live import LiveConfig, LiveScheduler, collect
from scale_ray.live.cluster import NodeInfo, server_caps
from scale_ray.live.config import ConfigError
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.node_planning import present_of
from scale_ray.live.nodes import LiveServer
from scale_ray.live.tasks import DONE, RUNNING
from scale_ray.live.workflow import Primitive, emulated_body


def _server(i, name, res, cpu=1.0, gpu=0.0):
    info = NodeInfo(name, 1, cpu, res.get("memory", 0.0), name, 0.0, 0.0, server_caps(res, 1),
                    gpu)
    return LiveServer(i, info, 0)


def _sched(servers, rule):
    env = replace(EnvConfig(), mdp={"transfer_delays_start": False})
    sched = LiveScheduler(get_policy("eft", env), env,
                          LiveConfig(model="nodes", node_rule=rule, time_scale=1.0, hedge="off"))
    sched.nodes.pooled = True  # as the first node refresh sets it on plain Ray nodes
    sched.set_alive(servers)
    sched.placement.origin = 0.0  # model s = wall s of the test's clock
    return sched


def _gpu_pair():
    res = {"CPU": 4, "GPU": 1, "memory": 16}
    return [_server(0, "a", res, gpu=2.0), _server(1, "b", res, gpu=1.0)]


@pytest.mark.parametrize("rule, where", [("eft", [0, 1]), ("lookahead:2", [1, 0])])
def test_the_planner_live_gives_the_long_call_the_fast_gpu(rule, where):
    """tests/test_node_lookahead.py's timeline, live: x (2 s at speed 1) then y (10 s), both one
    GPU; node a at GPU speed 2, b at 1. EFT puts x on a and leaves y the slow b; the planner
    tries x on b too and gives y the fast a (completions 2 + 5 against 1 + 10)."""
    sched = _sched(_gpu_pair(), rule)
    one = {"num_gpus": 1, "num_cpus": 1}
    for k, c in enumerate((2.0, 10.0)):
        wf = collect([Primitive(emulated_body, c, ray_options=one).bind(0)])
        sched.admission.admit(WorkflowHandle(k, wf, 0.0))
    started = {}
    sched.placement.round(lambda: 0.0, None,
                          lambda t, s: started.setdefault(t.wf.wid, s.sid) or s.take(t, 9.0))
    assert [started[w] for w in sorted(started)] == where
    assert sched.counters["planner_errors"] == 0


def test_a_burst_is_placed_live_as_the_simulators_planner_places_it():
    """Six agents.yaml requests at once on 4 nodes, runs taking their planned time: the live
    scheduler under lookahead:3 (over eft_spread; rounds at each run's end, as the twin) gives
    the requests the mean response the node simulator's planner gives them, not EFT's. (It
    failed while the present gave waiting tasks their slot-model demands: no memory.)"""
    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    specs = node_specs(cfg, 4)
    rng = np.random.default_rng(7)
    reqs = [sample_request(cfg, rng) for _ in range(6)]
    sim = NodeSimulator(cfg, specs, rate=1.0)
    calls = [(0.0, r) for r in reqs]
    twin = sim.run(node_decider("lookahead:3"), 0, arrivals=calls)["mean_workflow_response_s"]
    assert twin != pytest.approx(sim.run(eft, 0, arrivals=calls)["mean_workflow_response_s"])
    live = replay("lookahead:3", specs, calls)  # raises on a planner error
    assert len(live) == 6 and np.mean(live) == pytest.approx(twin, rel=1e-9)


def test_the_present_finishes_a_hedged_run_and_a_draining_one():
    """A call runs on a with a hedged copy on b; a finished call's cancelled run still holds
    the CPU node. In the present the copy is the task's ``Copy`` and the draining run a request
    of its own; a rollout with EFT ends every run (no resources leak) and places the new call."""
    cpu = _server(2, "c", {"CPU": 1, "memory": 16})
    sched = _sched([*_gpu_pair(), cpu], "lookahead")
    pl = sched.placement
    gpu = Primitive(emulated_body, 4.0, ray_options={"num_gpus": 1, "num_cpus": 1})
    tool = Primitive(emulated_body, 1.0, ray_options={"num_cpus": 1})
    for k, prims in enumerate(([gpu], [tool], [tool])):
        wf = collect([p.bind(0) for p in prims])
        sched.admission.admit(WorkflowHandle(k, wf, 0.0))
    (r, done, new) = sorted((e[2] for e in pl.queue.heap), key=lambda t: t.wf.wid)
    a, b = pl.alive[0], pl.alive[1]
    for t, srv, until in ((r, a, 3.0), (done, cpu, 5.0)):
        pl.queue.heap.remove(next(e for e in pl.queue.heap if e[2] is t))
        srv.take(t, until)
        t.server, t.state, t.started = srv, RUNNING, 0.0
        pl.table.start(pl.position(srv), t, t.demands, until)
    heapq.heapify(pl.queue.heap)
    r.copy = type("Run", (), {"server": b, "started": 1.0})()  # (runs._Run's fields read)
    b.take(r, 6.0)
    pl.hold(b, r)
    done.state = DONE  # finished on another run; this one drains until 5
    present, task = present_of(pl, new, sched.order, 1.0)
    copies = [k for run in present.table.running for k in run]
    assert len(copies) == 3 and copies[1] is present.tasks[0].copy  # r's copy on b
    assert [w.id for w in present.requests] == [0, 2, -1]  # the draining run: its own request
    assert not present.table.fits_now(2, task.demands)  # the CPU node: full until the drain
    fork = present.fork(eft)
    c = fork.task(task)
    assert fork.core.resolve(c, 0)  # a has 3 CPUs free
    fork.start(c, 0)
    fork.run(now_first=True)  # raises if a run never ended
    assert fork.table.running == [{}, {}, {}]
    # r ends at 3 on a and its copy (planned to 6) is cancelled then; the drain ends at 5
    assert {w.id: w.finish for w in fork.requests} == {0: 3.0, 2: 2.0, -1: 5.0}
    assert fork.task(present.tasks[0]).copy.cancelled  # freed b when r ended
    assert present.table.running[1] and pl.table.running[1]  # forks leave the present alone


def test_lookahead_names_its_k_and_a_bad_one_is_refused():
    assert LiveConfig(model="nodes", node_rule="lookahead:8").node_rule == "lookahead:8"
    for bad in ("lookahead:0", "lookahead:x", "lookahead:65"):
        with pytest.raises(ConfigError, match="lookahead\\[:K\\]"):
            LiveConfig(node_rule=bad)


def test_a_planner_error_is_counted_and_eft_places_the_call(monkeypatch):
    import scale_ray.live.node_planning as node_planning

    def broken(*a, **k):
        raise RuntimeError("a planner bug")

    monkeypatch.setattr(node_planning, "present_of", broken)
    sched = _sched(_gpu_pair(), "lookahead:2")
    for k, c in enumerate((2.0, 10.0)):
        wf = collect([Primitive(emulated_body, c, ray_options={"num_gpus": 1}).bind(0)])
        sched.admission.admit(WorkflowHandle(k, wf, 0.0))
    started = {}
    sched.placement.round(lambda: 0.0, None,
                          lambda t, s: started.setdefault(t.wf.wid, s.sid) or s.take(t, 9.0))
    assert [started[w] for w in sorted(started)] == [0, 1]  # EFT's picks
    assert sched.counters["planner_errors"] == 2
