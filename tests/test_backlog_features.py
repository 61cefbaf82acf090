"""features.backlog (beyond the paper): two task features exposing backlog and waiting. The
simulator, Serve (/v1/place from request fields, /v1/schedule from its own loop) and the live
scheduler compute them with the one function, envs.encoding.backlog_features."""
from __future__ import annotations

import numpy as np

from policies.guard import GuardConfig
import pytest

from envs.config import ConfigError, EnvConfig, build
from envs.encoding import BACKLOG_FEATURES, TASK_DIM, task_dim
from envs.simulator import READY, Simulator


def _cfg(backlog: bool) -> EnvConfig:
    return build(EnvConfig, {"cluster": {"servers": 8}, "n_max": 8,
                             "workload": {"horizon_s": 40.0, "arrival_rate_16": 2.0},
                             "mdp": {"head_of_line_blocking": False, "mask_infeasible": True,
                                     "ask_only_startable": True, "order": "hop"},
                             "features": {"backlog": backlog, "backlog_per_server": 2.0}})


def test_backlog_features_append_two_exact_values_and_change_nothing_else():
    from policies import make_heuristic

    assert task_dim(_cfg(False).features) == TASK_DIM == 5
    assert task_dim(_cfg(True).features) == TASK_DIM + len(BACKLOG_FEATURES) == 7
    plain, back = Simulator(_cfg(False)), Simulator(_cfg(True))
    policy = make_heuristic("eft", _cfg(True))  # heuristics read the table, not the features
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
        ready = {tk.id for _, _, tk in back.core.queue.heap if tk.state == READY} | {task.id}
        per_server = len(ready) / sum(back.table.accept_l) / 2.0
        age = (back.t - task.wf.arrival) / back.cfg.features.remaining_s
        np.testing.assert_allclose(ob["task"][5:], [per_server, age], rtol=1e-6)
        saw_backlog |= len(ready) > 1
        a = policy.decide(back)
        assert a == make_heuristic("eft", _cfg(False)).decide(plain)
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


def _backlog_artifact(tmp_path, env, seed: int = 2):
    """An untrained backlog network with fixed weights. Seed 2's picks a busy server for a task
    that no server could start: /v1/schedule asked the policy there while the simulator
    (mdp.ask_only_startable) waits without asking, which this test used to catch only for some
    draws of the weights."""
    import torch

    from policies.artifact import save_policy
    from policies.networks import build_network

    torch.manual_seed(seed)
    return save_policy(tmp_path / "p", build_network("crossattn", {"task_features": 7}),
                       {"name": "b", "algorithm": "ppo", "features": env.features})


def test_backlog_features_function_normalises_and_clips():
    from envs.encoding import backlog_features

    f = _cfg(True).features  # backlog_per_server 2, remaining_s 10, clip 100
    assert backlog_features(6, 3, 25.0, f) == (1.0, 2.5)
    assert backlog_features(1, 0, -1.0, f) == (0.5, 0.0)  # no accepting server: per 1; age >= 0
    assert backlog_features(10**6, 1, 1e9, f) == (f.clip, f.clip)
    with pytest.raises(ConfigError, match="features.backlog_per_server"):
        build(EnvConfig, {"features": {"backlog_per_server": 0}})


def test_serve_schedule_observations_equal_the_simulators(tmp_path, monkeypatch):
    """/v1/schedule on an exported simulator state builds, decision for decision, the
    observation the simulator's loop builds (backlog columns included), for a backlog-trained
    network; and /v1/place puts the request's ready_tasks and workflow_age_s in the same
    columns, or answers 422 naming the missing field."""
    import serve_apps.decisions as dec
    import serve_apps.schedule as sched_mod
    from serve_apps.schemas import PlaceRequest, ScheduleRequest
    from tests.test_serve import fresh_states, simulator_decisions, simulator_request

    env = _cfg(True)
    lp = dec.load(str(_backlog_artifact(tmp_path, env)), env,
                  guard=GuardConfig(enabled=False))  # the raw policy vs the simulator's loop
    assert lp.encoder.features.backlog
    seen: list[np.ndarray] = []
    observe = dec.RequestState.observe  # /v1/place and /v1/schedule build observations with it
    monkeypatch.setattr(dec.RequestState, "observe",
                        lambda self: seen.append(observe(self)) or seen[-1])
    checked = multi = 0
    for sim in fresh_states(env, lp.policy, seed=5, want=15, min_ready=2):
        body = {**simulator_request(sim), "now_s": sim.t}
        seen.clear()
        ans = sched_mod.schedule(ScheduleRequest.model_validate(body), lp, 10_000, 10_000)
        want: list[np.ndarray] = []
        policy_act = lp.policy.act

        class Recording:  # the simulator's observations, in its decision order
            order = lp.policy.order

            def decide(self, sim):
                obs = sim.observe()
                want.append(obs)
                return policy_act(obs)

        starts, waits = simulator_decisions(sim, Recording())
        assert [(a["workflow"], a["task"], a["server"]) for a in ans["assignments"]] == starts
        assert len(seen) == len(want) > 0
        for got, exp in zip(seen, want):
            assert got["task"].shape == (7,)
            for key in exp:
                np.testing.assert_array_equal(got[key], exp[key], err_msg=key)
        multi += want[0]["task"][5] > 1 / (2.0 * 8)  # more than one ready task per server
        checked += 1
    assert checked == 15 and multi > 0
    with pytest.raises(dec.RequestError, match="features.backlog") as e:
        sched_mod.schedule(ScheduleRequest.model_validate({k: v for k, v in body.items() if k != "now_s"}),
                     lp, 10_000, 10_000)
    assert e.value.loc == ["body", "now_s"]
    late = {**body, "now_s": 0.0}
    late["workflows"][-1]["arrival_s"] = 5.0
    with pytest.raises(dec.RequestError, match="after now_s") as e:
        sched_mod.schedule(ScheduleRequest.model_validate(late), lp, 10_000, 10_000)
    assert e.value.loc[-1] == "arrival_s"

    place = {"task": {"compute_gflop": 2.0, "memory_gb": 1.0},
             "servers": [{"id": i, "compute": 1.0 + i, "memory_gb": 80.0, "accepting": i != 2}
                         for i in range(4)]}
    for missing in ("ready_tasks", "workflow_age_s"):
        task = {**place["task"], "ready_tasks": 9, "workflow_age_s": 4.0}
        del task[missing]
        with pytest.raises(dec.RequestError, match="features.backlog") as e:
            dec.place(PlaceRequest.model_validate({**place, "task": task}), lp, 100)
        assert e.value.loc == ["body", "task", missing]
    seen.clear()
    dec.place(PlaceRequest.model_validate(
        {**place, "task": {**place["task"], "ready_tasks": 9, "workflow_age_s": 4.0}}), lp, 100)
    np.testing.assert_allclose(seen[0]["task"][5:], [9 / 3 / 2.0, 0.4], rtol=1e-6)
    # a paper-feature policy ignores the two fields
    plain = dec.load("eft", _cfg(False))
    state = dec.prepare_place(PlaceRequest.model_validate(
        {**place, "task": {**place["task"], "ready_tasks": 9, "workflow_age_s": 4.0}}), plain, 100)
    assert state.observe()["task"].shape == (5,)


def test_live_scheduler_observation_with_backlog_equals_the_encoder(tmp_path):
    """The live state's observation for a backlog-trained policy is exactly
    envs.encoding.encode of its record written out as plain descriptions, and the two columns are the ready tasks in
    its heap per offered server and the workflow's age in model seconds. No Ray needed."""
    from envs.encoding import encode
    from policies import get_policy
    from scale_ray.live import LiveConfig, LiveScheduler
    from scale_ray.live.cluster import NodeInfo
    from scale_ray.live.handles import WorkflowHandle
    from scale_ray.live.nodes import LiveServer
    from scale_ray.live.workflow import from_spec
    from envs.workload import TaskSpec, WorkflowSpec

    env = _cfg(True)
    policy = get_policy(str(_backlog_artifact(tmp_path, env)), EnvConfig())  # features: artifact's
    sched = LiveScheduler(policy, EnvConfig(), LiveConfig(time_scale=0.5))
    assert sched.features.backlog
    servers = [LiveServer(i, NodeInfo(f"node{i}", 1, 1.0 + i, 80.0, "t", 30.0, 100.0), 0)
               for i in range(5)]
    servers[3].offered = False  # its actor is starting: masked, and not counted
    pl = sched.placement
    pl.set_alive(servers)
    spec = WorkflowSpec((TaskSpec(2.0, 4.0, 0.3), TaskSpec(3.0, 4.0, 0.7),
                         TaskSpec(1.0, 1.0, 0.0, (0, 1))))
    o = pl.origin  # wall s (perf_counter) of model time 0
    for k, submitted in enumerate((o + 10.0, o + 12.0)):
        sched.admission.admit(WorkflowHandle(k, from_spec(spec), submitted))
    t = pl.queue.heap[0][2]
    now = o + 13.0
    got = pl.state(t, now).observe()
    from dataclasses import replace

    from tests.test_live import _plain_views
    view, views = _plain_views(pl, t, now)
    view = replace(view, ready_tasks=len(pl.queue), workflow_age_s=(now - t.wf.arrival_wall) / 0.5)
    want = encode(view, views, sched.features, env.cluster.bandwidth_gb_s,
                  env.cluster.latency_s, mask_infeasible=True)
    for key in ("task", "servers", "action_mask"):
        assert got[key].dtype == want[key].dtype
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    age = (now - t.wf.arrival_wall) / 0.5
    np.testing.assert_allclose(got["task"][5:], [4 / 4 / 2.0, age / 10.0], rtol=1e-6)
    assert got["action_mask"][3] == 0
    assert policy.scores(got).shape == (5,)
