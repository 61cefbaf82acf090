"""Placement headroom on Ray nodes (issue 46, item 4): every rule of ``policies.heuristics``
(and any policy ``--policies`` names: the lookahead planner, a trained artifact, guarded) on
``configs/env/agents.yaml`` at several cluster sizes and GPU loads, paired episodes (the same
seeds, the same requests: ``scale_ray.evaluation``), workflow response mean / p95 / p99, each
policy's difference from EFT and from Ray's emulated default with 95 % t-intervals, and the
default it chooses: the rule with the lowest mean whose gain over EFT excludes 0 at every size
and load with p95 no worse, else EFT. ``POLICY@ORDER``: another ready order (``eft@upward_rank``:
HEFT). ``--run-noise S``: runs take other than planned (``runtime.noise_sigma``);
``POLICY+hedge``: with stragglers hedged at ``--hedge-quantile`` (``runtime.hedge``).

    scale-ray bench headroom --nodes 16 64 --loads 0.6 0.8 --episodes 30 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from envs.config_base import replace
from envs.order import split_spec
from policies import HEURISTICS, PLANNERS, get_policy
from scale_ray.config import load_env
from scale_ray.evaluation import ci95_half_width, run_episode
from scale_ray.relative import rel

DEFAULT_POLICIES = ("eft", "gpu_rule", "reserve", "eft_bestfit", "eft_spread", "eft_wait", "ray",
                    "random", "eft@upward_rank")
HEDGE = "+hedge"  # POLICY+hedge: with hedged stragglers (envs.hedging)
LEARNED = ":learned"  # POLICY:learned: no node speed known, learned online (runtime.speeds)
METRICS = ("mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/env/agents.yaml", help="the env config")
    p.add_argument("--nodes", nargs="+", type=int, default=[16, 64], help="cluster sizes")
    p.add_argument("--loads", nargs="+", type=float, default=[0.6, 0.8],
                   help="offered GPU loads (workload.gpu_load)")
    p.add_argument("--episodes", type=int, default=30, help="paired episodes (seeds 0..E-1)")
    p.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES), type=_policy,
                   help=f"policies to compare (the rules {', '.join(sorted(HEURISTICS))}, a "
                   f"planner lookahead[:key=value,...], an artifact path; POLICY@ORDER with "
                   f"another ready order, e.g. eft@upward_rank: HEFT; POLICY:learned with no "
                   f"node speed known, learned online; POLICY+hedge with hedged stragglers); "
                   f"eft and ray are always run: the references")
    p.add_argument("--run-noise", type=float, default=None, help="lognormal sigma of runs "
                   "around their plan (runtime.noise_sigma; default: the config's)")
    p.add_argument("--hedge-quantile", type=float, default=0.9,
                   help="POLICY+hedge: a run past this quantile of its time gets a copy")
    p.add_argument("--horizon-s", type=float, default=None, help="arrivals stop here "
                   "(default: the config's workload.horizon_s)")
    p.add_argument("--workers", type=int, default=2, help="processes")
    p.add_argument("--paired-with", default=None, metavar="JSON",
                   help="also print this run against the same episodes of an earlier run's "
                        "--json")
    p.add_argument("--node-look", type=int, default=None, help="mdp.node_look: a round sets "
                   "aside at most this many tasks that fit no node now (0: no bound; default: "
                   "the config's)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the paired episodes")
    p.add_argument("--json", default=None, help="write every episode and the table here")


def _parts(text: str) -> tuple[str, bool, bool]:
    """``POLICY[@ORDER][:learned][+hedge]`` -> (POLICY[@ORDER], learned, hedged)."""
    hedged = text.endswith(HEDGE)
    text = text.removesuffix(HEDGE)
    return text.removesuffix(LEARNED), text.endswith(LEARNED), hedged


def _policy(text: str) -> str:
    base, _ = split_spec(_parts(text)[0])
    if base in HEURISTICS or base.partition(":")[0] in PLANNERS:
        return text
    try:
        get_policy(base)  # an artifact: a wrong one fails here, naming it
    except Exception as e:  # noqa: BLE001 - argparse prints it
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _episode(job: tuple) -> dict[str, Any]:
    env, n, load, policy, seed, base_seed = job
    cfg = replace(env.with_servers(n), workload={"gpu_load": load})
    spec, learned, _ = _parts(policy)
    if learned:
        cfg = replace(cfg, runtime={"speeds": "learned"})
    t0 = time.perf_counter()
    m = run_episode(cfg, spec, seed, base_seed)
    return m | {"nodes": n, "load": load, "policy": policy, "episode": seed,
                "seconds": time.perf_counter() - t0}


def _rel(rows: dict, policy: str, ref: str, metric: str, seeds: list[int]) -> tuple[float, float]:
    """The mean over paired episodes of value / reference − 1, and its 95 % half-width."""
    d = [rows[(policy, s)][metric] / rows[(ref, s)][metric] - 1.0 for s in seeds]
    return float(np.mean(d)), ci95_half_width(d)


def table(episodes: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """Per (nodes, load, policy): the means of the metrics and the paired differences
    (``{mean,p95,p99}_rel_diff_vs_{eft,ray}`` and their ``_ci95`` half-widths)."""
    out = []
    for n, load in sorted({(e["nodes"], e["load"]) for e in episodes}):
        rows = {(e["policy"], e["episode"]): e for e in episodes
                if e["nodes"] == n and e["load"] == load}
        seeds = sorted({s for (_, s) in rows})
        for p in policies:
            r: dict[str, Any] = {"nodes": n, "load": load, "policy": p}
            for m in METRICS:
                r[m] = float(np.mean([rows[(p, s)][m] for s in seeds]))
            for ref in ("eft", "ray"):
                for m, tag in ((METRICS[0], "mean"), (METRICS[1], "p95"), (METRICS[2], "p99")):
                    r[f"{tag}_rel_diff_vs_{ref}"], r[f"{tag}_rel_diff_vs_{ref}_ci95"] = _rel(
                        rows, p, ref, m, seeds)
            r["gpu_utilization"] = float(np.mean([rows[(p, s)]["gpu_utilization"] for s in seeds]))
            r["seconds_per_episode"] = float(np.mean([rows[(p, s)]["seconds"] for s in seeds]))
            out.append(r)
    return out


def paired_with(episodes: list[dict[str, Any]], path: str) -> list[str]:
    """This run against the episodes of another run's JSON (``--paired-with``; the same
    nodes, load, policy and seed): per (size, load, policy) the mean of value / that run's - 1
    for the mean, p95 and p99 workflow response, ± the 95 % half-width, and both runs' mean
    ``look_stops`` (rounds ``mdp.node_look`` ended)."""
    with open(path) as fh:
        other = json.load(fh)
    ref = {(e["nodes"], e["load"], e["policy"], e["episode"]): e for e in other["per_episode"]}
    lines = [f"against {path} (node_look {other.get('node_look')}), paired episodes:"]
    for n, load, p in sorted({(e["nodes"], e["load"], e["policy"]) for e in episodes}):
        mine = [e for e in episodes if (e["nodes"], e["load"], e["policy"]) == (n, load, p)
                and (n, load, p, e["episode"]) in ref]
        if not mine:
            continue
        theirs = [ref[(n, load, p, e["episode"])] for e in mine]
        parts = []
        for m, tag in ((METRICS[0], "mean"), (METRICS[1], "p95"), (METRICS[2], "p99")):
            d = [a[m] / b[m] - 1.0 for a, b in zip(mine, theirs)]
            parts.append(f"{tag} {rel(float(np.mean(d)))} ± {100 * ci95_half_width(d):.1f}")
        stops = [float(np.mean([e.get("look_stops", 0) for e in x])) for x in (mine, theirs)]
        lines.append(f"  N = {n}, load {load:g}, {p} ({len(mine)} episodes): " + ", ".join(parts)
                     + f"; look_stops {stops[0]:.0f} vs {stops[1]:.0f}")
    return lines


def choose_default(rows: list[dict[str, Any]]) -> str:
    """The rule (not a planner or a trained policy) whose mean beats EFT with the interval
    excluding 0 in every (size, load), p95 no worse (its difference <= 0), the lowest average
    mean among those; else ``eft``."""
    cells = {(r["nodes"], r["load"]) for r in rows}
    best, best_gain = "eft", 0.0
    for p in sorted({r["policy"] for r in rows} - {"eft"}):
        if split_spec(p)[0] not in HEURISTICS:
            continue  # not a rule (learned speeds and hedging are settings)
        mine = [r for r in rows if r["policy"] == p]
        if len(mine) != len(cells):
            continue
        if all(r["mean_rel_diff_vs_eft"] + r["mean_rel_diff_vs_eft_ci95"] < 0
               and r["p95_rel_diff_vs_eft"] <= 0 for r in mine):
            gain = float(np.mean([r["mean_rel_diff_vs_eft"] for r in mine]))
            if gain < best_gain:
                best, best_gain = p, gain
    return best


def format_table(rows: list[dict[str, Any]], episodes: int) -> str:
    """The table per (size, load): means, and differences vs EFT and Ray as ``rel`` prints them,
    ± the 95 % half-width in points."""
    lines = []
    for n, load in sorted({(r["nodes"], r["load"]) for r in rows}):
        lines += ["", f"N = {n} nodes, GPU load {load:g}, {episodes} paired episodes (workflow "
                      f"response, model seconds; value / reference - 1, ± 95 % CI in points)",
                  f"{'rule':15s} {'mean':>6s} {'p95':>6s} {'p99':>6s} {'mean vs EFT':>22s} "
                  f"{'p95 vs EFT':>22s} {'mean vs Ray':>22s} {'p95 vs Ray':>22s}"]
        for r in (r for r in rows if r["nodes"] == n and r["load"] == load):
            def f(tag: str, ref: str) -> str:
                return (f"{rel(r[f'{tag}_rel_diff_vs_{ref}'])} ± "
                        f"{100 * r[f'{tag}_rel_diff_vs_{ref}_ci95']:.1f}")
            lines.append(f"{r['policy']:15s} {r[METRICS[0]]:6.2f} {r[METRICS[1]]:6.2f} "
                         f"{r[METRICS[2]]:6.2f} {f('mean', 'eft'):>22s} {f('p95', 'eft'):>22s} "
                         f"{f('mean', 'ray'):>22s} {f('p95', 'ray'):>22s}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    env = load_env(args.config)
    if args.horizon_s is not None:
        env = replace(env, workload={"horizon_s": args.horizon_s})
    if args.run_noise is not None:
        env = replace(env, runtime={"noise_sigma": args.run_noise})
    if args.node_look is not None:
        env = replace(env, mdp={"node_look": args.node_look})  # validated: >= 0
    policies = list(dict.fromkeys(["eft", "ray"] + list(args.policies)))
    if args.episodes < 2:
        raise ValueError("--episodes: at least 2 (paired intervals)")
    hedged = any(p.endswith(HEDGE) for p in policies)
    if hedged and not (0 < args.hedge_quantile < 1 and env.runtime.noise_sigma > 0):
        raise ValueError(f"+hedge: needs --run-noise > 0 and 0 < --hedge-quantile < 1, got "
                         f"{env.runtime.noise_sigma} and {args.hedge_quantile}")
    hedge_env = replace(env, runtime={"hedge": "all", "hedge_quantile": args.hedge_quantile})
    jobs = [(hedge_env if p.endswith(HEDGE) else env, n, load, p, s, args.seed)
            for n in args.nodes for load in args.loads for s in range(args.episodes)
            for p in policies]
    print(f"headroom: {len(jobs)} episodes ({len(policies)} policies x {len(args.nodes)} sizes x "
          f"{len(args.loads)} loads x {args.episodes} seeds) on {args.workers} processes",
          flush=True)
    t0 = time.perf_counter()
    episodes = []
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for k, e in enumerate(pool.map(_episode, jobs, chunksize=4), 1):
            episodes.append(e)
            if k % max(1, len(jobs) // 10) == 0:
                print(f"  {k}/{len(jobs)} episodes, {time.perf_counter() - t0:.0f} s", flush=True)
    rows = table(episodes, policies)
    print(format_table(rows, args.episodes))
    default = choose_default(rows)
    print(f"\ndefault rule (beats EFT at every size and load, p95 no worse; else eft): {default}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.paired_with:
        print("\n".join(paired_with(episodes, args.paired_with)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": args.config, "nodes": args.nodes, "loads": args.loads,
                       "episodes": args.episodes, "seed": args.seed,
                       "run_noise": env.runtime.noise_sigma,
                       "hedge_quantile": args.hedge_quantile, "node_look": env.mdp.node_look,
                       "default": default, "table": rows, "per_episode": episodes}, fh, indent=1,
                      default=lambda o: None if isinstance(o, float) and math.isnan(o) else o)
        print(f"wrote {args.json}")
    return 0
