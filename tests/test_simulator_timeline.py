"""Exact timelines on hand-built scenarios: start/finish times and every step's reward."""

from __future__ import annotations

import math

import numpy as np
import pytest

from envs.config import EnvConfig, build
from envs.simulator import Simulator
from envs.trace import verify_trace
from envs.workflow import TaskSpec, WorkflowSpec


def make_env(tiers, mdp=None, dynamics=None, reward=None) -> EnvConfig:
    return build(EnvConfig, {
        "cluster": {"servers": sum(t["count"] for t in tiers), "tiers": tiers},
        "mdp": mdp or {}, "dynamics": dynamics or {}, "reward": reward or {},
    })


SMALL = {"name": "small", "compute": 1.0, "memory_gb": 8.0, "idle_w": 30, "busy_w": 100, "count": 1}
MEDIUM = {"name": "medium", "compute": 2.0, "memory_gb": 32.0, "idle_w": 50, "busy_w": 200, "count": 1}
LARGE = {"name": "large", "compute": 4.0, "memory_gb": 80.0, "idle_w": 80, "busy_w": 400, "count": 1}


def run(sim: Simulator, actions):
    rewards = []
    for a in actions:
        assert sim.current is not None, "episode ended before the scripted actions ran out"
        rewards.append(sim.step(a).reward)
    return rewards


def times(events, kind):
    return [(e["task"], e["server"], e["t"]) for e in events if e["event"] == kind]


def test_chain_with_invalid_pick():
    """A -> B on {small, large}: B needs 16 GB, the small pick is invalid (-0.1, clock +0.1)."""
    events = []
    sim = Simulator(make_env([SMALL, LARGE]), trace=events.append)
    wf = WorkflowSpec((TaskSpec(4.0, 4.0, 0.5), TaskSpec(2.0, 16.0, 0.1, (0,))))
    sim.reset(0, arrivals=[(0.0, wf)])
    assert sim.current.id == 0 and sim.t == 0.0
    rewards = run(sim, [1, 0, 1])
    assert rewards == pytest.approx([math.exp(-1.0 / 2.0), -0.1, math.exp(-0.5 / 2.0)], abs=1e-12)
    assert sim.terminated and sim.current is None
    assert times(events, "start") == [(0, 1, 0.0), (1, 1, pytest.approx(1.1))]
    assert times(events, "finish") == [(0, 1, 1.0), (1, 1, pytest.approx(1.6))]
    m = sim.metrics()
    assert m["mean_task_response_s"] == pytest.approx((1.0 + 1.6) / 2)
    assert m["mean_workflow_response_s"] == pytest.approx(1.6)
    assert m["slowdown"] == pytest.approx(1.6 / 1.5)          # lower bound 1.0 + 0.5 on large
    assert m["utilization"] == pytest.approx(1.5 / (2 * 1.6))  # busy 1.5 s over 2 servers x 1.6 s
    assert m["invalid_rate"] == pytest.approx(1 / 3)
    assert verify_trace(events)["mean_task_response_s"] == pytest.approx(m["mean_task_response_s"])


@pytest.mark.parametrize("delays", [False, True])
def test_transfer_cost_in_reward_and_optionally_in_start(delays):
    """B lands away from its parent: reward pays w2 * (d/B + L) / T0c; the switch delays its start."""
    events = []
    sim = Simulator(make_env([SMALL, MEDIUM], mdp={"transfer_delays_start": delays}),
                    trace=events.append)
    wf = WorkflowSpec((TaskSpec(2.0, 4.0, 1.0), TaskSpec(2.0, 4.0, 0.2, (0,))))
    sim.reset(0, arrivals=[(0.0, wf)])
    rewards = run(sim, [1, 0])
    comm = 1.0 / 10.0 + 0.01
    assert rewards == pytest.approx([math.exp(-0.5), math.exp(-1.0) - 0.5 * comm / 0.1], abs=1e-12)
    finish_b = 1.0 + (comm if delays else 0.0) + 2.0
    assert times(events, "finish")[-1] == (1, 0, pytest.approx(finish_b))
    start_b = [e for e in events if e["event"] == "start" and e["task"] == 1][0]
    assert start_b["t"] == 1.0 and start_b.get("transfer_s", 0.0) == pytest.approx(comm if delays else 0.0)
    verify_trace(events)


@pytest.mark.parametrize("hol,z_start", [(True, 1.0), (False, 0.0)])
def test_head_of_line_blocking_switch(hol, z_start):
    """X, Y, Z arrive at 0; Y fits only the large server X occupies. With head-of-line blocking,
    Z waits behind Y until 1.0; without it, Z starts on the small server at once."""
    events = []
    sim = Simulator(make_env([SMALL, LARGE], mdp={"head_of_line_blocking": hol, "wait_dt_s": 0.25}),
                    trace=events.append)
    arrivals = [(0.0, WorkflowSpec((TaskSpec(4.0, 4.0, 0.1),))),
                (0.0, WorkflowSpec((TaskSpec(2.0, 16.0, 0.1),))),
                (0.0, WorkflowSpec((TaskSpec(1.0, 4.0, 0.1),)))]
    sim.reset(0, arrivals=arrivals)
    if hol:  # X on large; Y waits 4 x 0.25 s on the busy large; then Y large, Z small
        rewards = run(sim, [1, 1, 1, 1, 1, 1, 0])
        assert rewards[1:5] == [-0.1] * 4
    else:    # X on large; Y's wait defers it; Z small at 0; Y waits 3 more steps of 0.25 s
        rewards = run(sim, [1, 1, 0, 1, 1, 1, 1])
        assert rewards[1] == -0.1 and rewards[2] == pytest.approx(math.exp(-0.5))
    assert sim.terminated
    starts = {task: (srv, t) for task, srv, t in times(events, "start")}
    assert starts == {0: (1, 0.0), 1: (1, 1.0), 2: (0, z_start)}
    verify_trace(events)


def test_failure_loses_task_and_reruns_it():
    """The large server fails at 0.5 s under X: X is lost, becomes ready, re-runs on small."""
    events = []
    env = make_env([SMALL, LARGE], dynamics={"events": [{"t": 0.5, "kind": "fail", "server": 1}]})
    sim = Simulator(env, trace=events.append)
    sim.reset(0, arrivals=[(0.0, WorkflowSpec((TaskSpec(4.0, 4.0, 0.1),)))])
    run(sim, [1])
    assert sim.t == 0.5 and sim.current.id == 0   # lost and ready again
    run(sim, [0])
    assert sim.terminated
    kinds = [(e["event"], e["t"]) for e in events if e["event"] not in ("episode", "server_add", "arrival")]
    assert kinds == [("start", 0.0), ("lost", 0.5), ("server_fail", 0.5), ("start", 0.5),
                     ("finish", 4.5), ("end", 4.5)]
    m = sim.metrics()
    assert m["lost_tasks"] == 1 and m["mean_task_response_s"] == pytest.approx(4.5)
    assert m["utilization"] == pytest.approx(4.5 / (4.5 + 0.5))
    assert verify_trace(events)["utilization"] == pytest.approx(m["utilization"])


def test_draining_server_finishes_then_leaves_and_new_server_is_used():
    events = []
    env = make_env([SMALL, LARGE], dynamics={"events": [
        {"t": 0.5, "kind": "remove", "server": 1}, {"t": 0.6, "kind": "add", "tier": "large"}]})
    sim = Simulator(env, trace=events.append)
    wfs = [(0.0, WorkflowSpec((TaskSpec(4.0, 4.0, 0.1),))), (0.7, WorkflowSpec((TaskSpec(4.0, 4.0, 0.1),)))]
    sim.reset(0, arrivals=wfs)
    run(sim, [1])                      # X on large (id 1); drain at 0.5; large #2 (id 2) joins at 0.6
    assert sim.t == 0.7 and sim.observe()["action_mask"].tolist() == [1.0, 0.0, 1.0]
    assert sim.table.fits_now(1, sim.current.demands) is False    # draining
    run(sim, [2])
    assert sim.terminated
    seq = [(e["event"], e.get("server"), e["t"]) for e in events if e["event"].startswith("server")]
    assert seq == [("server_add", 0, 0.0), ("server_add", 1, 0.0), ("server_drain", 1, 0.5),
                   ("server_add", 2, 0.6), ("server_remove", 1, 1.0)]
    verify_trace(events)


def test_observation_features_are_fixed_normalised():
    sim = Simulator(make_env([SMALL, LARGE]))
    wf = WorkflowSpec((TaskSpec(5.0, 16.0, 0.5), TaskSpec(2.0, 4.0, 0.3, (0,)), TaskSpec(1.0, 4.0, 0.3, (0,))))
    sim.reset(0, arrivals=[(0.0, wf)])
    obs = sim.observe()
    assert obs["task"].tolist() == pytest.approx([0.5, 0.25, 2 / 8, 0.0, 0.5])
    np.testing.assert_allclose(obs["servers"], [[0.25, 0.1, 0, 30 / 400, 0], [1.0, 1.0, 0, 0.2, 0]], rtol=1e-6)
    run(sim, [1])                      # task 0 on large, 1.25 s; then 1 and 2 become ready
    obs = sim.observe()
    assert sim.t == 1.25
    assert obs["task"].tolist() == pytest.approx([0.2, 4 / 64, 0.0, 1 / 3, 0.3])
    # transfer from the parent's server (large): 0 there, d/B + L = 0.06 s elsewhere
    assert obs["servers"][:, 4].tolist() == pytest.approx([0.06, 0.0])
    run(sim, [1])                      # task 1 on large: busy 0.5 s at 400 W
    obs = sim.observe()
    assert obs["servers"][1].tolist() == pytest.approx([1.0, 1.0, 0.05, 1.0, 0.0])
