"""A learned head-room on top of our sizer (issue 72 item 5; results/autoscale/README.md).

Where learning may pay in sizing is not the arithmetic of node mixes (``policies.sizing.model``
does it exactly) but how much head-room to keep: the model asks for the capacity that holds the
offered load under ``max_utilization`` plus ``beta`` x sqrt(load); a policy that sees the
backlog and the trend could ask for less in a calm hour and more before a burst.
:class:`HeadroomSizer` is our sizer with its need multiplied by one of :data:`HEADROOM`, chosen
every ``every`` turns by ``act(features)``; ``act`` None keeps 1.0 (our sizer exactly).
``scale_ray.bench.autoscale_rl`` trains ``act`` with RLlib PPO in the simulator on cost plus an
SLO penalty and evaluates it on held-out seeds against our sizer.

The features (:meth:`HeadroomSizer.features`, all from the :class:`envs.sizing.SizingView`,
nothing from the future): the arrival rate expected one launch ahead over the config's mean
rate; per kind (CPU, GPU) the need at head-room 1 over the capacity there is (accepting and
launching), the queued and the waiting work over (capacity x the SLO bound); the share of
nodes still launching; the head-room in force.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from envs.config import EnvConfig
from envs.demands import CPU, GPU
from envs.sizing import Plan, SizingView

from .model import ModelSizer

__all__ = ["HeadroomSizer", "HEADROOM", "N_FEATURES"]

#: the head-rooms a policy may choose (index 2: our sizer's)
HEADROOM = (0.7, 0.85, 1.0, 1.2, 1.5)
N_FEATURES = 9


class HeadroomSizer:
    """Our sizer, its need times a head-room ``act`` chooses every ``every`` turns (module
    docstring). ``asked`` is set on each turn ``act`` was called (the training env's cue)."""

    def __init__(self, cfg: EnvConfig, act: Callable[[np.ndarray], int] | None = None,
                 every: int = 6) -> None:
        if every < 1:
            raise ValueError(f"every: must be >= 1, got {every}")
        self.model = ModelSizer(cfg)
        self.interval_s = self.model.interval_s
        self.act, self.every = act, every
        w = cfg.workload
        self.mean_rate = max(w.arrival_rate_16 * cfg.cluster.servers / 16.0, 1e-9)
        self.slo_s = cfg.sizing.slo.p95_s
        self.reset()

    def reset(self) -> None:
        self.model.reset()
        self.turn, self.choice, self.asked = 0, HEADROOM.index(1.0), False
        self.chosen = [0] * len(HEADROOM)  # turns at each head-room (the report's)

    def features(self, view: SizingView) -> np.ndarray:
        need = self.model.need(view)
        cap = {CPU: 0.0, GPU: 0.0}
        tiers = {t.name: t for t in self.model.tiers}
        counts = dict(view.launching)
        for nv in view.nodes:
            if nv.accepting:
                counts[nv.tier] = counts.get(nv.tier, 0) + 1
        for name, k in counts.items():
            c, g = self.model.caps(tiers[name])
            cap[CPU] += k * c
            cap[GPU] += k * g
        n = sum(counts.values())
        f = [self.model.rate(view) / self.mean_rate]
        for kind in (CPU, GPU):
            room = max(cap[kind], 1e-9)
            f += [need[kind] / room, view.queued_work.get(kind, 0.0) / (room * self.slo_s),
                  view.waiting_work.get(kind, 0.0) / (room * self.slo_s)]
        f += [sum(view.launching.values()) / max(n, 1), HEADROOM[self.choice]]
        return np.clip(np.asarray(f, dtype=np.float32), 0.0, 10.0)

    def decide(self, view: SizingView) -> Plan:
        self.asked = False
        if self.act is not None and self.turn % self.every == 0:
            self.choice = int(self.act(self.features(view)))
            self.asked = True
        self.turn += 1
        self.chosen[self.choice] += 1
        plan = self.model.decide(view, HEADROOM[self.choice])
        plan.why += f" headroom {HEADROOM[self.choice]}"
        return plan
