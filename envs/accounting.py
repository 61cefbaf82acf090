"""What a cluster costs and whether it met the SLO (numpy + stdlib).

:class:`Billing` bills each node from the moment it is asked for (a launch is paid for while it
boots, as on every cloud) until it leaves, by the second, at least ``billing_min_s``, at its
tier's ``price_per_hour``. :func:`slo_report` groups workflows by the ``window_s`` window they
arrived in and checks each window's p95 response against the bound; a workflow that did not
finish counts as a miss (its response is unbounded). Windows with no arrival meet it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from .sizing import SloConfig

__all__ = ["Billing", "slo_report", "window_p95", "UNFINISHED"]

UNFINISHED = 1e18  # an unfinished response (finite: percentiles of inf are nan)


class Billing:
    """Node-seconds and cost of one episode (module docstring)."""

    def __init__(self, prices: dict[str, float], billing_min_s: float) -> None:
        self.prices = prices
        self.min_s = billing_min_s
        self.open: dict[Any, tuple[str, float]] = {}  # key -> (tier, since)
        # billed seconds per tier of the nodes that left (summed in leaving order: bounded)
        self.closed: dict[str, float] = {k: 0.0 for k in prices}

    def copy(self) -> "Billing":
        out = Billing(self.prices, self.min_s)
        out.open, out.closed = dict(self.open), dict(self.closed)
        return out

    def start(self, key: Any, tier: str, t: float) -> None:
        """Node (or launch) ``key`` of ``tier`` is billed from ``t``."""
        self.open[key] = (tier, t)

    def rekey(self, old: Any, new: Any) -> None:
        """A launch became a node: the same bill goes on under the node's key."""
        self.open[new] = self.open.pop(old)

    def since(self, key: Any) -> float | None:
        got = self.open.get(key)
        return None if got is None else got[1]

    def stop(self, key: Any, t: float) -> None:
        """Node ``key`` left at ``t``."""
        got = self.open.pop(key, None)
        if got is not None:
            self.closed[got[0]] = self.closed.get(got[0], 0.0) + max(t - got[1], self.min_s)

    def totals(self, t: float) -> dict[str, Any]:
        """Cost (``cost``, in the prices' currency) and node-hours per tier, nodes still open
        billed up to ``t``."""
        secs = dict(self.closed)
        for tier, since in self.open.values():
            secs[tier] = secs.get(tier, 0.0) + max(t - since, self.min_s)
        cost = sum(s * self.prices.get(k, 0.0) / 3600.0 for k, s in secs.items())
        return {"cost": cost, "node_hours": {k: s / 3600.0 for k, s in secs.items()}}


def window_p95(responses: Any) -> float:
    """The p95 of one window's responses (``UNFINISHED`` for a workflow that did not finish;
    then possibly inf); 0.0 for none."""
    if not len(responses):
        return 0.0
    p = float(np.percentile(responses, 95))
    return math.inf if p >= UNFINISHED / 2 else p


def slo_report(workflows: Iterable[Any], slo: SloConfig, until: float) -> dict[str, Any]:
    """Per ``slo.window_s`` window of arrival times in ``[0, until)``: the p95 workflow response
    (unfinished: inf) and whether it meets ``slo.p95_s``; ``attainment`` the share that do."""
    n = max(1, math.ceil(until / slo.window_s))
    resp: list[list[float]] = [[] for _ in range(n)]
    for w in workflows:
        k = int(w.arrival // slo.window_s)
        if 0 <= k < n:
            resp[k].append(w.finish - w.arrival if w.done == w.n else UNFINISHED)
    p95 = [window_p95(r) for r in resp]
    met = [p <= slo.p95_s for p in p95]
    return {"windows": n, "windows_met": int(sum(met)), "attainment": sum(met) / n,
            "window_p95_s": p95, "worst_window_p95_s": max(p95),
            "slo_met": sum(met) / n >= slo.target}
