"""A guard around learned policies: bounded, justified waits; EFT's choice as the fallback.

A trained policy is never trusted blindly. Acting greedily, it can answer the same ready task with
the same busy (or too small) node forever: the livelock of results/paper/README.md ("The greedy
livelock"), and the 5-50x collapse on real DAG families it never saw (docs/workloads.md). The
guard checks every answer of a learned policy against the decision's state (the table of nodes,
``policies.base.State``), so the simulator, Serve and the live runtime apply the same rule:

* a node that could never hold the task (not accepting, or its totals too small) -> EFT's
  choice (reason ``infeasible``);
* a node the task fits now -> kept (it starts now);
* a node it could hold later, while it fits no node now -> kept (every answer is a wait then);
* a node it could hold later, while it fits another now: a *wait*. Kept only while the task has
  waited fewer than ``max_waits`` times (else ``wait_budget``) and only when that node's
  expected finish (the start it could get there + run time) beats the best node's where it fits
  now (else ``slower_wait``, also when no run there will ever end); otherwise EFT's choice.

So a task waits at most ``max_waits`` times while a node it fits is free, and every wait it
makes has a shorter expected finish than starting now. The caller keeps the per-task wait count
(the simulator counts a task's waits; Serve takes it from the request; the live runtime from its
record). EFT here is :func:`policies.heuristics.eft_pick` on the same state. Switch it off
(``guard.enabled: false``, ``scale-ray eval --guard off``) to see the raw policy: that
reproduces the numbers of an unguarded run exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from envs.config import build, rng

from .base import ObservationPolicy, Policy, State
from .heuristics import eft_pick, finish_s

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
    """

    def __init__(self, config: GuardConfig):
        self.config = config
        self.reset()

    def reset(self) -> None:
        """Counters back to 0 (a new episode)."""
        self.counts = dict.fromkeys(REASONS, 0)
        self.checked = 0

    @property
    def overrides(self) -> int:
        return sum(self.counts.values())

    def reason(self, state: State, action: int) -> str | None:
        """Why ``action`` must be overridden (one of :data:`REASONS`), or None to keep it."""
        table, task, now = state.table, state.task, state.now
        d = task.demands
        if not (0 <= action < table.n and table.accept_l[action] and table.fits_total(action, d)):
            return "infeasible"
        if table.fits_now(action, d) or table.state(d) != 2:
            return None
        if task.waits >= self.config.max_waits:
            return "wait_budget"
        start = table.earliest_fit(action, d, now)
        wait = start - now + finish_s(state, action, table.run_time(action, task))
        best = min(finish_s(state, i, table.run_time(i, task)) for i in table.idle_heads(d))
        if not wait < best:
            return "slower_wait"
        return None

    def check(self, state: State, action: int) -> tuple[int, str | None]:
        """(the action to take, the override reason or None); counts overrides."""
        self.checked += 1
        why = self.reason(state, action)
        if why is None:
            return action, None
        self.counts[why] += 1
        return eft_pick(state), why

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
    """Whether ``policy`` is a trained one (guarded by default): it acts on an observation."""
    return isinstance(policy, ObservationPolicy)


def make_guard(policy: Policy, config: GuardConfig | None) -> Guard | None:
    """The guard for ``policy``: None for heuristics and planners, or when ``config.enabled``
    is false."""
    config = config or GuardConfig()
    if not config.enabled or not is_learned(policy):
        return None
    return Guard(config)
