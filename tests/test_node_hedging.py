"""Runs that take other than planned and hedged copies in Ray's resource model
(envs/node_hedging.py through envs/node_sim.py): a timeline by hand, the config's rules, the
planner's forks over running copies."""

import math
from dataclasses import replace

import pytest

from envs.agents import AgentTask, load_agents
from envs.config_base import ConfigError
from envs.config_files import read_yaml, resolve_config_path
from envs.node_sim import NodeSimulator
from envs.nodes import NodeSpec, demands_of
from policies.node_lookahead import NodeLookahead
from policies.node_rules import eft

# the 0.9-quantile the rules see (envs.run_model.PRIOR_SIGMA 0.5 around the plan)
Q90 = math.exp(-0.125 + 1.2815515655446004 * 0.5)


def _cfg(**over):
    return load_agents({
        "nodes": [{"name": "gpu", "resources": {"CPU": 4, "memory": 16, "GPU": 1}}],
        "llm": {"gpu": [1], "cpu": [1], "memory_gb": [1, 1], "compute_s": 1.0},
        "tool": {"gpu": [0], "cpu": [1], "memory_gb": [1, 1], "compute_s": 1.0}} | over)


def _episode(**over):
    """One one-GPU call of compute 4 on GPU nodes a (speed 2) and b (speed 1); its first run
    takes 5x its plan, a copy's run its plan (the call's own factors, as a live bench gives)."""
    nodes = [NodeSpec("a", {"CPU": 4, "memory": 16, "GPU": 1}, gpu_speed=2.0),
             NodeSpec("b", {"CPU": 4, "memory": 16, "GPU": 1}, gpu_speed=1.0)]
    call = [AgentTask("x", demands_of(num_cpus=1, num_gpus=1, memory_gb=1), 4.0, (), (5.0, 1.0))]
    ep = NodeSimulator(_cfg(**over), nodes, rate=1.0).episode(0, arrivals=[(0.0, call)])
    ep.policy = eft
    return ep


def test_a_straggler_gets_a_copy_on_the_other_node_and_the_first_to_end_wins():
    """EFT runs x on a: planned 2 s, it takes 10. Unhedged: response 10 s. With q = 0.9 the run
    is a straggler at 2 x Q90 = 4.37 s: a copy on b (planned 4 s, takes 4) ends at 8.37 s and
    wins; the run on a is cancelled then (wasted 8.37 s), both GPUs free."""
    m = _episode(run_noise=1.0).run()
    assert m["mean_workflow_response_s"] == pytest.approx(10.0) and "hedge_copies" not in m
    ep = _episode(run_noise=1.0, hedge_quantile=0.9)
    m = ep.run()
    due = 2.0 * Q90
    assert m["mean_workflow_response_s"] == pytest.approx(due + 4.0)
    assert (m["hedge_copies"], m["hedge_wins"]) == (1, 1)
    assert m["hedge_waste_s"] == pytest.approx(due + 4.0)
    assert ep.table.running == [{}, {}] and ep.table.free == [list(t) for t in ep.table.total]
    assert ep.tasks[0].node == 1  # the copy's run is the task's


def test_hedging_needs_noise_and_noise_zero_draws_nothing():
    with pytest.raises(ConfigError, match="hedge_quantile"):
        _cfg(hedge_quantile=0.9)
    with pytest.raises(ConfigError, match="run_noise"):
        _cfg(run_noise=-0.1)
    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    a = NodeSimulator(replace(cfg, horizon_s=40.0), 8).run(eft, 2)
    b = NodeSimulator(replace(cfg, horizon_s=40.0, run_noise=0.0), 8).run(eft, 2)
    assert a == b and "hedge_copies" not in a


def test_the_planner_forks_an_episode_with_running_copies():
    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    cfg = replace(cfg, horizon_s=40.0, gpu_load=0.8, run_noise=1.0, hedge_quantile=0.8)
    planner = NodeLookahead(k=3)
    m = NodeSimulator(cfg, 8).run(planner, 1)
    assert m["hedge_copies"] > 0 and planner.rollouts > 0
    assert math.isfinite(m["mean_workflow_response_s"])


def test_bench_headroom_runs_hedged_rules_and_the_planner_but_never_chooses_them(tmp_path):
    import argparse
    import json

    from scale_ray.bench import headroom

    p = argparse.ArgumentParser()
    headroom.add_arguments(p)
    for bad in ("eft+hedged", "lookahead@nope", "planner"):
        with pytest.raises(SystemExit):
            p.parse_args(["--policies", bad])
    out = tmp_path / "h.json"
    args = p.parse_args(["--nodes", "8", "--loads", "0.7", "--episodes", "2", "--policies",
                         "eft+hedge", "lookahead", "--run-noise", "1.0", "--horizon-s", "30",
                         "--workers", "1", "--lookahead-k", "2", "--json", str(out)])
    assert headroom.run(args) == 0
    d = json.loads(out.read_text())
    assert d["run_noise"] == 1.0 and d["lookahead_k"] == 2
    hedged = [e for e in d["per_episode"] if e["policy"] == "eft+hedge"]
    plain = [e for e in d["per_episode"] if e["policy"] == "eft"]
    assert all(e["hedge_copies"] > 0 for e in hedged) and all("hedge_copies" not in e
                                                               for e in plain)
    assert all(e["rollouts"] > 0 for e in d["per_episode"] if e["policy"] == "lookahead")
    rows = [dict(r, mean_rel_diff_vs_eft=-0.5, mean_rel_diff_vs_eft_ci95=0.1,
                 p95_rel_diff_vs_eft=-0.5) for r in d["table"] if r["policy"] != "eft"]
    assert {r["policy"] for r in rows} == {"ray", "eft+hedge", "lookahead"}
    assert headroom.choose_default(rows) == "ray"  # a rule; the others are not


def test_a_live_bench_stream_carries_each_calls_factors_to_live_and_twin():
    from scale_ray.bench.agents_live import collected, requests

    cfg = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
    nodes = NodeSimulator(cfg, 8).nodes
    plain, noisy = requests(cfg, nodes, 20, 3), requests(cfg, nodes, 20, 3, noise=1.0)
    assert [(t, [(c.name, c.compute) for c in r]) for t, r in plain] == \
        [(t, [(c.name, c.compute) for c in r]) for t, r in noisy]  # the same stream
    assert all(c.factors is None for _, r in plain for c in r)
    f = [x for _, r in noisy for c in r for x in c.factors]
    assert len(set(f)) == len(f) and 0.6 < sum(f) / len(f) < 1.5  # mean 1, drawn per call
    _, first = noisy[0]
    wf = collected(first, "r0")
    for c, call in zip(first, wf.calls):
        assert call.primitive.run_gflop == pytest.approx(c.compute * c.factors[0])
        assert call.primitive.copy_gflop == pytest.approx(c.compute * c.factors[1])
