"""A guard around learned policies: bounded, justified waits; EFT's choice as the fallback.

A trained policy is never trusted blindly. Acting greedily, it can answer the same ready task with
the same busy (or too small) server forever: the livelock of results/paper/README.md ("The
greedy livelock"), and the 5-50x collapse on real DAG families it never saw (docs/workloads.md). The guard checks every answer of
a learned policy against the observation alone, so the simulator, Serve and the live scheduler
apply the same rule:

* a server the task cannot use (masked, or its memory is too small) -> EFT's choice
  (reason ``infeasible``);
* an idle server that fits -> kept (the task starts now);
* a busy server that fits, while no idle server fits -> kept (every answer is a wait then);
* a busy server that fits, while an idle one fits: a *wait*. Kept only while the task has waited
  fewer than ``max_waits`` times (else ``wait_budget``) and only when the busy server's expected
  finish (remaining time + run time there) beats the best idle server's finish (else
  ``slower_wait``); otherwise EFT's choice.

So a task waits at most ``max_waits`` times while a server it fits is idle, and every wait it
makes has a shorter expected finish than starting now. The caller keeps the per-task wait count
(the simulator counts a task's waits; Serve takes it from the request; the live scheduler from its
record) and passes it in. EFT here is :class:`policies.heuristics.EarliestFinish` on the same
observation. Switch it off (``guard.enabled: false``, ``scale-ray eval --guard off``) to see the
raw policy: that reproduces the numbers of an unguarded run exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from envs.config import FeatureConfig, build, rng

from .base import Obs, Policy, is_planner
from .heuristics import EarliestFinish, Heuristic

#: override reasons, in the order the rules are checked (counter keys: ``guard_<reason>``)
REASONS = ("infeasible", "wait_budget", "slower_wait")


@dataclass(frozen=True)
class GuardConfig:
    """The guard around a learned policy (``guard`` section of eval, Serve and live configs)."""
    enabled: bool = field(default=True, metadata=rng(
        doc="check every answer of a learned policy; heuristics are never guarded"))
    max_waits: int = field(default=10, metadata=rng(
        ge=0, le=1_000_000, doc="waits a task may make while a server it fits is idle; then EFT"))


def load_guard_config(data: Mapping[str, Any] | GuardConfig | None, path: str = "guard") -> GuardConfig:
    """A validated :class:`GuardConfig` (unknown keys and out-of-range values name the key)."""
    return build(GuardConfig, data, path)


class Guard:
    """Checks one answer at a time; counts what it overrode (``counts``, keys of :data:`REASONS`).

    Args:
        config: the guard settings.
        features: the encoder constants of the observations (to read raw quantities back).
        transfer_delays_start: whether a transfer delays the start (EFT counts it then).
    """

    def __init__(self, config: GuardConfig, features: FeatureConfig | None = None,
                 transfer_delays_start: bool = False):
        self.config = config
        self._eft = EarliestFinish(features, transfer_delays_start)
        self.counts = dict.fromkeys(REASONS, 0)
        self.checked = 0

    @property
    def overrides(self) -> int:
        return sum(self.counts.values())

    def reason(self, obs: Obs, action: int, waits: int = 0) -> str | None:
        """Why ``action`` must be overridden (one of :data:`REASONS`), or None to keep it."""
        eft = self._eft
        task, srv, fits, idle = eft.read_obs(obs)
        if not 0 <= action < fits.shape[0] or not fits[action]:
            return "infeasible"
        if idle[action] or not idle.any():
            return None
        if waits >= self.config.max_waits:
            return "wait_budget"
        run = eft.run_time(task, srv)
        if not srv.remaining_s[action] + run[action] < run[idle].min():
            return "slower_wait"
        return None

    def check(self, obs: Obs, action: int, waits: int = 0) -> tuple[int, str | None]:
        """(the action to take, the override reason or None); counts overrides."""
        self.checked += 1
        why = self.reason(obs, action, waits)
        if why is None:
            return action, None
        self.counts[why] += 1
        return int(np.argmax(self._eft.scores(obs))), why

    def summary(self) -> dict[str, int]:
        """Counters for result rows, traces and live summaries: ``guard_overrides`` (all) and
        ``guard_<reason>`` per reason."""
        return {"guard_overrides": self.overrides,
                **{f"guard_{r}": n for r, n in self.counts.items()}}


def guard_summary(guard: Guard | None) -> dict[str, int]:
    """:meth:`Guard.summary`, or the same keys at 0 without a guard."""
    if guard is not None:
        return guard.summary()
    return {"guard_overrides": 0, **{f"guard_{r}": 0 for r in REASONS}}


def is_learned(policy: Policy) -> bool:
    """Whether ``policy`` is a trained one (guarded by default), not a built-in heuristic or a
    planner (:class:`policies.base.Planner`)."""
    return not isinstance(policy, Heuristic) and not is_planner(policy)


def make_guard(policy: Policy, config: GuardConfig | None, features: FeatureConfig | None,
               transfer_delays_start: bool) -> Guard | None:
    """The guard for ``policy``: None for heuristics or when ``config.enabled`` is false.
    ``features``: the constants the observations are encoded with."""
    config = config or GuardConfig()
    if not config.enabled or not is_learned(policy):
        return None
    return Guard(config, features, transfer_delays_start)
