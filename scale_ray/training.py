"""Training driver: typed train config -> RLlib algorithm config -> iterations, logs, checkpoints,
policy artifact (DESIGN.md §4, paper Table 2).

Layout of a run directory ``OUT``::

    OUT/config.json         the resolved train config (a resumed run reads it back)
    OUT/metrics.csv         one row per iteration (METRIC_COLUMNS)
    OUT/metrics.jsonl       the same rows as JSON lines
    OUT/tb/                 TensorBoard event files (tensorboardX)
    OUT/checkpoints/iter_000050/ ...  Algorithm checkpoints (every ``run.checkpoint_every`` and last)
    OUT/policy/             the policy artifact (policies.artifact)

Resume (``resume=True``) restores the newest checkpoint: iteration, optimiser, lifetime env steps
(so the LR schedule, a piecewise-linear function of env steps, continues where it was) and the
SRR learner's iteration counter (so the ramp continues).
"""

from __future__ import annotations

import csv
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

from .config import load_env, read_yaml, resolve_config_path

log = logging.getLogger(__name__)

RESPONSE_KEY = "scale/mean_response_s"
COMPLETED_KEY = "scale/completed_tasks"
INVALID_KEY = "scale/invalid_rate"


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
    num_env_runners: int = field(default=1, metadata=rng(ge=0, le=1024))
    num_envs_per_env_runner: int = field(default=4, metadata=rng(ge=1, le=1024))
    num_cpus_per_env_runner: float = field(default=1.0, metadata=rng(ge=0))
    rollout_fragment_length: int | None = field(default=None, metadata=rng(
        ge=1, doc="default: steps_per_iteration / (runners × envs)"))


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
                        train_batch_size_per_learner=p.steps_per_iteration,
                        minibatch_size=p.minibatch_size, num_epochs=p.num_epochs)
              .learners(num_learners=0, num_gpus_per_learner=0, learner_class=SrrPPOLearner,
                        learner_config_dict={"srr": to_dict(cfg.srr)}))
    elif cfg.algorithm == "dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        q = cfg.dqn
        model_cfg.update(dueling=True, double_q=True, num_atoms=1,
                         epsilon=[[0, q.epsilon_start], [q.epsilon_steps, q.epsilon_end]])
        ac = (DQNConfig()
              .training(lr=q.lr, gamma=q.gamma, train_batch_size_per_learner=q.train_batch_size,
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
                        train_batch_size_per_learner=s.train_batch_size,
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
    if cfg.algorithm != "ppo":
        ac = ac.learners(num_learners=0, num_gpus_per_learner=0)
    return ac


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

METRIC_COLUMNS = ("iteration", "env_steps", "time_s", "iter_s", "episodes", "episode_return",
                  "mean_response_s", "completed_tasks", "invalid_rate", "lr", "total_loss",
                  "policy_loss", "vf_loss", "entropy", "srr_decorrelation", "srr_kl", "srr_ramp",
                  "z_mean_abs_offdiag_cov", "z_mean_kl", "qf_loss", "alpha")


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def extract_metrics(result: Mapping[str, Any], iteration: int, elapsed_s: float) -> dict[str, float]:
    """One row of METRIC_COLUMNS from an RLlib result dict."""
    from policies.learner import SRR_DEC, SRR_KL, SRR_RAMP, Z_KL, Z_OFFDIAG

    er = result.get("env_runners", {}) or {}
    lrn = (result.get("learners", {}) or {}).get("default_policy", {}) or {}
    lr = lrn.get("default_optimizer_learning_rate", lrn.get("curr_lr"))
    return {
        "iteration": iteration,
        "env_steps": _num(result.get("num_env_steps_sampled_lifetime",
                                     er.get("num_env_steps_sampled_lifetime"))),
        "time_s": elapsed_s,
        "iter_s": _num(result.get("time_this_iter_s")),
        "episodes": _num(er.get("num_episodes_lifetime")),
        "episode_return": _num(er.get("episode_return_mean")),
        "mean_response_s": _num(er.get(RESPONSE_KEY)),
        "completed_tasks": _num(er.get(COMPLETED_KEY)),
        "invalid_rate": _num(er.get(INVALID_KEY)),
        "lr": _num(lr),
        "total_loss": _num(lrn.get("total_loss")),
        "policy_loss": _num(lrn.get("policy_loss")),
        "vf_loss": _num(lrn.get("vf_loss")),
        "entropy": _num(lrn.get("entropy")),
        "srr_decorrelation": _num(lrn.get(SRR_DEC)),
        "srr_kl": _num(lrn.get(SRR_KL)),
        "srr_ramp": _num(lrn.get(SRR_RAMP)),
        "z_mean_abs_offdiag_cov": _num(lrn.get(Z_OFFDIAG)),
        "z_mean_kl": _num(lrn.get(Z_KL)),
        "qf_loss": _num(lrn.get("qf_loss")),
        "alpha": _num(lrn.get("alpha_value")),
    }


def progress_line(row: Mapping[str, float], total: int) -> str:
    def f(key: str, fmt: str) -> str:
        v = row.get(key, math.nan)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    return (f"iter {row['iteration']:>4}/{total} steps {f('env_steps', '.0f')} "
            f"({f('iter_s', '.1f')}s) return {f('episode_return', '.2f')} "
            f"resp {f('mean_response_s', '.2f')}s lr {f('lr', '.2e')} loss {f('total_loss', '.3f')} "
            f"pi {f('policy_loss', '.3f')} vf {f('vf_loss', '.3f')} ent {f('entropy', '.3f')} "
            f"srr[dec {f('srr_decorrelation', '.3f')} kl {f('srr_kl', '.3f')} "
            f"ramp {f('srr_ramp', '.2f')}]")


class MetricsWriter:
    """Appends rows to metrics.csv / metrics.jsonl and TensorBoard scalars. ``resumed_at``: the
    iteration of the checkpoint a resumed run starts from; rows after it (written by the
    interrupted run, about to be trained again) are dropped first, so every iteration has one
    row."""

    def __init__(self, out: Path, resumed_at: int | None = None):
        self.csv_path = out / "metrics.csv"
        self.json_path = out / "metrics.jsonl"
        if resumed_at is not None:
            self._drop_after(resumed_at)
        new = not self.csv_path.exists()
        self._csv = self.csv_path.open("a", newline="")
        self._w = csv.DictWriter(self._csv, fieldnames=METRIC_COLUMNS)
        if new:
            self._w.writeheader()
        self._json = self.json_path.open("a")
        try:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(str(out / "tb"))
        except ImportError:  # pragma: no cover - tensorboardX ships with ray[rllib]
            self._tb = None

    def _drop_after(self, iteration: int) -> None:
        if self.csv_path.exists():
            with self.csv_path.open(newline="") as f:
                rows = list(csv.DictReader(f))
            with self.csv_path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=METRIC_COLUMNS)
                w.writeheader()
                w.writerows(r for r in rows if int(float(r["iteration"])) <= iteration)
        if self.json_path.exists():
            lines = [ln for ln in self.json_path.read_text().splitlines() if ln.strip()]
            self.json_path.write_text("".join(
                ln + "\n" for ln in lines if int(json.loads(ln)["iteration"]) <= iteration))

    def last(self, key: str) -> float:
        """``key`` of the last row written (after a resume: of the checkpoint's iteration)."""
        if not self.csv_path.exists():
            return math.nan
        with self.csv_path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        return _num(rows[-1][key]) if rows else math.nan

    def write(self, row: Mapping[str, float]) -> None:
        self._w.writerow({k: row.get(k) for k in METRIC_COLUMNS})
        self._csv.flush()
        self._json.write(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                                     for k, v in row.items()}) + "\n")
        self._json.flush()
        if self._tb is not None:
            step = int(row["iteration"])
            for k, v in row.items():
                if k != "iteration" and isinstance(v, (int, float)) and not math.isnan(v):
                    self._tb.add_scalar(f"train/{k}", v, step)
            self._tb.flush()

    def close(self) -> None:
        self._csv.close()
        self._json.close()
        if self._tb is not None:
            self._tb.close()


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

CKPT_DIR = "checkpoints"


def latest_checkpoint(out: Path) -> Path | None:
    ckpts = sorted((out / CKPT_DIR).glob("iter_*"))
    ckpts = [c for c in ckpts if (c / "algorithm_state.pkl").exists() or (c / "rllib_checkpoint.json").exists()]
    return ckpts[-1] if ckpts else None


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

    module = None
    lg = algo.learner_group
    if lg is not None and lg.is_local:  # the learner's module: the freshest weights
        module = lg._learner.module[DEFAULT_MODULE_ID]
    if module is None:
        module = algo.get_module(DEFAULT_MODULE_ID)
    net = export_network(module)
    return save_policy(path, net, {
        "name": cfg.name, "algorithm": cfg.label, "train_servers": env.cluster.servers,
        "features": env.features, "version": f"{cfg.name}-iter{iteration}",
        "iterations": iteration, "env_steps": env_steps, "seed": cfg.run.seed,
        "first_level": env.mdp.first_level, "srr": to_dict(cfg.srr),
        "env": to_dict(env)})  # the encoder settings the policy was trained with (Serve reads them)


def train(cfg: TrainConfig, env: EnvConfig, out: str | Path, iterations: int | None = None,
          resume: bool = False, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) training; returns a summary dict. ``iterations`` overrides
    ``run.iterations`` (the stopping point and the length of the LR schedule). A resumed run keeps
    the schedule of the run it continues; ``iterations`` then only moves the stopping point."""
    out = Path(out)
    echo = echo or (lambda s: print(s, file=sys.stderr, flush=True))
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None:
        raise ValueError(f"--resume: no checkpoint under {out / CKPT_DIR}")
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
        if ckpt is not None:
            algo.restore_from_path(str(ckpt.resolve()))
            echo(f"resumed from {ckpt} at iteration {algo.iteration}")
        log.info("algorithm built in %.1f s", time.perf_counter() - t_build)
        writer = MetricsWriter(out, resumed_at=int(algo.iteration) if ckpt is not None else None)
        t0 = time.perf_counter()
        row: dict[str, float] = {}
        last_saved = None
        max_steps = cfg.run.max_env_steps
        env_steps = writer.last("env_steps") if ckpt is not None else 0.0

        def steps_left() -> bool:
            return max_steps is None or not env_steps >= max_steps  # nan (no row): go on

        while algo.iteration < stop_at and steps_left():
            result = algo.train()
            it = int(algo.iteration)
            row = extract_metrics(result, it, time.perf_counter() - t0)
            env_steps = row["env_steps"]
            writer.write(row)
            echo(progress_line(row, stop_at))
            if it % cfg.run.checkpoint_every == 0 or it >= stop_at or not steps_left():
                last_saved = out / CKPT_DIR / f"iter_{it:06d}"
                algo.save_to_path(str(last_saved.resolve()))
        if last_saved is None and algo.iteration > 0:
            last_saved = out / CKPT_DIR / f"iter_{int(algo.iteration):06d}"
            algo.save_to_path(str(last_saved.resolve()))
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
