"""``scale-ray bench live --setting agents`` (issue 46, item 6): agent requests of
``configs/env/agents.yaml`` on a local Ray cluster of nodes with CPUs, memory and logical GPUs of
two accelerator types (emulated run times), placed live by the scheduler's policies (whole Ray
nodes, ``live.model: nodes``) and by Ray's default scheduler, each next to its twin: the
simulator on the same requests and arrival times, Ray default's twin being Ray's hybrid policy
as ``policies.heuristics.RayHybrid`` emulates it, ties broken in the live cluster's node-id
order (``ray_node_order``).

Prints per policy the live and the twin's workflow response (model s: mean, p95, p99), the gain
over Ray default live and in the twin (value / Ray default's − 1), and the gap between them in
points; ``--json`` writes ``rel_diff_vs_ray_default`` and ``max_twin_gap_points`` with every
number.

The overhead part (not with ``--skip-overhead``): a burst of requests submitted at once on the
same nodes, the first rule against Ray default (:func:`live_overhead`: throughput, the scheduler
thread's CPU per task split into its own work and its Ray client calls, Ray default's driver CPU
per task), and the scheduler's decision path
without Ray at ``--overhead-nodes`` nodes (:func:`decision_overhead`: this machine holds only 8
raylets), in ``overhead``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

from envs.config import EnvConfig, replace
from envs.workflow import WorkflowSpec
from policies import PLANNERS, get_policy
from policies.heuristics import RayHybrid
from scale_ray.config import load_env
from scale_ray.evaluation import env_for_policy, simulate
from scale_ray.live import LiveScheduler
from scale_ray.live.ray_default import RayDefaultRunner
from scale_ray.relative import rel

from .agents_cluster import (CONFIG, REFERENCE, AgentsCluster, collected,  # noqa: F401
                             live_settings, requests)
from .agents_overhead import decision_overhead, format_overhead, live_overhead  # noqa: F401
from .validity import MachineLoad, check, format_check, twin_ratio


HEDGE = "+hedge"  # POLICY+hedge: live.hedge all, its twin runtime.hedge all (envs.hedging)


def add_agents_arguments(p: argparse.ArgumentParser) -> None:
    """``scale-ray bench live``'s options for ``--setting agents``."""
    g = p.add_argument_group("--setting agents (Ray's resource model; scale_ray/bench/agents_live.py)")
    g.add_argument("--nodes", type=int, default=8, help="nodes of agents.yaml's shapes")
    g.add_argument("--gpu-load", type=float, default=None, help="offered GPU load (default: "
                   "the config's gpu_load)")
    g.add_argument("--rules", nargs="*", default=["eft_spread", "eft"], help="policies placed "
                   "live (any of --policy's: a rule of policies/heuristics.py, lookahead[:...], "
                   "an artifact path); POLICY+hedge: with hedged stragglers (live.hedge all)")
    g.add_argument("--speeds", choices=("known", "learned"), default="known", help="known: "
                   "live.gpu_speeds set; learned: none, live and twin learn them per kind and "
                   "node shape (live.estimator online; the twin's runtime.speeds learned)")
    g.add_argument("--run-noise", type=float, default=0.0, help="each call's runs take its "
                   "compute x a LogNormal factor of mean 1 and this log-spread, drawn per "
                   "request (live and twin alike; envs/runtime.py)")
    g.add_argument("--runs", type=int, default=2, help="runs (seeds from --seed) per cluster")
    g.add_argument("--clusters", type=int, default=1, help="fresh clusters, one after another "
                   "(each has its own node ids, so its own Ray tie order)")
    g.add_argument("--ray-draws", type=int, default=20, help="the twin's Ray default: the mean "
                   "of this many draws of its top-k choice (live Ray is one; 1: one draw), in "
                   "the cluster's node-id order and, for comparison, in random orders")
    g.add_argument("--agents-config", default="configs/env/agents.yaml")
    g.add_argument("--timeout-s", type=float, default=900.0, help="per run and policy")
    g.add_argument("--overhead-requests", type=int, default=150, help="the overhead part's "
                   "burst of requests on the live nodes (--skip-overhead: none); the decision "
                   "path without Ray gets as many per node")
    g.add_argument("--warm-workers", type=int, default=6, help="CPU workers Ray starts on "
                   "each node before any run (AgentsCluster.warm; a run that needs more waits "
                   "for a worker process to start)")
    g.add_argument("--overhead-nodes", type=int, nargs="*", default=[64, 256],
                   help="node counts of the decision path measured without Ray")


def live_run(runner: Any, reqs: list[tuple[float, WorkflowSpec]], ts: float,
             timeout_s: float) -> dict[str, Any]:
    """Submit every request at its arrival time (wall = model x ``ts``), wait for all."""
    with runner:
        t0 = time.perf_counter()
        for k, (t, tasks) in enumerate(reqs):
            delay = t0 + t * ts - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            runner.submit(collected(tasks, f"request{k}"))
        if not runner.drain(timeout=timeout_s):
            raise RuntimeError(f"{runner.summary().get('policy')}: requests still running after "
                               f"{timeout_s:.0f} s")
        return runner.summary()


def _run_rule(name: str, r: int, seed: int, reqs, args: Any, twin_env: EnvConfig,
              env: EnvConfig, live_cfg: dict, ray_order: list[int], load: MachineLoad
              ) -> tuple[dict, dict]:
    """One policy (or Ray's default) on one run's requests, live and in its twin: their rows
    (the live one with the machine's load after it, ``load_1m``)."""
    if name == REFERENCE:
        runner = RayDefaultRunner(env, {**live_cfg})
    else:
        hedge = {"hedge": "all"} if name.endswith(HEDGE) else {}
        runner = LiveScheduler(get_policy(name.removesuffix(HEDGE), env), env,
                               {**live_cfg, **hedge})
    t0 = time.perf_counter()
    s = live_run(runner, reqs, args.time_scale, args.timeout_s)
    live = {k: s[k] for k in (
        "mean_workflow_response_model_s", "p95_workflow_response_model_s",
        "p99_workflow_response_model_s", "workflows_completed")} | {
        "wall_s": time.perf_counter() - t0, "thread_cpu_s": s.get("thread_cpu_s"),
        "run_lag_model_s": s.get("run_lag_model_s"), "run_lag_by_node": s.get("run_lag_by_node"),
        "tasks_per_node": s.get("tasks_per_node"), "load_1m": load.sample()}
    twin_cfg = replace(twin_env, runtime={"noise_sigma": args.run_noise} | (
        {"hedge": "all", "hedge_quantile": live_cfg.get("hedge_quantile", 0.9)}
        if name.endswith(HEDGE) else {}) | (
        {"speeds": "learned"} if args.speeds == "learned" and name != REFERENCE else {}))
    twin = twin_prediction(name, seed, reqs, twin_cfg, args.ray_draws, ray_order)
    lag = s.get("run_lag_model_s")
    print(f"  run {r + 1} {name:12s} live mean {s['mean_workflow_response_model_s']:.2f} "
          f"twin {twin['mean_workflow_response_s']:.2f} model s "
          f"({time.perf_counter() - t0:.0f} s wall)"
          + (f"; a run's lag outside its worker {lag:.2f} model s" if lag is not None else ""),
          flush=True)
    return live, {(k[:-2] + "_model_s" if k.endswith("response_s") else k): v
                  for k, v in twin.items()}


def twin_spec(spec: str) -> str:
    """The policy of ``spec``'s twin: the same, and the planner as live runs it, on a snapshot
    of the present (``snapshot=true``, ``policies.lookahead``)."""
    base, _, opts = spec.partition(":")
    if base in PLANNERS and "snapshot=" not in opts:
        return f"{base}:{opts},snapshot=true" if opts else f"{base}:snapshot=true"
    return spec


def twin_prediction(name: str, seed: int, reqs: list, env: EnvConfig, ray_draws: int,
                    ray_order: list[int] | None = None) -> dict[str, Any]:
    """``name``'s twin on the run's requests. Ray default (``REFERENCE``) breaks ties by node id
    (``ray_order``: the live cluster's; None: a random order per draw) and draws among its top k;
    live Ray is one draw: its twin is the mean over ``ray_draws`` draws (seeds ``seed + 10,000
    j``), with their sd (``sd_mean_workflow_response_s``); given ``ray_order``, also the mean and
    sd under random id orders (``random_order_*``: what knowing the order changes)."""
    draws = ray_draws if name == REFERENCE else 1
    if draws < 1:
        raise ValueError(f"--ray-draws: {ray_draws} must be >= 1")

    def sims(order: list[int] | None) -> list[dict[str, Any]]:
        out = []
        for j in range(draws):
            policy = (RayHybrid(order=order) if name == REFERENCE
                      else get_policy(twin_spec(name.removesuffix(HEDGE)), env))
            out.append(simulate(env_for_policy(env, policy), policy, seed + 10_000 * j, reqs,
                                seed + 10_000 * j))
        return out

    def sd(runs: list[dict[str, Any]]) -> float:
        means = [r["mean_workflow_response_s"] for r in runs]
        return float(np.std(means, ddof=1)) if len(means) > 1 else 0.0

    runs = sims(ray_order)
    out = {k: (float(np.mean([r[k] for r in runs])) if isinstance(v, (int, float)) else v)
           for k, v in runs[0].items()} | {"draws": draws, "sd_mean_workflow_response_s": sd(runs)}
    if name == REFERENCE and ray_order is not None:
        rand = sims(None)
        out |= {"random_order_mean_workflow_response_s": float(np.mean(
            [r["mean_workflow_response_s"] for r in rand])), "random_order_sd": sd(rand)}
    return out


def run_agents(args: Any) -> int:
    twin_env = load_env(args.agents_config).with_servers(args.nodes)
    if args.gpu_load:
        twin_env = replace(twin_env, workload={"gpu_load": args.gpu_load})
    nodes = twin_env.cluster.nodes()
    ts = args.time_scale
    rules = list(dict.fromkeys(args.rules))
    for flag, v in (("--clusters", args.clusters), ("--runs", args.runs)):
        if v < 1:
            raise ValueError(f"{flag}: {v} must be >= 1")
    for name in rules:  # a wrong policy or artifact fails now, not after the first live run
        get_policy(name.removesuffix(HEDGE), twin_env)
        if name.endswith(HEDGE) and args.run_noise <= 0:
            raise ValueError(f"--rules {name}: hedging needs --run-noise > 0 (no run is late)")
    env, live_cfg = live_settings(twin_env, nodes, ts, args.speeds)
    load = MachineLoad()  # sampled after each live run (scale_ray.bench.validity)
    gpu_load = twin_env.workload.gpu_load
    out: dict[str, Any] = {"setting": "agents", "nodes": args.nodes, "gpu_load": gpu_load,
                           "run_noise": args.run_noise, "speeds": args.speeds,
                           "warm_workers": args.warm_workers,
                           "workflows": args.workflows, "time_scale": ts, "runs": []}
    shapes = {nd.name: sum(1 for m in nodes if m.name == nd.name) for nd in nodes}
    print(f"agents live: {args.nodes} nodes {shapes}, GPU load {gpu_load:g}, "
          f"{args.workflows} requests per run, time_scale {ts:g}, {args.runs} run(s) on each of "
          f"{args.clusters} cluster(s), policies {rules} vs {REFERENCE}, node speeds "
          f"{args.speeds}", flush=True)
    if not rules and not args.skip_overhead:
        raise ValueError("--rules: the overhead part times the first rule; name one or pass "
                         "--skip-overhead")
    for c in range(args.clusters):  # Ray's tie order is the cluster's: a fresh one draws anew
        with AgentsCluster(nodes, args.warm_workers) as cluster:
            out.setdefault("ray_node_order", cluster.ray_order)
            for r in range(args.runs):
                seed = args.seed + r
                reqs = requests(twin_env, args.workflows, seed, args.run_noise)
                row: dict[str, Any] = {"seed": seed, "cluster": c, "live": {}, "twin": {},
                                       "ray_node_order": cluster.ray_order}
                names = [REFERENCE] + rules
                for name in (names if r % 2 == 0 else names[::-1]):  # alternate who goes first
                    row["live"][name], row["twin"][name] = _run_rule(
                        name, r, seed, reqs, args, twin_env, env, live_cfg, cluster.ray_order,
                        load)
                out["runs"].append(row)
            if c == 0 and not args.skip_overhead:
                out["overhead"] = live_overhead(twin_env, nodes, args.overhead_requests,
                                                args.repeats, rules[0], args.seed, args.timeout_s)
    if not args.skip_overhead:
        out["overhead"]["decision_only"] = [
            decision_overhead(n, args.overhead_requests * n // args.nodes, args.seed, rules[0],
                              args.agents_config) for n in args.overhead_nodes]
    summarize(out, rules)
    print(format_agents(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"wrote {args.json}")
    return 0


def summarize(out: dict[str, Any], rules: list[str]) -> None:
    """Per rule and run: ``rel_diff_vs_ray_default`` = its mean / Ray default's − 1, live and in
    the twin, the same for p95 live, and the gap between live and twin (points); the means over
    runs in ``rel_diff_vs_ray_default`` and the largest gap in ``max_twin_gap_points``."""
    key, p95 = "mean_workflow_response_model_s", "p95_workflow_response_model_s"
    table, gaps = {}, []
    for name in rules:
        live = [r["live"][name][key] / r["live"][REFERENCE][key] - 1 for r in out["runs"]]
        twin = [r["twin"][name][key] / r["twin"][REFERENCE][key] - 1 for r in out["runs"]]
        p95_live = [r["live"][name][p95] / r["live"][REFERENCE][p95] - 1 for r in out["runs"]]
        gap = max(abs(a - b) for a, b in zip(live, twin)) * 100
        gaps.append(gap)
        table[name] = {"rel_diff_live": live, "rel_diff_twin": twin,
                       "p95_rel_diff_live": p95_live, "twin_gap_points": gap}
    out["validity"] = [run_validity(r) for r in out["runs"]]
    out["rel_diff_vs_ray_default"] = {n: float(np.mean(t["rel_diff_live"]))
                                      for n, t in table.items()}
    out["max_twin_gap_points"] = max(gaps) if gaps else math.nan
    out["table"] = table
    ray = [(r["live"][REFERENCE][key], r["twin"][REFERENCE]) for r in out["runs"]]
    out["ray_default_live_vs_twin"] = [lv / tw[key] - 1 for lv, tw in ray]
    out["ray_default_live_vs_random_order_twin"] = [
        lv / tw["random_order_mean_workflow_response_model_s"] - 1 for lv, tw in ray
        if "random_order_mean_workflow_response_model_s" in tw]


def run_validity(run: dict[str, Any]) -> dict[str, Any]:
    """One run's verdict (:func:`scale_ray.bench.validity.check`): every arm's live / twin mean
    (Ray default's included) and the machine's load after each arm."""
    key = "mean_workflow_response_model_s"
    ratios = {n: twin_ratio(lv[key], run["twin"][n][key]) for n, lv in run["live"].items()}
    load = MachineLoad(samples=[lv["load_1m"] for lv in run["live"].values()
                                if lv.get("load_1m") is not None])
    return check(ratios, load)


def format_agents(out: dict[str, Any]) -> str:
    lines = ["", f"{'policy':12s} {'run':>3s} {'live mean':>9s} {'p95':>7s} {'p99':>7s} "
                 f"{'twin mean':>9s} {'p95':>7s} {'p99':>7s}   (workflow response, model s)"]
    for k, r in enumerate(out["runs"]):
        for name in r["live"]:
            lv, tw = r["live"][name], r["twin"][name]
            lines.append(f"{name:12s} {k + 1:3d} {lv['mean_workflow_response_model_s']:9.2f} "
                         f"{lv['p95_workflow_response_model_s']:7.2f} "
                         f"{lv['p99_workflow_response_model_s']:7.2f} "
                         f"{tw['mean_workflow_response_model_s']:9.2f} "
                         f"{tw['p95_workflow_response_model_s']:7.2f} "
                         f"{tw['p99_workflow_response_model_s']:7.2f}")
            if name == REFERENCE:  # Ray default's tie order and random choice (twin_prediction)
                rnd = tw.get("random_order_mean_workflow_response_model_s")
                lines.append(f"{'':16s}(twin: this cluster's node-id order, {tw['draws']} draws, "
                             f"sd {tw['sd_mean_workflow_response_model_s']:.2f}" + (
                                 "" if rnd is None else f"; random id orders {rnd:.2f}, sd "
                                 f"{tw['random_order_sd']:.2f}") + ")")
    if out.get("overhead"):
        lines += format_overhead(out["overhead"], out["nodes"])
    lines.append("")
    for what, k in (("its twin", "ray_default_live_vs_twin"),
                    ("its twin in random id orders", "ray_default_live_vs_random_order_twin")):
        d = np.array(out[k])
        if d.size:
            lines.append(f"Ray default live vs {what}: " + " / ".join(rel(x) for x in d)
                         + (f" (mean {rel(d.mean(), 2)}, sd {100 * d.std(ddof=1):.2f} points)"
                            if d.size > 1 else ""))
    valid = [v["valid"] for v in out.get("validity", [])] or [True] * len(out["runs"])
    for k, v in enumerate(out.get("validity", [])):
        lines.append(f"run {k + 1}: {format_check(v)}")

    def live(gains: list[float]) -> str:  # an invalid run's gain is not reported
        return " / ".join(rel(g) if ok else "INVALID" for g, ok in zip(gains, valid))

    for name, t in out["table"].items():
        lines.append(f"{name}: mean vs Ray default live {live(t['rel_diff_live'])}, twin "
                     + " / ".join(rel(g) for g in t["rel_diff_twin"])
                     + f"; gap {t['twin_gap_points']:.1f} points; p95 vs Ray default live "
                     + live(t["p95_rel_diff_live"]))
    return "\n".join(lines)
