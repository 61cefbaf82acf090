"""Runs that take other than planned and hedged copies on Ray nodes (envs/hedging.py through the
one simulator): a timeline by hand, noise zero draws nothing, the planner's forks over running
copies, bench headroom's hedged and planned arms, a live bench stream's factors."""

import math

import pytest

from envs.config import EnvConfig, build, replace
from envs.demands import parse_options
from envs.simulator import Simulator
from envs.workflow import TaskSpec, WorkflowSpec
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.evaluation import simulate

# the 0.9-quantile the rules see (envs.run_model.PRIOR_SIGMA 0.5 around the plan)
Q90 = math.exp(-0.125 + 1.2815515655446004 * 0.5)


def _env(**runtime) -> EnvConfig:
    """GPU nodes a (GPU speed 2) and b (speed 1), the agents setting's rules."""
    return build(EnvConfig, {
        "cluster": {"servers": 2, "latency_s": 0.0, "tiers": [
            {"name": "a", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
             "gpu_speed": 2.0},
            {"name": "b", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
             "gpu_speed": 1.0}]},
        "mdp": {"order": "fifo", "head_of_line_blocking": False, "ask_only_startable": True,
                "advance_to_next_event": True, "mask_infeasible": True},
        "objective": "workflow", "runtime": runtime})


def _one_call() -> list:
    """One one-GPU call of compute 4; its first run takes 5x its plan, a copy's run its plan
    (the call's own factors, as a live bench gives them)."""
    r = parse_options({"num_cpus": 1, "num_gpus": 1, "memory": 1e9})
    x = TaskSpec(4.0, r.memory_gb, 0.0, (), "x", demands=r.named, factors=(5.0, 1.0))
    return [(0.0, WorkflowSpec((x,)))]


def test_a_straggler_gets_a_copy_on_the_other_node_and_the_first_to_end_wins():
    """EFT runs x on a: planned 2 s, it takes 10. Unhedged: response 10 s. With q = 0.9 the run
    is a straggler at 2 x Q90 = 4.37 s: a copy on b (planned 4 s, takes 4) ends at 8.37 s and
    wins; the run on a is cancelled then (wasted 8.37 s), both GPUs free."""
    env = _env(noise_sigma=1.0)
    m = simulate(env, get_policy("eft", env), 0, arrivals=_one_call())
    assert m["mean_workflow_response_s"] == pytest.approx(10.0) and "hedge_copies" not in m
    env = _env(noise_sigma=1.0, hedge="all", hedge_quantile=0.9)
    sim = Simulator(env)
    sim.reset(0, arrivals=_one_call())
    eft = get_policy("eft", env)
    while sim.current is not None:
        sim.step(eft.decide(sim))
    m = sim.metrics()
    due = 2.0 * Q90
    assert m["mean_workflow_response_s"] == pytest.approx(due + 4.0)
    assert (m["hedge_copies"], m["hedge_wins"]) == (1, 1)
    assert m["hedge_waste_server_s"] == pytest.approx(due + 4.0)
    t = sim.table
    assert t.running == [{}, {}] and t.free == [list(x) for x in t.total]
    assert sim.tasks[0].slot == 1  # the copy's run is the task's


def test_noise_zero_draws_nothing():
    env = replace(load_env("configs/env/agents.yaml"), workload={"horizon_s": 40.0})
    env = env.with_servers(8)
    a = simulate(env, get_policy("eft", env), 2)
    b = simulate(replace(env, runtime={"noise_sigma": 0.0, "hedge": "all"}),
                 get_policy("eft", env), 2)
    assert a["mean_workflow_response_s"] == b["mean_workflow_response_s"]
    assert b["hedge_copies"] == 0 and "hedge_copies" not in a


def test_the_planner_forks_an_episode_with_running_copies():
    env = replace(load_env("configs/env/agents.yaml").with_servers(8),
                  workload={"horizon_s": 40.0, "gpu_load": 0.8},
                  runtime={"noise_sigma": 1.0, "hedge": "all", "hedge_quantile": 0.8})
    planner = get_policy("lookahead:candidates=3", env)
    m = simulate(env, planner, 1)
    assert m["hedge_copies"] > 0 and planner.stats["rollouts"] > 0
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
                         "eft+hedge", "lookahead:candidates=2", "--run-noise", "1.0",
                         "--horizon-s", "30", "--workers", "1", "--json", str(out)])
    assert headroom.run(args) == 0
    d = json.loads(out.read_text())
    assert d["run_noise"] == 1.0
    hedged = [e for e in d["per_episode"] if e["policy"] == "eft+hedge"]
    plain = [e for e in d["per_episode"] if e["policy"] == "eft"]
    assert all(e["hedge_copies"] > 0 for e in hedged) and all("hedge_copies" not in e
                                                               for e in plain)
    assert all(e["planner_rollouts"] > 0 for e in d["per_episode"]
               if e["policy"] == "lookahead:candidates=2")
    rows = [dict(r, mean_rel_diff_vs_eft=-0.5, mean_rel_diff_vs_eft_ci95=0.1,
                 p95_rel_diff_vs_eft=-0.5) for r in d["table"] if r["policy"] != "eft"]
    assert {r["policy"] for r in rows} == {"ray", "eft+hedge", "lookahead:candidates=2"}
    assert headroom.choose_default(rows) == "ray"  # a rule; the others are not


def test_a_live_bench_stream_carries_each_calls_factors_to_live_and_twin():
    from scale_ray.bench.agents_cluster import collected, requests

    env = load_env("configs/env/agents.yaml").with_servers(8)
    plain, noisy = requests(env, 20, 3), requests(env, 20, 3, noise=1.0)
    assert [(t, [(c.name, c.compute_gflop) for c in r.tasks]) for t, r in plain] == \
        [(t, [(c.name, c.compute_gflop) for c in r.tasks]) for t, r in noisy]  # same stream
    assert all(c.factors is None for _, r in plain for c in r.tasks)
    f = [x for _, r in noisy for c in r.tasks for x in c.factors]
    assert len(set(f)) == len(f) and 0.6 < sum(f) / len(f) < 1.5  # mean 1, drawn per call
    _, first = noisy[0]
    wf = collected(first, "r0")
    for c, call in zip(first.tasks, wf.calls):
        assert call.primitive.run_gflop == pytest.approx(c.compute_gflop * c.factors[0])
        assert call.primitive.copy_gflop == pytest.approx(c.compute_gflop * c.factors[1])
