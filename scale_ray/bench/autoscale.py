"""Cluster sizing against a latency SLO at least cost (issue 72; docs/autoscale.md): the sizers
of ``policies.sizing`` on ``configs/env/autoscale.yaml`` (agents on CPU tool nodes and GPU model
nodes, four hours of a daily-shaped load with bursts), the same requests and the same launch
delays for every arm (paired seeds), cost and SLO attainment first, then workflow response.

Arms (sizer / placement):

* ``model/eft`` — ours (``policies.sizing.model``) with EFT placement;
* ``ray/ray``, ``ray/eft`` — Ray's autoscaler v2 emulated with its defaults (min_workers 0, idle
  timeout 300 s), with Ray's default placement and with EFT;
* ``ray-tuned/ray`` — the reference a user would deploy: Ray's autoscaler with the cheapest
  setting of ``min_workers`` per type (0, 1/4 or 1/2 of the type's peak under ``ray/ray``) and
  idle timeout (60 s, 300 s) that meets the SLO (attainment >= its target) on every seed;
* ``hpa/eft`` — the Kubernetes HPA rule per node type;
* ``static/eft`` — a fixed cluster sized for the peak: each type at the most nodes ``ray/eft``
  held at once on any seed.

``--decision-time`` also times our sizer's turn (the view of the cluster and the decision) at
``--dt-nodes`` nodes and ``--dt-tasks`` tasks in flight.

    scale-ray bench autoscale --seeds 0 1 2 --json results/autoscale/autoscale.json
    scale-ray bench autoscale --arms model/eft --seeds 100 101 --set sizing.model.beta=1.0
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from envs.config_base import replace, to_dict
from envs.sim_scaling import Scaling
from envs.simulator import Simulator
from policies import get_policy
from policies.sizing import ModelSizer
from scale_ray.config import load_env
from scale_ray.evaluation import run_episode
from scale_ray.relative import rel

ARMS = ("model/eft", "ray/ray", "ray/eft", "hpa/eft")
FRACTIONS = (0.0, 0.25, 0.5)  # min_workers per type: these shares of its ray/ray peak
IDLE_S = (60.0, 300.0)  # idle timeouts: KubeRay's 60 s, VMs' 300 s
KEEP = ("cost", "node_hours", "slo_attainment", "slo_windows_met", "slo_windows",
        "slo_worst_window_p95_s", "mean_workflow_response_s", "p95_workflow_response_s",
        "p99_workflow_response_s", "completed_workflows_ratio", "nodes_launched",
        "nodes_drained", "peak_nodes", "sizing_decide_ms_mean", "sizing_decide_ms_max",
        "arrived_tasks")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/env/autoscale.yaml", help="the env config")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="paired episodes: the same requests and launch delays for every arm")
    p.add_argument("--horizon-s", type=float, default=None,
                   help="arrivals stop here (default: the config's workload.horizon_s)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS),
                   help="the arms to run (static/eft needs ray/eft, the tuned grid ray/ray)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="env override, e.g. --set sizing.model.beta=1.5 (repeatable)")
    p.add_argument("--no-tuned", action="store_true",
                   help="skip the tuned Ray grid (2 x 3 settings x seeds episodes)")
    p.add_argument("--workers", type=int, default=2, help="processes")
    p.add_argument("--decision-time", action="store_true",
                   help="also time our sizer's turn at --dt-nodes nodes, --dt-tasks in flight")
    p.add_argument("--only-decision-time", action="store_true",
                   help="time our sizer's turn (--decision-time) and run no episode")
    p.add_argument("--dt-nodes", type=int, default=256, help="nodes for --decision-time")
    p.add_argument("--dt-tasks", type=int, default=10_000,
                   help="tasks in flight for --decision-time")
    p.add_argument("--json", default=None, help="write every episode and the table here")


def _episode(job: tuple) -> dict[str, Any]:
    env, arm, setting, seed = job
    sizer, placement = arm.split("/")
    over: dict[str, Any] = {"policy": "ray" if sizer == "ray-tuned" else sizer}
    if setting:
        over["ray"] = setting
    cfg = replace(env, sizing=over)
    t0 = time.perf_counter()
    m = run_episode(cfg, placement, seed)
    return {k: m.get(k) for k in KEEP} | {"arm": arm, "setting": setting, "seed": seed,
                                          "seconds": time.perf_counter() - t0}


def _static(env, peak: dict[str, int]):
    """``env`` with a fixed cluster of ``peak`` nodes per tier, no sizer, the same requests (the
    arrival rate is lambda16 x N / 16 of the initial N: lambda16 rescaled to keep it)."""
    cl = to_dict(env.cluster)
    for t in cl["tiers"]:
        t["count"] = peak[t["name"]]
        t["max_nodes"] = max(t.get("max_nodes") or 0, t["count"])
    cl["servers"] = sum(peak.values())
    rate = env.workload.arrival_rate_16 * env.cluster.servers / cl["servers"]
    return replace(env, cluster=cl, sizing={"policy": "static"},
                   workload={"arrival_rate_16": rate})


def _run(jobs: list[tuple], workers: int, label: str) -> list[dict[str, Any]]:
    print(f"{label}: {len(jobs)} episodes on {workers} processes", flush=True)
    t0 = time.perf_counter()
    out = []
    with ProcessPoolExecutor(max(1, workers)) as pool:
        for k, e in enumerate(pool.map(_episode, jobs), 1):
            out.append(e)
            print(f"  {k}/{len(jobs)} {e['arm']} {e['setting'] or ''} seed {e['seed']}: "
                  f"${e['cost']:.2f}, attainment {e['slo_attainment']:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def summarize(episodes: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    mine = [e for e in episodes if e["arm"] == arm]
    r: dict[str, Any] = {"arm": arm, "episodes": len(mine), "setting": mine[0]["setting"]}
    for k in ("cost", "slo_attainment", "mean_workflow_response_s", "p95_workflow_response_s",
              "p99_workflow_response_s", "nodes_launched", "nodes_drained"):
        vals = [e[k] for e in mine if e[k] is not None]
        r[k] = float(np.mean(vals)) if vals else math.nan
    r["min_attainment"] = min(e["slo_attainment"] for e in mine)
    r["completed"] = min(e["completed_workflows_ratio"] for e in mine)
    tiers = sorted({k for e in mine for k in e["node_hours"]})
    r["node_hours"] = {k: float(np.mean([e["node_hours"].get(k, 0.0) for e in mine]))
                       for k in tiers}
    ms = [e["sizing_decide_ms_max"] for e in mine if e.get("sizing_decide_ms_max") is not None]
    r["decide_ms_max"] = max(ms) if ms else None
    return r


def format_table(rows: list[dict[str, Any]], ref: str, target: float) -> str:
    by = {r["arm"]: r for r in rows}
    lines = [f"{'arm':16s} {'cost $':>8s} {'vs ' + ref:>14s} {'attain':>7s} {'min':>6s} "
             f"{'mean s':>7s} {'p95 s':>6s} {'p99 s':>6s} {'launch':>7s} {'drain':>6s}  "
             f"node-hours"]
    for r in rows:
        vs = rel(r["cost"] / by[ref]["cost"] - 1) if ref in by else "-"
        nh = ", ".join(f"{k} {v:.1f}" for k, v in r["node_hours"].items())
        lines.append(f"{r['arm']:16s} {r['cost']:8.2f} {vs:>14s} {r['slo_attainment']:7.3f} "
                     f"{r['min_attainment']:6.3f} {r['mean_workflow_response_s']:7.1f} "
                     f"{r['p95_workflow_response_s']:6.1f} {r['p99_workflow_response_s']:6.1f} "
                     f"{r['nodes_launched']:7.0f} {r['nodes_drained']:6.0f}  {nh}")
    lines.append(f"(means over paired seeds; attain: the share of SLO windows met, target "
                 f"{target:g}; min: the worst seed's)")
    return "\n".join(lines)


def decision_time(env, nodes: int, tasks: int) -> dict[str, Any]:
    """Our sizer's turn (view + decide) timed at ``nodes`` nodes with ``tasks`` in flight: a
    static cluster of that size fed far more requests than it serves, stopped once ``tasks``
    are in flight; 50 turns timed."""
    ratio = {t.name: t.max_nodes or 1 for t in env.cluster.tiers}
    total = sum(ratio.values())
    counts = {k: max(1, round(nodes * v / total)) for k, v in ratio.items()}
    counts[env.cluster.tiers[0].name] += nodes - sum(counts.values())
    big = _static(env, counts)
    big = replace(big, workload={"arrival_rate_16": 50.0 * 16 / nodes,  # 50 requests/s
                                 "curve": {"kind": "none", "bursts_per_hour": 0}})
    sim = Simulator(big)
    sim.reset(0)
    pol = get_policy("eft", big)
    while sim.current is not None and sim.outstanding < tasks:
        sim.step(pol.decide(sim))
    sized = replace(env, cluster=big.cluster)
    scaling = Scaling(sized, ModelSizer(sized), np.random.default_rng(0), sim, sim.cluster)
    view_s, decide_s = [], []
    sizer = scaling.sizer
    for _ in range(50):
        t0 = time.perf_counter()
        view = scaling.view()
        t1 = time.perf_counter()
        sizer.decide(view)
        t2 = time.perf_counter()
        view_s.append(t1 - t0)
        decide_s.append(t2 - t1)
    turn = [1e3 * (a + b) for a, b in zip(view_s, decide_s)]
    return {"nodes": sim.cluster.count, "tasks_in_flight": sim.outstanding,
            "view_ms_median": 1e3 * float(np.median(view_s)),
            "decide_ms_median": 1e3 * float(np.median(decide_s)),
            "turn_ms_median": float(np.median(turn)), "turn_ms_max": float(np.max(turn))}


def run(args: argparse.Namespace) -> int:
    env = load_env(args.config, args.overrides)
    if args.horizon_s is not None:
        env = replace(env, workload={"horizon_s": args.horizon_s})
    if env.sizing.policy == "static":
        env = replace(env, sizing={"policy": "model"})  # validates the bounds a sizer needs
    t0 = time.perf_counter()
    dt = None
    if args.decision_time or args.only_decision_time:
        dt = decision_time(env, args.dt_nodes, args.dt_tasks)
        print(f"decision time: {dt['nodes']} nodes, {dt['tasks_in_flight']} tasks in flight: "
              f"turn {dt['turn_ms_median']:.1f} ms median, {dt['turn_ms_max']:.1f} ms max "
              f"(view {dt['view_ms_median']:.1f} ms, decide {dt['decide_ms_median']:.1f} ms)",
              flush=True)
        if args.only_decision_time:
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"config": args.config, "decision_time": dt}, fh, indent=1)
                print(f"wrote {args.json}")
            return 0
    arms = tuple(a for a in ARMS if a in args.arms)
    episodes = _run([(env, arm, None, s) for arm in arms for s in args.seeds], args.workers,
                    "arms")

    def peak(arm: str) -> dict[str, int]:
        return {t.name: max(e["peak_nodes"][t.name] for e in episodes if e["arm"] == arm)
                for t in env.cluster.tiers}

    peak_eft = peak("ray/eft") if "ray/eft" in arms else None
    jobs, settings = [], []
    if peak_eft is not None:
        jobs = [(_static(env, peak_eft), "static/eft", None, s) for s in args.seeds]
        arms += ("static/eft",)
    if not args.no_tuned and "ray/ray" in arms:
        peak_ray = peak("ray/ray")
        for f in FRACTIONS:
            for idle in IDLE_S:
                settings.append({"idle_timeout_s": idle, "min_workers": {
                    k: int(math.floor(f * v)) for k, v in peak_ray.items()}})
        jobs += [(env, "ray-tuned/ray", st, s) for st in settings for s in args.seeds]
    if jobs:
        episodes += _run(jobs, args.workers, "static and the tuned Ray grid")
    target = env.sizing.slo.target
    rows = [summarize(episodes, arm) for arm in arms]
    grid = []
    for st in settings:
        mine = [e for e in episodes if e["arm"] == "ray-tuned/ray" and e["setting"] == st]
        grid.append({"setting": st, "cost": float(np.mean([e["cost"] for e in mine])),
                     "min_attainment": min(e["slo_attainment"] for e in mine)})
    ok = [g for g in grid if g["min_attainment"] >= target]
    ref = "ray/ray" if "ray/ray" in arms else arms[0]
    if ok:
        best = min(ok, key=lambda g: g["cost"])
        tuned = [dict(e, arm="ray-tuned/ray") for e in episodes
                 if e["arm"] == "ray-tuned/ray" and e["setting"] == best["setting"]]
        rows.append(summarize(tuned, "ray-tuned/ray"))
        ref = "ray-tuned/ray"
    print(f"\n{args.config}: SLO p95 <= {env.sizing.slo.p95_s:g} s per "
          f"{env.sizing.slo.window_s:g} s window, seeds {args.seeds}")
    print(format_table(rows, ref, target))
    if settings:
        print("\ntuned Ray grid (ray placement): setting -> mean cost, worst attainment")
        for g in grid:
            print(f"  min_workers {g['setting']['min_workers']}, idle "
                  f"{g['setting']['idle_timeout_s']:g} s: ${g['cost']:.2f}, "
                  f"{g['min_attainment']:.3f}")
        print("  chosen: " + (json.dumps(best["setting"]) if ok else
                              "none meets the SLO on every seed (reference: ray/ray)"))
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": args.config, "seeds": args.seeds,
                       "horizon_s": env.workload.horizon_s, "slo": {
                           "p95_s": env.sizing.slo.p95_s, "window_s": env.sizing.slo.window_s,
                           "target": target},
                       "reference": ref, "table": rows, "tuned_grid": grid,
                       "static_counts": peak_eft, "decision_time": dt,
                       "per_episode": episodes}, fh, indent=1,
                      default=lambda o: None if isinstance(o, float) and math.isnan(o) else o)
        print(f"wrote {args.json}")
    return 0
