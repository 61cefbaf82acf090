"""Runs that take other than planned, and backup copies of stragglers, in the node simulator
(``envs.node_sim``; the slot model's twin is ``envs.hedging``, live's ``scale_ray.live.runs``).

``run_noise`` s (``AgentsConfig``): a run takes its planned time (compute / the node's speed,
what the rules plan with) times a LogNormal factor of mean 1 and log-spread s, drawn from its
own generator (arrivals and requests stay those of the episode without noise), hidden from the
rules. ``hedge_quantile`` q (0: off): a run still going at the q-quantile of its planned time as
the rules see it (``envs.run_model.quantile_s`` without an estimator: a LogNormal of log-spread
``PRIOR_SIGMA`` around the plan, as live hedging decides) gets a copy on the fastest other node
where it fits now (else at the next instant one does), with a factor of its own; the first run to end completes the task, the other is cancelled at once and
frees its resources. At most one copy per task. Counted: ``hedge_copies``, ``hedge_wins`` (the
copy ended first), ``hedge_waste_s`` (run seconds of the cancelled runs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .run_model import quantile_s

__all__ = ["Copy", "NodeRuns"]


class Copy:
    """A task's backup run: its key in the node table and the events (its demands are the
    task's)."""
    __slots__ = ("task", "node", "start", "cancelled")

    def __init__(self, task: Any, node: int, start: float):
        self.task, self.node, self.start, self.cancelled = task, node, start, False

    @property
    def demands(self) -> tuple:
        return self.task.demands

    @property
    def compute(self) -> float:
        return self.task.compute


class NodeRuns:
    """The noise and the hedging counters of one episode (module docstring)."""

    def __init__(self, noise: float, quantile: float, rng: np.random.Generator | None):
        self.noise, self.quantile, self.rng = noise, quantile, rng
        self.hedging = quantile > 0
        #: a run is a straggler past planned x this (the rules' q-quantile of its time)
        self.due_factor = quantile_s(None, "", "", 1.0, quantile) if self.hedging else 0.0
        self.due: list[Any] = []  # stragglers waiting for a node where a copy fits
        self.copies = self.wins = 0
        self.waste_s = 0.0

    def factor(self, given: float | None = None) -> float:
        """A run's time over its planned time: ``given`` (a request's own factors, e.g. a
        replayed live stream), else a draw (1 without noise)."""
        if given is not None:
            return given
        if self.noise <= 0:
            return 1.0
        s = self.noise
        return float(self.rng.lognormal(-s * s / 2, s))

    def metrics(self) -> dict[str, Any]:
        return {"hedge_copies": self.copies, "hedge_wins": self.wins,
                "hedge_waste_s": self.waste_s} if self.hedging else {}
