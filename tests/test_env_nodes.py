"""The one gym env on Ray nodes (configs/env/agents.yaml, ``encoder: nodes``): stepping it is
the simulator's episode, the rewards add up to the objective, the nodes encoder's features say
what they claim on a hand-built table, and no policy can make an episode wait without bound."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.config import ConfigError
from envs.demands import parse_options
from envs.encoding import (CLIP, NODE_FEATURES, TIME_UNIT_S, NodeEncoder, TaskFacts)
from envs.gym_env import ENV_ID, ServerSelectEnv
from envs.nodes import NodeSpec, NodeTable
from envs.simulator import Simulator
from policies import get_policy
from policies.base import ObservationPolicy
from policies.guard import Guard, GuardConfig
from envs.config_base import merge, to_dict
from scale_ray.config import load_env
from scale_ray.evaluation import simulate

SMALL = {"file": "configs/env/agents.yaml", "encoder": "nodes", "cluster": {"servers": 8},
         "workload": {"horizon_s": 60.0}}


def _env(**over) -> ServerSelectEnv:
    """The agents setting on 8 nodes (``over``: more keys of the env config)."""
    return ServerSelectEnv(load_env(merge(SMALL, over)))


def _d(**opts) -> tuple:
    return parse_options(opts).on_nodes()


def _play(env, pick, seed):
    env.reset(seed=seed)
    total, done, info = 0.0, False, {}
    while not done:
        _, r, term, trunc, info = env.step(pick(env))
        total += r
        done = term or trunc
    return total, info["episode_metrics"]


def _episode_seed(seed: int) -> np.random.SeedSequence:
    """The episode seed ServerSelectEnv.reset(seed=seed) draws (gymnasium's np_random)."""
    return np.random.SeedSequence(int(np.random.default_rng(seed).integers(0, 2**63 - 1)))


def test_eft_through_the_env_is_the_simulators_eft_episode():
    env = _env()
    eft = get_policy("eft", env.config)
    total, m = _play(env, lambda e: eft.decide(e.sim), seed=5)
    ref = simulate(env.config, get_policy("eft", env.config), _episode_seed(5))
    assert m["completed_workflows"] == ref["completed_workflows"] > 5 and not m["truncated"]
    for key in ("mean_workflow_response_s", "p99_workflow_response_s", "mean_task_response_s",
                "decisions", "invalid_rate"):
        assert m[key] == ref[key], key
    # Little's law: the rewards add up to minus every request's response, in 10-s units
    assert total == pytest.approx(-m["mean_workflow_response_s"] * m["completed_workflows"]
                                  / TIME_UNIT_S, rel=1e-9)


def test_a_policy_that_always_waits_still_ends_the_episode():
    """A pick outside the mask (a node the call does not fit now) is a wait; a policy that only
    waits never starts a GPU call (the CPU nodes never fit one) and its episode is truncated at
    ``horizon_s x max_time_factor``, every wait charged. (RLlib's action masking keeps a
    training policy inside the mask: it never waits.)"""
    env = _env(workload={"horizon_s": 10.0}, mdp={"max_time_factor": 2.0})

    def never_fits(e):  # a node the call does not fit now, when there is one
        table = e.sim.table
        free = set(table.fitting(e.sim.task.demands))
        return next((i for i in range(table.n) if i not in free), 0)

    total, m = _play(env, never_fits, seed=1)
    assert m["truncated"] and m["invalid_rate"] > 0.99
    assert m["completed_tasks"] < m["arrived_tasks"] and env.sim.t > 20.0
    eft = get_policy("eft", env.config)
    ref_total, ref = _play(env, lambda e: eft.decide(e.sim), seed=1)
    assert not ref["truncated"] and total < ref_total  # waiting costs


def test_node_features_on_a_hand_built_table():
    table = NodeTable([NodeSpec("cpu", {"CPU": 4, "memory": 16}, cpu_speed=2.0),
                       NodeSpec("gpu", {"CPU": 4, "memory": 16, "GPU": 1}, gpu_speed=2.5),
                       NodeSpec("small", {"CPU": 1, "memory": 2})], capacity=5)
    call = SimpleNamespace(demands=_d(num_cpus=1, num_gpus=1, memory=4e9), compute=5.0)
    table.start(1, "other", _d(num_gpus=1), until=13.0)  # the GPU is busy until 13 s
    enc = NodeEncoder(5)
    facts = TaskFacts(5.0, 4.0, successors=2, completion=0.5, age_s=23.0)
    obs = enc.observe(table, call, facts, now=3.0)
    out, mask = obs["servers"], obs["action_mask"]
    col = {k: i for i, k in enumerate(NODE_FEATURES)}
    assert not mask.any()  # only the GPU node could ever run it, and it is busy
    gpu = out[1]
    assert gpu[col["run_s"]] == pytest.approx(5.0 / 2.5 / TIME_UNIT_S)
    assert gpu[col["start_in_s"]] == pytest.approx(10.0 / TIME_UNIT_S)  # free at 13 s
    assert gpu[col["fits_now"]] == 0 and gpu[col["free_gpu"]] == 0 and gpu[col["has_gpu"]] == 1
    assert gpu[col["running"]] > 0
    for never in (0, 2):
        assert out[never][col["run_s"]] == CLIP == out[never][col["start_in_s"]]
    assert out[0][col["free_cpu"]] == 1.0 and out[0][col["speed"]] > 0
    assert not out[3:].any()  # padding
    table.finish("other", 1)
    obs = enc.observe(table, call, facts, now=3.0)
    assert obs["servers"][1][col["fits_now"]] == 1 and obs["servers"][1][col["start_in_s"]] == 0
    assert obs["action_mask"].tolist() == [0, 1, 0, 0, 0]  # the valid picks: fits now
    task = obs["task"]
    assert task[5] == 0.5 and task[6] == pytest.approx(2.3) and task[7] == pytest.approx(2 / 8)
    assert ((task >= 0) & (task <= CLIP)).all()


def test_the_env_passes_gymnasiums_checker_and_refuses_bad_input():
    import gymnasium as gym

    env = gym.make(ENV_ID, config=to_dict(_env(n_max=12).config)).unwrapped
    assert isinstance(env, ServerSelectEnv)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert obs["servers"].shape == (12, len(NODE_FEATURES)) and not obs["action_mask"][8:].any()
    for bad in (12, -1, 1.5, "x"):
        with pytest.raises(ValueError, match="allowed: 0..11"):
            env.step(bad)
    with pytest.raises(ConfigError, match="unknown key env.nodes"):
        ServerSelectEnv({**to_dict(env.config), "nodes": 16})
    with pytest.raises(ConfigError, match="n_max"):
        _env(n_max=4)
    with pytest.raises(ConfigError, match="gpu_load"):
        _env(workload={"gpu_load": 1.5})


def test_the_same_node_reads_the_same_at_any_cluster_size():
    """Constants, not N, normalise every feature: a policy trained on 16 nodes reads a node of
    a 256-node cluster the same way."""
    rows = {}
    for n in (16, 256):
        env = _env(cluster={"servers": n}, workload={"horizon_s": 30.0})
        obs, _ = env.reset(seed=2)
        rows[n] = obs["servers"][0]
        assert math.isfinite(float(obs["servers"].sum()))
    np.testing.assert_array_equal(rows[16], rows[256])


def test_the_guard_keeps_a_learned_node_policy_from_waiting_without_bound():
    """A network that always picks a node the task does not fit now (a wait): its guard keeps a
    wait at most ``max_waits`` times per task while the task fits some node, then EFT places it;
    the episode ends and every task ran."""
    class Stubborn(ObservationPolicy):
        encoder = "nodes"

        def scores(self, obs):
            return -obs["servers"][:, 2]  # fits_now: a node it does not fit now scores highest

    pol = Stubborn()
    pol.guard = Guard(GuardConfig(max_waits=3))
    env = _env().config
    sim = Simulator(env)
    sim.reset(3)
    while sim.current is not None:
        sim.step(pol.decide(sim))
    m = sim.metrics()
    assert m["completed_tasks"] == m["arrived_tasks"] > 0 and not m["truncated"]
    assert pol.guard.overrides > 0
    assert max(t.waits for t in sim.tasks) <= 3 + 1  # a wait while it fits no node is allowed
    ref = simulate(env, get_policy("eft", env), 3)
    assert m["mean_workflow_response_s"] >= ref["mean_workflow_response_s"]
