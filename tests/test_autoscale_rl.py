"""Issue 72 item 5: the learned head-room sizer's env. Its constant choice 1.0 is our sizer
episode for episode; a choice reaches the plan; bad arguments are refused by name."""

from __future__ import annotations

import argparse

import pytest

from policies.sizing.learned import HEADROOM, HeadroomSizer
from scale_ray.bench import autoscale_rl
from scale_ray.bench.autoscale_rl import SizingEnv, run_policy
from scale_ray.evaluation import run_episode


@pytest.fixture(scope="module")
def env():
    return SizingEnv({"horizon_s": 900})


def test_the_constant_choice_one_is_our_sizer_exactly(env):
    got = run_policy(env, lambda _obs: HEADROOM.index(1.0), 3)
    ref = run_episode(env.cfg, "eft", 3)
    assert got["cost"] == ref["cost"] and got["slo_attainment"] == ref["slo_attainment"]
    assert got["p99_workflow_response_s"] == ref["p99_workflow_response_s"]
    assert got["headroom_share"]["1.0"] == 1.0


def test_the_choice_reaches_the_plan(env):
    low = run_policy(env, lambda _obs: 0, 3)
    high = run_policy(env, lambda _obs: len(HEADROOM) - 1, 3)
    assert high["cost"] > low["cost"] * 1.05, (low["cost"], high["cost"])
    assert low["headroom_share"][str(HEADROOM[0])] > 0.8


def test_steps_observe_features_and_reward_cost(env):
    obs, info = env.reset(options={"episode": 7})
    assert info["episode"] == 7 and obs.shape == env.observation_space.shape
    assert env.observation_space.contains(obs)
    obs, r, done, trunc, _ = env.step(2)
    assert r < 0 and not done and not trunc  # nodes cost money every step
    assert env.observation_space.contains(obs)


def test_training_episodes_are_short_and_start_at_a_random_phase_of_the_day():
    env = SizingEnv({"horizon_s": 900, "train_horizon_s": 120, "seed": 1})
    phases = set()
    for _ in range(3):
        _, info = env.reset()
        wl = env.sizer.model.cfg.workload
        assert info["episode"] >= autoscale_rl.TRAIN_SEEDS_FROM and wl.horizon_s == 120
        phases.add(wl.curve.peak_s)
    assert len(phases) == 3
    env.reset(options={"episode": 2})  # evaluation: the config as it is
    assert env.sizer.model.cfg.workload.horizon_s == 900
    assert env.sizer.model.cfg.workload.curve.peak_s == env.cfg.workload.curve.peak_s


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="every"):
        HeadroomSizer(SizingEnv({"horizon_s": 60}).cfg, every=0)
    p = argparse.ArgumentParser()
    autoscale_rl.add_arguments(p)
    with pytest.raises(ValueError, match="--eval-seeds"):
        autoscale_rl.run(p.parse_args(["--eval-seeds", "10000"]))
    with pytest.raises(ValueError, match="--iterations"):
        autoscale_rl.run(p.parse_args(["--iterations", "-1"]))
    with pytest.raises(ValueError, match="--iterations 0 trains nothing"):
        autoscale_rl.run(p.parse_args(["--iterations", "0"]))
    with pytest.raises(ValueError, match="--constants"):
        autoscale_rl.run(p.parse_args(["--iterations", "0", "--constants", "0.9"]))


def test_constant_head_rooms_are_compared_with_ours_without_training(tmp_path):
    """``--iterations 0 --constants``: no Ray, each constant against ours on the same seeds;
    1.0 is ours itself (a relative cost of exactly 0, and it does not win)."""
    import json

    p = argparse.ArgumentParser()
    autoscale_rl.add_arguments(p)
    out = tmp_path / "c.json"
    assert autoscale_rl.run(p.parse_args(
        ["--horizon-s", "600", "--iterations", "0", "--constants", "1.0", "1.5",
         "--eval-seeds", "3", "--json", str(out)])) == 0
    d = json.loads(out.read_text())
    same, high = d["constants"]["1.0"], d["constants"]["1.5"]
    assert same["rel_cost_vs_model"] == 0.0 and same["wins"] is False
    assert high["rel_cost_vs_model"] > 0 and high["wins"] is False
    assert high["runs"][0]["seed"] == d["model"][0]["seed"] == 3
    assert d["training"] == [] and "ships" not in d  # nothing learned, nothing to ship


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bench_trains_evaluates_and_reports(tmp_path):
    """RLlib PPO on the env end to end (2 tiny iterations): the JSON has the log, both arms on
    the held-out seed, and a verdict that follows from them."""
    import json

    from processes import no_ray_connection
    from scale_ray.cli import main

    no_ray_connection()
    out = tmp_path / "learned.json"
    assert main(["bench", "autoscale-rl", "--horizon-s", "300", "--train-horizon-s", "300",
                 "--iterations", "2", "--batch",
                 "32", "--runners", "0", "--eval-seeds", "4", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert [r["iteration"] for r in d["training"]] == [1, 2]
    assert d["training"][-1]["env_steps"] >= 64
    learned, ours = d["learned"][0], d["model"][0]
    assert learned["seed"] == ours["seed"] == 4
    assert d["rel_cost_vs_model"] == pytest.approx(learned["cost"] / ours["cost"] - 1)
    assert d["ships"] == (learned["cost"] < ours["cost"] and learned["slo_attainment"] >= 0.99)
