"""An online run-time estimator: per (kind, tier), learned from completions (NumPy + stdlib).

What it learns is the log of ``actual / expected``, where *expected* is the run time the hint
implies on that server (``hint_gflop / server compute``): 0 when the hints are right. So the prior
comes from the tier speeds (a server of twice the compute runs a task in half the time), and what
is learned is how far each kind's hint is off, per tier.

* Per kind (all tiers together) and per (kind, tier) cell: a running mean and variance of the log
  ratio (Welford), each shrunk toward its parent: a cell toward its kind, a kind toward 0 (the
  hint), with ``prior_n`` pseudo-observations of spread ``prior_sigma``.
* Robust in log space: once a cell has ``robust_after`` observations, a new one is clipped to its
  mean +/- ``clip_z`` standard deviations before it is added (one wild straggler does not move
  the estimate much).
* :meth:`duration` is the expected run (LogNormal mean, ``exp(m + s^2 / 2)`` times expected);
  :meth:`quantile` the ``q``-quantile (``exp(m + z_q s)``), what hedging waits for;
  :meth:`gflop` the kind's estimated compute, what a decider's task features show.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

__all__ = ["RuntimeEstimator"]

_Z = NormalDist()


class _Stat:
    __slots__ = ("n", "mean", "m2")

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


class RuntimeEstimator:
    """Run-time estimates per (kind, tier) (module docstring)."""

    def __init__(self, prior_n: float = 1.0, prior_sigma: float = 0.5, clip_z: float = 3.0,
                 robust_after: int = 5):
        if prior_n <= 0 or prior_sigma <= 0 or clip_z <= 0:
            raise ValueError("prior_n, prior_sigma and clip_z must be > 0")
        self.prior_n, self.prior_sigma = float(prior_n), float(prior_sigma)
        self.clip_z, self.robust_after = float(clip_z), int(robust_after)
        self._kind: dict[str, _Stat] = {}
        self._cell: dict[tuple[str, str], _Stat] = {}
        self.observations = 0

    # ------------------------------------------------------------------ learning
    def observe(self, kind: str, tier: str, actual_s: float, expected_s: float) -> None:
        """A completed run of ``kind`` on ``tier``: it took ``actual_s``; the hint implied
        ``expected_s``. Non-positive or non-finite values are ignored."""
        if not (actual_s > 0 and expected_s > 0 and math.isfinite(actual_s)
                and math.isfinite(expected_s)):
            return
        x = math.log(actual_s / expected_s)
        cell = self._cell.get((kind, tier))
        if cell is None:
            cell = self._cell[(kind, tier)] = _Stat()
        if cell.n >= self.robust_after:
            m, s = self.log_params(kind, tier)
            x = min(max(x, m - self.clip_z * s), m + self.clip_z * s)
        cell.add(x)
        k = self._kind.get(kind)
        if k is None:
            k = self._kind[kind] = _Stat()
        k.add(x)
        self.observations += 1

    # ------------------------------------------------------------------ estimates
    def _shrink(self, st: _Stat | None, prior_m: float, prior_s: float) -> tuple[float, float]:
        n0 = self.prior_n
        if st is None or st.n == 0:
            return prior_m, prior_s
        n = st.n
        m = (n0 * prior_m + n * st.mean) / (n0 + n)
        # combined spread: the prior's, the data's, and how far the data's mean is from the prior
        var = (n0 * prior_s * prior_s + (n - 1) * st.var()
               + n0 * n / (n0 + n) * (st.mean - prior_m) ** 2) / (n0 + n - 1)
        return m, math.sqrt(max(var, 1e-12))

    def log_params(self, kind: str, tier: str | None) -> tuple[float, float]:
        """(mean, sd) of the log ratio for ``kind`` on ``tier`` (``None``: the kind over all tiers)."""
        km, ks = self._shrink(self._kind.get(kind), 0.0, self.prior_sigma)
        if tier is None:
            return km, ks
        return self._shrink(self._cell.get((kind, tier)), km, ks)

    def duration(self, kind: str, tier: str, expected_s: float) -> float:
        """Expected run time of ``kind`` on ``tier`` where the hint implies ``expected_s``."""
        m, s = self.log_params(kind, tier)
        return expected_s * math.exp(m + 0.5 * s * s)

    def quantile(self, kind: str, tier: str, expected_s: float, q: float) -> float:
        """The ``q``-quantile of that run time."""
        m, s = self.log_params(kind, tier)
        return expected_s * math.exp(m + _Z.inv_cdf(q) * s)

    def gflop(self, kind: str, hint_gflop: float) -> float:
        """The estimated compute (GFLOP) of a task of ``kind`` shown with ``hint_gflop``: what
        its expected run times imply (over all tiers)."""
        m, s = self.log_params(kind, None)
        return hint_gflop * math.exp(m + 0.5 * s * s)

    def median(self, kind: str, tier: str | None, expected_s: float) -> float:
        m, _ = self.log_params(kind, tier)
        return expected_s * math.exp(m)

    def summary(self) -> dict[str, Any]:
        """Per kind: observations, median factor (actual / hinted), spread (log sd)."""
        out = {}
        for kind in sorted(self._kind):
            m, s = self.log_params(kind, None)
            out[kind] = {"n": self._kind[kind].n, "median_factor": round(math.exp(m), 4),
                         "log_sd": round(s, 4)}
        return {"observations": self.observations, "kinds": out}
