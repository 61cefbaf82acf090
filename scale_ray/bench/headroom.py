"""Placement headroom in Ray's resource model (issue 46, item 4): every node rule of
``policies.node_rules`` on ``configs/env/agents.yaml`` at several cluster sizes and GPU loads,
paired episodes (same seeds, same requests), workflow response mean / p95 / p99, each rule's
difference from EFT and from Ray's emulated default with 95 % t-intervals, and the default it
chooses: the rule with the lowest mean whose gain over EFT excludes 0 at every size and load
with p95 no worse, else EFT. ``RULE:learned``: the rule knows no node speed and plans with what
the run-time estimator learned (``NodeSimulator(learn_speeds=True)``), as live with
``live.estimator: online`` and no speeds configured. ``lookahead``: the rollout planner
(``policies.node_lookahead``, EFT's ``--lookahead-k`` best nodes tried on forks); simulator only,
so it is compared but never chosen as the default. ``--run-noise S``: runs take other than
planned (``envs.node_hedging``); ``RULE+hedge``: the rule with stragglers hedged at
``--hedge-quantile``.

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

from envs.agents import load_agents
from envs.order import ORDERS
from envs.config_base import replace
from envs.config_files import read_yaml, resolve_config_path
from envs.decision import NODE_LOOK
from envs.node_sim import NodeSimulator
from policies.node_learned import LearnedNodePolicy
from policies.node_lookahead import MAX_OPEN_PER_NODE, NodeLookahead
from policies.node_rules import NODE_POLICIES, node_policy
from scale_ray.evaluation import ci95_half_width
from scale_ray.relative import rel

DEFAULT_POLICIES = ("eft", "gpu_rule", "reserve", "eft_bestfit", "eft_spread", "eft_wait", "ray",
                    "random", "eft@upward_rank")
HEDGE = "+hedge"  # RULE+hedge: with hedged stragglers (envs.node_hedging)
PLANNER = "lookahead"  # policies.node_lookahead (not a rule: never the default)
METRICS = ("mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/env/agents.yaml", help="the agents setting")
    p.add_argument("--nodes", nargs="+", type=int, default=[16, 64], help="cluster sizes")
    p.add_argument("--loads", nargs="+", type=float, default=[0.6, 0.8],
                   help="offered GPU loads (gpu_load)")
    p.add_argument("--episodes", type=int, default=30, help="paired episodes (seeds 0..E-1)")
    p.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES), type=_rule,
                   help=f"node rules to compare ({', '.join(sorted(NODE_POLICIES))}; RULE@ORDER "
                   f"with another ready order, e.g. eft@upward_rank: HEFT; RULE:learned with "
                   f"no speed known, learned online: envs/node_sim.py; lookahead: the rollout "
                   f"planner); eft and ray are always run: the references")
    p.add_argument("--run-noise", type=float, default=None, help="lognormal sigma of runs "
                   "around their plan (agents config run_noise; default: the config's)")
    p.add_argument("--hedge-quantile", type=float, default=0.9,
                   help="RULE+hedge: a run past this quantile of its time gets a copy")
    p.add_argument("--lookahead-k", type=int, default=4,
                   help="nodes the lookahead planner tries per decision (1: EFT)")
    p.add_argument("--horizon-s", type=float, default=None, help="arrivals stop here "
                   "(default: the config's horizon_s)")
    p.add_argument("--workers", type=int, default=2, help="processes")
    p.add_argument("--paired-with", default=None, metavar="JSON",
                   help="also print this run against the same episodes of an earlier run's "
                        "--json (e.g. another --node-look)")
    p.add_argument("--node-look", type=int, default=NODE_LOOK,
                   help="tasks a round sets aside at most (envs.decision.NODE_LOOK; 0: no bound)")
    p.add_argument("--learned", action="append", default=[], metavar="NAME=ARTIFACT",
                   help="also a trained node policy (cluster_model: nodes), guarded "
                        "(policies.node_learned), labelled NAME (repeatable)")
    p.add_argument("--json", default=None, help="write every episode and the table here")


def _rule(text: str) -> str:
    head, _, speeds = text.removesuffix(HEDGE).partition(":")
    rule, _, order = head.partition("@")
    if ((rule not in NODE_POLICIES and rule != PLANNER) or (order and order not in ORDERS)
            or speeds not in ("", "learned")):
        raise argparse.ArgumentTypeError(
            f"{text!r}: RULE[@ORDER][:learned][+hedge], RULE one of {sorted(NODE_POLICIES)} or "
            f"{PLANNER}, ORDER one of {list(ORDERS)}; :learned: the rule knows no speed, the "
            f"estimator learns them")
    return text


def _episode(job: tuple) -> dict[str, Any]:
    cfg, n, load, policy, seed, look, learned, k, q = job
    hedged = policy.endswith(HEDGE)
    if policy in learned:  # a trained network (policies.node_learned), guarded
        rule, order, speeds = policy, "", ""
        decide = LearnedNodePolicy(learned[policy])
    else:
        head, _, speeds = policy.removesuffix(HEDGE).partition(":")  # eft:learned: no speed known, estimated
        rule, _, order = head.partition("@")  # eft@upward_rank: HEFT (its order, then EFT)
        decide = NodeLookahead(k) if rule == PLANNER else node_policy(rule)
    over = ({"order": order} if order else {}) | ({"hedge_quantile": q} if hedged else {})
    sim = NodeSimulator(replace(cfg, gpu_load=load, **over), n,
                        learn_speeds=speeds == "learned", node_look=look)
    t0 = time.perf_counter()
    m = sim.run(decide, seed)
    extra = {"guard_overrides": decide.overrides} if policy in learned else {}
    if isinstance(decide, NodeLookahead):
        extra = {"rollouts": decide.rollouts, "changed_picks": decide.changed,
                 "skipped": decide.skipped}
    return m | extra | {"nodes": n, "load": load, "policy": policy, "episode": seed,
                        "seconds": time.perf_counter() - t0}


def _learned(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or name in NODE_POLICIES:
            raise ValueError(f"--learned {spec!r}: NAME=ARTIFACT with a NAME that is not a rule "
                             f"({sorted(NODE_POLICIES)})")
        LearnedNodePolicy(path)  # a wrong artifact fails here, naming it, not in a worker
        out[name] = path
    return out


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
    nodes, load, rule and seed): per (size, load, rule) the mean of value / that run's - 1 for
    the mean, p95 and p99 workflow response, ± the 95 % half-width, and both runs' mean
    ``look_stops`` (rounds ``node_look`` ended)."""
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
    """The rule (not the planner) whose mean beats EFT with the interval excluding 0 in every (size, load), p95
    no worse (its difference <= 0), the lowest average mean among those; else ``eft``."""
    cells = {(r["nodes"], r["load"]) for r in rows}
    best, best_gain = "eft", 0.0
    for p in sorted({r["policy"] for r in rows} - {"eft"}):
        if p.partition("@")[0].partition(":")[0] == PLANNER or p.endswith(HEDGE):
            continue  # simulator only, or not a rule (hedging is a setting)
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
    raw = read_yaml(resolve_config_path(args.config))
    if args.horizon_s is not None:
        raw["horizon_s"] = args.horizon_s
    if args.run_noise is not None:
        raw["run_noise"] = args.run_noise
    cfg = load_agents(raw)
    learned = _learned(args.learned)
    policies = list(dict.fromkeys(["eft", "ray"] + list(args.policies) + list(learned)))
    if args.episodes < 2:
        raise ValueError("--episodes: at least 2 (paired intervals)")
    if args.node_look < 0:
        raise ValueError(f"--node-look: {args.node_look} must be >= 0 (0: no bound)")
    if args.lookahead_k < 1:
        raise ValueError(f"--lookahead-k: {args.lookahead_k} must be >= 1")
    if any(p.endswith(HEDGE) for p in policies) and not (0 < args.hedge_quantile < 1
                                                          and cfg.run_noise > 0):
        raise ValueError(f"+hedge: needs --run-noise > 0 and 0 < --hedge-quantile < 1, got "
                         f"{cfg.run_noise} and {args.hedge_quantile}")
    jobs = [(cfg, n, load, p, s, args.node_look, learned, args.lookahead_k,
             args.hedge_quantile) for n in args.nodes
            for load in args.loads for s in range(args.episodes) for p in policies]
    print(f"headroom: {len(jobs)} episodes ({len(policies)} rules x {len(args.nodes)} sizes x "
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
    planned = [e for e in episodes if "skipped" in e]
    if planned:  # NodeLookahead's bound on its cost (MAX_OPEN_PER_NODE)
        print(f"\nlookahead: {sum(e['skipped'] for e in planned)} of "
              f"{sum(e['decisions'] for e in planned)} decisions by the base rule alone "
              f"(over {MAX_OPEN_PER_NODE} open requests a node)")
    default = choose_default(rows)
    print(f"\ndefault rule (beats EFT at every size and load, p95 no worse; else eft): {default}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.paired_with:
        print("\n".join(paired_with(episodes, args.paired_with)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": args.config, "nodes": args.nodes, "loads": args.loads,
                       "episodes": args.episodes, "node_look": args.node_look,
                       "lookahead_k": args.lookahead_k, "run_noise": cfg.run_noise,
                       "hedge_quantile": args.hedge_quantile,
                       "default": default, "table": rows, "per_episode": episodes}, fh, indent=1,
                      default=lambda o: None if isinstance(o, float) and math.isnan(o) else o)
        print(f"wrote {args.json}")
    return 0
