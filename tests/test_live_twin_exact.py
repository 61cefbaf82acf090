"""The live scheduler's decision path in Ray's resource model, without Ray, gives its twin's
result to the bit: agents.yaml requests arriving over time (with and without run noise) are
placed by ``LiveScheduler``'s rounds (``LivePlacement``, the node table, the node rule, the
admission and completion paths) while runs end at their emulated times, and every request's
response equals the node simulator's (``NodeSimulator.run``, what ``bench live`` calls the
twin). So a gap between a rule live and its twin is Ray's execution, not what the rule reads."""

from __future__ import annotations

import numpy as np
import pytest
from live_replay import replay

from envs.agents import load_agents, node_specs
from envs.config_files import read_yaml, resolve_config_path
from envs.node_sim import NodeSimulator
from policies.node_learned import node_decider
from scale_ray.bench.agents_live import requests

LEARNED = "learned:results/resource_model/scale_nodes/policy"


@pytest.mark.parametrize("rule", ["eft_spread", "ray", LEARNED, "lookahead:2"])
@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_live_decisions_give_the_twins_responses(rule, noise):
    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    specs = node_specs(cfg, 4)
    calls = requests(cfg, specs, 16, 1, noise)
    twin = NodeSimulator(cfg, specs, rate=1.0).run(node_decider(rule), 1, arrivals=calls)
    live = replay(rule, specs, calls)
    assert len(live) == 16
    assert np.mean(live) == pytest.approx(twin["mean_workflow_response_s"], rel=1e-9)


def test_the_learned_policy_live_reads_each_requests_age_as_its_twin():
    """`bench live --setting agents --run-noise 1.0`'s second run (8 nodes, 120 requests, seed
    2), the learned node policy: live decisions give its twin's mean. (It did not while the
    replay read the requests' arrivals on another clock than the rules' ``now``: the policy saw
    every request's age clipped, as live did before 9eed7f5; its 157th start went elsewhere.)"""
    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    specs = node_specs(cfg, 8)
    calls = requests(cfg, specs, 120, 2, 1.0)
    twin = NodeSimulator(cfg, specs, rate=1.0).run(node_decider(LEARNED), 2, arrivals=calls)
    assert np.mean(replay(LEARNED, specs, calls)) == pytest.approx(
        twin["mean_workflow_response_s"], rel=1e-9)
