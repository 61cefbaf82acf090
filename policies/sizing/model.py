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
   backlog that would otherwise outlive the SLO; all of it times ``headroom``.
3. **Mix.** Up: the cheapest nodes to add to what is there (never a trade of one type for
   another) whose capacity covers the need; down: the cheapest subset of what is there that
   covers the need with ``down_margin`` to spare, within ``min_nodes``. Capacity: GPU capacity
   = GPUs x GPU speed, on GPU tiers only (GPU nodes only for GPU demand); CPU capacity = CPUs x
   CPU speed, a GPU node's counted at 1 - ``GPU_CPU_RESERVE`` (its CPUs also feed its model
   calls). Both kinds are covered at once: every count of the GPU tiers, each with its
   cheapest CPU cover.
4. **Apply.** Additions launch at once. A smaller mix that stays enough for ``down_after_s``,
   with no launch under way, gives the rest back, at most ``down_step`` of the nodes a turn,
   draining the nodes with the fewest runs that have served their billing
   minimum; a drained node takes no new work, so the placement
   consolidates on the rest and the drained ones empty.

It does not read the future of the trace, and it has no learned part: its calibrated settings
are ``beta``, ``max_utilization`` and ``headroom`` (results/autoscale/README.md says how they were
chosen).
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
        """Capacity needed per kind (step 2), times ``headroom`` x ``sizing.model.headroom``
        (``policies.sizing.learned`` chooses the first; 1 for ours)."""
        mc = self.mc
        r = self.rate(view)
        drain_s = mc.backlog_share * self.cfg.sizing.slo.p95_s
        out = {}
        for k in (CPU, GPU):
            a = r * view.work_per_workflow.get(k, 0.0)  # the offered load, in capacity units
            load = max(a / mc.max_utilization, a + mc.beta * math.sqrt(a))
            out[k] = headroom * mc.headroom * (load + view.queued_work.get(k, 0.0) / drain_s)
        return out

    def caps(self, tier) -> tuple[float, float]:
        res = tier.spec().resources
        gpu = res.get(GPU, 0.0) * (tier.gpu_speed or tier.compute)
        cpu = res.get(CPU, 0.0) * tier.compute * ((1 - GPU_CPU_RESERVE) if gpu else 1.0)
        return cpu, gpu

    def mix(self, need: dict[str, float], lo: dict[str, int], hi: dict[str, int]
            ) -> tuple[dict[str, int], bool]:
        """The cheapest counts per tier within ``lo``..``hi`` whose capacity covers ``need``
        in both kinds at once (step 3: a GPU node's CPUs count, so one more GPU node of a type
        with many CPUs can beat a CPU node), and whether they do: when nothing covers, the GPU
        kind's cheapest cover (or its tiers at ``hi``), then the CPU kind's (or at ``hi``)."""
        gpu = [(t.name, *self.caps(t), t.price_per_hour) for t in self.tiers if self.caps(t)[1] > 0]
        cpu = [(t.name, self.caps(t)[0], t.price_per_hour, lo[t.name], hi[t.name])
               for t in self.tiers if self.caps(t)[1] == 0]
        best: tuple[float, dict[str, int]] | None = None
        if not gpu:
            c = cheapest_mix(need[CPU], cpu)
            best = None if c is None else (0.0, c)
        else:
            *head, (name, c_cap, g_cap, price) = gpu
            for counts in itertools.product(*(range(lo[h[0]], hi[h[0]] + 1) for h in head)):
                base = sum(n * h[3] for n, h in zip(counts, head))
                if best is not None and base >= best[0]:
                    continue
                g_have = sum(n * h[2] for n, h in zip(counts, head))
                c_have = sum(n * h[1] for n, h in zip(counts, head))
                k = lo[name] if g_have >= need[GPU] - 1e-9 else max(
                    lo[name], math.ceil((need[GPU] - g_have) / g_cap - 1e-9))
                while k <= hi[name]:  # more of the last GPU type: more CPUs, until covered
                    cost = base + k * price
                    if best is not None and cost >= best[0]:
                        break
                    left = need[CPU] - c_have - k * c_cap
                    c = cheapest_mix(left, cpu)
                    if c is not None:
                        cost += sum(c[r[0]] * r[2] for r in cpu)
                        if best is None or cost < best[0] - 1e-12:
                            best = (cost, {h[0]: n for n, h in zip(counts, head)} | {name: k} | c)
                    if left <= 0:
                        break
                    k += 1
        if best is not None:
            return best[1], True
        gpu_rows = [(g[0], g[2], g[3], lo[g[0]], hi[g[0]]) for g in gpu]
        g = cheapest_mix(need[GPU], gpu_rows) or {r[0]: r[4] for r in gpu_rows}
        cpu_left = need[CPU] - sum(g[r[0]] * r[1] for r in gpu)
        return g | (cheapest_mix(cpu_left, cpu) or {r[0]: r[4] for r in cpu}), False

    def price(self, counts: dict[str, int]) -> float:
        """Dollars per hour of ``counts`` nodes per tier."""
        return sum(counts[t.name] * t.price_per_hour for t in self.tiers)

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
