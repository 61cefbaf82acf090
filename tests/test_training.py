"""Training driver: config validation, the LR schedule, and (slow) one-iteration smoke runs per
algorithm config with checkpoint, exact resume, export, artifact load at N=48 and one evaluation
episode; plus the same run submitted with `ray job submit` to a `ray start --head` cluster."""

from __future__ import annotations

import csv
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from processes import stop_own, wait_for_port

from envs.config import ConfigError, replace
from scale_ray.config import REPO_ROOT, load_env
from scale_ray.ports import free_port
from scale_ray.train_config import cosine_lr, load_train_config

CONFIGS = ["scale", "crossattn", "ppo_mlp", "ppo_mlp_srr", "dqn", "sac", "scale_realistic",
           "crossattn_realistic", "scale_realistic_backlog", "scale_next_event"]
# A tiny setting for smoke runs: short episodes, small batches.
SMALL = {"env": {"workload": {"horizon_s": 15.0}},
         "ppo": {"steps_per_iteration": 128, "minibatch_size": 64, "num_epochs": 1},
         "dqn": {"steps_per_iteration": 64, "train_batch_size": 16,
                 "num_steps_sampled_before_learning_starts": 32},
         "sac": {"steps_per_iteration": 64, "train_batch_size": 16,
                 "num_steps_sampled_before_learning_starts": 32},
         "rollout": {"num_env_runners": 0, "num_envs_per_env_runner": 2},
         "srr": {"ramp_start": 0, "ramp_end": 4},
         "run": {"checkpoint_every": 1}}


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_validate(name):
    cfg, env = load_train_config(REPO_ROOT / "configs" / "train" / f"{name}.yaml")
    assert cfg.run.seed == 42 and cfg.run.iterations == 1000
    assert env.cluster.servers == 16
    if cfg.algorithm == "ppo":
        p = cfg.ppo
        assert (p.lr, p.gamma, p.lambda_, p.clip_param, p.entropy_coeff, p.grad_clip) == (
            3e-4, 0.99, 0.95, 0.2, 0.01, 0.5)
        assert (p.steps_per_iteration, p.minibatch_size, p.num_epochs) == (1024, 256, 8)
    assert cfg.label == {"scale": "ppo+srr", "crossattn": "ppo", "ppo_mlp": "ppo",
                         "ppo_mlp_srr": "ppo+srr", "dqn": "dqn", "sac": "sac",
                         "scale_realistic": "ppo+srr", "crossattn_realistic": "ppo",
                         "scale_realistic_backlog": "ppo+srr", "scale_next_event": "ppo+srr"}[name]


def test_bad_train_config_names_the_key():
    with pytest.raises(ConfigError, match="train.ppo.clip_param"):
        load_train_config({"ppo": {"clip_param": -1}})
    with pytest.raises(ConfigError, match="unknown key train.ppo.lrr"):
        load_train_config({"ppo": {"lrr": 1}})
    with pytest.raises(ConfigError, match="train.algorithm"):
        load_train_config({"algorithm": "a2c"})
    with pytest.raises(ConfigError, match="env.workload.horizon_s"):
        load_train_config({}, {"env": {"workload": {"horizon_s": -5}}})


def test_fine_tuning_config_validates_and_is_ppo_only():
    cfg, env = load_train_config(REPO_ROOT / "configs" / "train" / "student_ppo.yaml")
    assert cfg.run.init == "results/student/policy" and cfg.label == "ppo+srr"
    assert cfg.ppo.lr == 3e-5 and env.mdp.transfer_delays_start
    with pytest.raises(ConfigError, match="run.init: fine-tuning from an artifact is for "
                                          "algorithm ppo, not 'dqn'"):
        load_train_config(REPO_ROOT / "configs" / "train" / "dqn.yaml", {"run": {"init": "scale"}})


@pytest.mark.slow
def test_fine_tuning_starts_from_the_artifact_weights(tmp_path, local_ray):
    """run.init loads the artifact into the learner and the env runners: with a negligible
    learning rate the exported policy still holds the artifact's weights; a network of another
    shape is refused, naming run.init."""
    import torch

    from policies.artifact import load_network
    from scale_ray.training import train

    small = {**SMALL, "ppo": {**SMALL["ppo"], "lr": 1e-12, "lr_final": 0.0},
             "run": {**SMALL["run"], "init": "scale"}}
    cfg, env = load_train_config(REPO_ROOT / "configs" / "train" / "scale_realistic.yaml", small)
    lines: list[str] = []
    train(cfg, env, tmp_path / "ft", iterations=1, echo=lines.append)
    assert any(s.startswith("initial weights: scale (ppo+srr") for s in lines)
    want = load_network(REPO_ROOT / "policies" / "artifacts" / "scale")[0].state_dict()
    got = load_network(tmp_path / "ft" / "policy")[0].state_dict()
    assert set(want) == set(got)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=0)
    bigger = {**small, "model": {"d_model": 32}}
    cfg, env = load_train_config(REPO_ROOT / "configs" / "train" / "scale_realistic.yaml", bigger)
    with pytest.raises(ConfigError, match="run.init: 'scale'.*does not match"):
        train(cfg, env, tmp_path / "bad", iterations=1, echo=lines.append)


def test_scale_out_knobs_are_validated():
    cfg, _ = load_train_config({"learners": {"num_learners": 2, "num_gpus_per_learner": 0.5,
                                             "num_cpus_per_learner": 3},
                                "rollout": {"num_cpus_per_env_runner": 2}})
    assert (cfg.learners.num_learners, cfg.learners.num_gpus_per_learner,
            cfg.learners.num_cpus_per_learner, cfg.rollout.num_cpus_per_env_runner) == (2, 0.5, 3.0, 2.0)
    assert load_train_config({})[0].learners.num_cpus_per_learner is None  # RLlib's auto
    with pytest.raises(ConfigError, match=r"unknown key train.learners.num_learner; allowed keys"):
        load_train_config({"learners": {"num_learner": 1}})
    with pytest.raises(ConfigError, match=r"train.learners.num_learners: -1 is out of range; allowed: >= 0"):
        load_train_config({"learners": {"num_learners": -1}})
    with pytest.raises(ConfigError, match=r"train.learners.num_learners: expected an integer"):
        load_train_config({"learners": {"num_learners": 1.5}})
    with pytest.raises(ConfigError, match=r"learners.num_gpus_per_learner: 1.5 is out of range; "
                                          r"allowed: a fraction in \[0, 1\] or a whole number"):
        load_train_config({"learners": {"num_gpus_per_learner": 1.5}})
    with pytest.raises(ConfigError, match=r"train.learners.num_cpus_per_learner: -1.0 is out of range"):
        load_train_config({"learners": {"num_cpus_per_learner": -1}})
    with pytest.raises(ConfigError, match=r"train.rollout.num_cpus_per_env_runner: -0.5 is out of range; "
                                          r"allowed: >= 0 and <= 1024"):
        load_train_config({"rollout": {"num_cpus_per_env_runner": -0.5}})


@pytest.mark.parametrize("algorithm", ["ppo", "dqn", "sac"])
def test_scale_out_knobs_reach_rllib(algorithm):
    """learners.* and rollout.num_cpus_per_env_runner set RLlib's own fields (no hard-coded
    num_learners=0); the config's batch stays the whole batch, split over the learners."""
    from scale_ray.rllib_config import build_algo_config

    name = {"ppo": "scale", "dqn": "dqn", "sac": "sac"}[algorithm]
    cfg, env = load_train_config(REPO_ROOT / f"configs/train/{name}.yaml", {
        "learners": {"num_learners": 2, "num_gpus_per_learner": 1, "num_cpus_per_learner": 3},
        "rollout": {"num_env_runners": 2, "num_cpus_per_env_runner": 2.5}})
    ac = build_algo_config(cfg, env)
    assert (ac.num_learners, ac.num_gpus_per_learner, ac.num_cpus_per_learner) == (2, 1, 3)
    assert (ac.num_env_runners, ac.num_cpus_per_env_runner) == (2, 2.5)
    whole = cfg.ppo.steps_per_iteration if algorithm == "ppo" else getattr(cfg, algorithm).train_batch_size
    assert ac.train_batch_size_per_learner == whole // 2
    if algorithm == "ppo":
        assert ac.learner_class.__name__ == "SrrPPOLearner"  # still the SRR learner
    default = build_algo_config(*load_train_config(REPO_ROOT / f"configs/train/{name}.yaml"))
    assert (default.num_learners, default.num_gpus_per_learner, default.num_cpus_per_learner) == (0, 0, "auto")
    cfg, env = load_train_config(REPO_ROOT / "configs/train/scale.yaml",
                                 {"learners": {"num_learners": 3}})
    with pytest.raises(ConfigError, match=r"ppo.steps_per_iteration: 1024 is not divisible into "
                                          r"learners.num_learners = 3 equal shares"):
        build_algo_config(cfg, env)


def test_task_embedding_width_follows_the_env():
    from scale_ray.rllib_config import build_algo_config

    cfg, env = load_train_config(REPO_ROOT / "configs/train/scale_realistic_backlog.yaml")
    assert env.features.backlog
    ac = build_algo_config(cfg, env)
    assert ac.rl_module_spec.model_config["task_features"] == 7
    cfg, env = load_train_config(REPO_ROOT / "configs/train/scale_realistic_backlog.yaml",
                                 {"model": {"task_features": 6}})
    with pytest.raises(ConfigError, match="model.task_features: 6"):
        build_algo_config(cfg, env)


def test_cosine_lr_schedule():
    pts = cosine_lr(3e-4, 0.0, 1_024_000, 16)
    assert len(pts) == 16 and pts[0] == [0, 3e-4] and pts[-1][0] == 1_024_000
    assert pts[-1][1] == pytest.approx(0.0, abs=1e-12)
    vals = [v for _, v in pts]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    mid = np.interp(512_000, [t for t, _ in pts], vals)
    assert mid == pytest.approx(1.5e-4, rel=0.02)


# ----------------------------------------------------------------------------- slow smoke runs

@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    import ray

    tmp = tmp_path_factory.mktemp("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=str(tmp),
             log_to_driver=False)
    yield
    ray.shutdown()


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_one_iteration_checkpoint_resume_export_evaluate(name, tmp_path, local_ray):
    from policies import load_policy
    from scale_ray.evaluation import run_episode
    from scale_ray.training import train

    cfg, env = load_train_config(REPO_ROOT / "configs" / "train" / f"{name}.yaml", SMALL)
    out = tmp_path / name
    lines: list[str] = []
    first = train(cfg, env, out, iterations=1, echo=lines.append)
    assert first["iterations"] == 1 and Path(first["checkpoint"]).is_dir()
    resumed = train(cfg, env, out, iterations=2, resume=True, echo=lines.append)
    assert resumed["iterations"] == 2
    assert any("resumed from" in s for s in lines) and any(s.startswith("iter    2/2") for s in lines)
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == [1, 2]
    assert float(rows[1]["env_steps"]) > float(rows[0]["env_steps"])
    # time_s continues after the resume (from the checkpoint's progress.json), not from 0
    progress = json.loads((out / "checkpoints" / "iter_000001" / "progress.json").read_text())
    assert progress["time_s"] == float(rows[0]["time_s"]) > 0
    assert float(rows[1]["time_s"]) >= float(rows[0]["time_s"]) + float(rows[1]["iter_s"])
    if cfg.algorithm == "ppo":
        # exact resume: the LR follows the schedule of the run it continues (env steps), and the
        # SRR ramp continues from the restored iteration counter (ramp 0 -> 4: 0, then 0.25)
        pts = cosine_lr(cfg.ppo.lr, cfg.ppo.lr_final, 1 * cfg.ppo.steps_per_iteration, 16)
        for r in rows:
            want = np.interp(float(r["env_steps"]), [t for t, _ in pts], [v for _, v in pts])
            assert float(r["lr"]) == pytest.approx(want, abs=1e-9)
        want_ramp = [0.0, 0.25] if cfg.srr.enabled else [0.0, 0.0]
        assert [float(r["srr_ramp"]) for r in rows] == want_ramp
        for r in rows:
            assert math.isfinite(float(r["srr_decorrelation"])) and math.isfinite(float(r["srr_kl"]))
            assert math.isfinite(float(r["z_mean_abs_offdiag_cov"]))
    meta = json.loads((out / "policy" / "policy.json").read_text())
    assert meta["algorithm"] == cfg.label and meta["iterations"] == 2
    assert (out / "metrics.jsonl").is_file() and list((out / "tb").glob("events.out.tfevents*"))
    pol = load_policy(out / "policy")
    n = 16 if cfg.network == "mlp" else 48
    env_n = load_env(None, {"workload": {"horizon_s": 10.0},
                            "features": {"backlog": env.features.backlog}}, servers=n)
    m = run_episode(env_n, str(out / "policy"), episode=0, base_seed=1)
    assert m["completed_tasks"] > 0 and math.isfinite(m["mean_task_response_s"])
    assert pol.describe()["algorithm"] == cfg.label


def _fake_checkpoint(path: Path, complete: bool = True, progress: dict | None = None) -> Path:
    """The file layout of an RLlib 2.60 PPO checkpoint (as Algorithm.save_to_path writes it)."""
    files = ["algorithm_state.pkl", "class_and_ctor_args.pkl", "rllib_checkpoint.json",
             "env_runner/class_and_ctor_args.pkl", "env_runner/metadata.json", "env_runner/state.pkl",
             "learner_group/class_and_ctor_args.pkl", "learner_group/metadata.json",
             "learner_group/state.pkl", "learner_group/learner/class_and_ctor_args.pkl",
             "learner_group/learner/metadata.json", "learner_group/learner/state.pkl",
             "learner_group/learner/rl_module/class_and_ctor_args.pkl",
             "learner_group/learner/rl_module/metadata.json",
             "learner_group/learner/rl_module/module_state.pkl",
             "learner_group/learner/rl_module/default_policy/class_and_ctor_args.pkl",
             "learner_group/learner/rl_module/default_policy/metadata.json",
             "learner_group/learner/rl_module/default_policy/module_state.pkl"]
    for f in files:
        (path / f).parent.mkdir(parents=True, exist_ok=True)
        (path / f).write_bytes(b"x")
    if progress is not None:
        (path / "progress.json").write_text(json.dumps(progress))
    return path


def test_latest_checkpoint_skips_incomplete_ones_and_says_which(tmp_path):
    from scale_ray.checkpoints import checkpoint_problem, latest_checkpoint

    ck = tmp_path / "checkpoints"
    _fake_checkpoint(ck / "iter_000005", progress={"iteration": 5, "time_s": 12.5})
    _fake_checkpoint(ck / "iter_000010")
    _fake_checkpoint(ck / "iter_000015")
    _fake_checkpoint(ck / ".iter_000020.partial")  # a save interrupted before its rename
    (ck / "iter_000015/learner_group/learner/rl_module/default_policy/module_state.pkl").unlink()
    (ck / "iter_000010/env_runner/state.pkl").unlink()
    said: list[str] = []
    assert latest_checkpoint(tmp_path, report=said.append) == ck / "iter_000005"
    assert said == [
        f"checkpoint {ck / 'iter_000015'} is incomplete (missing "
        "learner_group/learner/rl_module/default_policy/module_state.pkl); skipping it",
        f"checkpoint {ck / 'iter_000010'} is incomplete (missing the state file of env_runner); "
        "skipping it"]
    assert checkpoint_problem(ck / "iter_000005") is None
    (ck / "iter_000005/algorithm_state.pkl").unlink()
    assert checkpoint_problem(ck / "iter_000005") == "missing algorithm_state.pkl"
    assert latest_checkpoint(tmp_path) is None
    # iterations sort numerically, not as strings
    _fake_checkpoint(ck / "iter_1000000")
    _fake_checkpoint(ck / "iter_000999")
    assert latest_checkpoint(tmp_path) == ck / "iter_1000000"
    (ck / "iter_1000000/progress.json").write_text("{cut sh")
    assert "unreadable progress.json" in checkpoint_problem(ck / "iter_1000000")
    assert latest_checkpoint(tmp_path) == ck / "iter_000999"


@pytest.mark.slow
def test_resume_falls_back_to_the_newest_complete_checkpoint(tmp_path, local_ray):
    """A crash while writing the last checkpoint (module_state.pkl missing, a .partial left):
    resume starts from the checkpoint before it, says so, and time_s keeps counting."""
    from scale_ray.training import train

    cfg, env = load_train_config(REPO_ROOT / "configs/train/scale.yaml", SMALL)
    out = tmp_path / "run"
    train(cfg, env, out, iterations=2, echo=lambda s: None)
    ck = out / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["iter_000001", "iter_000002"]  # no .partial left
    (ck / "iter_000002/learner_group/learner/rl_module/default_policy/module_state.pkl").unlink()
    shutil.copytree(ck / "iter_000001", ck / ".iter_000003.partial")
    rows_before = _rows(out)
    lines: list[str] = []
    done = train(cfg, env, out, iterations=3, resume=True, echo=lines.append)
    assert done["iterations"] == 3
    assert (f"checkpoint {ck / 'iter_000002'} is incomplete (missing learner_group/learner/rl_module/"
            f"default_policy/module_state.pkl); skipping it") in lines
    assert f"resumed from {ck / 'iter_000001'} at iteration 1" in lines
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
    assert rows[0] == rows_before[0]  # the rows after the checkpoint were trained again
    t = [float(r["time_s"]) for r in rows]
    assert t[1] >= t[0] + float(rows[1]["iter_s"]) and t[2] > t[1]
    assert not list(ck.glob(".*"))  # the interrupted save was cleaned up
    progress = json.loads((ck / "iter_000003" / "progress.json").read_text())
    assert progress["iteration"] == 3 and progress["time_s"] == t[2]
    assert progress["env_steps"] == float(rows[2]["env_steps"])


@pytest.mark.slow
def test_training_is_deterministic_for_a_seed(tmp_path, local_ray):
    """An uninterrupted run is a function of code, config and seed: the same seed gives the same
    weights bit for bit, another seed other weights (so the seed reaches the run). A resumed run
    is not bit-identical to an uninterrupted one: the episodes in flight are not checkpointed."""
    from scale_ray.training import train

    def weights(seed: int, name: str) -> bytes:
        cfg, env = load_train_config(REPO_ROOT / "configs/train/scale.yaml",
                                     {**SMALL, "run": {**SMALL["run"], "seed": seed}})
        train(cfg, env, tmp_path / name, iterations=3, echo=lambda s: None)
        return (tmp_path / name / "policy" / "weights.pt").read_bytes()

    a, b, c = weights(7, "a"), weights(7, "b"), weights(8, "c")
    assert a == b and a != c
    untimed = [[{k: v for k, v in r.items() if k not in ("time_s", "iter_s")} for r in _rows(tmp_path / x)]
               for x in ("a", "b")]
    assert untimed[0] == untimed[1] and len(untimed[0]) == 3


@pytest.mark.slow
def test_off_policy_training_stops_at_its_env_step_budget(tmp_path, local_ray):
    """DQN/SAC sample a varying number of env steps per iteration: run.max_env_steps stops them
    at the budget (the iterations are a cap), also after a resume."""
    from scale_ray.training import train

    cfg, env = load_train_config(REPO_ROOT / "configs/train/sac.yaml",
                                 {**SMALL, "run": {**SMALL["run"], "max_env_steps": 150}})
    out = tmp_path / "sac"
    first = train(cfg, env, out, iterations=1, echo=lambda s: None)
    assert first["iterations"] == 1
    done = train(cfg, env, out, iterations=100, resume=True, echo=lambda s: None)
    steps = [float(r["env_steps"]) for r in _rows(out)]
    assert steps[-1] >= 150 and all(s < 150 for s in steps[:-1])
    assert done["iterations"] == len(steps) < 100
    meta = json.loads((out / "policy" / "policy.json").read_text())
    assert meta["iterations"] == len(steps) and meta["env_steps"] == steps[-1]


# ----------------------------------------------------------------------------- ray job submit



@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_job_submit_on_a_local_head(tmp_path):
    """`ray job submit --working-dir . -- python -m scale_ray.cli train ...` against a head the
    test starts (own temp dir and ports) and stops (only its own processes)."""
    temp_dir = str(Path("/tmp") / f"scale_job_{os.getpid()}")
    bindir = str(Path(sys.executable).parent)
    # token auth as a user would run it, with this cluster's own token: a fresh machine has no
    # ~/.ray/auth_token, and we never write one there
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    # every port our head opens is chosen here (other clusters may run on this machine)
    ports: set[int] = set()
    while len(ports) < 8:
        ports.add(free_port(exclude=ports))  # outside Ray's worker ports and the ephemeral range
    gcs, dash, client, agent_http, agent_grpc, metrics, runtime_env, node_mgr = sorted(ports)
    head = subprocess.Popen(
        [f"{bindir}/ray", "start", "--head", "--block", "--num-cpus=2", f"--port={gcs}",
         f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", f"--ray-client-server-port={client}",
         f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
         f"--node-manager-port={node_mgr}", f"--temp-dir={temp_dir}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out = tmp_path / "job_run"
    try:
        wait_for_port(dash, [head], "ray head")  # the dashboard (job API)
        sets = ["--set", "env.workload.horizon_s=15", "--set", "ppo.steps_per_iteration=128",
                "--set", "ppo.minibatch_size=64", "--set", "ppo.num_epochs=1",
                "--set", "rollout.num_env_runners=0"]
        cmd = [f"{bindir}/ray", "job", "submit", "--address", f"http://127.0.0.1:{dash}",
               "--working-dir", str(REPO_ROOT),
               "--runtime-env-json", json.dumps({"excludes": [".venv", ".git", "runs", "*.log"]}),
               "--", "python", "-m", "scale_ray.cli", "train", "configs/train/scale.yaml",
               "--iterations", "1", "--out", str(out), *sets]
        for _ in range(20):  # the dashboard answers before its job agent is ready
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
            if "No available agent" not in res.stdout + res.stderr:
                break
            time.sleep(3)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "iter    1/1" in res.stdout + res.stderr
        assert (out / "policy" / "policy.json").is_file()
        from policies import load_policy
        assert load_policy(out / "policy").scores(
            {"task": np.ones(5, np.float32) * 0.1, "servers": np.ones((48, 5), np.float32) * 0.2,
             "action_mask": np.ones(48, np.float32)}).shape == (48,)
    finally:
        stop_own([head], temp_dir)  # the head, then anything of ours left behind


def test_features_command_reports_z_statistics(tmp_path):
    from policies.artifact import save_untrained
    from scale_ray.cli import main

    path = save_untrained(tmp_path / "p", seed=1)
    out = tmp_path / "features.json"
    rc = main(["features", "--policy", str(path), "--servers", "8", "16", "--episodes", "1",
               "--set", "workload.horizon_s=20", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["servers"] for r in rows] == [8, 16]
    for r in rows:
        assert r["decisions"] > 0
        assert math.isfinite(r["mean_abs_offdiag_cov"]) and r["mean_abs_offdiag_cov"] >= 0
        assert math.isfinite(r["mean_kl"]) and r["mean_kl"] >= 0
        assert 0 <= r["mean_abs_corr"] <= 1 and 0 < r["mean_pick_prob"] <= 1
        assert 0 <= r["mean_entropy_norm"] <= 1 and 1 <= r["mean_valid_servers"] <= r["servers"]
    assert main(["features", "--policy", "eft", "--servers", "4"]) == 2  # not a trained artifact
    png = tmp_path / "shift.png"  # the plot of earlier --json files, seeds averaged per label
    assert main(["features", "--plot", str(png), str(out)]) == 0 and png.stat().st_size > 1000
    assert main(["features", "--plot", str(png)]) == 2  # no --json file to plot


def test_pointer_calibration_and_feature_correlation_by_hand():
    import numpy as np

    from scale_ray.features import calibration, mean_abs_corr

    p, h, n = calibration(np.array([0.0, 0.0, -np.inf, 0.0, 0.0]))  # uniform over 4 valid
    assert (p, n) == (0.25, 4) and h == pytest.approx(1.0)
    p, h, n = calibration(np.array([np.log(3.0), 0.0, -np.inf]))  # 3/4 and 1/4
    assert p == pytest.approx(0.75) and n == 2
    assert h == pytest.approx(-(0.75 * np.log(0.75) + 0.25 * np.log(0.25)) / np.log(2))
    assert calibration(np.array([1.0, -np.inf])) == (1.0, 0.0, 1)
    x = np.arange(10.0)
    z = np.stack([x, 2 * x + 1, -x, np.ones(10)], axis=1)  # |corr| 1 among three, 0 with a const
    assert mean_abs_corr(z) == pytest.approx(6 / 12)


def test_metrics_of_an_interrupted_run_are_cut_back_to_the_checkpoint_on_resume(tmp_path):
    """Rows written after the last checkpoint are trained again on resume: keep one per iteration."""
    from scale_ray.train_metrics import MetricsWriter

    w = MetricsWriter(tmp_path)
    for it in range(1, 8):  # checkpoint at 5, interrupted after 7
        w.write({"iteration": it, "env_steps": 100 * it, "total_loss": 0.1 * it})
    w.close()
    w = MetricsWriter(tmp_path, resumed_at=5)
    for it in range(6, 9):
        w.write({"iteration": it, "env_steps": 100 * it, "total_loss": 1.0})
    w.close()
    with (tmp_path / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["iteration"]) for r in rows] == list(range(1, 9))
    assert [float(r["total_loss"]) for r in rows[5:]] == [1.0, 1.0, 1.0]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["iteration"] for ln in lines] == list(range(1, 9))


def test_the_nodes_encoder_trains_the_pointer_network_with_node_features():
    """env.encoder nodes (configs/train/scale_nodes.yaml): the one env, its observation the
    nodes encoder's, the network's input widths that encoder's; only PPO with the
    cross-attention network is accepted."""
    from envs.encoding import NODE_DIM, NODE_TASK_DIM
    from scale_ray.rllib_config import build_algo_config

    cfg, env = load_train_config(REPO_ROOT / "configs/train/scale_nodes.yaml",
                                 {"env": {"workload": {"horizon_s": 30.0},
                                          "cluster": {"servers": 8}}})
    assert env.encoder == "nodes" and env.cluster.servers == 8
    assert env.workload.horizon_s == 30.0 and not env.cluster.slotted
    ac = build_algo_config(cfg, env)
    mc = ac.rl_module_spec.model_config
    assert (mc["task_features"], mc["server_features"]) == (NODE_TASK_DIM, NODE_DIM)
    assert ac.env_config["encoder"] == "nodes" and ac.env_config["cluster"]["servers"] == 8
    for bad in ({"algorithm": "dqn"}, {"network": "mlp"}):
        with pytest.raises(ConfigError, match="encoder: nodes"):
            load_train_config(REPO_ROOT / "configs/train/scale_nodes.yaml", bad)


@pytest.mark.slow
def test_nodes_encoder_training_exports_a_policy_evaluated_guarded_at_any_size(tmp_path,
                                                                               local_ray):
    from policies import get_policy
    from scale_ray.evaluation import run_episode
    from scale_ray.training import train

    overrides = {"env": {"workload": {"horizon_s": 30.0}, "cluster": {"servers": 8}},
                 "ppo": SMALL["ppo"], "run": {"checkpoint_every": 1}}
    cfg, env = load_train_config(REPO_ROOT / "configs/train/scale_nodes.yaml", overrides)
    out = tmp_path / "nodes"
    first = train(cfg, env, out, iterations=1, echo=lambda s: None)
    assert first["iterations"] == 1
    assert train(cfg, env, out, iterations=2, resume=True, echo=lambda s: None)["iterations"] == 2
    meta = json.loads((out / "policy" / "policy.json").read_text())
    assert meta["encoder"] == "nodes" and meta["train_servers"] == 8
    pol = get_policy(str(out / "policy"), env)
    assert pol.encoder == "nodes" and pol.guard is not None
    for n in (8, 32):  # zero-shot on another size: the same network, any number of nodes
        m = run_episode(replace(env, cluster={"servers": n}), str(out / "policy"), 0)
        assert m["completed_tasks"] > 0 and math.isfinite(m["mean_workflow_response_s"])
