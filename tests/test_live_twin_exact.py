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
