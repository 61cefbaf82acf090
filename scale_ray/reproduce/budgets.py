"""The methods of the paper and the budgets that size a reproduction run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

EVAL_SEED = 20_260_605  # fixed before any result was seen (the paper's arXiv date)
HEURISTICS = ("random", "round-robin", "least-loaded", "fastest-idle", "eft", "eft-wait", "heft")


@dataclass(frozen=True)
class Method:
    name: str          # table label
    config: str        # configs/train/*.yaml
    size_free: bool    # runs at any N (cross-attention)
    main: bool = False  # trained with every seed of the budget


METHODS = (
    Method("SCALE", "configs/train/scale.yaml", True, True),
    Method("CrossAttn", "configs/train/crossattn.yaml", True, True),
    Method("PPO", "configs/train/ppo_mlp.yaml", False),
    Method("PPO+SRR", "configs/train/ppo_mlp_srr.yaml", False),
    Method("DQN", "configs/train/dqn.yaml", True),
    Method("SAC", "configs/train/sac.yaml", True),
)


@dataclass(frozen=True)
class Budget:
    """Everything that sizes a reproduction run."""
    name: str
    ppo_iterations: int                 # PPO iterations (1024 env steps each)
    seeds: tuple[int, ...]              # training seeds of SCALE and CrossAttn
    other_seeds: tuple[int, ...]        # training seeds of the other methods
    episodes: int                       # evaluation episodes per (policy, size)
    sizes: tuple[int, ...]              # Table 4 sizes
    feature_sizes: tuple[int, ...]      # Table 5 sizes
    robustness_sizes: tuple[int, ...]
    horizon_s: float | None = None      # evaluation arrival horizon (None: the env config's)
    srr_ramp: tuple[int, int] | None = None  # SRR ramp (iterations) for short runs
    off_policy: bool = True             # train DQN and SAC
    workers: int = 2
    env_overrides: dict = field(default_factory=dict)
    # Fewer episodes at large N (servers -> episodes): an episode has N/16 times the tasks of
    # one at N=16 and every decision scores N servers.
    max_episodes: dict = field(default_factory=dict)
    # The env config every run trains and is evaluated in (None: each method's train config's,
    # configs/env/paper.yaml); `reproduce --env-config` sets it.
    env_config: str | None = None

    @property
    def env_steps(self) -> int:
        return self.ppo_iterations * 1024

    def episodes_at(self, servers: int) -> int:
        return min(self.episodes, self.max_episodes.get(servers, self.episodes))


BUDGETS = {
    # The paper: 1000 iterations, 30 evaluation episodes; 3 seeds for SCALE and CrossAttn.
    "paper": Budget("paper", 1000, (42, 43, 44), (42,), 30, (16, 32, 48, 64, 128, 256, 1024),
                    (16, 32, 48, 256), (16, 48), max_episodes={256: 10, 1024: 4}),
    # About 20 minutes on a quiet 2-core machine: the same tables with smaller numbers (40
    # iterations, about 1 s each). The SRR ramp is compressed with the run (the paper's 10->60
    # of 1000 iterations would barely switch on).
    "quick": Budget("quick", 40, (42, 43, 44), (42,), 4, (16, 32, 48, 256, 1024), (16, 48, 256),
                    (16, 48), horizon_s=40.0, srr_ramp=(4, 16)),
    # A smoke run for tests (minutes): one seed, tiny everything.
    "smoke": Budget("smoke", 1, (42,), (42,), 2, (16, 48), (16,), (16,), horizon_s=10.0,
                    srr_ramp=(0, 1), off_policy=False, max_episodes={48: 1}),
}


def table4_policies(chosen: Sequence[Method], budget: Budget,
                    policies: dict[tuple[str, int], str]) -> list[str]:
    """Table 4's learned policies: SCALE and CrossAttn with every seed, the other size-free
    methods (DQN, SAC: pointer networks) with their first seed; the fixed-N MLPs cannot run."""
    specs = [policies[(m.name, s)] for m in chosen if m.main for s in budget.seeds]
    return specs + [policies[(m.name, budget.other_seeds[0])] for m in chosen
                    if m.size_free and not m.main]


def to_dict_budget(b: Budget) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in b.__dict__.items()}
