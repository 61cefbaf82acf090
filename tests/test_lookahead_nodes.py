"""The rollout planner on Ray nodes (policies/lookahead.py on the one simulator) and the
simulator's fork it plans on (envs/fork.py): a timeline by hand, EFT with one candidate, and a
fork that continues exactly as the episode does and leaves it alone."""

import pytest

from envs.config import EnvConfig, build, replace
from envs.demands import parse_options
from envs.simulator import Simulator
from envs.workflow import TaskSpec, WorkflowSpec
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.evaluation import simulate


def _agents(load=0.8, horizon=120.0, n=8) -> EnvConfig:
    return replace(load_env("configs/env/agents.yaml").with_servers(n),
                   workload={"gpu_load": load, "horizon_s": horizon})


def _timeline() -> tuple[EnvConfig, list]:
    """Two one-GPU calls at once: x (2 s at speed 1), then y (10 s); GPU nodes a (speed 2), b
    (speed 1)."""
    env = build(EnvConfig, {
        "cluster": {"servers": 2, "latency_s": 0.0, "tiers": [
            {"name": "a", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
             "gpu_speed": 2.0},
            {"name": "b", "count": 1, "resources": {"CPU": 4, "memory": 16, "GPU": 1},
             "gpu_speed": 1.0}]},
        "mdp": {"order": "fifo", "head_of_line_blocking": False, "ask_only_startable": True,
                "advance_to_next_event": True, "mask_infeasible": True},
        "objective": "workflow"})
    r = parse_options({"num_cpus": 1, "num_gpus": 1, "memory": 1e9})

    def call(name, c):
        return WorkflowSpec((TaskSpec(c, r.memory_gb, 0.0, (), name, demands=r.named),))
    return env, [(0.0, call("x", 2.0)), (0.0, call("y", 10.0))]


def test_the_planner_beats_eft_where_a_greedy_first_fit_blocks_the_long_call():
    """Two one-GPU calls arrive at once: x (2 s at speed 1) first in fifo, then y (10 s); a GPU
    node of speed 2 (a) and one of speed 1 (b). EFT: x on a (0-1 s), y finds only b (0-10 s):
    completions 1 + 10 = 11. The planner tries x on b too: y then takes a (0-5 s), x ends at 2:
    2 + 5 = 7, so it places x on b. Mean response 5.5 (EFT) vs 3.5 (planner)."""
    env, calls = _timeline()
    mean = "mean_workflow_response_s"
    assert simulate(env, get_policy("eft", env), 0, arrivals=calls)[mean] == pytest.approx(5.5)
    planner = get_policy("lookahead:candidates=2", env)
    assert simulate(env, planner, 0, arrivals=calls)[mean] == pytest.approx(3.5)
    assert planner.stats["changed"] == 1 and planner.stats["rollouts"] == 2  # y: one candidate
    one = get_policy("lookahead:candidates=1,wait=false", env)
    assert simulate(env, one, 0, arrivals=calls)[mean] == pytest.approx(5.5)


def test_over_its_bound_of_open_requests_a_node_the_planner_is_its_base_rule():
    """Its cost is bounded (a burst): the same timeline with 2 open requests on 2 nodes is
    planned at 1 a node (2 > 2: no), and is EFT's at 0.5 a node, without a rollout."""
    env, calls = _timeline()
    mean = "mean_workflow_response_s"
    at_one = get_policy("lookahead:candidates=2,max_open_per_node=1", env)
    assert simulate(env, at_one, 0, arrivals=calls)[mean] == pytest.approx(3.5)
    assert at_one.stats["skipped"] == 0
    bounded = get_policy("lookahead:candidates=2,max_open_per_node=0.5", env)
    assert simulate(env, bounded, 0, arrivals=calls)[mean] == pytest.approx(5.5)
    assert bounded.stats["skipped"] == 2 and bounded.stats["rollouts"] == 0


def test_one_candidate_is_eft_to_the_bit_and_the_planner_is_deterministic():
    env = _agents(horizon=60.0)
    one = get_policy("lookahead:candidates=1,wait=false", env)
    assert simulate(env, one, 3) == simulate(env, get_policy("eft", env), 3)
    a, b = get_policy("lookahead:candidates=3", env), get_policy("lookahead:candidates=3", env)
    assert simulate(env, a, 3) == simulate(env, b, 3) and a.stats["rollouts"] > 0


def test_a_fork_continues_as_the_episode_does_and_leaves_it_alone():
    """At every 10th decision of an EFT episode whose requests have all arrived, a fork run to
    the end with EFT gives each open request the finish time the episode gives it; running the
    forks changes nothing in the episode (its metrics equal an episode never forked)."""
    env = _agents(load=0.9, horizon=30.0)
    eft = get_policy("eft", env)
    plain = simulate(env, eft, 5)
    sim = Simulator(env)
    sim.reset(5)
    forks, k = [], 0
    while sim.current is not None:
        k += 1
        if k % 10 == 0 and sim.t > env.workload.horizon_s:  # (no arrival is left)
            f = sim.fork()
            while f.current is not None:
                f.step(eft.decide(f))
            forks.append({w.id: w.finish for w in f.workflows if w.finish == w.finish})
        sim.step(eft.decide(sim))
    assert sim.metrics() == plain
    assert len(forks) >= 2
    finish = {w.id: w.finish for w in sim.workflows}
    for fk in forks:
        assert fk and all(fk[i] == finish[i] for i in fk)
