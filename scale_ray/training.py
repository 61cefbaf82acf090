"""Training driver: typed train config -> RLlib algorithm config -> iterations, logs, checkpoints,
policy artifact (DESIGN.md §4, paper Table 2).

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

Scale-out uses RLlib's own knobs (``learners`` and ``rollout`` sections): env runner actors with
``rollout.num_cpus_per_env_runner`` CPUs each, and ``learners.num_learners`` learner actors
(0: one learner in the driver) with ``num_gpus_per_learner`` / ``num_cpus_per_learner`` each.
``ppo.steps_per_iteration`` (and the DQN/SAC train batch) stays the whole batch of an iteration;
each learner trains on its share.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from envs.config import ConfigError, EnvConfig, build, rng, to_dict
from envs.encoding import TASK_DIM, task_dim
from policies.networks import ModelConfig
from policies.srr import SrrConfig

from .checkpoints import (CKPT_DIR, latest_checkpoint, read_progress, remove_partials,
                          save_checkpoint)
from .config import load_env, read_yaml, resolve_config_path
from .train_metrics import (COMPLETED_KEY, INVALID_KEY, METRIC_COLUMNS, RESPONSE_KEY,  # noqa: F401
                            MetricsWriter, extract_metrics, progress_line)

log = logging.getLogger(__name__)



# --------------------------------------------------------------------------------------------
# Typed train config
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PPOSection:
    """PPO hyperparameters (paper Table 2)."""
    lr: float = field(default=3e-4, metadata=rng(gt=0, le=1, doc="initial learning rate"))
    lr_final: float = field(default=0.0, metadata=rng(ge=0, le=1, doc="cosine end value"))
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    lr_points: int = field(default=16, metadata=rng(ge=2, le=1000, doc="points of the cosine"))
    gamma: float = field(default=0.99, metadata=rng(ge=0, le=1))
    lambda_: float = field(default=0.95, metadata=rng(ge=0, le=1, doc="GAE λ"))
    clip_param: float = field(default=0.2, metadata=rng(gt=0, le=1))
    entropy_coeff: float = field(default=0.01, metadata=rng(ge=0))
    vf_loss_coeff: float = field(default=0.5, metadata=rng(ge=0))
    vf_clip_param: float = field(default=10.0, metadata=rng(gt=0))
    grad_clip: float = field(default=0.5, metadata=rng(gt=0))
    steps_per_iteration: int = field(default=1024, metadata=rng(ge=2, doc="train batch (env steps)"))
    minibatch_size: int = field(default=256, metadata=rng(ge=2))
    num_epochs: int = field(default=8, metadata=rng(ge=1, le=1000))


@dataclass(frozen=True)
class DQNSection:
    """Dueling double DQN (RLlib DQN)."""
    lr: float = field(default=3e-4, metadata=rng(gt=0, le=1))
    gamma: float = field(default=0.99, metadata=rng(ge=0, le=1))
    steps_per_iteration: int = field(default=1024, metadata=rng(ge=1, doc="env steps sampled per iteration"))
    train_batch_size: int = field(default=256, metadata=rng(ge=2))
    replay_capacity: int = field(default=100_000, metadata=rng(ge=100))
    num_steps_sampled_before_learning_starts: int = field(default=1000, metadata=rng(ge=0))
    target_network_update_freq: int = field(default=2000, metadata=rng(ge=1))
    epsilon_start: float = field(default=1.0, metadata=rng(ge=0, le=1))
    epsilon_end: float = field(default=0.05, metadata=rng(ge=0, le=1))
    epsilon_steps: int = field(default=100_000, metadata=rng(ge=1))
    grad_clip: float = field(default=0.5, metadata=rng(gt=0))
    training_intensity: float | None = field(default=None, metadata=rng(gt=0))


@dataclass(frozen=True)
class SACSection:
    """Discrete SAC (RLlib SAC)."""
    actor_lr: float = field(default=3e-4, metadata=rng(gt=0, le=1))
    critic_lr: float = field(default=3e-4, metadata=rng(gt=0, le=1))
    alpha_lr: float = field(default=3e-4, metadata=rng(gt=0, le=1))
    gamma: float = field(default=0.99, metadata=rng(ge=0, le=1))
    tau: float = field(default=0.005, metadata=rng(gt=0, le=1))
    initial_alpha: float = field(default=0.1, metadata=rng(gt=0))
    target_entropy: float = field(default=0.5, metadata=rng(doc="nats; masking changes |A|"))
    steps_per_iteration: int = field(default=1024, metadata=rng(ge=1))
    train_batch_size: int = field(default=256, metadata=rng(ge=2))
    replay_capacity: int = field(default=100_000, metadata=rng(ge=100))
    num_steps_sampled_before_learning_starts: int = field(default=1000, metadata=rng(ge=0))
    grad_clip: float = field(default=0.5, metadata=rng(gt=0))
    training_intensity: float | None = field(default=None, metadata=rng(gt=0))


@dataclass(frozen=True)
class RolloutSection:
    """Env runners (default sized for 2 cores: one runner process with 4 vectorised envs = the
    paper's 4 parallel environments, the learner in the driver)."""
    num_env_runners: int = field(default=1, metadata=rng(ge=0, le=1024, doc=(
        "env runner actors; 0: sample in the driver")))
    num_envs_per_env_runner: int = field(default=4, metadata=rng(ge=1, le=1024))
    num_cpus_per_env_runner: float = field(default=1.0, metadata=rng(ge=0, le=1024, doc=(
        "CPUs Ray reserves for each env runner actor (placement: a node must have them free)")))
    rollout_fragment_length: int | None = field(default=None, metadata=rng(
        ge=1, doc="default: steps_per_iteration / (runners × envs)"))


@dataclass(frozen=True)
class LearnersSection:
    """RLlib learners (``AlgorithmConfig.learners``). 0 learners: one learner inside the driver
    process (the default, right for 2 cores); k >= 1: k learner actors that Ray places on any
    node with the resources free, training data-parallel on equal shares of each batch (with
    GPUs: one or more GPUs each)."""
    num_learners: int = field(default=0, metadata=rng(ge=0, le=1024, doc=(
        "learner actors; 0: the learner runs in the driver")))
    num_gpus_per_learner: float = field(default=0.0, metadata=rng(ge=0, le=64, doc=(
        "GPUs of each learner (fractions below 1 share a GPU; above 1 a whole number)")))
    num_cpus_per_learner: float | None = field(default=None, metadata=rng(ge=0, le=1024, doc=(
        "CPUs of each learner actor; none: RLlib's auto (1 without a GPU, 0 with one)")))

    def __post_init__(self) -> None:
        g = self.num_gpus_per_learner
        if g > 1 and g != int(g):
            raise ConfigError(f"learners.num_gpus_per_learner: {g} is out of range; allowed: a "
                              f"fraction in [0, 1] or a whole number of GPUs (Ray's rule)")


@dataclass(frozen=True)
class RunSection:
    """Length, seed, logging and checkpoints."""
    iterations: int = field(default=1000, metadata=rng(ge=1))
    seed: int = field(default=42, metadata=rng(ge=0))
    checkpoint_every: int = field(default=50, metadata=rng(ge=1))
    max_env_steps: int | None = field(default=None, metadata=rng(ge=1, doc=(
        "also stop once this many env steps are sampled (DQN and SAC sample a varying number "
        "per iteration: equal budgets are equal env steps); none: iterations alone")))
    out_dir: str = "runs/scale"
    num_cpus: int | None = field(default=None, metadata=rng(ge=1, doc="embedded Ray CPUs"))
    metrics_window: int = field(default=20, metadata=rng(ge=1, doc="episodes averaged in metrics"))
    learner_threads: int | None = field(default=1, metadata=rng(ge=1, le=1024, doc=(
        "torch intra-op threads of the driver/learner; none: torch's default. Tiny networks gain "
        "nothing from a thread pool, and on 2 busy cores 2 threads made an iteration 5x slower")))


@dataclass(frozen=True)
class TrainConfig:
    """A training run (``configs/train/*.yaml``)."""
    name: str = "scale"
    algorithm: Literal["ppo", "dqn", "sac"] = "ppo"
    network: Literal["crossattn", "mlp"] = "crossattn"
    env: Any = "configs/env/paper.yaml"  # a path or an env mapping (validated by load_env)
    model: ModelConfig = ModelConfig()
    srr: SrrConfig = SrrConfig(enabled=False)
    ppo: PPOSection = PPOSection()
    dqn: DQNSection = DQNSection()
    sac: SACSection = SACSection()
    rollout: RolloutSection = RolloutSection()
    learners: LearnersSection = LearnersSection()
    run: RunSection = RunSection()

    @property
    def label(self) -> str:
        """Algorithm label of the artifact: ppo, ppo+srr, dqn, sac."""
        if self.algorithm == "ppo" and self.srr.enabled:
            return "ppo+srr"
        return self.algorithm

    @property
    def steps_per_iteration(self) -> int:
        return getattr(self, self.algorithm).steps_per_iteration


def load_train_config(source: str | Path | Mapping[str, Any],
                      overrides: Mapping[str, Any] | None = None) -> tuple[TrainConfig, EnvConfig]:
    """(TrainConfig, EnvConfig) from a YAML path or mapping plus nested overrides."""
    from envs.config import merge

    data = dict(source) if isinstance(source, Mapping) else read_yaml(resolve_config_path(source))
    if overrides:
        if isinstance(overrides.get("env"), Mapping) and isinstance(data.get("env", "configs/env/paper.yaml"), str):
            data["env"] = {"file": data.get("env", "configs/env/paper.yaml")}  # inherit, then override
        data = merge(data, overrides)
    cfg = build(TrainConfig, data, "train")
    env = load_env(cfg.env)
    if cfg.network == "mlp" and env.dynamics.events:
        raise ConfigError("train.network: the structured MLP needs a fixed server set (no dynamics.events)")
    return cfg, env


def cosine_lr(lr0: float, lr_final: float, total_steps: int, points: int = 16) -> list[list[float]]:
    """Cosine decay from ``lr0`` to ``lr_final`` over ``total_steps`` env steps as ``points``
    ``[t, v]`` pairs (RLlib interpolates linearly between them; a schedule of env steps survives
    checkpoint/restore, unlike a torch LR scheduler)."""
    out = []
    for k in range(points):
        frac = k / (points - 1)
        out.append([int(round(frac * total_steps)),
                    lr_final + 0.5 * (lr0 - lr_final) * (1.0 + math.cos(math.pi * frac))])
    return out


# --------------------------------------------------------------------------------------------
# RLlib config
# --------------------------------------------------------------------------------------------

def _episode_metrics_callback():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class EpisodeMetricsCallback(RLlibCallback):
        """Logs the simulator's episode metrics (final step's info["episode_metrics"])."""

        def on_episode_end(self, *, episode, metrics_logger=None, **kwargs) -> None:
            if metrics_logger is None:
                return
            try:
                info = episode.get_infos(-1)
            except (IndexError, KeyError, AttributeError):
                return
            m = (info or {}).get("episode_metrics")
            if not m:
                return
            for key, src in ((RESPONSE_KEY, "mean_response_s"), (COMPLETED_KEY, "completed_tasks"),
                             (INVALID_KEY, "invalid_rate")):
                v = m.get(src)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    metrics_logger.log_value(key, float(v), window=20)

    return EpisodeMetricsCallback


def build_algo_config(cfg: TrainConfig, env: EnvConfig, total_iterations: int | None = None):
    """The RLlib AlgorithmConfig of a train config (new API stack)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from envs.gym_env import register_rllib
    from policies.rl_modules import MODULES

    env_name = register_rllib()
    env_config = {**to_dict(env), "seed": cfg.run.seed}
    iterations = total_iterations or cfg.run.iterations
    ro = cfg.rollout
    n_envs = max(1, ro.num_env_runners) * ro.num_envs_per_env_runner
    frag = ro.rollout_fragment_length or max(1, cfg.steps_per_iteration // n_envs)
    model_cfg = {"network": cfg.network, **to_dict(cfg.model)}
    # the task embedding's input width follows the env's observation (features.backlog: 7)
    width = task_dim(env.features)
    if cfg.model.task_features not in (TASK_DIM, width):
        raise ConfigError(f"model.task_features: {cfg.model.task_features} does not match the "
                          f"env's task features ({width}); leave it out, it is set from the env")
    model_cfg["task_features"] = width
    k = max(1, cfg.learners.num_learners)

    def per_learner(total: int, key: str) -> int:
        """Each learner's share of a batch of ``total`` (the config keeps the whole batch)."""
        if total % k or total // k < 2:
            raise ConfigError(f"{key}: {total} is not divisible into learners.num_learners = {k} "
                              f"equal shares of at least 2; allowed: a multiple of {k}")
        return total // k

    if cfg.algorithm == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        from policies.learner import SrrPPOLearner

        p = cfg.ppo
        lr = (cosine_lr(p.lr, p.lr_final, iterations * p.steps_per_iteration, p.lr_points)
              if p.lr_schedule == "cosine" else p.lr)
        ac = (PPOConfig()
              .training(lr=lr, gamma=p.gamma, lambda_=p.lambda_, clip_param=p.clip_param,
                        entropy_coeff=p.entropy_coeff, vf_loss_coeff=p.vf_loss_coeff,
                        vf_clip_param=p.vf_clip_param, grad_clip=p.grad_clip,
                        grad_clip_by="global_norm", use_kl_loss=False,
                        train_batch_size_per_learner=per_learner(p.steps_per_iteration,
                                                                 "ppo.steps_per_iteration"),
                        minibatch_size=p.minibatch_size, num_epochs=p.num_epochs)
              .learners(learner_class=SrrPPOLearner, learner_config_dict={"srr": to_dict(cfg.srr)}))
    elif cfg.algorithm == "dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        q = cfg.dqn
        model_cfg.update(dueling=True, double_q=True, num_atoms=1,
                         epsilon=[[0, q.epsilon_start], [q.epsilon_steps, q.epsilon_end]])
        ac = (DQNConfig()
              .training(lr=q.lr, gamma=q.gamma,
                        train_batch_size_per_learner=per_learner(q.train_batch_size, "dqn.train_batch_size"),
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                              "capacity": q.replay_capacity,
                                              "alpha": 0.6, "beta": 0.4},
                        num_steps_sampled_before_learning_starts=q.num_steps_sampled_before_learning_starts,
                        target_network_update_freq=q.target_network_update_freq,
                        double_q=True, dueling=True, n_step=1, grad_clip=q.grad_clip,
                        grad_clip_by="global_norm", training_intensity=q.training_intensity,
                        epsilon=[[0, q.epsilon_start], [q.epsilon_steps, q.epsilon_end]])
              .reporting(min_sample_timesteps_per_iteration=q.steps_per_iteration))
    else:
        from ray.rllib.algorithms.sac import SACConfig

        s = cfg.sac
        model_cfg.update(twin_q=True)
        ac = (SACConfig()
              .training(actor_lr=s.actor_lr, critic_lr=s.critic_lr, alpha_lr=s.alpha_lr,
                        gamma=s.gamma, tau=s.tau, initial_alpha=s.initial_alpha,
                        target_entropy=s.target_entropy, twin_q=True,
                        train_batch_size_per_learner=per_learner(s.train_batch_size, "sac.train_batch_size"),
                        replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                              "capacity": s.replay_capacity,
                                              "alpha": 0.6, "beta": 0.4},
                        num_steps_sampled_before_learning_starts=s.num_steps_sampled_before_learning_starts,
                        grad_clip=s.grad_clip, grad_clip_by="global_norm", n_step=1,
                        training_intensity=s.training_intensity)
              .reporting(min_sample_timesteps_per_iteration=s.steps_per_iteration))
    ac = (ac.environment(env_name, env_config=env_config)
          .env_runners(num_env_runners=ro.num_env_runners,
                       num_envs_per_env_runner=ro.num_envs_per_env_runner,
                       num_cpus_per_env_runner=ro.num_cpus_per_env_runner,
                       rollout_fragment_length=frag)
          .rl_module(rl_module_spec=RLModuleSpec(module_class=MODULES[cfg.algorithm],
                                                 model_config=model_cfg))
          .callbacks(_episode_metrics_callback())
          .reporting(metrics_num_episodes_for_smoothing=cfg.run.metrics_window)
          .fault_tolerance(restart_failed_env_runners=False)  # fail fast, never hang
          .debugging(seed=cfg.run.seed, log_level="WARN")
          .framework("torch"))
    lr_ = cfg.learners
    ac = ac.learners(num_learners=lr_.num_learners, num_gpus_per_learner=lr_.num_gpus_per_learner,
                     num_cpus_per_learner=("auto" if lr_.num_cpus_per_learner is None
                                           else lr_.num_cpus_per_learner))
    return ac


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

def _ensure_ray(num_cpus: int | None) -> bool:
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

    from policies.artifact import save_policy
    from policies.rl_modules import export_network

    lg = algo.learner_group
    if lg is not None and lg.is_local:  # the learner's module: the freshest weights
        net = export_network(lg._learner.module[DEFAULT_MODULE_ID])
    elif lg is not None:  # learner actors (all hold the same weights): a CPU copy of the first's
        def _export(learner):
            import copy

            from policies.rl_modules import export_network as export

            return copy.deepcopy(export(learner.module[DEFAULT_MODULE_ID])).cpu()

        net = next(iter(lg.foreach_learner(_export))).get()
    else:
        net = export_network(algo.get_module(DEFAULT_MODULE_ID))
    return save_policy(path, net, {
        "name": cfg.name, "algorithm": cfg.label, "train_servers": env.cluster.servers,
        "features": env.features, "version": f"{cfg.name}-iter{iteration}",
        "iterations": iteration, "env_steps": env_steps, "seed": cfg.run.seed,
        "first_level": env.mdp.first_level, "srr": to_dict(cfg.srr),
        "env": to_dict(env)})  # the encoder settings the policy was trained with (Serve reads them)


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
    cfg_file = out / "config.json"
    if resume and cfg_file.exists():
        saved = json.loads(cfg_file.read_text())
        cfg = build(TrainConfig, saved["train"], "train")
        env = load_env(saved["env"])
        schedule_iterations = int(saved.get("schedule_iterations", cfg.run.iterations))
    else:
        schedule_iterations = iterations or cfg.run.iterations
        out.mkdir(parents=True, exist_ok=True)
        cfg_file.write_text(json.dumps({"train": to_dict(cfg), "env": to_dict(env),
                                        "schedule_iterations": schedule_iterations}, indent=2))
    stop_at = iterations or schedule_iterations
    apply_learner_threads(cfg)
    started_ray = _ensure_ray(cfg.run.num_cpus)
    writer = None
    algo = None
    try:
        algo_cfg = build_algo_config(cfg, env, schedule_iterations)
        t_build = time.perf_counter()
        algo = algo_cfg.build_algo()
        remove_partials(out)
        if ckpt is not None:
            algo.restore_from_path(str(ckpt.resolve()))
            echo(f"resumed from {ckpt} at iteration {algo.iteration}")
        log.info("algorithm built in %.1f s", time.perf_counter() - t_build)
        placement = record_placement(algo, out)
        if placement["env_runners"] or placement["learners_remote"]:
            echo(f"placement: {len(placement['env_runners'])} env runner(s) on "
                 f"{len(set(placement['env_runners']))} node(s), {len(placement['learners'])} "
                 f"learner actor(s) on {len(set(placement['learners']))} node(s) "
                 f"({out / 'placement.json'})")
        writer = MetricsWriter(out, resumed_at=int(algo.iteration) if ckpt is not None else None)
        # time_s continues after a resume: the checkpoint's elapsed time (older checkpoints: the
        # metrics row of its iteration)
        progress = read_progress(ckpt) if ckpt is not None else {}
        time_offset = float(progress.get("time_s", math.nan)) if ckpt is not None else 0.0
        if math.isnan(time_offset):
            time_offset = writer.last("time_s")
            time_offset = 0.0 if math.isnan(time_offset) else time_offset
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
        echo(f"policy artifact: {artifact}")
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
