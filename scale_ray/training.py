"""Training driver: iterations, logs, checkpoints and the policy artifact of a train config
(docs/training.md). The typed config is :mod:`scale_ray.train_config`; the RLlib algorithm config
built from it, :mod:`scale_ray.rllib_config`.

Layout of a run directory ``OUT``::

    OUT/config.json         the resolved train config (a resumed run reads it back)
    OUT/metrics.csv         one row per iteration (METRIC_COLUMNS)
    OUT/metrics.jsonl       the same rows as JSON lines
    OUT/tb/                 TensorBoard event files (tensorboardX)
    OUT/placement.json      the node of the driver, of every env runner and of every learner
    OUT/checkpoints/iter_000050/ ...  Algorithm checkpoints (every ``run.checkpoint_every`` and last;
                            written atomically, with progress.json: scale_ray.checkpoints)
    OUT/policy/             the policy artifact (policies.artifact)

Resume (``resume=True``) restores the newest complete checkpoint (a newer one left incomplete by
a crash is skipped, and said so): iteration, optimiser, lifetime env steps (so the LR schedule, a
piecewise-linear function of env steps, continues where it was), the SRR learner's iteration
counter (so the ramp continues) and the elapsed training time (``time_s`` continues).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from envs.config import ConfigError, EnvConfig, build, to_dict
from policies import ARTIFACTS_DIR, shipped_policies
from policies.artifact import save_policy

from .checkpoints import (CKPT_DIR, latest_checkpoint, read_progress, remove_partials,
                          save_checkpoint)
from .config import REPO_ROOT, load_env
from .rllib_config import build_algo_config
from .train_config import TrainConfig
from .train_metrics import PROGRESS_LEGEND, MetricsWriter, extract_metrics, progress_line

log = logging.getLogger(__name__)


def ensure_ray(num_cpus: int | None) -> bool:
    """Start an embedded local Ray unless one is connected or RAY_ADDRESS points at a cluster
    (inside ``ray job submit`` the job attaches to its cluster). Returns True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        return True
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True


def apply_learner_threads(cfg: TrainConfig) -> None:
    """Set torch's intra-op threads in this (driver + local learner) process."""
    if cfg.run.learner_threads is not None:
        import torch
        torch.set_num_threads(cfg.run.learner_threads)


def export_policy(algo, cfg: TrainConfig, env: EnvConfig, path: Path, iteration: int,
                  env_steps: float) -> Path:
    """Write the current module as a policy artifact at ``path``."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from policies.rl_modules import export_network

    lg = algo.learner_group
    if lg is not None and lg.is_local:  # the learner's module: the freshest weights
        net = export_network(lg._learner.module[DEFAULT_MODULE_ID])
    elif lg is not None:  # learner actors (all hold the same weights): a CPU copy of the first's
        def _export(learner):
            from policies.rl_modules import export_network as export

            return copy.deepcopy(export(learner.module[DEFAULT_MODULE_ID])).cpu()

        net = next(iter(lg.foreach_learner(_export))).get()
    else:
        net = export_network(algo.get_module(DEFAULT_MODULE_ID))
    common = {"name": cfg.name, "algorithm": cfg.label, "version": f"{cfg.name}-iter{iteration}",
              "iterations": iteration, "env_steps": env_steps, "seed": cfg.run.seed,
              "srr": to_dict(cfg.srr)}
    return save_policy(path, net, {
        **common, "train_servers": env.cluster.servers, "features": env.features,
        "order": env.mdp.order or "hop", "encoder": env.encoder,
        "env": to_dict(env)})  # the encoder settings the policy was trained with (Serve reads them)


def init_path(spec: str) -> Path:
    """``run.init`` -> the artifact directory: a shipped policy's name, a path, or a path
    relative to the repository (``results/student/policy`` from anywhere)."""
    if spec in shipped_policies():
        return ARTIFACTS_DIR / spec
    p = Path(spec)
    if p.exists() or p.is_absolute() or not (REPO_ROOT / p).exists():
        return p
    return REPO_ROOT / p


def init_weights(algo, spec: str) -> str:
    """Load the network of policy artifact ``spec`` into the learner(s) and the env runners
    (``run.init``: PPO fine-tuning). Every parameter must match by name and shape, or
    ConfigError names ``run.init`` and the mismatch. Returns a line for the log."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    from policies.artifact import load_network

    net, meta = load_network(init_path(spec))
    lg = algo.learner_group
    weights = lg.get_weights()
    mine = weights[DEFAULT_MODULE_ID]
    theirs = {f"net.{k}": v for k, v in net.state_dict().items()}
    missing = sorted(set(mine) - set(theirs))
    extra = sorted(set(theirs) - set(mine))
    bad = [k for k in theirs if k in mine and tuple(theirs[k].shape) != tuple(mine[k].shape)]
    if missing or extra or bad:
        raise ConfigError(f"run.init: {spec!r} ({meta.get('algorithm')}, {net.kind}) does not "
                          f"match the module being trained: missing {missing[:3]}, unexpected "
                          f"{extra[:3]}, other shapes {bad[:3]} (same network and model sizes "
                          f"and task features needed)")
    for k, v in theirs.items():
        t = v.detach().cpu()
        mine[k] = t.numpy() if not isinstance(mine[k], torch.Tensor) else t.to(mine[k].dtype)
    lg.set_weights(weights)
    if algo.env_runner_group is not None:
        algo.env_runner_group.sync_weights(from_worker_or_learner_group=lg, inference_only=True)
    return (f"{spec} ({meta.get('algorithm')}, version {meta.get('version')}, "
            f"{len(theirs)} tensors)")


def record_placement(algo, out: Path) -> dict[str, Any]:
    """Write ``OUT/placement.json``: the Ray node id of the driver, of each remote env runner and
    of each learner (the driver's for a local learner), and each learner's GPU ids."""
    import ray

    def where(*_args) -> dict[str, Any]:
        import ray as _ray

        ctx = _ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]}

    runners = []
    group = algo.env_runner_group
    if group is not None and group.num_remote_env_runners() > 0:
        runners = [r["node_id"] for r in group.foreach_env_runner(where, local_env_runner=False)]
    learners = []
    if algo.learner_group is not None:
        learners = [r.get() for r in algo.learner_group.foreach_learner(where)]
    doc = {"driver": ray.get_runtime_context().get_node_id(), "env_runners": runners,
           "learners": [lr["node_id"] for lr in learners],
           "learner_gpu_ids": [lr["gpu_ids"] for lr in learners],
           "learners_remote": bool(algo.learner_group is not None and algo.learner_group.is_remote)}
    (out / "placement.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _run_config(cfg: TrainConfig, env: EnvConfig, out: Path, iterations: int | None,
                resume: bool) -> tuple[TrainConfig, EnvConfig, int]:
    """(train config, env, LR-schedule iterations) of the run: a resumed run's saved ones, else
    the given ones, saved to ``out/config.json``."""
    cfg_file = out / "config.json"
    if resume and cfg_file.exists():
        saved = json.loads(cfg_file.read_text())
        cfg = build(TrainConfig, saved["train"], "train")
        env = load_env(saved["env"])
        return cfg, env, int(saved.get("schedule_iterations", cfg.run.iterations))
    schedule_iterations = iterations or cfg.run.iterations
    out.mkdir(parents=True, exist_ok=True)
    saved_env = to_dict(env)
    cfg_file.write_text(json.dumps({"train": to_dict(cfg), "env": saved_env,
                                    "schedule_iterations": schedule_iterations}, indent=2))
    return cfg, env, schedule_iterations


def _build_algo(cfg: TrainConfig, env: EnvConfig, schedule_iterations: int, out: Path,
                ckpt: Path | None, echo: Callable[[str], None]):
    """The RLlib algorithm, restored from ``ckpt`` or with the initial weights, its placement
    recorded (``out/placement.json``) and reported when actors are remote."""
    algo_cfg = build_algo_config(cfg, env, schedule_iterations)
    t_build = time.perf_counter()
    algo = algo_cfg.build_algo()
    remove_partials(out)
    if ckpt is not None:
        algo.restore_from_path(str(ckpt.resolve()))
        echo(f"resumed from {ckpt} at iteration {algo.iteration}")
    elif cfg.run.init is not None:
        echo(f"initial weights: {init_weights(algo, cfg.run.init)}")
    log.info("algorithm built in %.1f s", time.perf_counter() - t_build)
    placement = record_placement(algo, out)
    if placement["env_runners"] or placement["learners_remote"]:
        echo(f"placement: {len(placement['env_runners'])} env runner(s) on "
             f"{len(set(placement['env_runners']))} node(s), {len(placement['learners'])} "
             f"learner actor(s) on {len(set(placement['learners']))} node(s) "
             f"({out / 'placement.json'})")
    return algo


def _time_offset(ckpt: Path | None, writer: MetricsWriter) -> float:
    """Where ``time_s`` continues after a resume: the checkpoint's elapsed time (older
    checkpoints: the metrics row of its iteration); 0 for a new run."""
    if ckpt is None:
        return 0.0
    offset = float(read_progress(ckpt).get("time_s", math.nan))
    if math.isnan(offset):
        offset = writer.last("time_s")
    return 0.0 if math.isnan(offset) else offset


def train(cfg: TrainConfig, env: EnvConfig, out: str | Path, iterations: int | None = None,
          resume: bool = False, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) training; returns a summary dict. ``iterations`` overrides
    ``run.iterations`` (the stopping point and the length of the LR schedule). A resumed run keeps
    the schedule of the run it continues; ``iterations`` then only moves the stopping point."""
    out = Path(out)
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    ckpt = latest_checkpoint(out, report=echo) if resume else None
    if resume and ckpt is None:
        raise ValueError(f"--resume: no complete checkpoint under {out / CKPT_DIR}")
    cfg, env, schedule_iterations = _run_config(cfg, env, out, iterations, resume)
    stop_at = iterations or schedule_iterations
    apply_learner_threads(cfg)
    started_ray = ensure_ray(cfg.run.num_cpus)
    writer = None
    algo = None
    try:
        algo = _build_algo(cfg, env, schedule_iterations, out, ckpt, echo)
        writer = MetricsWriter(out, resumed_at=int(algo.iteration) if ckpt is not None else None)
        time_offset = _time_offset(ckpt, writer)
        t0 = time.perf_counter()
        row: dict[str, float] = {}
        last_saved = None
        max_steps = cfg.run.max_env_steps
        env_steps = writer.last("env_steps") if ckpt is not None else 0.0
        elapsed = time_offset

        def save(it: int) -> Path:
            return save_checkpoint(algo, out, it, {"time_s": elapsed, "env_steps": env_steps})

        def steps_left() -> bool:
            return max_steps is None or not env_steps >= max_steps  # nan (no row): go on

        echo(PROGRESS_LEGEND)
        while algo.iteration < stop_at and steps_left():
            result = algo.train()
            it = int(algo.iteration)
            elapsed = time_offset + (time.perf_counter() - t0)
            row = extract_metrics(result, it, elapsed)
            env_steps = row["env_steps"]
            writer.write(row)
            echo(progress_line(row, stop_at))
            if it % cfg.run.checkpoint_every == 0 or it >= stop_at or not steps_left():
                last_saved = save(it)
        if last_saved is None and algo.iteration > 0:
            last_saved = save(int(algo.iteration))
        artifact = export_policy(algo, cfg, env, out / "policy", int(algo.iteration), env_steps)
        echo(f"policy artifact: {artifact}; before serving it: scale-ray eval --gate --policy "
             f"{artifact} (Serve refuses a learned policy never checked against EFT)")
        return {"iterations": int(algo.iteration), "checkpoint": str(last_saved) if last_saved else None,
                "policy": str(artifact), "last": row}
    finally:
        if writer is not None:
            writer.close()
        if algo is not None:
            algo.stop()
        if started_ray:
            import ray
            ray.shutdown()
