"""`scale-ray bench live`: the live scheduler's overhead against plain Ray, and its placement
quality against Ray's default placement, on one local heterogeneous multi-node cluster.

Overhead (no-op primitives, ``time_scale = 0``; all sides on the same cluster, alternated
``--repeats`` times, medians reported):

* throughput: ``--overhead-workflows`` workflows, half chains of 8 and half fans 1 -> 14 -> 1,
  all submitted at once; tasks per wall second through the scheduler vs the same DAGs as plain
  Ray tasks (``@ray.remote`` no-ops with Ray's default 1-CPU request, parents' results passed
  as refs; server nodes have one CPU per server and the head none, so both sides run at most
  one task per server);
* a reference for the throughput: the same DAGs through the simplest loop with the scheduler's
  constraints (one task per server slot, hard-pinned, submitted when the slot is idle, parents'
  refs as args) and nothing else (``pinned_floor_ratio``): what the pinned-task design allows
  before any policy, encoding or bookkeeping;
* latency per dependency hop: one chain of ``--chain`` no-ops alone;
  ``(T_scheduler - T_plain) / hops``.

Quality: the same emulated workload (``--servers`` N, three tiers 2:5:1, Poisson arrivals at
``--load`` offered load) under ``--policy``, EFT and Ray's default placement; mean, p95 and p99
workflow response time; ``rel_diff_vs_ray_default = policy / ray-default - 1`` (mean).
``--setting realistic`` runs configs/env/realistic.yaml's workload at its own arrival rate
(about 0.7 utilisation) at ``--time-scale 0.25``, and measures EFT + hop (the paper's order),
EFT + the default order (fifo), the lookahead planner, ``--policy`` and Ray's default. Every
policy but Ray's default also runs in its simulator twin on the same arrivals
(:mod:`scale_ray.bench.twin`): the prediction is printed next to the live number, and ``--json``
adds ``rel_diff_vs_hop``, ``rel_diff_vs_ray_default`` and ``max_twin_gap_points``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

from envs.config import EnvConfig
from envs.trace import JsonlTraceWriter
from envs.workflow import TaskSpec, WorkflowSpec
from policies import default_policy, get_policy
from scale_ray.live import LiveScheduler
from scale_ray.live.cluster import LocalHeteroCluster, live_nodes
from scale_ray.live.config import EXECUTORS, LiveConfig
from scale_ray.live.runner import (arrival_times, emulated_runtime, make_target, rate_for_load,
                                   stream, warm_up, workload_specs)
from scale_ray.live.workflow import emulated_body
from scale_ray.relative import rel

from . import autoscale_live
from .agents_live import add_agents_arguments, run_agents
from .validity import MachineLoad, check, format_check, gain_line, ratio_interval, twin_ratio
from .programs_live import run_programs
from .twin import (NO_TWIN, REFERENCE, add_runtime_arguments, add_setting_arguments, calibrated,
                   compare, format_calibrated, format_rows, format_why, headline, live_model,
                   predict, resolve_setting, runtime_env, setting_env, why)

log = logging.getLogger(__name__)

# a result without a verdict (made before scale_ray.bench.validity): its gains as they are
UNCHECKED = {"valid": True, "reasons": [], "unchecked": []}
# quality targets (issue 26): --policy's mean workflow response this % below Ray default's
TARGET_VS_RAY_DEFAULT = {"paper": 20, "realistic": 35}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=default_policy(),
                   help="the policy under test (heuristic, shipped name or artifact dir); "
                        "EFT and ray-default are always measured")
    p.add_argument("--also", nargs="*", default=[], metavar="POLICY",
                   help="more policies for the quality runs and --twin-only (e.g. a student "
                        "artifact dir, or another order: eft@srpt)")
    p.add_argument("--servers", type=int, default=16, help="servers N for the quality run")
    p.add_argument("--servers-per-node", type=int, default=1,
                   help="pack up to K same-tier servers into one raylet (1: a raylet per server)")
    add_setting_arguments(p, "EFT + hop, EFT + fifo, lookahead, --policy and Ray default, each "
                             "next to its simulator twin")
    p.add_argument("--workflows", type=int, default=120, help="workflows per quality run")
    p.add_argument("--overhead-workflows", type=int, default=40)
    p.add_argument("--chain", type=int, default=100, help="hops of the latency chain")
    p.add_argument("--repeats", type=int, default=5, help="overhead measurements per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--executor", choices=EXECUTORS, default=LiveConfig().executor,
                   help="executor of the headline numbers and the quality runs (the overhead "
                        "part measures both)")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    add_runtime_arguments(p, "quality runs")
    p.add_argument("--twin-only", type=int, default=0, metavar="K",
                   help="start no cluster: print the simulator twin's EFT + hop and EFT + "
                        "default-order responses on the arrivals of K seeds from --seed (how "
                        "much the order can gain on the streams a live run would replay)")
    add_agents_arguments(p)
    autoscale_live.add_arguments(p)
    p.add_argument("--trace-dir", default=None,
                   help="write each quality run's live trace (live_POLICY.jsonl) and its twin's "
                        "(twin_POLICY.jsonl) here, for scale-ray explain")


def _chain(n: int) -> WorkflowSpec:
    return WorkflowSpec(tuple(TaskSpec(1.0, 0.0, 0.0, (i - 1,) if i else ()) for i in range(n)),
                        f"chain{n}")


def _fan(width: int) -> WorkflowSpec:
    tasks = [TaskSpec(1.0, 0.0, 0.0)]
    tasks += [TaskSpec(1.0, 0.0, 0.0, (0,)) for _ in range(width)]
    tasks.append(TaskSpec(1.0, 0.0, 0.0, tuple(range(1, width + 1))))
    return WorkflowSpec(tuple(tasks), f"fan{width}")


def _plain_ray(specs: list[WorkflowSpec]) -> float:
    """Wall seconds to run ``specs`` as plain Ray tasks (submitted at once, refs as args):
    ``@ray.remote`` with Ray's default request of 1 CPU (server nodes have one CPU per server and
    the head none, so at most one task per server, as under the scheduler)."""
    import ray


    f = ray.remote(emulated_body)
    t0 = time.perf_counter()
    sinks = []
    for spec in specs:
        refs: list[Any] = []
        for i, t in enumerate(spec.tasks):
            refs.append(f.remote(i, *(refs[p] for p in t.parents)))
        sinks.append(refs[-1])
    ray.get(sinks)
    return time.perf_counter() - t0


def _pinned_floor(specs: list[WorkflowSpec], slots: list[str]) -> tuple[float, list[list[Any]]]:
    """(wall seconds, every task's result ref per workflow) to run ``specs`` through the simplest
    loop that keeps the scheduler's constraints: one task per server slot at a time, hard-pinned
    to the slot's node, submitted only when the slot is idle, parents' results passed as refs;
    ready tasks in arrival order, idle slots in any order; no policy, no encoding, no
    bookkeeping. This is the ceiling of the pinned-task design on the cluster (``slots``: one
    node id per server slot)."""

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


    f = ray.remote(num_cpus=1, max_retries=0)(emulated_body)
    pinned = {node: f.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
              for node in set(slots)}
    children = [spec.children() for spec in specs]
    pending = [[len(t.parents) for t in spec.tasks] for spec in specs]
    t0 = time.perf_counter()
    ready = collections.deque((w, i) for w, spec in enumerate(specs)
                              for i, t in enumerate(spec.tasks) if not t.parents)
    refs: dict[tuple[int, int], Any] = {}
    running: dict[Any, tuple[int, int, int]] = {}
    free = list(range(len(slots)))
    while ready or running:
        while ready and free:
            w, i = ready.popleft()
            s = free.pop()
            ref = pinned[slots[s]].remote(i, *(refs[(w, p)] for p in specs[w].tasks[i].parents))
            refs[(w, i)] = ref
            running[ref] = (w, i, s)
        done, _ = ray.wait(list(running), num_returns=1, fetch_local=False)
        for ref in done:
            w, i, s = running.pop(ref)
            free.append(s)
            for c in children[w][i]:
                pending[w][c] -= 1
                if pending[w][c] == 0:
                    ready.append((w, c))
    ray.get([refs[(w, len(spec.tasks) - 1)] for w, spec in enumerate(specs)])
    wall = time.perf_counter() - t0
    return wall, [[refs[(w, i)] for i in range(len(spec.tasks))] for w, spec in enumerate(specs)]


def _scheduled(specs: list[WorkflowSpec], env, sched) -> float:
    t0 = time.perf_counter()
    hs = [sched.submit(s) for s in specs]
    for h in hs:
        h.result(timeout=600)
    return time.perf_counter() - t0


def _scheduler_round(env, executor: str, mix: list[WorkflowSpec], lat: list[WorkflowSpec],
                     counters: dict[str, float]) -> tuple[float, float]:
    """(throughput wall s, latency-chain wall s) through a fresh scheduler: started (with
    executor=actor: one actor per server, ready), warmed with a few workflows, timed, shut
    down (its actors release their CPUs before the next side runs)."""
    sched = LiveScheduler(get_policy("eft", env), env,
                          LiveConfig(time_scale=0.0, executor=executor)).start()
    try:
        _scheduled(mix[:4], env, sched)  # warm every path (function export, workers)
        tp = _scheduled(mix, env, sched)
        chain = _scheduled(lat, env, sched)
        for k in ("thread_cpu_s", "tasks_started"):
            counters[k] = counters.get(k, 0) + sched.counters[k]
    finally:
        sched.shutdown()
    return tp, chain


def overhead(env, repeats: int, n_workflows: int, chain: int,
             executor: str = "task") -> dict[str, Any]:
    """Throughput and latency per hop of both executors (``executor`` is the headline one)
    against plain Ray and the pinned-task floor, alternated ``repeats`` times; medians."""

    mix = [_chain(8) if k % 2 == 0 else _fan(14) for k in range(n_workflows)]
    n_tasks = sum(len(s.tasks) for s in mix)
    lat = [_chain(chain)]

    slots = [n.node_id for n in live_nodes(env.cluster.tiers) for _ in range(n.slots)]
    live = LiveConfig()
    warm_up(env, live)
    _plain_ray(mix[:4])  # warm every path
    _pinned_floor(mix[:4], slots)
    rows: dict[str, list[float]] = {"plain_tp": [], "floor_tp": [], "plain_chain": []}
    counters: dict[str, dict[str, float]] = {e: {} for e in EXECUTORS}
    for r in range(repeats):
        warm_up(env, live)  # the actor executor's shutdown took its workers with it
        rows["plain_tp"].append(n_tasks / _plain_ray(mix))
        rows["floor_tp"].append(n_tasks / _pinned_floor(mix, slots)[0])
        rows["plain_chain"].append(_plain_ray(lat))
        for e in EXECUTORS:
            tp, ch = _scheduler_round(env, e, mix, lat, counters[e])
            rows.setdefault(f"{e}_tp", []).append(n_tasks / tp)
            rows.setdefault(f"{e}_chain", []).append(ch)
        log.info("overhead round %d: plain %.0f tasks/s, pinned floor %.0f tasks/s, %s; "
                 "chain of %d: plain %.3f s, %s", r + 1, rows["plain_tp"][-1],
                 rows["floor_tp"][-1], ", ".join(f"{e} executor {rows[f'{e}_tp'][-1]:.0f} tasks/s"
                                                  for e in EXECUTORS),
                 chain, rows["plain_chain"][-1],
                 ", ".join(f"{e} {rows[f'{e}_chain'][-1]:.3f} s" for e in EXECUTORS))
    med = {k: statistics.median(v) for k, v in rows.items()}
    hops = chain - 1
    by_exec = {e: {
        "tasks_per_s": med[f"{e}_tp"],
        "throughput_ratio": med[f"{e}_tp"] / med["plain_tp"],
        "latency_per_hop_ms": 1e3 * med[f"{e}_chain"] / hops,
        "added_latency_per_hop_ms": 1e3 * (med[f"{e}_chain"] - med["plain_chain"]) / hops,
        "cpu_ms_per_task": 1e3 * counters[e]["thread_cpu_s"] / max(1, counters[e]["tasks_started"]),
    } for e in EXECUTORS}
    head = by_exec[executor]
    return {
        "executor": executor,
        "plain_ray_tasks_per_s": med["plain_tp"],
        "scheduler_tasks_per_s": head["tasks_per_s"],
        "throughput_ratio": head["throughput_ratio"],
        # the same DAGs through a loop with the task executor's constraints and nothing else
        "pinned_floor_tasks_per_s": med["floor_tp"],
        "pinned_floor_ratio": med["floor_tp"] / med["plain_tp"],
        "plain_ray_latency_per_hop_ms": 1e3 * med["plain_chain"] / hops,
        "scheduler_latency_per_hop_ms": head["latency_per_hop_ms"],
        "added_latency_per_hop_ms": head["added_latency_per_hop_ms"],
        "scheduler_cpu_ms_per_task": head["cpu_ms_per_task"],
        "by_executor": by_exec,
        "overhead_tasks": n_tasks,
        "chain_hops": hops,
        "raw": rows,
    }


def arrivals(env: EnvConfig, args: argparse.Namespace, seed: int
              ) -> tuple[list[WorkflowSpec], float, list[float]]:
    """A quality run's arrivals: (workflow specs, rate per model s, arrival times in model s)."""
    specs = workload_specs(env, args.workflows, seed)
    if args.load is not None:
        rate = rate_for_load(env, args.load, specs)
    else:  # the env's own arrival rate (lambda16 x N / 16), as in the simulator
        rate = env.workload.arrival_rate_16 * env.cluster.servers / 16.0
    return specs, rate, arrival_times(rate, len(specs), seed)


def twin_streams(env: EnvConfig, args: argparse.Namespace, seeds: int) -> dict[str, Any]:
    """``--twin-only K``: no cluster; the twin's prediction for EFT + hop, EFT + the default
    order and each ``--also`` policy (another order: ``eft@srpt``) on the arrivals of seeds
    ``--seed`` .. ``--seed`` + K - 1 (what a live run of each seed would be compared with)."""
    tenv = runtime_env(env, args)
    also = [p for p in dict.fromkeys(getattr(args, "also", None) or [])
            if p not in (REFERENCE, "eft") and p not in NO_TWIN]
    rows = []
    for seed in range(args.seed, args.seed + seeds):
        specs, _, times = arrivals(env, args, seed)
        m = {p: predict(tenv, p, specs, times, seed) for p in (REFERENCE, "eft", *also)}
        ref, eft = (m[p]["mean_workflow_response_s"] for p in (REFERENCE, "eft"))
        rows.append({"seed": seed, "hop_s": ref, "default_order_s": eft,
                     "rel_diff_vs_hop": eft / ref - 1.0,
                     "utilization": m[REFERENCE]["utilization"],
                     "also": {p: {"mean_s": m[p]["mean_workflow_response_s"],
                                  "rel_diff_vs_hop":
                                      m[p]["mean_workflow_response_s"] / ref - 1.0}
                              for p in also}})
        log.info("twin seed %d: EFT + hop %.2f s, EFT + default order %.2f s (%s), "
                 "utilisation %.2f", seed, ref, eft, rel(rows[-1]["rel_diff_vs_hop"]),
                 rows[-1]["utilization"])
    mean, median, share = _spread([r["rel_diff_vs_hop"] for r in rows])
    return {"setting": args.setting, "workflows": args.workflows, "streams": rows,
            "also": also, "mean_rel_diff_vs_hop": mean,
            "median_rel_diff_vs_hop": median, "share_8pct_lower": share}


def _spread(gains: list[float]) -> tuple[float, float, float]:
    """(mean, median, share 8 % lower or more) of per-stream relative differences."""
    return (statistics.fmean(gains), statistics.median(gains),
            sum(x <= -0.08 for x in gains) / len(gains))


def _format_spread(mean: float, median: float, share: float) -> str:
    return (f"mean {rel(mean)}, median {rel(median)}, 8 % lower or more in "
            f"{100 * share:.0f} % of the streams")


def format_twin_streams(r: dict[str, Any]) -> str:
    also = r.get("also", [])
    lines = [f"twin only ({r['setting']}, {r['workflows']} workflows per stream): the default "
             f"order{' and --also' if also else ''} vs EFT + hop, mean workflow response "
             f"(model s)",
             "  seed   EFT+hop   default      vs EFT+hop   utilisation"
             + "".join(f"  {p[:14]:>14}" for p in also)]
    for x in r["streams"]:
        lines.append(f"  {x['seed']:>4}  {x['hop_s']:8.2f}  {x['default_order_s']:8.2f}  "
                     f"{rel(x['rel_diff_vs_hop']):>14}  {x['utilization']:10.2f}"
                     + "".join(f"  {rel(x['also'][p]['rel_diff_vs_hop']):>14}"
                               for p in also))
    lines.append("  " + _format_spread(r["mean_rel_diff_vs_hop"],
                                       r["median_rel_diff_vs_hop"], r["share_8pct_lower"]))
    for p in also:
        g = [x["also"][p]["rel_diff_vs_hop"] for x in r["streams"]]
        lines.append(f"  {p}: " + _format_spread(*_spread(g)))
    return "\n".join(lines)


def quality(env, policies: list[str], args: argparse.Namespace, cluster,
            load: MachineLoad | None = None) -> dict[str, Any]:
    """Each policy's live run on the same arrivals (and its twin's prediction); ``load``
    sampled after each run."""
    live = LiveConfig(time_scale=args.time_scale, executor=args.executor,
                      estimator=getattr(args, "estimator", "off"),
                      hedge=getattr(args, "hedge", "off"))
    specs, rate, times = arrivals(env, args, args.seed)
    noise, hints = getattr(args, "noise", 0.0), getattr(args, "hints", "exact")
    runs = (emulated_runtime(env, specs, hints, noise, args.seed)
            if noise > 0 or hints != "exact" else specs)  # what the live runs execute
    tdir = getattr(args, "trace_dir", None)
    if tdir:
        Path(tdir).mkdir(parents=True, exist_ok=True)

    def trace_path(kind: str, name: str) -> str | None:
        return str(Path(tdir) / f"{kind}_{name.replace('/', '_')}.jsonl") if tdir else None

    out: dict[str, Any] = {"rate_per_model_s": rate, "workflows": len(specs),
                           "twin": {p: predict(runtime_env(env, args), p, specs, times,
                                               args.seed, trace_path("twin", p))
                                    for p in policies if p not in NO_TWIN}}
    for name in policies:
        warm_up(env, live)
        path = trace_path("live", name) if name not in NO_TWIN else None
        writer = JsonlTraceWriter(path) if path else None
        target = make_target(name, env, live, args.seed, trace=writer)
        try:
            stats = stream(target, runs, times, live.time_scale, timeout_s=900)
            stats["workflow_response_s"] = [h.response_s for h in target.handles()
                                            if h.response_s is not None]
        finally:
            target.shutdown()
            if writer is not None:
                writer.close()
        stats.pop("tasks_per_node", None)
        out[name] = stats
        if load is not None:
            load.sample()
        lag = stats.get("submit_lag_model_s", {})
        log.info("quality %s: mean workflow response %.3f s (p95 %.3f s), %d/%d completed; "
                 "submitted late by %.4f model s on average (max %.4f)",
                 name, stats["mean_workflow_response_s"], stats["p95_workflow_response_s"],
                 stats["workflows_completed"], stats["workflows_submitted"],
                 lag.get("mean", 0.0), lag.get("max", 0.0))
    return out


def run(args: argparse.Namespace) -> int:
    if args.setting == "programs":  # agents submitting call by call (bench/programs_live.py)
        return run_programs(args)
    if args.setting == "autoscale":  # elastic nodes, our sizing vs Ray's autoscaler path
        return autoscale_live.run(args)
    if args.setting == "agents":
        if args.time_scale is None:
            args.time_scale = 0.5
        return run_agents(args)
    env = setting_env(args.setting, args.servers)
    runtime_env(env, args)  # a bad --noise fails before a cluster starts
    resolve_setting(args)
    if args.twin_only < 0:
        raise SystemExit(f"--twin-only: expected a number of seeds >= 0, got {args.twin_only}")
    if args.twin_only:
        out = twin_streams(env, args, args.twin_only)
        print(format_twin_streams(out))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=2))
        return 0
    if args.policy not in ("eft", "ray-default"):
        get_policy(args.policy, env, args.seed)  # fail before starting a cluster
    t0 = time.perf_counter()
    cluster = LocalHeteroCluster(env.cluster, args.servers_per_node)
    result: dict[str, Any] = {"servers": env.cluster.servers, "raylets": len(cluster.plan()),
                              "servers_per_node": args.servers_per_node,
                              "time_scale": args.time_scale, "load": args.load,
                              "seed": args.seed}
    try:
        cluster.start(progress=True)
        result["cluster_start_s"] = time.perf_counter() - t0
        result["warm_up_s"] = warm_up(env, LiveConfig())
        if not args.skip_overhead:
            result.update(overhead(env, args.repeats, args.overhead_workflows, args.chain,
                                   args.executor))
        if not args.skip_quality:
            result.update(_quality_result(env, args, cluster))
    finally:
        cluster.shutdown()
    result["total_s"] = time.perf_counter() - t0
    print(format_result(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


def _quality_result(env: EnvConfig, args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    """The quality part's keys of ``--json``: each policy live and its twin, the headline, and
    with ``--trace-dir`` the gap measured apart and the calibrated twin."""
    first = [REFERENCE, "eft", "lookahead"] if args.setting == "realistic" else []
    pols = list(dict.fromkeys([*first, args.policy, *args.also, "eft", "ray-default"]))
    load = MachineLoad()
    q = quality(env, pols, args, cluster, load)
    lm = {p: live_model(q[p], args.time_scale) for p in pols}
    rows = compare(lm, {p: m for p, m in q["twin"].items()})
    result: dict[str, Any] = {"quality": q, "twin": rows, **headline(rows, "eft", args.policy),
                              "setting": args.setting}
    # what may be read as a gain (scale_ray.bench.validity): every arm against its twin
    ratios = {r["policy"]: twin_ratio(r["live_mean_workflow_response_s"],
                                      r.get("twin_mean_workflow_response_s")) for r in rows}
    result["validity"] = {"vs_ray_default": check(ratios, load, [args.policy, "ray-default"]),
                          "vs_hop": check(ratios, load, ["eft", REFERENCE])}
    if args.trace_dir:  # the gap measured apart, from the traces
        td = Path(args.trace_dir)
        result["why"] = {p: why(str(td / f"live_{p.replace('/', '_')}.jsonl"),
                                str(td / f"twin_{p.replace('/', '_')}.jsonl"), q[p],
                                args.time_scale)
                         for p in pols if p not in NO_TWIN}
        specs, _, times = arrivals(env, args, args.seed)
        result["twin_calibrated"] = calibrated(env, args, lm, specs, times, args.seed,
                                               result["why"])
    for k in ("mean", "p95", "p99"):
        result[f"{k}_workflow_response_s"] = {p: q[p][f"{k}_workflow_response_s"] for p in pols}
    base = q["ray-default"]["mean_workflow_response_s"]
    result["rel_diff_vs_ray_default"] = q[args.policy]["mean_workflow_response_s"] / base - 1
    result["rel_diff_interval"] = ratio_interval(q[args.policy]["workflow_response_s"],
                                                 q["ray-default"]["workflow_response_s"],
                                                 args.seed)
    result["eft_rel_diff_vs_ray_default"] = q["eft"]["mean_workflow_response_s"] / base - 1
    result["policy"] = args.policy
    return result


def format_result(r: dict[str, Any]) -> str:
    lines = [f"live bench: N={r['servers']} servers on {r['raylets']} raylets "
             f"(cluster up in {r.get('cluster_start_s', float('nan')):.1f} s)"]
    if "throughput_ratio" in r:
        lines += [
            f"  overhead ({r['executor']} executor): plain Ray {r['plain_ray_tasks_per_s']:.0f} "
            f"tasks/s, scheduler {r['scheduler_tasks_per_s']:.0f} tasks/s -> ratio "
            f"{r['throughput_ratio']:.2f} (target >= 0.60)",
            f"  pinned-task floor (one pinned task per idle slot, no policy or bookkeeping): "
            f"{r['pinned_floor_tasks_per_s']:.0f} tasks/s -> ratio {r['pinned_floor_ratio']:.2f}",
            f"  latency per hop: plain Ray {r['plain_ray_latency_per_hop_ms']:.2f} ms, scheduler "
            f"{r['scheduler_latency_per_hop_ms']:.2f} ms -> added "
            f"{r['added_latency_per_hop_ms']:.2f} ms (target <= 1)",
            f"  scheduler thread CPU: {r['scheduler_cpu_ms_per_task']:.2f} ms per task "
            f"(policy, encoding, Ray calls)"]
        for e, b in r.get("by_executor", {}).items():
            lines.append(f"    executor={e:<5}: {b['tasks_per_s']:.0f} tasks/s (ratio "
                         f"{b['throughput_ratio']:.2f}), {b['added_latency_per_hop_ms']:+.2f} ms/hop, "
                         f"{b['cpu_ms_per_task']:.2f} ms CPU/task")
    if "quality" in r:
        load = (f"load {r['load']}" if r.get("load") is not None
                else f"the {r.get('setting', 'paper')} setting's arrival rate")
        lines.append(f"  quality at {load} (time scale {r['time_scale']}):")
        for p, m in r["mean_workflow_response_s"].items():
            q = r["quality"][p]
            lines.append(f"    {p:<14} mean {m:.3f} s  p95 {r['p95_workflow_response_s'][p]:.3f} s "
                         f"p99 {q.get('p99_workflow_response_s', float('nan')):.3f} s "
                         f"wall  (model mean {q['mean_workflow_response_model_s']:.2f} s)  "
                         f"{q['workflows_completed']}/{q['workflows_submitted']} completed")
        valid = r.get("validity", {}).get("vs_ray_default", UNCHECKED)
        if valid is not UNCHECKED:
            lines.append("  " + format_check(valid))
        lines.append("  " + gain_line(f"mean workflow response vs ray-default ({r['policy']})",
                                      r["rel_diff_vs_ray_default"], valid,
                                      r.get("rel_diff_interval"))
                     + f" (target: {TARGET_VS_RAY_DEFAULT[r.get('setting', 'paper')]} % lower "
                       f"or more)")
    if "twin" in r:
        lines.append(format_rows(r["twin"]))
        if not math.isnan(r["rel_diff_vs_hop"]):
            lines.append("  " + gain_line("EFT + default order vs EFT + hop, live mean workflow "
                                          "response", r["rel_diff_vs_hop"],
                                          r.get("validity", {}).get("vs_hop", UNCHECKED))
                         + " (target: 8 % lower or more)")
        lines.append(f"  max twin gap {r['max_twin_gap_points']:.1f} points (target <= 3)")
    if "why" in r:
        lines.append(format_why(r["why"]))
    if "twin_calibrated" in r:
        lines.append(format_calibrated(r["twin_calibrated"]))
    return "\n".join(lines)
