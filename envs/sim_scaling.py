"""The simulator's cluster sizing (``sim.scaling``, a part the simulator owns when
``env.sizing.policy`` is not static): every sizer turn it builds the :class:`envs.sizing.SizingView`,
asks the sizer (``policies.sizing``) for a :class:`envs.sizing.Plan` and applies it within the
tiers' bounds: launches through :meth:`envs.sim_cluster.Cluster.launch` (the node joins after a
delay drawn from its tier's ``launch_s``, from the episode's fifth random stream, so every sizer
sees the same delays in the same order), drains through :meth:`envs.sim_cluster.Cluster.remove`
(a drained node takes no new work; it leaves when its runs end).

Its constructor takes the settings, the sizer, the generator of launch delays and the few
collaborators it reads: the simulator (clock, tasks, workflows, idle times) and the cluster
part. A fork does not size (a planner's rollout keeps the node set; launches already asked for
still join).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import DistConfig, EnvConfig
from .decision import READY, RUNNING, WAITING
from .demands import CPU, GPU
from .events import SIZE
from .sizing import NodeView, Plan, Sizer, SizingView, within_budget, work
from .workload import draw

if TYPE_CHECKING:
    from .sim_cluster import Cluster
    from .simulator import Simulator

__all__ = ["Scaling", "HANDLERS", "work_of"]


def work_of(task: Any) -> tuple[str, float]:
    """A simulated task's work as sizing counts it (``envs.sizing.work``)."""
    return work(task.demands, bool(task.gpu), task.compute)


class Scaling:
    """The sizer's turns in one episode (module docstring)."""

    def __init__(self, cfg: EnvConfig, sizer: Sizer, rng_launch: np.random.Generator,
                 sim: "Simulator", cluster: "Cluster") -> None:
        self.cfg, self.sizer, self.rng = cfg, sizer, rng_launch
        self.sim, self.cluster = sim, cluster
        self.turns = self.launched = self.drained = 0
        self.decide_s: list[float] = []
        self.peak: dict[str, int] = {t.name: 0 for t in cfg.cluster.tiers}
        self.prices = {t.name: t.price_per_hour for t in cfg.cluster.tiers}
        self.over_budget = False  # the last turn's launches were cut to sizing.budget_per_hour
        #: per turn: (t, nodes per tier accepting or launching) -- the bench's plot
        self.timeline: list[tuple[float, dict[str, int]]] = []

    def start(self, t: float) -> None:
        """The first turn now; the peak counts from the initial nodes."""
        self._note_peak()
        self.sim.event_q.push(t, SIZE, None, None)

    def delay(self, dist: DistConfig | None) -> float:
        return 0.0 if dist is None else float(draw(dist, self.rng, 1)[0])

    def turn(self) -> None:
        """One sizer turn: view, decide, apply; the next turn while the episode goes on."""
        sim = self.sim
        t0 = time.perf_counter()
        view = self.view()
        plan = self.sizer.decide(view)
        self.decide_s.append(time.perf_counter() - t0)
        self.turns += 1
        self.apply(plan, view)
        if sim.outstanding or not sim.arrivals.done:
            sim.event_q.push(sim.t + self.sizer.interval_s, SIZE, None, None)

    def apply(self, plan: Plan, view: SizingView) -> None:
        """Launch and drain within each tier's ``min_nodes``/``max_nodes`` and the free node
        positions."""
        sim, cl = self.sim, self.cluster
        counts = self.counts()
        free = sim.table.n - cl.count - sum(len(v) for v in cl.launching.values())
        launch, self.over_budget = within_budget(plan.launch, counts, self.prices,
                                                 self.cfg.sizing.budget_per_hour)
        for tier_name, k in launch.items():
            tier = self.cfg.cluster.tier(tier_name)
            room = (tier.max_nodes if tier.max_nodes is not None else 10**9) - counts[tier_name]
            k = min(int(k), room, free)
            for _ in range(max(k, 0)):
                cl.launch(tier, sim.t, self.delay(tier.launch_s), sim.trace)
                counts[tier_name] += 1
                free -= 1
                self.launched += 1
        tiers = {nv.id: nv.tier for nv in view.nodes if nv.accepting}
        for sid in plan.drain:
            tier_name = tiers.pop(sid, None)
            if tier_name is None:  # gone, already draining or unknown
                continue
            if counts[tier_name] - 1 < self.cfg.cluster.tier(tier_name).min_nodes:
                continue
            cl.remove(sim.t, sim.trace, None, sid)
            counts[tier_name] -= 1
            self.drained += 1
        self._note_peak()

    def counts(self) -> dict[str, int]:
        """Per tier, the nodes accepting work plus the nodes launching."""
        table, cl = self.sim.table, self.cluster
        out = {t.name: len(cl.launching.get(t.name, ())) for t in self.cfg.cluster.tiers}
        for i in table.positions():
            if table.accept_l[i]:
                out[table.specs[i].name] += 1
        return out

    def _note_peak(self) -> None:
        counts = self.counts()
        for k, v in counts.items():
            self.peak[k] = max(self.peak[k], v)
        self.timeline.append((self.sim.t, counts))

    def view(self) -> SizingView:
        """What the sizer reads now (``envs.sizing.SizingView``)."""
        sim, table, cl = self.sim, self.sim.table, self.cluster
        t = sim.t
        nodes = []
        for i in table.positions():
            run = table.running[i]
            used: dict[str, float] = {}
            for task in run:
                for k, v in task.demands:
                    used[k] = used.get(k, 0.0) + v
            since = cl.billing.since(table.ids[i])
            nodes.append(NodeView(table.ids[i], table.specs[i].name, bool(table.accept_l[i]),
                                  len(run), 0.0 if run else t - sim.idle_since[i], used,
                                  0.0 if since is None else t - since))
        pending = []
        queued, later, running = {CPU: 0.0, GPU: 0.0}, {CPU: 0.0, GPU: 0.0}, {CPU: 0.0, GPU: 0.0}
        for task in sim.tasks[sim.done_below:]:
            st = task.state
            if st == READY:
                kind, w = work_of(task)
                queued[kind] += w
                pending.append(task.demands)
            elif st == WAITING:
                kind, w = work_of(task)
                later[kind] += w
            elif st == RUNNING:
                kind, w = work_of(task)
                speed = table.speed(task.slot, task.demands) if task.slot >= 0 else 1.0
                left = max(0.0, (task.run_from + task.compute / speed) - t) * speed
                running[kind] += w * left / max(task.compute, 1e-9)
        return SizingView(t, nodes, {k: len(v) for k, v in cl.launching.items()}, pending,
                          queued, later, running, [w.arrival for w in sim.workflows],
                          self._per_workflow())

    def _per_workflow(self) -> dict[str, float]:
        """Mean work of an arrived request (resource-seconds at speed 1, by kind), from the
        last 500 arrivals."""
        wfs = self.sim.workflows[-500:]
        out = {CPU: 0.0, GPU: 0.0}
        for wf in wfs:
            for task in wf.tasks:
                kind, w = work_of(task)
                out[kind] += w
        return {k: v / len(wfs) for k, v in out.items()} if wfs else out

    def metrics(self) -> dict[str, Any]:
        ms = [1e3 * s for s in self.decide_s] or [0.0]
        return {"sizing_turns": self.turns, "nodes_launched": self.launched,
                "nodes_drained": self.drained, "peak_nodes": dict(self.peak),
                "sizing_timeline": [[t, c] for t, c in self.timeline],
                "arrivals_per_min": np.bincount(np.array(
                    [int(w.arrival // 60) for w in self.sim.workflows], dtype=int)).tolist(),
                "sizing_decide_ms_mean": float(np.mean(ms)),
                "sizing_decide_ms_max": float(np.max(ms))}


def _on_size(sim: "Simulator", _a: Any, _b: Any) -> None:
    if sim.scaling is not None:  # a fork does not size
        sim.scaling.turn()


#: the simulator's handler of the sizing turns
HANDLERS = {SIZE: _on_size}
