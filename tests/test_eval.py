"""`scale-ray eval`: JSON schema, fixed seeds, in-process and Ray-parallel runs agree."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from scale_ray.evaluation import ROW_KEYS, evaluate, run_episode
from scale_ray.config import load_env

SHORT = ["workload.horizon_s=20"]


def test_eval_cli_json_schema(tmp_path):
    out = tmp_path / "r.json"
    traces = tmp_path / "traces"
    p = subprocess.run([sys.executable, "-m", "scale_ray.cli", "eval", "--policy", "eft", "random",
                        "--servers", "4", "8", "--episodes", "2", "--workers", "1",
                        "--set", "workload.horizon_s=20", "--json", str(out),
                        "--trace-dir", str(traces)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "eft" in p.stdout and "random" in p.stdout
    res = json.loads(out.read_text())["results"]
    assert [(r["policy"], r["servers"]) for r in res] == [("eft", 4), ("eft", 8), ("random", 4), ("random", 8)]
    for r in res:
        assert set(ROW_KEYS) <= set(r) and r["episodes"] == 2
        assert r["mean_task_response_s"] > 0 and 0 < r["utilization"] <= 1
    assert len(list(traces.glob("*.jsonl"))) == 8


def test_trace_recomputes_eval_metrics(tmp_path):
    from envs.trace import read_trace, verify_trace

    env = load_env(None, SHORT, servers=8)
    m = run_episode(env, "heft", 0, 3, tmp_path / "t.jsonl")
    re = verify_trace(read_trace(tmp_path / "t.jsonl"))
    for key in ("mean_task_response_s", "p95_task_response_s", "mean_workflow_response_s", "slowdown", "utilization"):
        assert m[key] == pytest.approx(re[key], rel=1e-9)


def test_fixed_seeds_are_common_across_policies_and_reproducible():
    env = load_env(None, SHORT)
    a = run_episode(env.with_servers(8), "eft", 1, 0)
    b = run_episode(env.with_servers(8), "eft", 1, 0)
    c = run_episode(env.with_servers(8), "random", 1, 0)
    assert a["mean_task_response_s"] == b["mean_task_response_s"]
    assert a["arrived_tasks"] == c["arrived_tasks"]  # same workload under another policy


def _episode_key(e: dict) -> tuple:
    return (e["policy"], e["servers"], e["episode"])


def _untimed(episodes: list[dict]) -> list[dict]:
    """Per-episode metrics without the wall-clock time, in a fixed order."""
    return [{k: v for k, v in e.items() if k != "wall_s"} for e in sorted(episodes, key=_episode_key)]


def _assert_same_episodes(a: list[dict], b: list[dict]) -> None:
    a, b = _untimed(a), _untimed(b)
    assert len(a) == len(b) and [_episode_key(e) for e in a] == [_episode_key(e) for e in b]
    for ea, eb in zip(a, b, strict=True):
        assert ea.keys() == eb.keys()
        for k in ea:  # exactly equal (nan == nan)
            va, vb = ea[k], eb[k]
            assert va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb)), (
                _episode_key(ea), k, va, vb)


@pytest.mark.slow
def test_ray_parallel_equals_in_process():
    env = load_env(None, SHORT)
    rows1, eps1 = evaluate(env, ["eft", "heft"], [8], 3, base_seed=5, workers=1)
    rows2, eps2 = evaluate(env, ["eft", "heft"], [8], 3, base_seed=5, workers=2)
    assert len(rows1) == len(rows2) == 2
    for r1, r2 in zip(rows1, rows2, strict=True):
        for k in ROW_KEYS:
            v1, v2 = r1[k], r2[k]
            assert v1 == v2 or (isinstance(v1, float) and math.isnan(v1) and math.isnan(v2)), k
    _assert_same_episodes(eps1, eps2)
    assert len(eps1) == 6


def test_lockstep_slicing_gives_the_sequential_episodes_for_trained_policies(tmp_path):
    """A learned policy's episodes are the same whether they run one by one (run_episode), in
    lockstep all together, or in lockstep slices of other sizes (what --workers changes): the
    batched scoring never changes a decision."""
    from policies.artifact import save_untrained
    from scale_ray.evaluation import Job, _run_jobs

    env = load_env(None, ["workload.horizon_s=40"])
    untrained = str(save_untrained(tmp_path / "u", seed=4))
    for spec in ("scale", untrained):
        for n in (16, 48):
            cfg = env.with_servers(n)
            seq = [run_episode(cfg, spec, k, 3) for k in range(6)]
            for m in seq:
                m.update(policy=spec, servers=n)
            for slicing in (((0, 1, 2, 3, 4, 5),), ((0, 1, 2), (3, 4), (5,)), ((4, 1), (0, 5, 3, 2))):
                got = _run_jobs(env, [Job(spec, n, sl) for sl in slicing], 3, None)
                _assert_same_episodes(seq, got)


@pytest.mark.slow
def test_trained_policy_evaluation_does_not_depend_on_workers(tmp_path):
    """The same `scale-ray eval` of a trained and an untrained artifact gives the same per-episode
    metrics with --workers 1 (one lockstep batch of all episodes, in process) and --workers 2 (Ray
    tasks of 2-episode slices)."""
    from policies.artifact import save_untrained

    env = load_env(None, ["workload.horizon_s=40"])
    specs = ["scale", str(save_untrained(tmp_path / "u", seed=4))]
    rows1, eps1 = evaluate(env, specs, [16, 48], 8, base_seed=1, workers=1)
    rows2, eps2 = evaluate(env, specs, [16, 48], 8, base_seed=1, workers=2)
    assert len(eps1) == len(eps2) == 2 * 2 * 8
    _assert_same_episodes(eps1, eps2)
    assert len(rows1) == len(rows2) == 4
    for r1, r2 in zip(rows1, rows2, strict=True):
        assert r1 == r2 or all(r1[k] == r2[k] or (isinstance(r1[k], float) and math.isnan(r1[k])
                                                   and math.isnan(r2[k])) for k in r1)


def test_paired_differences_against_hand_computation():
    from scale_ray.evaluation import paired_differences

    eps = [{"policy": "eft", "servers": 16, "episode": k, "mean_task_response_s": v}
           for k, v in enumerate([4.0, 5.0, 8.0])]
    eps += [{"policy": "a", "servers": 16, "episode": k, "mean_task_response_s": v}
            for k, v in enumerate([3.0, 5.5, 8.0])]
    eps += [{"policy": "a", "servers": 48, "episode": 0, "mean_task_response_s": 1.0}]  # no reference
    (row,) = paired_differences(eps, "eft", "task")  # the paper's metric, by name
    d = np.array([3.0 / 4.0 - 1, 5.5 / 5.0 - 1, 0.0])
    assert row["policy"] == "a" and row["servers"] == 16 and row["episodes"] == 3
    assert row["mean_rel_diff"] == pytest.approx(d.mean())
    # the 95 % t-interval: t_{0.975, 2} = 4.3027 (not the normal 1.96)
    assert row["ci95_half_width"] == pytest.approx(4.302652729911275 * d.std(ddof=1) / np.sqrt(3))
    assert (row["better"], row["worse"]) == (1, 1)
    assert math.isnan(row["completed_rel_diff"])  # no completed_tasks given


def test_ci95_half_width_is_the_t_interval():
    from scipy import stats

    from scale_ray.evaluation import ci95_half_width

    rng = np.random.default_rng(0)
    for n in (2, 5, 30, 200):
        x = rng.normal(size=n)
        lo, hi = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x))
        assert ci95_half_width(x) == pytest.approx((hi - lo) / 2, rel=1e-12)
    assert math.isnan(ci95_half_width([1.0])) and math.isnan(ci95_half_width([]))


def test_paired_output_flags_unequal_completed_tasks():
    from scale_ray.evaluation import format_paired, paired_differences

    eps = [{"policy": p, "servers": 16, "episode": k, "mean_task_response_s": 4.0 + k,
            "completed_tasks": done, "censored_task_response_s": cens * (4.0 + k)}
           for p, done, cens in (("eft", 100, 1.0), ("a", 90, 1.5), ("b", 100, 1.0)) for k in range(2)]
    rows = paired_differences(eps, "eft", "task")
    by = {r["policy"]: r for r in rows}
    assert by["a"]["completed_rel_diff"] == pytest.approx(-0.1)
    assert by["b"]["completed_rel_diff"] == 0.0
    # the censored mean (every arrived task) is 50% higher in both episodes: comparable
    assert by["a"]["censored_rel_diff"] == pytest.approx(0.5)
    assert by["a"]["censored_ci95_half_width"] == pytest.approx(0.0, abs=1e-12)
    text = format_paired(rows).splitlines()
    assert "completed tasks -10.0 % lower: not comparable; on everything that arrived (censored) +50.00 % higher" in text[1]
    assert "not comparable" not in text[2]


def test_paired_vs_must_be_an_evaluated_policy():
    import argparse

    from scale_ray.commands import eval as eval_cmd

    p = argparse.ArgumentParser()
    eval_cmd.add_arguments(p)
    args = p.parse_args(["--policy", "eft", "--paired-vs", "heft", "--workers", "1"])
    with pytest.raises(ValueError, match="--paired-vs"):
        eval_cmd.run(args)


def test_policy_labels_tell_artifacts_apart():
    from scale_ray.evaluation import policy_labels

    got = policy_labels(["eft", "runs/a/policy", "runs/b/policy", "/x/y/scale", "eft"])
    assert got == {"eft": "eft", "runs/a/policy": "a/policy", "runs/b/policy": "b/policy",
                   "/x/y/scale": "scale"}
    got = policy_labels(["runs/a/policy", "sample:runs/a/policy", "sample:runs/b/policy", "sample:scale"])
    assert got == {"runs/a/policy": "policy", "sample:runs/a/policy": "sample:a/policy",
                   "sample:runs/b/policy": "sample:b/policy", "sample:scale": "sample:scale"}


def test_sampled_evaluation_is_reproducible_per_episode_and_differs_from_greedy(tmp_path):
    from policies.artifact import save_untrained

    untrained = str(save_untrained(tmp_path / "untrained", seed=1))  # diffuse: samples differ
    env = load_env(None, SHORT)
    rows_a, eps_a = evaluate(env, [f"sample:{untrained}", untrained], [8], 3, base_seed=2, workers=1)
    rows_b, _ = evaluate(env, [f"sample:{untrained}"], [8], 3, base_seed=2, workers=1)
    assert rows_a[0]["mean_task_response_s"] == rows_b[0]["mean_task_response_s"]
    sampled = [e for e in eps_a if e["policy"].startswith("sample:")]
    greedy = [e for e in eps_a if not e["policy"].startswith("sample:")]
    assert [e["arrived_tasks"] for e in sampled] == [e["arrived_tasks"] for e in greedy]
    assert [e["mean_task_response_s"] for e in sampled] != [e["mean_task_response_s"] for e in greedy]
