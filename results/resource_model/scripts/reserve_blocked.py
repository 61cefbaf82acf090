"""Probe: does an EASY-style reservation (Slurm's backfill) for the oldest ready call that fits
no node shorten workflows? On agents.yaml, whole-GPU calls wait behind fractional ones (the
waits by GPU size are printed first). With the reservation, a younger call is not started on the node where the oldest
blocked call will first fit (by the running calls' expected ends) when that would delay it; the
rule then picks among the other nodes, or the call waits. Paired episodes (seeds 1000..),
agents.yaml at loads 0.6 and 0.8. An experiment script (results/resource_model/README.md; it
monkeypatches envs.node_sim), 2 min at N = 16 and 30 episodes:

    python results/resource_model/scripts/reserve_blocked.py EPISODES NODES RULE
"""
import sys
from dataclasses import replace
import numpy as np
from envs import node_sim
from envs.agents import load_agents
from envs.config_files import read_yaml, resolve_config_path
from policies.node_rules import node_policy
from scale_ray.relative import rel

E = node_sim._Episode
_ask, _ready = E.ask, E.ready
MODE = {"on": False, "stats": None}
READY = {}  # (episode, task id) -> when it became ready


def ready(self, t):
    READY.setdefault((id(self), t.id), self.now)
    _ready(self, t)


def oldest_blocked(ep, t):
    best = None
    q = ep.core.queue
    for _, _, c in q.heap + q.deferred + q.blocked:
        if c is t or c.state != node_sim.READY or not (c.key < t.key):
            continue
        if best is not None and not (c.key < best.key):
            continue
        if ep.table.fitting(c.demands):
            continue
        best = c
    return best


def ask(self, t):
    pick = _ask(self, t)
    if not MODE["on"] or pick < 0:
        return pick
    r = oldest_blocked(self, t)
    if r is None:
        return pick
    tab, now = self.table, self.now
    fits = [(tab.earliest_fit(i, r.demands, now), i) for i in range(tab.n)]
    T_r, h = min(fits)
    if pick != h or now + tab.run_time(h, t) <= T_r:
        return pick
    probe = object()
    tab.start(h, probe, t.demands, now + tab.run_time(h, t))
    T2 = tab.earliest_fit(h, r.demands, now)
    tab.finish(probe, h)
    if T2 <= T_r:
        return pick
    MODE["stats"][0] += 1
    tab.set_accepting(h, False)
    try:
        alt = _ask(self, t)
    finally:
        tab.set_accepting(h, True)
    return alt  # -1 or a node without h: a wait when nothing else fits


E.ask, E.ready = ask, ready
cfg0 = load_agents(read_yaml(resolve_config_path("configs/env/agents.yaml")))
n_ep, N, rule = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for load in (0.6, 0.8):
    cfg = replace(cfg0, gpu_load=load)
    res = {False: [], True: []}
    waits = {False: {}, True: {}}  # GPU size -> the waits (start - ready) of its calls
    for on in (False, True):
        MODE.update(on=on, stats=[0])
        for seed in range(1000, 1000 + n_ep):
            ep = node_sim.NodeSimulator(cfg, N).episode(seed)
            ep.policy = node_policy(rule)
            m = ep.run()
            res[on].append([m["mean_workflow_response_s"], m["p95_workflow_response_s"],
                            m["p99_workflow_response_s"]])
            for t in ep.tasks:
                waits[on].setdefault(dict(t.demands).get("GPU", 0.0), []).append(
                    t.start - READY[id(ep), t.id])
            READY.clear()
        held = MODE["stats"][0]
    for on in (False, True):
        print(f"N {N} load {load} {rule}{' + reserve' if on else ''}: waits by GPU size, model s: "
              + "; ".join(f"{g:g}: mean {np.mean(w):.2f} p99 {np.percentile(w, 99):.2f} "
                          f"max {max(w):.1f}" for g, w in sorted(waits[on].items())))
    a, b = np.array(res[False]), np.array(res[True])
    d = b / a - 1
    out = []
    for k, name in enumerate(("mean", "p95", "p99")):
        ci = 1.96 * d[:, k].std(ddof=1) / np.sqrt(len(d))
        out.append(f"{name} {a[:, k].mean():.2f} -> {b[:, k].mean():.2f} "
                   f"({rel(d[:, k].mean(), 2)} ± {100 * ci:.2f} points)")
    print(f"N {N} load {load} {rule} + reserve: " + "; ".join(out) + f"; picks held back {held}", flush=True)
