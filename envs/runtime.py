"""Run times as they are: noisy, undeclared, heavy-tailed (the env's ``runtime`` section).

* **Kind.** Every task has a *kind*, the primitive it calls: a real family's task type (its name
  without a trailing instance number, :func:`kind_of_name`), or, for generated workloads and
  unnamed tasks, one of ``kinds`` log-spaced buckets of the nominal compute
  (:func:`compute_bucket`: the kinds partition the generator's compute profile).
* **Actual run.** nominal (``compute_gflop / server compute``) times a factor with mean 1:
  LogNormal(``noise_sigma``); with ``tail: pareto`` a share ``tail_prob`` of runs is further
  multiplied by a Pareto(``tail_alpha``) draw (LLM-like stragglers), and the mixture is scaled
  back to mean 1 (:func:`factors`). Each task draws its factors when it arrives, from the
  episode's own random stream, so every policy sees the same ones.
* **What deciders see** (``hints``): ``exact`` the nominal compute; ``kind`` the typical compute
  of its kind (geometric mean of that kind's nominal computes seen so far in the episode, as an
  operator would declare per tool); ``none`` ``default_gflop`` for every task. With
  ``estimator: online`` (:mod:`envs.estimator`) estimates are corrected from completions.
  Busy and idle always come from what happened (events), never from an estimate.
* ``speeds: learned``: deciders know no node speed; they plan each run with what an estimator
  learned of its kind on that node shape from finished runs (speed 1 before any), as the live
  scheduler does with ``live.estimator: online`` and no speeds configured.
* ``hedge`` / ``hedge_quantile``: backup copies of stragglers (:mod:`envs.hedging`).
* ``overhead_s``: every run ends this much after its (actual) run time, and deciders are not
  told: a busy server past its expected end shows ``OVERDUE_S`` left, as the live scheduler
  shows it. What the live runtime adds per run (``scale-ray bench live`` measures it; its twin
  replays it).

With the defaults (no noise, exact hints, no estimator, no hedging) nothing changes: every run
takes exactly its nominal time, as before this section existed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .config_base import ConfigError, rng

__all__ = ["RuntimeConfig", "factors", "kind_of_name", "compute_bucket", "KindHints"]


@dataclass(frozen=True)
class RuntimeConfig:
    """The ``runtime`` section of an env config (module docstring)."""
    noise_sigma: float = field(default=0.0, metadata=rng(
        ge=0, le=3, doc="sigma of the LogNormal (mean 1) factor on every run; 0: exact runs"))
    tail: Literal["none", "pareto"] = field(default="none", metadata=rng(
        doc="heavy tail: none, or pareto (a share tail_prob of runs times a Pareto draw)"))
    tail_prob: float = field(default=0.05, metadata=rng(ge=0, le=1, doc="share of tail runs"))
    tail_alpha: float = field(default=1.5, metadata=rng(
        gt=1, le=20, doc="Pareto shape of the tail (smaller: heavier)"))
    hints: Literal["exact", "kind", "none"] = field(default="exact", metadata=rng(
        doc="what deciders see of a task's compute: exact nominal, its kind's typical value, "
            "or default_gflop for all"))
    kinds: int = field(default=12, metadata=rng(
        ge=1, le=1000, doc="kinds of generated (and unnamed) tasks: log-spaced compute buckets"))
    default_gflop: float = field(default=4.0, metadata=rng(
        gt=0, le=1e9, doc="hints none: the compute every task is shown with"))
    estimator: Literal["off", "online"] = field(default="off", metadata=rng(
        doc="online: estimates per (kind, tier) learned from completions (envs.estimator)"))
    speeds: Literal["known", "learned"] = field(default="known", metadata=rng(
        doc="learned: deciders know no node speed (each is 1 to them) and plan with the runs "
            "an estimator learns per kind and node shape from finished runs, as live with "
            "live.estimator online and no speeds configured; known: the configured speeds"))
    hedge: Literal["off", "all", "marked"] = field(default="off", metadata=rng(
        doc="backup copies of stragglers (envs.hedging): never, any task, or marked tasks only"))
    hedge_quantile: float = field(default=0.9, metadata=rng(
        gt=0, lt=1, doc="a running task is a straggler once past this quantile of its estimate"))
    overhead_s: float = field(default=0.0, metadata=rng(
        ge=0, le=10, doc="seconds every run takes beyond its run time, unseen by deciders: what "
                         "the live runtime's dispatch and result return add (bench live's twin)"))

    def __post_init__(self) -> None:
        if self.tail == "pareto" and self.tail_prob <= 0:
            raise ConfigError("runtime.tail_prob: must be > 0 with tail: pareto")

    @property
    def noisy(self) -> bool:
        return self.noise_sigma > 0 or self.tail != "none"

    @property
    def active(self) -> bool:
        """Whether anything differs from exact, declared run times."""
        return (self.noisy or self.hints != "exact" or self.estimator != "off"
                or self.hedge != "off" or self.speeds != "known")


def factors(rng: np.random.Generator, cfg: RuntimeConfig, size: int) -> np.ndarray:
    """``size`` run-time factors with mean 1 (module docstring); ones without noise."""
    if not cfg.noisy:
        return np.ones(size)
    s = cfg.noise_sigma
    f = rng.lognormal(-s * s / 2.0, s, size) if s > 0 else np.ones(size)
    if cfg.tail == "pareto":
        a, p = cfg.tail_alpha, cfg.tail_prob
        tail = rng.random(size) < p
        # numpy's pareto is Lomax (x_m = 0): 1 + it is Pareto with x_m = 1, mean a / (a - 1)
        f = np.where(tail, f * (1.0 + rng.pareto(a, size)), f)
        f /= (1.0 - p) + p * a / (a - 1.0)
    return f


_INSTANCE = re.compile(r"[_\-.:#]?(ID)?\d+$", re.IGNORECASE)


def kind_of_name(name: str) -> str:
    """A task's kind from its name: the name without a trailing instance number
    (``mProject_00012`` -> ``mProject``, ``search-3`` -> ``search``); '' if nothing is left."""
    prev = None
    while prev != name:
        prev, name = name, _INSTANCE.sub("", name)
    return name


def compute_bucket(compute: float, lo: float, hi: float, kinds: int) -> str:
    """The kind of an unnamed task: its bucket among ``kinds`` log-spaced buckets of [lo, hi]."""
    if kinds <= 1 or hi <= lo:
        return "k0"
    x = (math.log(max(compute, lo)) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return f"k{min(kinds - 1, max(0, int(x * kinds)))}"


class KindHints:
    """``hints: kind``: the typical compute of each kind, the geometric mean of the nominal
    computes of that kind seen so far (a kind seen first is shown with its own value)."""

    __slots__ = ("_sum", "_n")

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}

    def copy(self) -> "KindHints":
        """An independent copy (a fork's arrivals must not move the original's hints)."""
        out = KindHints()
        out._sum, out._n = dict(self._sum), dict(self._n)
        return out

    def see(self, kind: str, compute: float) -> None:
        self._sum[kind] = self._sum.get(kind, 0.0) + math.log(compute)
        self._n[kind] = self._n.get(kind, 0) + 1

    def value(self, kind: str, default: float) -> float:
        n = self._n.get(kind, 0)
        return math.exp(self._sum[kind] / n) if n else default
