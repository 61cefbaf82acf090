"""features.backlog (beyond the paper): two task features exposing backlog and waiting, in the
simulator and gym only; every consumer that cannot compute them refuses such a policy."""
from __future__ import annotations

import numpy as np
import pytest

from envs.config import ConfigError, EnvConfig, build
from envs.encoding import BACKLOG_FEATURES, TASK_DIM, task_dim
from envs.simulator import READY, Simulator


def _cfg(backlog: bool) -> EnvConfig:
    return build(EnvConfig, {"cluster": {"servers": 8}, "n_max": 8,
                             "workload": {"horizon_s": 40.0, "arrival_rate_16": 2.0},
                             "mdp": {"head_of_line_blocking": False, "mask_infeasible": True,
                                     "ask_only_startable": True},
                             "features": {"backlog": backlog, "backlog_per_server": 2.0}})


def test_backlog_features_append_two_exact_values_and_change_nothing_else():
    from policies import make_heuristic

    assert task_dim(_cfg(False).features) == TASK_DIM == 5
    assert task_dim(_cfg(True).features) == TASK_DIM + len(BACKLOG_FEATURES) == 7
    plain, back = Simulator(_cfg(False)), Simulator(_cfg(True))
    policy = make_heuristic("eft", _cfg(True))  # heuristics read the first five only
    plain.reset(3)
    back.reset(3)
    steps, saw_backlog = 0, False
    while back.current is not None:
        ob, op = back.observe(), plain.observe()
        assert ob["task"].shape == (7,) and ob["task"].dtype == np.float32
        np.testing.assert_array_equal(ob["task"][:5], op["task"])
        np.testing.assert_array_equal(ob["servers"], op["servers"])
        np.testing.assert_array_equal(ob["action_mask"], op["action_mask"])
        # the two values, computed here from the simulator's state
        task = back.current
        ready = {tk.id for _, _, tk in back._ready if tk.state == READY} | {task.id}
        per_server = len(ready) / int(back.accepting.sum()) / 2.0
        age = (back.t - task.wf.arrival) / back.cfg.features.remaining_s
        np.testing.assert_allclose(ob["task"][5:], [per_server, age], rtol=1e-6)
        saw_backlog |= len(ready) > 1
        a = policy.act(ob)
        assert a == make_heuristic("eft", _cfg(False)).act(op)
        back.step(a)
        plain.step(a)
        steps += 1
    assert plain.current is None and steps > 50 and saw_backlog
    assert back.metrics() == plain.metrics()
    assert back.observe()["task"].shape == (7,)  # the terminal observation too


def test_gym_space_and_network_follow_the_feature_width():
    from envs.gym_env import ServerSelectEnv
    from policies.artifact import TorchPolicy
    from policies.networks import build_network

    env = ServerSelectEnv(_cfg(True))
    obs, _ = env.reset(seed=0)
    assert env.observation_space["task"].shape == (7,) and env.observation_space.contains(obs)
    net = build_network("crossattn", {"task_features": 7})
    pol = TorchPolicy(net, {"features": {"backlog": True}})
    assert pol.scores(obs).shape == (8,)
    plain_obs = {**obs, "task": obs["task"][:5]}
    with pytest.raises(ValueError, match="task: this policy takes 7 task features"):
        pol.scores(plain_obs)


def test_serve_and_live_refuse_a_backlog_policy(tmp_path):
    from policies.artifact import save_policy
    from policies.networks import build_network
    from scale_ray.live.scheduler import LiveScheduler
    from serve_apps.decisions import load

    env = _cfg(True)
    path = save_policy(tmp_path / "p", build_network("crossattn", {"task_features": 7}),
                       {"name": "b", "algorithm": "ppo", "features": env.features})
    with pytest.raises(ConfigError, match="features.backlog: Serve"):
        load(str(path), EnvConfig())
    from policies import get_policy
    with pytest.raises(ConfigError, match="features.backlog: the live scheduler"):
        LiveScheduler(get_policy(str(path), env), env)
    with pytest.raises(ConfigError, match="features.backlog_per_server"):
        build(EnvConfig, {"features": {"backlog_per_server": 0}})
