"""Our sizer: the cheapest node mix that keeps every resource under a utilization bound at the
load expected one launch ahead, plus what drains the backlog in time (``env.sizing.model``).

What it reads that an autoscaler does not (``envs.sizing.SizingView``): the work of every
request in flight (queued and running, in resource-seconds at speed 1, by kind: GPU work for
the GPU, the rest for CPUs), the mean work of a request, the arrivals and their trend, and the
price of each node type. Every ``interval_s``:

1. **Rate.** r = arrivals over the last ``trend_s``; its slope from the two halves of the last
   ``slope_s`` (longer, so that a burst is not taken for a trend; none before ``slope_s``);
   the rate expected when a node asked for now joins, r + max(slope, 0) x (the slowest launch
   + one interval): up at once, down only as it is seen.
2. **Need**, per kind k, with the offered load a = r x (work of a request in k), in capacity
   units: max(a / ``max_utilization``, a + ``beta`` x sqrt(a)) (square-root staffing: a small
   cluster needs more head-room than a large one for the same wait, as in Erlang C), plus
   (work ready and waiting for a node in k) / (``backlog_share`` x the SLO's p95 bound), a
   backlog that would otherwise outlive the SLO.
3. **Mix.** Up: the cheapest nodes to add to what is there (never a trade of one type for
   another) whose capacity covers the need; down: the cheapest subset of what is there that
   covers the need with ``down_margin`` to spare, within ``min_nodes``. Capacity: GPU capacity = GPUs x GPU speed, on GPU tiers only (GPU nodes only for GPU
   demand); CPU capacity = CPUs x CPU speed, a GPU node's counted at 1 - ``GPU_CPU_RESERVE``
   (its CPUs also feed its model calls). Enumerated exactly over the tiers of a kind.
4. **Apply.** Additions launch at once. A smaller mix that stays enough for ``down_after_s``,
   with no launch under way, gives the rest back, at most ``down_step`` of the nodes a turn,
   draining the nodes with the fewest runs that have served their billing
   minimum; a drained node takes no new work, so the placement
   consolidates on the rest and the drained ones empty.

It does not read the future of the trace, and it has no learned part: its one calibrated
settings are ``beta`` and ``max_utilization`` (docs/autoscale.md says how they were chosen).
"""

from __future__ import annotations

import bisect
import itertools
import math

from envs.config import EnvConfig
from envs.demands import CPU, GPU
from envs.sizing import Plan, SizingView

__all__ = ["ModelSizer", "GPU_CPU_RESERVE", "cheapest_mix"]

GPU_CPU_RESERVE = 0.25  # share of a GPU node's CPU capacity left to its own model calls


def cheapest_mix(need: float, tiers: list[tuple[str, float, float, int, int]]
                 ) -> dict[str, int] | None:
    """The cheapest counts covering ``need`` capacity: ``tiers`` as (name, capacity per node,
    price per node, min, max); None when even every tier at its max falls short."""
    if not tiers:
        return {} if need <= 0 else None
    best: tuple[float, dict[str, int]] | None = None
    *head, (name, cap, price, lo, hi) = tiers
    ranges = [range(lo_, hi_ + 1) for _, _, _, lo_, hi_ in head]
    for counts in itertools.product(*ranges):
        have = sum(c * t[1] for c, t in zip(counts, head))
        rest = need - have
        k = lo if rest <= 0 or cap <= 0 else max(lo, math.ceil(rest / cap - 1e-9))
        if k > hi or (cap <= 0 and rest > 0):
            continue
        cost = sum(c * t[2] for c, t in zip(counts, head)) + k * price
        if best is None or cost < best[0] - 1e-12:
            best = (cost, {t[0]: c for c, t in zip(counts, head)} | {name: k})
    return None if best is None else best[1]


class ModelSizer:
    """Our sizer (module docstring)."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.mc = cfg.sizing.model
        self.interval_s = self.mc.interval_s
        self.tiers = cfg.cluster.tiers
        self.horizon_s = max((t.launch_s.mean if t.launch_s is not None else 0.0)
                             for t in self.tiers) + self.interval_s
        self.reset()

    def reset(self) -> None:
        self.above_since: dict[str, float] = {}

    def rate(self, view: SizingView) -> float:
        """Requests per second expected one launch ahead (step 1)."""
        mc, arr, t = self.mc, view.arrivals, view.t
        span = min(mc.trend_s, t)
        if span <= 0:
            return 0.0
        r = (len(arr) - bisect.bisect_left(arr, t - span)) / span
        if t < mc.slope_s:  # too short a past for a trend
            return r
        half = mc.slope_s / 2
        old = bisect.bisect_left(arr, t - half) - bisect.bisect_left(arr, t - mc.slope_s)
        new = len(arr) - bisect.bisect_left(arr, t - half)
        slope = (new - old) / half / half
        return r + max(slope, 0.0) * self.horizon_s

    def need(self, view: SizingView, headroom: float = 1.0) -> dict[str, float]:
        """Capacity needed per kind (step 2), times ``headroom`` (``policies.sizing.learned``
        chooses it; 1 for ours)."""
        mc = self.mc
        r = self.rate(view)
        drain_s = mc.backlog_share * self.cfg.sizing.slo.p95_s
        out = {}
        for k in (CPU, GPU):
            a = r * view.work_per_workflow.get(k, 0.0)  # the offered load, in capacity units
            out[k] = headroom * (max(a / mc.max_utilization, a + mc.beta * math.sqrt(a))
                                 + view.queued_work.get(k, 0.0) / drain_s)
        return out

    def caps(self, tier) -> tuple[float, float]:
        res = tier.spec().resources
        gpu = res.get(GPU, 0.0) * (tier.gpu_speed or tier.compute)
        cpu = res.get(CPU, 0.0) * tier.compute * ((1 - GPU_CPU_RESERVE) if gpu else 1.0)
        return cpu, gpu

    def mix(self, need: dict[str, float], lo: dict[str, int], hi: dict[str, int]
            ) -> tuple[dict[str, int], bool]:
        """The cheapest counts per tier within ``lo``..``hi`` whose capacity covers ``need``
        (step 3), and whether they do: a kind nothing covers gets its tiers at ``hi``."""
        gpu_tiers = [t for t in self.tiers if self.caps(t)[1] > 0]
        cpu_tiers = [t for t in self.tiers if self.caps(t)[1] == 0]
        g = cheapest_mix(need[GPU], [(t.name, self.caps(t)[1], t.price_per_hour, lo[t.name],
                                      hi[t.name]) for t in gpu_tiers])
        covered = g is not None
        if g is None:
            g = {t.name: hi[t.name] for t in gpu_tiers}
        cpu_left = need[CPU] - sum(g[t.name] * self.caps(t)[0] for t in gpu_tiers)
        c = cheapest_mix(cpu_left, [(t.name, self.caps(t)[0], t.price_per_hour, lo[t.name],
                                     hi[t.name]) for t in cpu_tiers])
        if c is None:
            covered = False
            c = {t.name: hi[t.name] for t in cpu_tiers}
        return g | c, covered

    def decide(self, view: SizingView, headroom: float = 1.0) -> Plan:
        mc, t = self.mc, view.t
        need = self.need(view, headroom)
        nodes = {tier.name: [] for tier in self.tiers}
        for nv in view.nodes:
            if nv.accepting:
                nodes[nv.tier].append(nv)
        have = {k: len(v) + view.launching.get(k, 0) for k, v in nodes.items()}
        floor = {tier.name: tier.min_nodes for tier in self.tiers}
        top = {tier.name: max(tier.max_nodes, have[tier.name]) for tier in self.tiers}
        # up: the cheapest additions to what is there (never trade one type for another)
        up, _ = self.mix(need, have, top)  # short even at every bound: that kind at its bound
        plan = Plan(why=f"need cpu {need[CPU]:.1f} gpu {need[GPU]:.2f}")
        launch = {k: up[k] - have[k] for k in have if up[k] > have[k]}
        if launch:
            plan.launch = launch
            self.above_since.clear()
            return plan
        if any(view.launching.values()):  # no scale-down while launches are under way
            self.above_since.clear()
            return plan
        # down: the cheapest subset of what is there that covers the need with the margin
        margin = {k: v * (1 + mc.down_margin) for k, v in need.items()}
        down, covered = self.mix(margin, floor, have)
        if not covered or down == have:
            self.above_since.clear()
            return plan
        since = self.above_since.setdefault("down", t)
        if t - since < mc.down_after_s:
            return plan
        budget = max(1, math.ceil(mc.down_step * sum(have.values())))
        for name, k in have.items():
            excess = min(k - down[name], budget)
            if excess <= 0:
                continue
            budget -= excess
            served = [nv for nv in nodes[name] if nv.age_s >= self.cfg.cluster.billing_min_s]
            served.sort(key=lambda nv: (nv.running, -nv.idle_s))
            plan.drain += [nv.id for nv in served[:excess]]
        self.above_since.clear()
        return plan
