"""The rollout planner in Ray's resource model (policies/node_lookahead.py) and the node
episode's fork it plans on (envs/node_sim.py ``_Episode.fork``): a timeline by hand, EFT at
k = 1, and a fork that continues exactly as the episode does and leaves it alone."""

from dataclasses import replace

import pytest

from envs.agents import AgentTask, load_agents
from envs.config_files import read_yaml, resolve_config_path
from envs.node_sim import NodeSimulator
from envs.nodes import NodeSpec, demands_of
from policies.node_lookahead import NodeLookahead
from policies.node_rules import eft


def _cfg():
    return load_agents({
        "nodes": [{"name": "gpu", "resources": {"CPU": 4, "memory": 16, "GPU": 1}}],
        "llm": {"gpu": [1], "cpu": [1], "memory_gb": [1, 1], "compute_s": 1.0},
        "tool": {"gpu": [0], "cpu": [1], "memory_gb": [1, 1], "compute_s": 1.0}})


def _agents(load=0.8, horizon=120.0):
    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    return replace(cfg, gpu_load=load, horizon_s=horizon)


def _timeline():
    """Two one-GPU calls at once: x (2 s at speed 1), then y (10 s); GPU nodes a (speed 2), b
    (speed 1)."""
    one = demands_of(num_cpus=1, num_gpus=1, memory_gb=1)
    nodes = [NodeSpec("a", {"CPU": 4, "memory": 16, "GPU": 1}, gpu_speed=2.0),
             NodeSpec("b", {"CPU": 4, "memory": 16, "GPU": 1}, gpu_speed=1.0)]
    calls = [(0.0, [AgentTask("x", one, 2.0, ())]), (0.0, [AgentTask("y", one, 10.0, ())])]
    return NodeSimulator(_cfg(), nodes, rate=1.0), calls


def test_the_planner_beats_eft_where_a_greedy_first_fit_blocks_the_long_call():
    """Two one-GPU calls arrive at once: x (2 s at speed 1) first in fifo, then y (10 s); a GPU
    node of speed 2 (a) and one of speed 1 (b). EFT: x on a (0-1 s), y finds only b (0-10 s):
    completions 1 + 10 = 11. The planner tries x on b too: y then takes a (0-5 s), x ends at 2:
    2 + 5 = 7, so it places x on b. Mean response 5.5 (EFT) vs 3.5 (planner)."""
    sim, calls = _timeline()
    assert sim.run(eft, 0, arrivals=calls)["mean_workflow_response_s"] == pytest.approx(5.5)
    planner = NodeLookahead(k=2)
    assert sim.run(planner, 0, arrivals=calls)["mean_workflow_response_s"] == pytest.approx(3.5)
    assert planner.changed == 1 and planner.rollouts == 2  # y had one candidate: no rollout
    assert sim.run(NodeLookahead(k=1), 0, arrivals=calls)["mean_workflow_response_s"] == \
        pytest.approx(5.5)


def test_over_its_bound_of_open_requests_a_node_the_planner_is_its_base_rule():
    """Its cost is bounded (a burst): the same timeline with 2 open requests on 2 nodes is
    planned at 1 a node (2 > 2: no), and is EFT's at 0.5 a node, without a rollout."""
    sim, calls = _timeline()
    at_one = NodeLookahead(k=2, max_open_per_node=1.0)
    assert sim.run(at_one, 0, arrivals=calls)["mean_workflow_response_s"] == pytest.approx(3.5)
    assert at_one.skipped == 0
    bounded = NodeLookahead(k=2, max_open_per_node=0.5)
    assert sim.run(bounded, 0, arrivals=calls)["mean_workflow_response_s"] == pytest.approx(5.5)
    assert bounded.skipped == 2 and bounded.rollouts == 0
    with pytest.raises(ValueError, match="max_open_per_node"):
        NodeLookahead(max_open_per_node=0)


def test_k1_is_eft_to_the_bit_and_the_planner_is_deterministic():
    sim = NodeSimulator(_agents(horizon=60.0), 8)
    assert sim.run(NodeLookahead(k=1), 3) == sim.run(eft, 3)
    a, b = NodeLookahead(k=3), NodeLookahead(k=3)
    assert sim.run(a, 3) == sim.run(b, 3) and a.rollouts > 0


def test_a_fork_continues_as_the_episode_does_and_leaves_it_alone():
    """At every 10th decision of an EFT episode whose requests have all arrived, a fork run to
    the end with EFT gives each open request the finish time the episode gives it; running the
    forks changes nothing in the episode (its metrics equal an episode never forked)."""
    cfg = _agents(load=0.9, horizon=30.0)
    sim = NodeSimulator(cfg, 8)
    plain = sim.run(eft, 5)
    ep = sim.episode(5)
    forks, k = [], 0
    steps = ep.decisions()
    try:
        task = next(steps)
        while True:
            k += 1
            if k % 10 == 0 and ep.now > cfg.horizon_s:  # (no arrival is left)
                pick = eft(ep.table, task, ep.now, ep.r_pol)
                f = ep.fork(eft)
                copy = f.task(task)
                assert f.core.resolve(copy, pick)
                f.start(copy, pick)
                f.run(now_first=True)
                forks.append({w.id: w.finish for w in f.requests})
            task = steps.send(eft(ep.table, task, ep.now, ep.r_pol))
    except StopIteration as done:
        metrics = done.value
    assert metrics == plain
    assert len(forks) >= 2
    finish = {w.id: w.finish for w in ep.requests}
    for fk in forks:
        assert fk and all(fk[i] == finish[i] for i in fk)
