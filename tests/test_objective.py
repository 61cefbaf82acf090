"""envs.objective: one definition of "better" read by the reward, the planner, eval and the
summaries."""
from __future__ import annotations

import math

import pytest

from envs import objective
from envs.config import EnvConfig, build
from envs.simulator import Simulator
from envs.workflow import TaskSpec, WorkflowSpec
from scale_ray.evaluation import ROW_KEYS, aggregate, format_table, paired_differences

PAIR = WorkflowSpec((TaskSpec(2.0, 1.0, 0.0), TaskSpec(2.0, 1.0, 0.0)), "pair")


def _env(obj: str) -> EnvConfig:
    return build(EnvConfig, {"objective": obj, "cluster": {"servers": 1, "tiers": [
        {"name": "only", "compute": 1.0, "memory_gb": 80.0, "ratio": 1}]},
        "reward": {"kind": "response", "wait_penalty_per_s": 1.0, "w1": 0.0, "w2": 0.0,
                   "invalid_penalty": 0.0},
        "mdp": {"mask_infeasible": True, "ask_only_startable": True,
                "head_of_line_blocking": False}})


@pytest.mark.parametrize("obj,per_second", [("task", 2), ("workflow", 1)])
def test_response_reward_counts_open_tasks_or_open_workflows(obj, per_second):
    """One workflow of two 2-s tasks on one server. A step's reward carries the penalty of the
    time until the next decision: after the first start, 2 s with 2 tasks (1 workflow) open;
    after the second, 2 s with 1 task (1 workflow) open."""
    sim = Simulator(_env(obj))
    sim.reset(0, arrivals=[(0.0, PAIR)])
    assert sim.step(0).reward == pytest.approx(-per_second * 2.0, abs=0.11 * per_second)
    assert 2.0 <= sim.t < 2.11
    last = sim.step(0)
    assert last.terminated and last.reward == pytest.approx(-2.0, abs=0.11)


def test_completion_cost_sums_tasks_or_workflow_last_completions():
    c = [(0, 1.0), (0, 3.0), (1, 2.0)]
    assert objective.completion_cost("task", c) == 6.0
    assert objective.completion_cost("workflow", c) == 5.0


def test_metric_names_and_errors():
    assert objective.metric_key("workflow") == "mean_workflow_response_s"
    assert objective.metric_key("task") == "mean_task_response_s"
    with pytest.raises(ValueError, match=r"--metric: 'slowness' is not one of"):
        objective.metric_key("slowness")
    reward = EnvConfig().reward
    assert objective.Objective("workflow", reward).open_count(7, 2) == 2
    assert objective.Objective("task", reward).open_count(7, 2) == 7
    with pytest.raises(ValueError, match="objective: 'speed' is not one of"):
        objective.Objective("speed", reward)


def test_the_start_reward_is_the_papers_equation_2():
    """w1 exp(-T_exec/T0) - w2 T_comm/T0c - w3 P_busy T_exec / E0, by hand."""
    r = build(EnvConfig, {"reward": {"w1": 1.0, "w2": 0.5, "w3": 0.2, "t0_s": 2.0,
                                     "t0c_s": 0.1, "e0_j": 1000.0}}).reward
    o = objective.Objective("task", r)
    assert o.start_reward(3.0, 0.05, 200.0) == pytest.approx(
        math.exp(-1.5) - 0.5 * 0.5 - 0.2 * 200.0 * 3.0 / 1000.0)
    assert o.start_reward(3.0, 0.0, 200.0) == pytest.approx(math.exp(-1.5) - 0.12)
    assert o.penalty_rate == 0.0  # kind paper: no per-second penalty


def test_paired_comparison_defaults_to_mean_workflow_response():
    eps = [{"policy": p, "servers": 16, "episode": k, "mean_task_response_s": 5.0,
            "mean_workflow_response_s": w, "completed_workflows": 10,
            "censored_workflow_response_s": w}
           for p, ws in (("eft", [10.0, 20.0]), ("a", [9.0, 18.0])) for k, w in enumerate(ws)]
    (row,) = paired_differences(eps, "eft")
    assert row["metric"] == "workflow" and row["mean_rel_diff"] == pytest.approx(-0.1)


def test_episode_rows_lead_with_workflow_response_and_censored_tails():
    from policies import get_policy

    env = build(EnvConfig, {"cluster": {"servers": 4}, "workload": {"horizon_s": 20.0}})
    eft = get_policy("eft", env)
    sim = Simulator(env)
    sim.reset(3)
    while sim.current is not None:
        sim.step(eft.decide(sim))
    m = sim.metrics()
    for k in ("p95_workflow_response_s", "p99_workflow_response_s", "censored_workflow_response_s",
              "censored_p95_workflow_response_s", "censored_p99_workflow_response_s"):
        assert not math.isnan(m[k]), k
    assert m["p99_workflow_response_s"] >= m["p95_workflow_response_s"]
    if not m["truncated"]:  # every workflow finished: the censored mean is the mean
        assert m["censored_workflow_response_s"] == pytest.approx(m["mean_workflow_response_s"])
    m.update(policy="x", servers=4, episode=0, guard_overrides=0, guard_override_rate=0.0)
    row = aggregate([m], "x", 4)
    assert ROW_KEYS[3:6] == objective.HEADLINE
    assert all(k in row for k in ROW_KEYS)
    head = next(ln for ln in format_table([row]).splitlines() if ln.startswith("policy"))
    assert head.index("wf mean") < head.index("wf p95") < head.index("wf p99") < head.index("task mean")
