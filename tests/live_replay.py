"""Test helper: a ``LiveScheduler`` on whole Ray nodes driven without Ray (runs end at their
emulated times on a model clock), for comparisons with the simulator
(tests/test_live_twin_exact.py, tests/test_live_node_lookahead.py)."""

from __future__ import annotations

import heapq

import numpy as np

from envs.config import EnvConfig, replace
from policies import get_policy
from scale_ray.bench.agents_live import collected
from scale_ray.live import LiveConfig, LiveScheduler
from scale_ray.live.cluster import NodeInfo, run_speed, server_caps
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.nodes import LiveServer
from scale_ray.live.tasks import RUNNING


def live_servers(specs) -> list[LiveServer]:
    """The node specs as discovery sees whole Ray nodes."""
    out = []
    for i, s in enumerate(specs):
        res = s.all_resources()
        info = NodeInfo(f"n{i}", 1, s.cpu_speed, res.get("memory", 0.0), f"n{i}", 0.0, 0.0,
                        server_caps(res, 1), s.gpu_speed if res.get("GPU") else 0.0)
        out.append(LiveServer(i, info, 0))
    return out


def replay(spec: str, env: EnvConfig, calls) -> list[float]:
    """``calls`` (``(arrival, WorkflowSpec)``, model s) through a ``LiveScheduler`` on whole Ray
    nodes (``env``'s cluster) under policy ``spec``: a run ends at its emulated time (its noise
    factor included, as the twin's) while the node table holds the planned end, as live; one
    round after each instant's arrivals and ends. Each request's response, in arrival order."""
    env = replace(env, mdp={"transfer_delays_start": False})
    sched = LiveScheduler(get_policy(spec, env), env,
                          LiveConfig(model="nodes", time_scale=1.0, hedge="off"))
    sched.nodes.slotted = False  # as the first node refresh sets it on plain Ray nodes
    sched.set_alive(live_servers(env.cluster.nodes()))
    sched.clock_origin = sched.placement.origin = 0.0  # model s = the clock below (arrivals too)
    clock, ends, arrival, response = [0.0], [], {}, {}

    def start(t, srv):
        speed = run_speed(srv.node, t.demands)
        srv.take(t, clock[0] + t.prim.compute_gflop / speed)  # the planned end
        t.server, t.state, t.started = srv, RUNNING, clock[0]
        heapq.heappush(ends, (clock[0] + t.prim.run_gflop / speed, t.gid, t))

    handles = [WorkflowHandle(k, collected(spec_, f"r{k}"), at) for k, (at, spec_) in
               enumerate(calls)]
    nxt = 0
    while True:
        while nxt < len(calls) and calls[nxt][0] <= clock[0]:
            sched.admission.admit(handles[nxt])
            arrival[id(handles[nxt])] = calls[nxt][0]
            nxt += 1
        if sched._planner is not None:
            sched._planner.new_round()
        sched.placement.round(lambda: clock[0], sched.ask, start)
        t_arr = calls[nxt][0] if nxt < len(calls) else np.inf
        t_end = ends[0][0] if ends else np.inf
        if t_arr == t_end == np.inf:
            break
        clock[0] = min(t_arr, t_end)
        while ends and ends[0][0] == clock[0]:  # every end of this instant, then one round
            _, _, t = heapq.heappop(ends)
            sched.completions.finish(t, t.server.node.node_id, 0.0)
            if t.wf.done == len(t.wf.tasks):
                response[id(t.wf.handle)] = clock[0] - arrival[id(t.wf.handle)]
    assert sched.counters["planner_errors"] == 0
    return [response[id(h)] for h in handles]
