"""The gym env in Ray's resource model (envs/node_env.py) and its encoder
(envs/node_encoding.py): stepping the env is the node simulator's episode, the rewards add up to
the objective, the features say what they claim on a hand-built table, and no policy can make an
episode wait without bound."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.config_base import ConfigError
from envs.node_encoding import CLIP, NODE_FEATURES, TIME_UNIT_S, encode_nodes, encode_task
from envs.node_env import NodeSelectEnv
from envs.nodes import NodeSpec, NodeTable, demands_of
from policies.node_rules import eft

SMALL = {"nodes": 8, "horizon_s": 60.0}


def _episode_seed(seed: int) -> int:
    """The episode seed NodeSelectEnv.reset(seed=seed) draws (gymnasium's np_random)."""
    return int(np.random.default_rng(seed).integers(0, 2**63 - 1))


def _play(env, pick, seed):
    env.reset(seed=seed)
    total, done, info = 0.0, False, {}
    while not done:
        _, r, done, _, info = env.step(pick(env))
        total += r
    return total, info["episode_metrics"]


def test_eft_through_the_env_is_the_node_simulators_eft_episode():
    env = NodeSelectEnv(SMALL)
    total, m = _play(env, lambda e: eft(e.episode.table, e.task, e.episode.now, e.episode.r_pol),
                     seed=5)
    ref = env.sim.run(eft, _episode_seed(5))
    assert m["workflows"] == ref["workflows"] > 5 and m["forced_picks"] == 0
    for key in ("mean_workflow_response_s", "p99_workflow_response_s", "mean_task_response_s",
                "decisions", "waits"):
        assert m[key] == ref[key], key
    # Little's law: the rewards add up to minus every request's response, in 10-s units
    assert total == pytest.approx(-m["mean_workflow_response_s"] * m["workflows"] / TIME_UNIT_S,
                                  rel=1e-9)


def test_a_policy_that_always_waits_still_ends_the_episode():
    env = NodeSelectEnv(SMALL)

    def never_fits(e):  # a node the call does not fit now, when there is one
        table = e.episode.table
        free = set(table.fitting(e.task.demands))
        return next((i for i in range(table.n) if i not in free), 0)

    _, m = _play(env, never_fits, seed=1)
    assert m["forced_picks"] > 0 and m["tasks"] > 0
    _, ref = _play(env, lambda e: eft(e.episode.table, e.task, e.episode.now, e.episode.r_pol),
                   seed=1)
    assert m["mean_workflow_response_s"] > ref["mean_workflow_response_s"]  # waiting costs


def test_node_features_on_a_hand_built_table():
    table = NodeTable([NodeSpec("cpu", {"CPU": 4, "memory": 16}, cpu_speed=2.0),
                       NodeSpec("gpu", {"CPU": 4, "memory": 16, "GPU": 1}, gpu_speed=2.5),
                       NodeSpec("small", {"CPU": 1, "memory": 2})])
    call = SimpleNamespace(demands=demands_of(num_cpus=1, num_gpus=1, memory_gb=4),
                           compute=5.0, children=[1, 2],
                           wf=SimpleNamespace(done=1, tasks=[0, 0], arrival=0.0))
    table.start(1, "other", demands_of(num_gpus=1), until=13.0)  # the GPU is busy until 13 s
    out = np.full((5, len(NODE_FEATURES)), 7.0, dtype=np.float32)
    mask = encode_nodes(table, call, now=3.0, out=out)
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
    table.finish("other")
    mask = encode_nodes(table, call, now=3.0, out=out)
    assert out[1][col["fits_now"]] == 1 and out[1][col["start_in_s"]] == 0
    assert mask.tolist() == [0, 1, 0, 0, 0]  # the valid picks: the nodes it fits now
    task = encode_task(call, now=23.0)
    assert task[5] == 0.5 and task[6] == pytest.approx(2.3) and task[7] == pytest.approx(2 / 8)
    assert ((task >= 0) & (task <= CLIP)).all()


def test_the_env_passes_gymnasiums_checker_and_refuses_bad_input():
    import gymnasium as gym

    env = gym.make("scale_ray/NodeSelect-v0", config={**SMALL, "n_max": 12}).unwrapped
    assert isinstance(env, NodeSelectEnv)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert obs["servers"].shape == (12, len(NODE_FEATURES)) and not obs["action_mask"][8:].any()
    for bad in (12, -1, 1.5, "x"):
        with pytest.raises(ValueError, match="allowed: 0..11"):
            env.step(bad)
    with pytest.raises(ConfigError, match="unknown keys \\['servers'\\]"):
        NodeSelectEnv({"servers": 16})
    with pytest.raises(ConfigError, match="n_max"):
        NodeSelectEnv({"nodes": 16, "n_max": 8})
    with pytest.raises(ConfigError, match="gpu_load"):
        NodeSelectEnv({"gpu_load": 1.5})


def test_the_same_node_reads_the_same_at_any_cluster_size():
    """Constants, not N, normalise every feature: a policy trained on 16 nodes reads a node of
    a 256-node cluster the same way."""
    rows = {}
    for n in (16, 256):
        env = NodeSelectEnv({"nodes": n, "horizon_s": 30.0})
        obs, _ = env.reset(seed=2)
        rows[n] = obs["servers"][0]
        assert math.isfinite(float(obs["servers"].sum()))
    np.testing.assert_array_equal(rows[16], rows[256])


def test_the_guard_keeps_a_learned_node_policy_from_waiting_without_bound():
    """A network that always picks a node the task does not fit (a wait): the guard keeps a
    wait only while something runs and at most MAX_WAITS times per task, then EFT places it;
    the episode ends and every task ran."""
    import numpy as np

    from envs.node_sim import NodeSimulator
    from policies.node_learned import LearnedNodePolicy
    from policies.node_rules import MAX_WAITS

    class Stubborn:
        def act(self, obs):
            free = obs["servers"][:, 2]  # fits_now
            return int(np.argmin(free))  # a node it does not fit now whenever there is one

    pol = object.__new__(LearnedNodePolicy)
    pol.policy, pol.overrides = Stubborn(), 0
    pol._nodes = np.zeros((0, len(NODE_FEATURES)), dtype=np.float32)
    sim = NodeSimulator(NodeSelectEnv(SMALL).agents, 8)
    seen = []
    orig = sim._admit

    def admit(spec, now, requests, tasks, ready):
        orig(spec, now, requests, tasks, ready)
        seen[:] = tasks
    sim._admit = admit
    m = sim.run(pol, seed=3)
    assert m["tasks"] == len(seen) > 0 and pol.overrides > 0
    assert max(t.waits for t in seen) <= MAX_WAITS
    assert m["mean_workflow_response_s"] > sim.run(eft, 3)["mean_workflow_response_s"]
