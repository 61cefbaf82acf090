"""The simulator's side of :mod:`envs.runtime`: each task's kind, noise and hint, the estimates
deciders see, and the truth they never see.

:class:`RunModel` exists only when ``runtime`` is active (``RuntimeConfig.active``); the
simulator then asks it, at a workflow's arrival, for the computes deciders are shown
(:meth:`RunModel.shown`) and gives it the new tasks (:meth:`RunModel.arrive`: kind, nominal
compute, factors); at a start, for the estimated and the actual run (:meth:`RunModel.run_times`);
at a finish, to learn (:meth:`RunModel.finished`). A task's ``compute`` is what deciders see; the
truth is ``nominal * factor``. A fork for planning sets ``truth`` False: its runs then take their
estimates, and its running tasks' finish events are moved to their estimated ends
(``envs.fork``), so a rollout cannot see a true finish time.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .estimator import RuntimeEstimator
from .runtime import KindHints, RuntimeConfig, compute_bucket, factors, kind_of_name
from .workflow import WorkflowSpec

if TYPE_CHECKING:
    from .nodes import NodeTable

__all__ = ["RunModel", "OVERDUE_S", "compute_range", "quantile_s", "residual_s", "show_overdue"]

OVERDUE_S = 1e-3  # the least remaining time a busy server shows: it never looks idle
PRIOR_SIGMA = 0.5  # the log-spread deciders assume without the estimator


def compute_range(dist) -> tuple[float, float]:
    """[lo, hi] of a generator's compute distribution (``DistConfig``): the range the kinds of
    generated tasks split (log-spaced buckets)."""
    lo = max(dist.min, 1e-3)
    if dist.max is not None:
        hi = dist.max
    elif dist.dist == "normal":
        hi = dist.mean + 4 * dist.std
    else:
        hi = 5 * dist.mean
    return lo, max(hi, 2 * lo)


def show_overdue(table: "NodeTable", now: float,
                 residual: Callable[[Any, int, float], float] | None = None) -> None:
    """What deciders see of a run past its expected end, in the simulator and live alike: it
    ends ``residual(task, node, now)`` from now (the expected residual life an estimator
    learned, :meth:`RunModel.residual`), at least ``OVERDUE_S``; without an estimator
    ``OVERDUE_S`` from now. Never an end in the past (it would look idle)."""
    floor = now + OVERDUE_S
    for i in table.overdue(floor):
        for task, end in list(table.running[i].items()):
            if end < floor:
                left = OVERDUE_S if residual is None else max(residual(task, i, now), OVERDUE_S)
                table.expect(i, task, now + left)


def residual_s(est: RuntimeEstimator | None, kind: str, tier: str, expected_s: float,
               elapsed_s: float) -> float:
    """Expected time left of a run the hint puts at ``expected_s`` after ``elapsed_s`` without
    finishing: the mean residual life of its LogNormal estimate (the estimator's, else one of
    log-spread :data:`PRIOR_SIGMA` around ``expected_s``), ``E[T - a | T > a]``."""
    if est is None:
        s = PRIOR_SIGMA
        mu = math.log(max(expected_s, 1e-12)) - s * s / 2
    else:
        m, s = est.log_params(kind, tier)
        mu = math.log(max(expected_s, 1e-12)) + m
    a = max(elapsed_s, 1e-12)
    la = math.log(a)
    den = 0.5 * math.erfc(-(mu - la) / (s * math.sqrt(2)))
    if den < 1e-12:  # far in the tail: the LogNormal's residual grows like a s^2 / ln(a/med)
        return a * s * s / max(la - mu, s * s)
    num = 0.5 * math.erfc(-(mu + s * s - la) / (s * math.sqrt(2)))
    return max(math.exp(mu + s * s / 2) * num / den - a, 0.0)


def quantile_s(est: RuntimeEstimator | None, kind: str, tier: str, expected_s: float,
               q: float) -> float:
    """The ``q``-quantile of a run the hint puts at ``expected_s`` (what hedging waits for, in the
    simulator and live): the estimator's, else a LogNormal of mean ``expected_s`` and log-spread
    :data:`PRIOR_SIGMA`."""
    if est is None:
        s = PRIOR_SIGMA
        return expected_s * float(np.exp(-s * s / 2 + NormalDist().inv_cdf(q) * s))
    return est.quantile(kind, tier, expected_s, q)


class RunModel:
    """Kinds, factors, hints and estimates of one simulator episode (module docstring)."""

    def __init__(self, cfg: RuntimeConfig, rng: np.random.Generator, compute_range: tuple[float, float]):
        self.cfg = cfg
        self.rng = rng
        self.lo, self.hi = compute_range
        self.kind_hints = KindHints()
        self.estimator = RuntimeEstimator() if cfg.estimator == "online" else None
        #: runtime.speeds learned: each kind's run per node shape, learned from finished runs
        #: against the run at speed 1 (what deciders plan with: :meth:`planned_s`)
        self.speeds = RuntimeEstimator() if cfg.speeds == "learned" else None
        self.truth = True  # False in a planner's fork: runs take their estimates

    def copy(self) -> "RunModel":
        """An independent model in this state for a fork (truth hidden; the estimator and the
        kind hints are shared read-only: a fork never finishes a real run)."""
        out = object.__new__(RunModel)  # the estimator is shared: a fork never learns
        out.__dict__.update(self.__dict__)
        out.truth = False
        out.kind_hints = self.kind_hints.copy()  # a fork's arrivals must not move the original's
        return out

    # ------------------------------------------------------------------ arrivals
    def kinds(self, spec: WorkflowSpec) -> list[str]:
        """Each task's kind (module docstring of envs.runtime)."""
        out = []
        for ts in spec.tasks:
            k = ts.kind or (kind_of_name(ts.name) if ts.name else "")
            out.append(k or compute_bucket(ts.compute_gflop, self.lo, self.hi, self.cfg.kinds))
        return out

    def shown(self, spec: WorkflowSpec, kinds: Sequence[str]) -> list[float]:
        """The computes deciders see for ``spec``'s tasks (hints, then the estimator)."""
        h = self.cfg.hints
        if h == "exact":
            vals = [ts.compute_gflop for ts in spec.tasks]
        elif h == "kind":
            for ts, k in zip(spec.tasks, kinds):
                self.kind_hints.see(k, ts.compute_gflop)
            vals = [self.kind_hints.value(k, ts.compute_gflop) for ts, k in zip(spec.tasks, kinds)]
        else:
            vals = [self.cfg.default_gflop] * len(spec.tasks)
        est = self.estimator
        if est is not None:
            vals = [est.gflop(k, v) for k, v in zip(kinds, vals)]
        return vals

    def arrive(self, tasks: Sequence, spec: WorkflowSpec, kinds: Sequence[str],
               shown: Sequence[float]) -> None:
        """Give the new tasks their kind, nominal compute, hint and run factors."""
        # a fork draws nothing (its runs take estimates): the episode's stream stays the same
        f = factors(self.rng, self.cfg, 2 * len(tasks)) if self.truth else np.ones(2 * len(tasks))
        n = len(tasks)
        hedge = self.cfg.hedge
        for i, (tk, ts) in enumerate(zip(tasks, spec.tasks)):
            tk.kind = kinds[i]
            tk.nominal = ts.compute_gflop
            tk.hint = shown[i] if self.estimator is None else self._raw_hint(ts, kinds[i])
            tk.factor, tk.factor2 = ts.factors if ts.factors is not None and self.truth else (
                float(f[i]), float(f[n + i]))  # a replayed stream's own factors
            tk.hedgeable = hedge == "all" or (hedge == "marked" and ts.hedge)

    def _raw_hint(self, ts, kind: str) -> float:
        h = self.cfg.hints
        if h == "exact":
            return ts.compute_gflop
        if h == "kind":
            return self.kind_hints.value(kind, ts.compute_gflop)
        return self.cfg.default_gflop

    # ------------------------------------------------------------------ runs
    def run_times(self, task, compute: float, tier: str, copy: bool = False
                  ) -> tuple[float, float]:
        """(estimated, actual) exec seconds of ``task`` on a server of ``compute`` GFLOP/s of
        ``tier``; sets ``task.expected`` (the hint-implied exec) unless ``copy``."""
        expected = task.hint / compute
        if not copy:
            task.expected = expected
        est = self.estimator
        estimate = expected if est is None else est.duration(task.kind, tier, expected)
        if not self.truth:
            return estimate, estimate
        return estimate, task.nominal * (task.factor2 if copy else task.factor) / compute

    def quantile_s(self, task, compute: float, tier: str, q: float) -> float:
        """The ``q``-quantile of ``task``'s exec on that server, as estimated (hedging)."""
        return quantile_s(self.estimator, task.kind, tier, task.hint / compute, q)

    def residual_s(self, task, compute: float, tier: str, elapsed_s: float) -> float:
        """Expected exec time left of ``task`` (on that server) after ``elapsed_s`` without
        finishing (:func:`residual_s`)."""
        return residual_s(self.estimator, task.kind, tier, task.hint / compute, elapsed_s)

    def finished(self, task, compute: float, tier: str, actual_s: float) -> None:
        """A run of ``task`` on that server took ``actual_s`` exec seconds: learn from it."""
        if not self.truth:
            return
        if self.estimator is not None:
            self.estimator.observe(task.kind, tier, actual_s, task.hint / compute)
        if self.speeds is not None:
            self.speeds.observe(task.kind, tier, actual_s, task.hint)

    def planned_s(self, task, tier: str) -> float:
        """``runtime.speeds: learned``: the run deciders plan with for ``task`` on a node of
        ``tier`` (``NodeTable.estimate``): its run at speed 1, times what was learned there."""
        return self.speeds.duration(task.kind, tier, task.hint)

    def residual(self, table: "NodeTable") -> Callable[[Any, int, float], float]:
        """:func:`show_overdue`'s residual of a run on ``table``'s node (:meth:`residual_s`)."""
        return lambda run, i, now: self.residual_s(run, table.speed(i, run.demands),
                                                   table.specs[i].name, now - run.start)

    def refresh(self, task) -> None:
        """What deciders see of ``task`` now (the estimator may have learned since)."""
        est = self.estimator
        if est is not None:
            task.compute = est.gflop(task.kind, task.hint)
