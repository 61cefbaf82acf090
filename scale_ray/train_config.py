"""The typed train config (``configs/train/*.yaml``; paper Table 2): one frozen dataclass per
section, validated by :func:`envs.config.build` (unknown keys and out-of-range values raise
:class:`~envs.config.ConfigError` naming the dotted key), and the cosine learning-rate schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from envs.config import ConfigError, EnvConfig, build, merge, rng
from policies.networks import ModelConfig
from policies.srr import SrrConfig

from .config import load_env, read_yaml, resolve_config_path


@dataclass(frozen=True)
class PPOSection:
    """PPO hyperparameters (paper Table 2)."""
    lr: float = field(default=3e-4, metadata=rng(gt=0, le=1, doc="initial learning rate"))
    lr_final: float = field(default=0.0, metadata=rng(ge=0, le=1, doc="cosine end value"))
    lr_schedule: Literal["cosine", "constant"] = field(default="cosine", metadata=rng(
        doc="cosine from lr to lr_final over the run, or constant lr"))
    lr_points: int = field(default=16, metadata=rng(ge=2, le=1000, doc="points of the cosine"))
    gamma: float = field(default=0.99, metadata=rng(ge=0, le=1, doc="discount"))
    lambda_: float = field(default=0.95, metadata=rng(ge=0, le=1, doc="GAE λ"))
    clip_param: float = field(default=0.2, metadata=rng(gt=0, le=1, doc="PPO's ratio clip"))
    entropy_coeff: float = field(default=0.01, metadata=rng(ge=0, doc="entropy bonus"))
    vf_loss_coeff: float = field(default=0.5, metadata=rng(ge=0, doc="value loss weight"))
    vf_clip_param: float = field(default=10.0, metadata=rng(gt=0, doc="value loss clip"))
    grad_clip: float = field(default=0.5, metadata=rng(
        gt=0, doc="gradient norm clip (global norm)"))
    steps_per_iteration: int = field(default=1024, metadata=rng(ge=2, doc="train batch (env steps)"))
    minibatch_size: int = field(default=256, metadata=rng(ge=2, doc="SGD minibatch (env steps)"))
    num_epochs: int = field(default=8, metadata=rng(
        ge=1, le=1000, doc="passes over each train batch"))


@dataclass(frozen=True)
class DQNSection:
    """Dueling double DQN (RLlib DQN)."""
    lr: float = field(default=3e-4, metadata=rng(gt=0, le=1, doc="learning rate"))
    gamma: float = field(default=0.99, metadata=rng(ge=0, le=1, doc="discount"))
    steps_per_iteration: int = field(default=1024, metadata=rng(ge=1, doc="env steps sampled per iteration"))
    train_batch_size: int = field(default=256, metadata=rng(
        ge=2, doc="replayed transitions per SGD step"))
    replay_capacity: int = field(default=100_000, metadata=rng(
        ge=100, doc="replay buffer size, transitions"))
    num_steps_sampled_before_learning_starts: int = field(default=1000, metadata=rng(
        ge=0, doc="env steps sampled before the first update"))
    target_network_update_freq: int = field(default=2000, metadata=rng(
        ge=1, doc="env steps between target network updates"))
    epsilon_start: float = field(default=1.0, metadata=rng(
        ge=0, le=1, doc="exploration epsilon at the start"))
    epsilon_end: float = field(default=0.05, metadata=rng(
        ge=0, le=1, doc="exploration epsilon after epsilon_steps"))
    epsilon_steps: int = field(default=100_000, metadata=rng(
        ge=1, doc="env steps of the linear epsilon decay"))
    grad_clip: float = field(default=0.5, metadata=rng(
        gt=0, doc="gradient norm clip (global norm)"))
    training_intensity: float | None = field(default=None, metadata=rng(
        gt=0, doc="replayed / sampled steps ratio; none: RLlib's natural ratio"))


@dataclass(frozen=True)
class SACSection:
    """Discrete SAC (RLlib SAC)."""
    actor_lr: float = field(default=3e-4, metadata=rng(gt=0, le=1, doc="policy learning rate"))
    critic_lr: float = field(default=3e-4, metadata=rng(gt=0, le=1, doc="Q learning rate"))
    alpha_lr: float = field(default=3e-4, metadata=rng(
        gt=0, le=1, doc="entropy temperature learning rate"))
    gamma: float = field(default=0.99, metadata=rng(ge=0, le=1, doc="discount"))
    tau: float = field(default=0.005, metadata=rng(
        gt=0, le=1, doc="target network soft-update rate"))
    initial_alpha: float = field(default=0.1, metadata=rng(gt=0, doc="initial entropy temperature"))
    target_entropy: float = field(default=0.5, metadata=rng(doc="nats; masking changes |A|"))
    steps_per_iteration: int = field(default=1024, metadata=rng(
        ge=1, doc="env steps sampled per iteration"))
    train_batch_size: int = field(default=256, metadata=rng(
        ge=2, doc="replayed transitions per SGD step"))
    replay_capacity: int = field(default=100_000, metadata=rng(
        ge=100, doc="replay buffer size, transitions"))
    num_steps_sampled_before_learning_starts: int = field(default=1000, metadata=rng(
        ge=0, doc="env steps sampled before the first update"))
    grad_clip: float = field(default=0.5, metadata=rng(
        gt=0, doc="gradient norm clip (global norm)"))
    training_intensity: float | None = field(default=None, metadata=rng(
        gt=0, doc="replayed / sampled steps ratio; none: RLlib's natural ratio"))


@dataclass(frozen=True)
class RolloutSection:
    """Env runners (default sized for 2 cores: one runner process with 4 vectorised envs = the
    paper's 4 parallel environments, the learner in the driver)."""
    num_env_runners: int = field(default=1, metadata=rng(ge=0, le=1024, doc=(
        "env runner actors; 0: sample in the driver")))
    num_envs_per_env_runner: int = field(default=4, metadata=rng(
        ge=1, le=1024, doc="vectorised envs per runner"))
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
    iterations: int = field(default=1000, metadata=rng(ge=1, doc="training iterations"))
    seed: int = field(default=42, metadata=rng(ge=0, doc="seed of the run (envs, weights)"))
    checkpoint_every: int = field(default=50, metadata=rng(
        ge=1, doc="iterations between checkpoints"))
    max_env_steps: int | None = field(default=None, metadata=rng(ge=1, doc=(
        "also stop once this many env steps are sampled (DQN and SAC sample a varying number "
        "per iteration: equal budgets are equal env steps); none: iterations alone")))
    out_dir: str = field(default="runs/scale", metadata=rng(
        doc="where checkpoints, metrics and the artifact go"))
    init: str | None = field(default=None, metadata=rng(doc=(
        "start from a policy artifact's network weights (a shipped name such as student, or a "
        "path; PPO only; module, size and task features must match): fine-tuning. "
        "none: random initial weights")))
    num_cpus: int | None = field(default=None, metadata=rng(ge=1, doc="embedded Ray CPUs"))
    metrics_window: int = field(default=20, metadata=rng(ge=1, doc="episodes averaged in metrics"))
    learner_threads: int | None = field(default=1, metadata=rng(ge=1, le=1024, doc=(
        "torch intra-op threads of the driver/learner; none: torch's default. Tiny networks gain "
        "nothing from a thread pool, and on 2 busy cores 2 threads made an iteration 5x slower")))


@dataclass(frozen=True)
class TrainConfig:
    """A training run (``configs/train/*.yaml``)."""
    name: str = field(default="scale", metadata=rng(
        doc="the run's name (its artifact and output folder)"))
    algorithm: Literal["ppo", "dqn", "sac"] = field(default="ppo", metadata=rng(
        doc="ppo (SCALE, CrossAttn, PPO), dqn or sac (RLlib)"))
    network: Literal["crossattn", "mlp"] = field(default="crossattn", metadata=rng(
        doc="crossattn (the pointer network, any N) or mlp (a fixed server set)"))
    env: Any = field(default="configs/env/paper.yaml", metadata=rng(
        doc="the env config: a YAML path or a mapping (validated by load_env; its cluster "
            "either the paper's servers or Ray nodes, e.g. configs/env/agents.yaml, and its "
            "encoder what the policy sees)"))
    model: ModelConfig = field(default=ModelConfig(), metadata=rng(
        doc="the network's sizes (ModelConfig)"))
    srr: SrrConfig = field(default=SrrConfig(enabled=False), metadata=rng(
        doc="Structured Representation Regularization (SrrConfig); off: CrossAttn"))
    ppo: PPOSection = field(default=PPOSection(), metadata=rng(
        doc="PPO hyperparameters (algorithm ppo)"))
    dqn: DQNSection = field(default=DQNSection(), metadata=rng(
        doc="DQN hyperparameters (algorithm dqn)"))
    sac: SACSection = field(default=SACSection(), metadata=rng(
        doc="SAC hyperparameters (algorithm sac)"))
    rollout: RolloutSection = field(default=RolloutSection(), metadata=rng(
        doc="env runners (RolloutSection)"))
    learners: LearnersSection = field(default=LearnersSection(), metadata=rng(
        doc="RLlib learners (LearnersSection)"))
    run: RunSection = field(default=RunSection(), metadata=rng(
        doc="length, seed, checkpoints (RunSection)"))

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
                      overrides: Mapping[str, Any] | None = None
                      ) -> tuple[TrainConfig, EnvConfig]:
    """(TrainConfig, its env) from a YAML path or mapping plus nested overrides."""
    data = dict(source) if isinstance(source, Mapping) else read_yaml(resolve_config_path(source))
    if overrides:
        if isinstance(overrides.get("env"), Mapping) and isinstance(data.get("env", "configs/env/paper.yaml"), str):
            data["env"] = {"file": data.get("env", "configs/env/paper.yaml")}  # inherit, then override
        data = merge(data, overrides)
    cfg = build(TrainConfig, data, "train")
    env = load_env(cfg.env)
    if env.encoder == "nodes" and (cfg.algorithm != "ppo" or cfg.network != "crossattn"):
        raise ConfigError("train.env.encoder: nodes trains the cross-attention network with "
                          f"ppo only, not {cfg.algorithm}/{cfg.network}")
    if cfg.run.init is not None and cfg.algorithm != "ppo":
        raise ConfigError(f"run.init: fine-tuning from an artifact is for algorithm ppo, not "
                          f"{cfg.algorithm!r}")
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
