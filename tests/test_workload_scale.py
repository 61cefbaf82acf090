"""features.workload_scale: a workload k times the paper's looks like the paper's to a policy;
heuristics do not change; the family configs carry the value `scale-ray workloads stats` prints."""

from __future__ import annotations

import numpy as np
import pytest

from envs.config import ConfigError, FeatureConfig, replace
from envs.encoding import ServerView, TaskView, encode
from scale_ray.config import load_env
from scale_ray.evaluation import run_episode


def test_a_k_times_larger_workload_encodes_like_the_paper_one():
    k = 14.2
    servers = [ServerView(1.0, 8), ServerView(4.0, 80, remaining_s=3.0), ServerView(2.0, 32)]
    big = [ServerView(s.compute, s.memory_gb, s.remaining_s * k) for s in servers]
    plain = encode(TaskView(5.0, 4.0), servers, FeatureConfig())
    scaled = encode(TaskView(5.0 * k, 4.0), big, FeatureConfig(workload_scale=k))
    for key in ("task", "servers", "action_mask"):
        np.testing.assert_allclose(scaled[key], plain[key], rtol=1e-6)
    with pytest.raises(ConfigError, match="features.workload_scale"):
        load_env(None, ["features.workload_scale=0"])


def test_heuristics_and_the_simulator_are_unchanged_by_the_scale():
    env = load_env(None, ["workload.horizon_s=30"], servers=8)
    scaled = replace(env, features={"workload_scale": 5.0})
    for policy in ("eft", "heft", "eft-wait"):
        a, b = run_episode(env, policy, 0, 1), run_episode(scaled, policy, 0, 1)
        for key in ("mean_task_response_s", "p95_task_response_s", "completed_tasks", "invalid_rate"):
            assert a[key] == b[key], (policy, key)


def test_family_configs_carry_the_measured_scale():
    from envs.loaders import load_family
    from scale_ray.families import family_env, workload_scale

    for family in ("wfinstances", "wfinstances-soykb", "nestful", "dagbench"):
        env = family_env(family)
        wfs = load_family(env.workload.source, env.workload.resources)
        assert env.features.workload_scale == workload_scale(wfs), family
    assert family_env("wfinstances-soykb").features.workload_scale > 30  # 5000-s jobs


def test_serve_and_live_take_a_workload_scale():
    from scale_ray.live import LiveConfig
    from serve_apps.decisions import load
    from serve_apps.placement import parse_args

    env = load_env(None)
    assert load("scale", env, workload_scale=14.2).encoder.features.workload_scale == 14.2
    assert load("scale", env).encoder.features.workload_scale == 1.0
    assert parse_args({"workload_scale": "14.2"}).workload_scale == 14.2
    with pytest.raises(ConfigError, match="args.workload_scale"):
        parse_args({"workload_scale": "-1"})
    with pytest.raises(ConfigError, match="live.workload_scale"):
        from envs.config import build
        build(LiveConfig, {"workload_scale": 0}, "live")
