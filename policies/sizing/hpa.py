"""The Kubernetes HorizontalPodAutoscaler rule, per tier (kubernetes.io, "Horizontal Pod
Autoscaling", algorithm details): every ``sync_s``, desired = ceil(ready x utilization /
target), unchanged while the ratio is within ``tolerance`` of 1; a scale-down goes only to the
highest recommendation of the last ``stabilization_s`` (its default behaviour), a scale-up at
once. Utilization is the busy share of the tier's bottleneck resource (GPU on a GPU tier, else
CPU) over its ready nodes; a tier keeps at least one node (minReplicas 1) or its ``min_nodes``.
"""

from __future__ import annotations

import math
from collections import deque

from envs.config import EnvConfig
from envs.demands import CPU, GPU
from envs.sizing import Plan, SizingView

__all__ = ["Hpa"]


class Hpa:
    """The HPA rule (module docstring) on every tier."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.hc = cfg.sizing.hpa
        self.interval_s = self.hc.sync_s
        self.res = {t.name: t.spec().resources for t in cfg.cluster.tiers}
        self.reset()

    def reset(self) -> None:
        self.recs: dict[str, deque] = {t: deque() for t in self.res}

    def decide(self, view: SizingView) -> Plan:
        hc = self.hc
        plan = Plan(why="hpa")
        for tier, res in self.res.items():
            kind = GPU if res.get(GPU) else CPU
            nodes = [nv for nv in view.nodes if nv.tier == tier and nv.accepting]
            launching = view.launching.get(tier, 0)
            current = len(nodes) + launching
            used = sum(nv.used.get(kind, 0.0) for nv in nodes)
            cap = res[kind] * len(nodes)
            desired = current
            if cap > 0:
                ratio = used / cap / hc.target
                if abs(ratio - 1) > hc.tolerance:
                    desired = math.ceil(len(nodes) * ratio)
            desired = max(desired, 1, self.cfg.cluster.tier(tier).min_nodes)
            recs = self.recs[tier]
            recs.append((view.t, desired))
            while recs and recs[0][0] < view.t - hc.stabilization_s:
                recs.popleft()
            if desired < current:
                desired = max(r for _, r in recs)  # the stabilization window
            if desired > current:
                plan.launch[tier] = desired - current
            elif desired < current:
                busy_last = sorted(nodes, key=lambda nv: (nv.running, -nv.idle_s))
                plan.drain += [nv.id for nv in busy_last[:current - desired]]
        return plan
