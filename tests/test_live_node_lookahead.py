"""The rollout planner on whole Ray nodes in the live scheduler (``policies.lookahead`` asked by
``scale_ray.live.planning`` on a snapshot of the live record) without a cluster: the hand
timeline of tests/test_lookahead_nodes.py placed live, a burst placed live as the simulator's
planner places it, a present with a hedged copy and a draining run, and a planner error."""

from __future__ import annotations

import numpy as np
import pytest
from live_replay import replay

from envs.agents import sample_request
from envs.config import ConfigError, EnvConfig, replace
from envs.demands import parse_options
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.evaluation import simulate
from scale_ray.live import LiveConfig, LiveScheduler, collect
from scale_ray.live import planning
from scale_ray.live.cluster import NodeInfo, server_caps
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.nodes import LiveServer
from scale_ray.live.tasks import DONE, RUNNING
from scale_ray.live.workflow import Primitive, emulated_body


def _server(i, name, res, cpu=1.0, gpu=0.0):
    info = NodeInfo(name, 1, cpu, res.get("memory", 0.0), name, 0.0, 0.0, server_caps(res, 1),
                    gpu)
    return LiveServer(i, info, 0)


def _sched(servers, spec):
    env = replace(EnvConfig(), mdp={"transfer_delays_start": False})
    sched = LiveScheduler(get_policy(spec, env), env,
                          LiveConfig(model="nodes", time_scale=1.0, hedge="off"))
    sched.nodes.slotted = False  # as the first node refresh sets it on plain Ray nodes
    sched.set_alive(servers)
    sched.clock_origin = sched.placement.origin = 0.0  # model s = wall s of the test's clock
    return sched


def _round(sched, start):
    if sched._planner is not None:
        sched._planner.new_round()
    sched.placement.round(lambda: 0.0, sched.ask, start)


def _gpu_pair():
    res = {"CPU": 4, "GPU": 1, "memory": 16}
    return [_server(0, "a", res, gpu=2.0), _server(1, "b", res, gpu=1.0)]


@pytest.mark.parametrize("spec, where", [("eft", [0, 1]), ("lookahead:candidates=2", [1, 0])])
def test_the_planner_live_gives_the_long_call_the_fast_gpu(spec, where):
    """tests/test_lookahead_nodes.py's timeline, live: x (2 s at speed 1) then y (10 s), both
    one GPU; node a at GPU speed 2, b at 1. EFT puts x on a and leaves y the slow b; the planner
    tries x on b too and gives y the fast a (completions 2 + 5 against 1 + 10)."""
    sched = _sched(_gpu_pair(), spec)
    one = {"num_gpus": 1, "num_cpus": 1}
    for k, c in enumerate((2.0, 10.0)):
        wf = collect([Primitive(emulated_body, c, ray_options=one).bind(0)])
        sched.admission.admit(WorkflowHandle(k, wf, 0.0))
    started = {}
    _round(sched, lambda t, s: started.setdefault(t.wf.wid, s.sid) or s.take(t, 9.0))
    assert [started[w] for w in sorted(started)] == where
    assert sched.counters["planner_errors"] == 0


def test_a_burst_is_placed_live_as_the_simulators_planner_places_it():
    """Six agents.yaml requests at once on 4 nodes, runs taking their planned time: the live
    scheduler under the planner (rounds at each run's end, as the twin) gives the requests the
    mean response the simulator's planner gives them on a snapshot of the same present, not
    EFT's. (It failed while the present gave waiting tasks their slot-model demands: no
    memory.)"""
    env = load_env("configs/env/agents.yaml").with_servers(4)
    rng = np.random.default_rng(7)
    calls = [(0.0, sample_request(env.workload.agents, rng)) for _ in range(6)]
    spec = "lookahead:candidates=3"
    twin = simulate(env, get_policy(spec + ",snapshot=true", env), 0,
                    arrivals=calls)["mean_workflow_response_s"]
    eft = simulate(env, get_policy("eft", env), 0, arrivals=calls)["mean_workflow_response_s"]
    assert twin != pytest.approx(eft)
    live = replay(spec, env, calls)  # raises on a planner error
    assert len(live) == 6 and np.mean(live) == pytest.approx(twin, rel=1e-9)


def test_the_present_holds_a_hedged_copy_and_a_draining_run():
    """A call r runs on a with a hedged copy on b; a finished call's cancelled run still drains
    on the CPU node. The planner's snapshot lists r on a and holds its copy's demands on b and
    the draining run's on the CPU node until their expected ends; the planner then places the
    new call where it fits (a has 3 CPUs free), with no error."""
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
    import heapq
    heapq.heapify(pl.queue.heap)
    r.copy = type("Run", (), {"server": b, "started": 1.0})()  # (runs._Run's fields read)
    b.take(r, 6.0)
    pl.hold(b, r)
    done.state = DONE  # finished on another run; this one drains until 5
    lp = sched._planner
    listed = {id(r)}  # r's workflow is listed (a run of it on a); done's is not
    held = [lp._server(pl, i, s, 0.0, listed).held for i, s in enumerate(pl.alive)]
    gpu_d = parse_options({"num_gpus": 1, "num_cpus": 1}).on_nodes()
    assert held == [(), ((gpu_d, 6.0),), ((parse_options({"num_cpus": 1}).on_nodes(), 5.0),)]
    assert not pl.table.fits_now(2, new.demands)  # the CPU node: full until the drain
    lp.new_round()
    assert lp.ask(new, pl, 0.0) == 0  # a has 3 CPUs free
    assert pl.table.running[1] and pl.table.running[2]  # planning left the record alone


def test_a_bad_planner_spec_is_refused_by_name():
    for bad in ("lookahead:candidates=0", "lookahead:candidates=x", "lookahead:k=2"):
        with pytest.raises((ConfigError, ValueError), match="candidates|k"):
            get_policy(bad, EnvConfig())


def test_a_planner_error_is_counted_and_eft_places_the_call(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("a planner bug")

    monkeypatch.setattr(planning.LivePlanner, "ask", broken)
    sched = _sched(_gpu_pair(), "lookahead:candidates=2")
    for k, c in enumerate((2.0, 10.0)):
        wf = collect([Primitive(emulated_body, c, ray_options={"num_gpus": 1}).bind(0)])
        sched.admission.admit(WorkflowHandle(k, wf, 0.0))
    started = {}
    _round(sched, lambda t, s: started.setdefault(t.wf.wid, s.sid) or s.take(t, 9.0))
    assert [started[w] for w in sorted(started)] == [0, 1]  # EFT's picks
    assert sched.counters["planner_errors"] == 2
