"""Ray's autoscaler (v2) emulated, as its docs and code describe it (ray/autoscaler/v2:
``scheduler.py`` bin-packs, ``instance_manager/reconciler.py`` launches and terminates):

* every ``update_s`` it reads the *pending resource demand* (the ready tasks that hold no
  node), first-fits it onto the free resources of the nodes present and of those launching,
  and bin-packs what is left onto new nodes, choosing for each new node the type that scores
  best: a type with GPUs is avoided for a demand that needs none, then more of the node's
  resource kinds used, then the higher least and mean utilization (``_compute_score``);
* at most ``max(5, upscaling_speed x running nodes of the type)`` nodes of a type launch at
  once, and ``max_concurrent_launches`` over all types;
* ``min_workers`` nodes of a type are kept; any other node idle (no run) for
  ``idle_timeout_s`` is terminated.

Latency, queueing, price and what is about to arrive are not its inputs; neither are they here.
"""

from __future__ import annotations

from envs.config import EnvConfig
from envs.demands import GPU
from envs.sizing import Plan, SizingView

__all__ = ["RayAutoscaler"]


def _fits(free: dict[str, float], demand: tuple) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in demand)


def _take(free: dict[str, float], demand: tuple) -> None:
    for k, v in demand:
        free[k] = free.get(k, 0.0) - v


class RayAutoscaler:
    """Ray's autoscaler (module docstring) over ``cfg``'s tiers as node types."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.rc = cfg.sizing.ray
        self.interval_s = self.rc.update_s
        self.types = {t.name: t.spec().resources for t in cfg.cluster.tiers}

    def reset(self) -> None:
        pass

    def _score(self, tier: str, packed: list[tuple]) -> tuple:
        res = self.types[tier]
        used: dict[str, float] = {}
        for d in packed:
            for k, v in d:
                used[k] = used.get(k, 0.0) + v
        gpu_ok = not (res.get(GPU, 0) > 0 and not used.get(GPU))
        utils = [used[k] / res[k] for k in used if res.get(k)]
        return (gpu_ok, len([k for k in used if used[k] > 0]),
                min(utils, default=0.0), sum(utils) / max(len(utils), 1))

    def _new_node(self, demands: list[tuple]) -> tuple[str, list[int]] | None:
        """The best type for a new node and which of ``demands`` it takes (first fit)."""
        best = None
        for tier, res in self.types.items():
            free = dict(res)
            took = []
            for j, d in enumerate(demands):
                if _fits(free, d):
                    _take(free, d)
                    took.append(j)
            if not took:
                continue
            score = self._score(tier, [demands[j] for j in took])
            if best is None or score > best[0]:
                best = (score, tier, took)
        return None if best is None else (best[1], best[2])

    def decide(self, view: SizingView) -> Plan:
        rc, cfg = self.rc, self.cfg
        plan = Plan(why="ray")
        running: dict[str, int] = {t: 0 for t in self.types}
        for nv in view.nodes:
            if nv.accepting:
                running[nv.tier] += 1
        # free resources: the nodes present (what their runs leave) and those launching
        bins = []
        for nv in view.nodes:
            if nv.accepting:
                bins.append({k: v - nv.used.get(k, 0.0) for k, v in self.types[nv.tier].items()})
        for tier, k in view.launching.items():
            bins += [dict(self.types[tier]) for _ in range(k)]
        left = []
        for d in sorted(view.pending, key=lambda d: sorted(d), reverse=True):
            for b in bins:
                if _fits(b, d):
                    _take(b, d)
                    break
            else:
                left.append(d)
        launching = dict(view.launching)
        total_launching = sum(launching.values())
        want: dict[str, int] = {}
        while left and sum(want.values()) < rc.max_concurrent_launches - total_launching:
            got = self._new_node(left)
            if got is None:
                break  # fits no node type (Ray reports it infeasible)
            tier, took = got
            want[tier] = want.get(tier, 0) + 1
            gone = set(took)
            left = [d for j, d in enumerate(left) if j not in gone]
        for tier, k in want.items():
            cap = max(5, int(rc.upscaling_speed * running[tier])) - launching.get(tier, 0)
            k = min(k, cap, rc.max_concurrent_launches - total_launching)
            if k > 0:
                plan.launch[tier] = k
                total_launching += k
        for t in cfg.cluster.tiers:  # min_workers: kept, and launched when short
            floor = max(rc.min_workers.get(t.name, 0), t.min_nodes)
            have = running[t.name] + launching.get(t.name, 0) + plan.launch.get(t.name, 0)
            if have < floor:
                plan.launch[t.name] = plan.launch.get(t.name, 0) + floor - have
        idle = sorted((nv for nv in view.nodes if nv.accepting and nv.running == 0
                       and nv.idle_s >= rc.idle_timeout_s), key=lambda nv: -nv.idle_s)
        for nv in idle:
            floor = max(rc.min_workers.get(nv.tier, 0), cfg.cluster.tier(nv.tier).min_nodes)
            if running[nv.tier] > floor:
                plan.drain.append(nv.id)
                running[nv.tier] -= 1
        return plan
