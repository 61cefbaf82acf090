"""Whether a live comparison may be read as a gain: each arm's live / twin ratio and the
machine's load (issue 73), for every live bench's printout (``bench live``, its agents
setting, ``bench service``, ``run-workflows``).

A live bench emulates work by sleeping on a local multi-node cluster. On a machine whose load
exceeds its cores the sleeps stretch and Ray's workers queue for CPU, and not equally for every
arm (Ray's default placement starts a worker per task, the scheduler's server actors stay): a
difference between arms is then the machine's, not placement's. Likewise an arm whose live mean
departs from its simulator twin by more than :data:`TWIN_BOUND` did not run as modelled (one
run seen: Ray default 121.2 model s live against its twin's 14.1, while the rule matched its
own). Either way the comparison is marked INVALID and no gain is printed; ``--json`` keeps the
numbers with ``valid: false`` and the reasons. An arm without a twin (Ray's placement in the
slot model, which the simulator does not model) cannot be checked: a comparison with it says so.

The spread of a gain (:func:`ratio_interval`): a 95 % bootstrap interval of the ratio of the
two arms' mean workflow responses over their workflows.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from scale_ray.relative import rel

#: |live / twin - 1| beyond this: the arm did not run as modelled
TWIN_BOUND = 0.25
BOOTSTRAP_DRAWS = 2000


@dataclass
class MachineLoad:
    """The machine's 1-min load average, sampled after each arm of a run: its peak against the
    cores."""
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    samples: list[float] = field(default_factory=list)

    def sample(self) -> float:
        load = os.getloadavg()[0]
        self.samples.append(load)
        return load

    @property
    def peak(self) -> float:
        return max(self.samples, default=math.nan)

    @property
    def overloaded(self) -> bool:
        return bool(self.samples) and self.peak > self.cores


def twin_ratio(live_mean: float | None, twin_mean: float | None) -> float | None:
    """live / twin mean workflow response (model s), None without a twin."""
    if live_mean is None or twin_mean is None or not twin_mean or math.isnan(twin_mean):
        return None
    return live_mean / twin_mean


def check(ratios: Mapping[str, float | None], load: MachineLoad,
          compared: Sequence[str] | None = None, bound: float = TWIN_BOUND) -> dict[str, Any]:
    """The verdict on a comparison of ``compared`` (default: every arm): ``ratios`` is each
    arm's live / twin mean (None: no twin). Invalid when a compared arm departs from its twin
    beyond ``bound`` or the load's peak exceeds the cores."""
    compared = list(ratios) if compared is None else list(compared)
    departed = [a for a in compared if ratios.get(a) is not None
                and abs(ratios[a] - 1.0) > bound]
    unchecked = [a for a in compared if ratios.get(a) is None]
    reasons = [f"{a} ran {ratios[a]:.2f}x its twin (bound {1 - bound:.2f}-{1 + bound:.2f})"
               for a in departed]
    if load.overloaded:
        reasons.append(f"machine overloaded: load {load.peak:.1f} on {load.cores} cores; run "
                       f"on more cores or fewer raylets (--servers-per-node)")
    return {"valid": not reasons, "reasons": reasons, "unchecked": unchecked,
            "live_vs_twin": dict(ratios), "bound": bound, "load_1m_peak": load.peak,
            "cores": load.cores}


def format_check(verdict: Mapping[str, Any]) -> str:
    """One line: every arm's live / twin ratio and the load, then VALID or INVALID and why."""
    arms = ", ".join(f"{a} {'n/a (no twin)' if r is None else f'{r:.2f}'}"
                     for a, r in verdict["live_vs_twin"].items())
    load = verdict["load_1m_peak"]
    head = (f"live / twin mean workflow response: {arms}; machine load "
            f"{'n/a' if math.isnan(load) else f'{load:.1f}'} (1-min, peak) on "
            f"{verdict['cores']} cores")
    if verdict["valid"]:
        return head + ": the comparison is valid"
    return head + ": INVALID (" + "; ".join(verdict["reasons"]) + ")"


def gain_line(what: str, rel_diff: float, verdict: Mapping[str, Any],
              interval: tuple[float, float] | None = None) -> str:
    """``what``'s relative difference (value / reference - 1, lower is better) if the
    comparison is valid (with its spread, and which arm is unchecked); else INVALID, no
    number."""
    if not verdict["valid"]:
        return f"{what}: INVALID, no gain reported ({'; '.join(verdict['reasons'])})"
    text = f"{what}: {rel(rel_diff)}"
    if interval is not None and not any(math.isnan(x) for x in interval):
        text += f" (95 % interval over workflows: {rel(interval[0])} to {rel(interval[1])})"
    if verdict["unchecked"]:
        text += (f"; {', '.join(verdict['unchecked'])} unchecked (no twin: its run may not "
                 f"be as modelled)")
    return text


def ratio_interval(values: Sequence[float], reference: Sequence[float], seed: int = 0,
                   draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float]:
    """A 95 % bootstrap interval of mean(values) / mean(reference) - 1, each arm's workflows
    resampled with replacement (nan for an empty arm)."""
    a, b = np.asarray(values, float), np.asarray(reference, float)
    if not len(a) or not len(b):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(0, len(a), (draws, len(a)))].mean(axis=1)
    rb = b[rng.integers(0, len(b), (draws, len(b)))].mean(axis=1)
    lo, hi = np.percentile(ra / rb - 1.0, [2.5, 97.5])
    return float(lo), float(hi)
