"""`scale-ray reproduce`: gap statistics by hand, the run lock, and a smoke run of the whole pipeline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scale_ray.reproduce.budgets import BUDGETS, METHODS, table4_policies
from scale_ray.reproduce.report import gaps, mean_ci, paired_matrix
from scale_ray.reproduce.runs import finished, run_lock


def test_mean_ci_matches_hand_computation():
    m, ci = mean_ci([0.05, 0.10, 0.12])
    sd = math.sqrt(((0.05 - 0.09) ** 2 + (0.10 - 0.09) ** 2 + (0.12 - 0.09) ** 2) / 2)
    assert m == pytest.approx(0.09) and ci == pytest.approx(4.303 * sd / math.sqrt(3))
    assert math.isnan(mean_ci([0.1])[1])


def test_gap_is_per_seed_pair():
    rows = [{"label": "SCALE/s1", "servers": 48, "mean_task_response_s": 6.0, "completed_tasks": 90.0},
            {"label": "SCALE/s2", "servers": 48, "mean_task_response_s": 7.0, "completed_tasks": 100.0},
            {"label": "CrossAttn/s1", "servers": 48, "mean_task_response_s": 6.5, "completed_tasks": 100.0},
            {"label": "CrossAttn/s2", "servers": 48, "mean_task_response_s": 7.0, "completed_tasks": 100.0},
            {"label": "eft", "servers": 48, "mean_task_response_s": 5.0, "completed_tasks": 100.0}]
    g = gaps(rows, BUDGETS["smoke"].__class__(**{**BUDGETS["smoke"].__dict__, "sizes": (48,)}))["48"]
    assert g["gap_per_seed"] == pytest.approx([1 - 6.0 / 6.5, 0.0])
    assert g["scale_mean"] == pytest.approx(6.5) and g["scale_vs_eft"] == pytest.approx(0.3)
    assert g["completed_vs_eft"] == pytest.approx({"SCALE/s1": -0.1, "SCALE/s2": 0.0,
                                                   "CrossAttn/s1": 0.0, "CrossAttn/s2": 0.0})


def test_a_run_is_finished_by_iterations_or_by_its_env_step_budget():
    assert finished({"iterations": 1000, "env_steps": 1.02e6}, 1000, None)
    assert not finished({"iterations": 999, "env_steps": 1.5e6}, 1000, None)  # PPO: iterations
    assert finished({"iterations": 640, "env_steps": 1_024_100}, 1000, 1_024_000)  # SAC: steps
    assert not finished({"iterations": 640, "env_steps": 1_000_000}, 1000, 1_024_000)
    assert not finished({"iterations": 640, "env_steps": None}, 1000, 1_024_000)


def test_table4_runs_every_size_free_method():
    budget = BUDGETS["paper"]
    policies = {(m.name, s): f"{m.name}/{s}" for m in METHODS
                for s in (budget.seeds if m.main else budget.other_seeds)}
    assert table4_policies(METHODS, budget, policies) == [
        "SCALE/42", "SCALE/43", "SCALE/44", "CrossAttn/42", "CrossAttn/43", "CrossAttn/44",
        "DQN/42", "SAC/42"]  # not PPO / PPO+SRR: fixed N = 16


def test_paired_matrix_flags_unequal_completed_tasks():
    paired = [{"label": "SCALE/s42", "servers": 16, "mean_rel_diff": 0.005, "ci95_half_width": 0.0032,
               "completed_rel_diff": 0.0},
              {"label": "SCALE/s42", "servers": 1024, "mean_rel_diff": -0.03, "ci95_half_width": 0.01,
               "completed_rel_diff": -0.21},
              {"label": "heft", "servers": 16, "mean_rel_diff": 0.0004, "ci95_half_width": 0.0038,
               "completed_rel_diff": 0.0}]
    lines = paired_matrix(paired)
    assert lines[0] == "| policy | N = 16 | N = 1024 |"
    assert lines[2] == "| SCALE/s42 | +0.50 ± 0.32 | -3.00 ± 1.00 † |"
    assert lines[3] == "| heft | +0.04 ± 0.38 | – |"


@pytest.mark.slow
def test_smoke_budget_end_to_end(tmp_path):
    from scale_ray.reproduce.pipeline import run

    res = run("smoke", tmp_path, echo=lambda s: None, methods=["SCALE", "CrossAttn"])
    assert {r["method"] for r in res["runs"]} == {"SCALE", "CrossAttn"}
    assert {r["servers"] for r in res["table4"]} == {16, 48}
    # fewer episodes where the budget caps them (N=48), the budget's count elsewhere
    assert {(r["servers"], r["episodes"]) for r in res["table4"]} == {(16, 2), (48, 1)}
    assert "1 at N = 48" in (tmp_path / "results.md").read_text()
    assert res["table5"] and all(r["mean_kl"] >= 0 for r in res["table5"])
    for f in ("results.json", "results.md", "fig6_training.png", "response_vs_n.png"):
        assert (tmp_path / f).stat().st_size > 0
    md = (tmp_path / "results.md").read_text()
    assert "Table 4" in md and "masked at inference" in md
    # every evaluation that lists EFT also has its paired differences, the masked one included
    assert {p["servers"] for p in res["table4_masked_paired"]} == {16, 48}
    assert {r["label"] for r in res["table4_masked"]} >= {"SCALE/s42", "CrossAttn/s42", "eft"}
    assert res["robust_tiers_masked"] and res["robust_dynamics_masked"]
    json.loads((tmp_path / "results.json").read_text())
    # a run's wall time is reported once, as recorded in its run directory
    for r in res["runs"]:
        assert r["wall_s"] == pytest.approx(float((Path(r["run_dir"]) / "wall_s.txt").read_text()),
                                            abs=0.06)
    # a second call reuses the finished runs instead of training again
    res2 = run("smoke", tmp_path, echo=lambda s: None, methods=["SCALE"], sizes=[16])
    assert res2["runs"][0]["resumed"] is False and res2["runs"][0]["iterations"] == 1
    assert {r["servers"] for r in res2["table4"]} == {16} and res2["budget"]["sizes"] == [16]


def test_run_lock_refuses_a_second_trainer_and_takes_over_a_stale_one(tmp_path):
    with run_lock(tmp_path / "r"):
        assert (tmp_path / "r" / "train.lock").read_text() == str(os.getpid())
        with pytest.raises(RuntimeError, match=r"is being trained by process \d+"):
            with run_lock(tmp_path / "r"):
                pass
    assert not (tmp_path / "r" / "train.lock").exists()
    # a lock left by a process that is gone is taken over
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "r" / "train.lock").write_text(dead)
    with run_lock(tmp_path / "r"):
        assert (tmp_path / "r" / "train.lock").read_text() == str(os.getpid())


def test_a_run_another_live_process_trains_is_skipped_not_waited_for(tmp_path):
    from scale_ray.reproduce.runs import train_one

    scale = next(m for m in METHODS if m.name == "SCALE")
    run_dir = tmp_path / "runs" / "scale_s42"
    run_dir.mkdir(parents=True)
    (run_dir / "train.lock").write_text(str(os.getppid()))  # alive, and not us
    lines: list[str] = []
    assert train_one(scale, 42, BUDGETS["smoke"], tmp_path, lines.append, skip_busy=True) is None
    assert "being trained by another process" in lines[-1]
    assert not (run_dir / "policy").exists()
    with pytest.raises(RuntimeError, match="is being trained by process"):
        train_one(scale, 42, BUDGETS["smoke"], tmp_path, lines.append)


@pytest.mark.slow
def test_jobs_2_trains_the_runs_in_two_processes(tmp_path):
    from scale_ray.reproduce.pipeline import run

    lines: list[str] = []
    res = run("smoke", tmp_path, echo=lines.append, methods=["SCALE", "CrossAttn"],
              train_only=True, jobs=2)
    assert [(r["method"], r["seed"], r["iterations"]) for r in res["runs"]] == [
        ("SCALE", 42, 1), ("CrossAttn", 42, 1)]
    assert any("training helper started" in s for s in lines)
    assert not any("exited with status" in s for s in lines)
    # this process trained one run and left the other to its helper (which needs a few
    # seconds to start, less than one training takes)
    assert sum(" training to " in s for s in lines) == 1
    assert not list(tmp_path.glob("runs/*/train.lock"))


def test_env_config_reaches_training_and_a_run_of_another_env_is_refused(tmp_path):
    """`reproduce --env-config` trains in that env; a run directory trained in another env is
    refused before training (a resume would silently train on in the saved env)."""
    from dataclasses import replace

    from envs.config import to_dict
    from scale_ray.config import load_env
    from scale_ray.reproduce.runs import same_env, train_one

    scale = next(m for m in METHODS if m.name == "SCALE")
    run_dir = tmp_path / "runs" / "scale_s42"
    run_dir.mkdir(parents=True)
    paper = to_dict(load_env("configs/env/paper.yaml"))
    (run_dir / "config.json").write_text(json.dumps({"train": {}, "env": paper}))
    same_env(run_dir, load_env("configs/env/paper.yaml"))  # the same env: accepted
    regime = replace(BUDGETS["smoke"], env_config="configs/env/paper_regime.yaml")
    with pytest.raises(ValueError, match="--env-config: .* trained in another environment"):
        train_one(scale, 42, regime, tmp_path, lambda s: None)
    assert not (run_dir / "policy").exists()
    assert load_env("configs/env/paper_regime.yaml").mdp.max_decisions == 12


def test_reproduce_names_a_bad_env_config_before_training(tmp_path):
    from scale_ray.reproduce.pipeline import run

    with pytest.raises(Exception, match="no_such_env"):
        run("smoke", tmp_path, echo=lambda s: None, methods=["SCALE"],
            env_config="configs/env/no_such_env.yaml")
    assert not (tmp_path / "runs").exists()
