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

* ``oracle/eft`` — the hindsight oracle (:func:`run_oracle`): per window the cheapest mix that
  meets the SLO, found on forks that know every arrival, its nodes there at once: a lower
  bound, not a policy.

``--plot PNG`` draws,
for the first seed, the nodes per type over time of each arm against the load and the window
p95 (the oracle's from its per-window plan, :func:`oracle_timeline`; static's a flat line). The JSON's headline keys: ``rel_cost_vs_ray_autoscaler`` (ours / the tuned Ray autoscaler
- 1), ``rel_cost_vs_ray_autoscaler_eft`` (ours / Ray's autoscaler with EFT - 1),
``slo_attainment`` (ours), ``ray_autoscaler_slo_attainment`` (Ray's defaults).

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
from envs.sim_scaling import Scaling, work_of
from envs.simulator import Simulator
from policies import get_policy
from policies.sizing import ModelSizer
from scale_ray.config import load_env
from scale_ray.evaluation import episode_seed, run_episode
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
    p.add_argument("--no-oracle", action="store_true",
                   help="skip the hindsight oracle (a bisection of forks per window; slow)")
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
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="nodes per type over time for each arm (the first seed), load, p95")


def _episode(job: tuple) -> dict[str, Any]:
    env, arm, setting, seed = job
    sizer, placement = arm.split("/")
    over: dict[str, Any] = {"policy": "ray" if sizer == "ray-tuned" else sizer}
    if setting:
        over["ray"] = setting
    cfg = replace(env, sizing=over)
    t0 = time.perf_counter()
    m = run_episode(cfg, placement, seed)
    out = {k: m.get(k) for k in KEEP} | {"arm": arm, "setting": setting, "seed": seed,
                                         "seconds": time.perf_counter() - t0,
                                         "slo_window_p95_s": m.get("slo_window_p95_s")}
    if arm != "ray-tuned/ray":  # the plot's: nodes over time, arrivals per minute
        out["timeline"] = m.get("sizing_timeline")
        out["arrivals_per_min"] = m.get("arrivals_per_min")
    return out


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


def _set_counts(sim: Simulator, want: dict[str, int]) -> None:
    """Nodes per tier now: missing ones join at once, surplus ones (the fewest runs first) drain."""
    table, cl = sim.table, sim.cluster
    have: dict[str, list[int]] = {k: [] for k in want}
    for i in table.positions():
        if table.accept_l[i]:
            have[table.specs[i].name].append(i)
    for tier, slots in have.items():
        for _ in range(want[tier] - len(slots)):
            cl.add(sim.cfg.cluster.tier(tier), sim.t, None)
        for i in sorted(slots, key=lambda i: len(table.running[i]))[:max(0, len(slots) - want[tier])]:
            cl.remove(sim.t, None, None, table.ids[i])


def _run_until(sim: Simulator, pol, t_end: float) -> None:
    while sim.current is not None and sim.t < t_end:
        sim.step(pol.decide(sim))


def _window(sim: Simulator, pol, k: int, w: float, bound: float, prev: dict[str, int],
            counts: dict[str, int]) -> None:
    """Window ``k`` of the oracle's run: ``counts`` nodes per tier, the previous window's kept
    until ``bound`` s in (its requests' tail keeps the nodes it was sized with)."""
    _set_counts(sim, {t: max(prev[t], counts[t]) for t in counts})
    _run_until(sim, pol, k * w + min(bound, w))
    _set_counts(sim, counts)
    _run_until(sim, pol, (k + 1) * w)


def _window_ok(sim: Simulator, pol, k: int, w: float, bound: float, prev: dict[str, int],
               counts: dict[str, int]) -> bool:
    """On ``sim`` (a fork): window ``k`` with ``counts``, then its requests' tail (the next
    window keeps these nodes that long): whether their p95 meets ``bound``."""
    _window(sim, pol, k, w, bound, prev, counts)
    _run_until(sim, pol, (k + 1) * w + bound)  # by then each is done or too late
    lo, hi = k * w, (k + 1) * w
    resp = [wf.finish - wf.arrival if wf.done == wf.n else 1e18 for wf in sim.workflows
            if lo <= wf.arrival < hi]
    return not resp or float(np.percentile(resp, 95)) <= bound


def run_oracle(job: tuple) -> dict[str, Any]:
    """The hindsight oracle of one seed: window by window, the cheapest mix (ours, scaled by s)
    whose fork of the run meets the window's p95, knowing every arrival (a fork replays them);
    its nodes join at the window's start at once (no launch delay), billed from then, and a
    window's surplus leaves ``p95_s`` into the next (its requests' tail): a lower bound on what
    a sizer pays for the SLO, not a policy."""
    env, seed, base_seed = job
    t0 = time.perf_counter()
    cfg = replace(env, sizing={"policy": "model"})
    sim = Simulator(cfg)
    sim.reset(episode_seed(base_seed, seed))
    pol = get_policy("eft", cfg)
    sizer = ModelSizer(cfg)
    slo = cfg.sizing.slo
    w, n = slo.window_s, math.ceil(cfg.workload.horizon_s / slo.window_s)
    lo = {t.name: t.min_nodes for t in cfg.cluster.tiers}
    hi = {t.name: t.max_nodes for t in cfg.cluster.tiers}
    probe = sim.fork()
    _run_until(probe, get_policy("eft", cfg), cfg.workload.horizon_s)
    per_wf: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
    for wf in probe.workflows:
        for task in wf.tasks:
            kind, x = work_of(task)
            per_wf[kind] += x
    per_wf = {k: v / max(len(probe.workflows), 1) for k, v in per_wf.items()}
    arrivals = np.array([wf.arrival for wf in probe.workflows])
    plan: list[dict[str, int]] = []
    prev = {t.name: c for t, c in zip(cfg.cluster.tiers, cfg.cluster.tier_counts().values())}
    for k in range(n):
        rate = float(np.count_nonzero((arrivals >= k * w) & (arrivals < (k + 1) * w))) / w

        def mix(scale: float) -> dict[str, int]:
            need = {kd: scale * rate * per_wf[kd] for kd in ("CPU", "GPU")}
            return sizer.mix(need, lo, hi)[0]

        def ok(counts: dict[str, int]) -> bool:
            return _window_ok(sim.fork(), pol, k, w, slo.p95_s, prev, counts)

        a, b = 0.5, 4.0  # bisect the scale: a fails (or is the floor), b passes
        if not ok(mix(b)):
            best = hi
        else:
            for _ in range(6):
                m = (a + b) / 2
                if ok(mix(m)):
                    b = m
                else:
                    a = m
            best = mix(b)
        plan.append(best)
        _window(sim, pol, k, w, slo.p95_s, prev, best)
        prev = best
    while sim.current is not None:
        sim.step(pol.decide(sim))
    m = sim.metrics()
    return {k: m.get(k) for k in KEEP} | {
        "arm": "oracle/eft", "setting": None, "seed": seed, "plan": plan,
        "slo_window_p95_s": m.get("slo_window_p95_s"), "seconds": time.perf_counter() - t0}


def oracle_timeline(plan: list[dict[str, int]], env) -> list[tuple[float, dict[str, int]]]:
    """The oracle's nodes per tier over time, as a sizer's ``timeline`` ((t, counts) steps):
    what :func:`run_oracle` set -- from the start of window k the larger of window k-1's and
    window k's counts, window k's alone ``p95_s`` in (the first window's predecessor: the
    cluster's initial counts), the last window's to the end of the plan."""
    w, bound = env.sizing.slo.window_s, env.sizing.slo.p95_s
    prev = dict(env.cluster.tier_counts())
    out: list[tuple[float, dict[str, int]]] = []
    for k, counts in enumerate(plan):
        out.append((k * w, {t: max(prev.get(t, 0), c) for t, c in counts.items()}))
        out.append((k * w + min(bound, w), dict(counts)))
        prev = counts
    if plan:
        out.append((len(plan) * w, dict(plan[-1])))
    return out


def plot(path: str, episodes: list[dict[str, Any]], env, static: dict[str, int] | None) -> None:
    """For the first seed: each arm's nodes per type over time (top), requests per minute and
    each arm's window p95 against the SLO (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seed = min(e["seed"] for e in episodes)
    mine = [e for e in episodes if e["seed"] == seed and e["arm"] != "ray-tuned/ray"]
    tiers = [t.name for t in env.cluster.tiers]
    fig, axes = plt.subplots(len(tiers) + 1, 1, figsize=(10, 2.2 * (len(tiers) + 1)),
                             sharex=True)
    horizon = env.workload.horizon_s
    for e in mine:
        timeline = e.get("timeline") or (oracle_timeline(e["plan"], env) if e.get("plan")
                                         else None)
        for ax, tier in zip(axes, tiers):
            if timeline:
                ts = [p[0] / 3600 for p in timeline]
                ax.step(ts, [p[1][tier] for p in timeline], where="post", label=e["arm"],
                        lw=1)
            elif e["arm"] == "static/eft" and static is not None:
                ax.plot([0, horizon / 3600], [static[tier]] * 2, ls="--", label=e["arm"], lw=1)
    for ax, tier in zip(axes, tiers):
        ax.set_ylabel(f"{tier} nodes")
    axes[0].legend(fontsize=7, ncol=3)
    ax = axes[-1]
    per_min = next((e["arrivals_per_min"] for e in mine if e.get("arrivals_per_min")), [])
    ax.bar([k / 60 for k in range(len(per_min))], per_min, width=1 / 60, color="0.8",
           align="edge", label="requests / min")
    ax.set_ylabel("requests / min")
    ax2 = ax.twinx()
    w = env.sizing.slo.window_s
    for e in mine:
        p95 = [min(x, 3 * env.sizing.slo.p95_s) for x in e["slo_window_p95_s"]]
        ax2.step([(k * w) / 3600 for k in range(len(p95) + 1)], p95 + p95[-1:], where="post",
                 lw=1)
    ax2.axhline(env.sizing.slo.p95_s, color="red", lw=0.8, ls=":")
    ax2.set_ylabel("window p95 s (SLO dotted)")
    ax.set_xlabel(f"hours (seed {seed})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON's headline keys (module docstring); None where an arm did not run."""
    by = {r["arm"]: r for r in rows}

    def ratio(a: str, b: str) -> float | None:
        return by[a]["cost"] / by[b]["cost"] - 1 if a in by and b in by else None

    return {"rel_cost_vs_ray_autoscaler": ratio("model/eft", "ray-tuned/ray"),
            "rel_cost_vs_ray_autoscaler_eft": ratio("model/eft", "ray/eft"),
            "rel_cost_vs_oracle": ratio("model/eft", "oracle/eft"),
            "slo_attainment": by["model/eft"]["slo_attainment"] if "model/eft" in by else None,
            "ray_autoscaler_slo_attainment": (by["ray/ray"]["slo_attainment"]
                                              if "ray/ray" in by else None)}


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
    if not args.no_oracle:
        print(f"the hindsight oracle: {len(args.seeds)} seeds on {args.workers} processes "
              f"(a bisection of forks per {env.sizing.slo.window_s:g}-s window)", flush=True)
        with ProcessPoolExecutor(max(1, args.workers)) as pool:
            for e in pool.map(run_oracle, [(env, s, 0) for s in args.seeds]):
                episodes.append(e)
                print(f"  oracle seed {e['seed']}: ${e['cost']:.2f}, attainment "
                      f"{e['slo_attainment']:.3f} ({e['seconds']:.0f} s)", flush=True)
        arms += ("oracle/eft",)
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
    head = headline(rows)
    print("headline: " + ", ".join(f"{k} {rel(v) if k.startswith('rel') else f'{v:.3f}'}"
                                   for k, v in head.items() if v is not None))
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.plot:
        plot(args.plot, episodes, env, peak_eft)
        print(f"wrote {args.plot}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(head | {"config": args.config, "seeds": args.seeds,
                       "horizon_s": env.workload.horizon_s, "slo": {
                           "p95_s": env.sizing.slo.p95_s, "window_s": env.sizing.slo.window_s,
                           "target": target},
                       "reference": ref, "table": rows, "tuned_grid": grid,
                       "static_counts": peak_eft, "decision_time": dt,
                       "per_episode": episodes}, fh, indent=1,
                      default=lambda o: None if isinstance(o, float) and math.isnan(o) else o)
        print(f"wrote {args.json}")
    return 0
