"""`scale-ray eval`: fixed-seed evaluation of heuristics and trained policies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from envs.config import DAG_FORMATS, replace
from envs.objective import DEFAULT_METRIC, METRICS
from envs.loaders import dags_workflows
from envs.loaders.dags import arrival_rate_for_load, capacity_gflop_s
from envs.workload import make_source, sample_workflows
from policies import default_policy, shipped_policies
from policies.guard import GuardConfig, load_guard_config
from scale_ray.config import DEFAULT_ENV_CONFIG, load_env
from scale_ray.evaluation import (METRIC_NAMES, evaluate, format_paired, format_table,
                                  paired_differences, run_identity, stderr_progress)
from scale_ray.families import WORKLOAD_CONFIG_DIR, family_names, workload_env_args, workload_scale
from scale_ray.relative import rel
from serve_apps.gate import DEFAULT_TOLERANCE, REFERENCE as GATE_REFERENCE
from serve_apps.gate import learned_artifact, write_mark


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", nargs="+", default=[default_policy()],
                   help="heuristic names, shipped policy names or artifact paths (several allowed); "
                        "prefix a trained one with sample: to draw from its action "
                        "distribution instead of acting greedily")
    p.add_argument("--servers", nargs="+", type=int, default=[16], help="cluster sizes N")
    p.add_argument("--episodes", type=int, default=30, help="episodes per policy and size")
    p.add_argument("--seed", type=int, default=0, help="base seed of the fixed evaluation set")
    p.add_argument("--env-config", default=None,
                   help="environment YAML (default: configs/env/paper.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an env key, e.g. --set workload.horizon_s=100 (repeatable)")
    p.add_argument("--workers", type=int, default=0,
                   help="parallel Ray workers (0: one per CPU; 1: in process, no Ray)")
    p.add_argument("--trace-dir", default=None, help="write one JSONL trace per episode here")
    p.add_argument("--json", default=None, help="write results to this JSON file")
    p.add_argument("--paired-vs", default=None, metavar="POLICY",
                   help="also print each policy's --metric relative to POLICY (one of "
                        "--policy) on the same episodes, with a 95%% confidence interval; "
                        "POLICY@ORDER (eft@fifo) runs a policy under another mdp.order")
    p.add_argument("--metric", nargs="+", default=[DEFAULT_METRIC], choices=list(METRICS),
                   help="the paired metrics (one table each) (envs/objective.py): workflow (default: mean workflow "
                        "response), task (the paper's mean task response), workflow_p95, "
                        "workflow_p99")
    p.add_argument("--workload", default=None, metavar="FAMILY",
                   help="evaluate on a real-DAG family (its configs/env/workloads/ config; "
                        "see --list-workloads and docs/workloads.md)")
    p.add_argument("--guard", choices=["on", "off"], default="on",
                   help="on (default): a learned policy acts through policies.guard (bounded, "
                        "justified waits; EFT's choice as the fallback; overrides counted in the "
                        "'guard' column); off: the raw policy. Heuristics are never guarded")
    p.add_argument("--guard-max-waits", type=int, default=GuardConfig().max_waits, metavar="K",
                   help="waits a task may make while a server it fits is idle (default "
                        "%(default)s)")
    p.add_argument("--gate", action="store_true",
                   help="check each learned policy of --policy against EFT on these episodes "
                        "(EFT is added if absent) and write the measurement into its artifact "
                        "(gate.json), which Serve reads before it serves the policy "
                        "(serve_apps/gate.py); exit 1 if one is worse than --gate-tolerance")
    p.add_argument("--gate-tolerance", type=float, default=DEFAULT_TOLERANCE, metavar="F",
                   help="with --gate: the most a policy's mean may exceed EFT's, as a fraction")
    p.add_argument("--list-workloads", action="store_true",
                   help="print the real-DAG workload family names, one a line, and exit")
    add_dag_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.list_workloads:
        print("\n".join(family_names()))
        return 0
    if args.workload is not None:
        args.env_config, args.set = workload_env_args(args.workload, args.env_config, args.set)
    if args.episodes < 1:
        raise ValueError(f"--episodes: {args.episodes} must be >= 1")
    for n in args.servers:
        if n < 1:
            raise ValueError(f"--servers: {n} must be >= 1")
    twice = sorted({p for p in args.policy if args.policy.count(p) > 1})
    if twice:
        raise ValueError(f"--policy: {', '.join(twice)} named more than once (each policy runs "
                         f"once on the fixed episodes)")
    if args.paired_vs is not None and args.paired_vs not in args.policy:
        raise ValueError(f"--paired-vs: {args.paired_vs!r} is not one of --policy {args.policy}")
    guard = load_guard_config({"enabled": args.guard == "on", "max_waits": args.guard_max_waits},
                              "guard")
    env = dags_env(args)
    gated = gate_policies(args)
    rows, episodes = evaluate(env, args.policy, args.servers, args.episodes, args.seed,
                              args.workers, args.trace_dir, stderr_progress("eval"), guard)
    print(format_table(rows))
    paired = []
    same = same_runs(args.policy, args.paired_vs, env) if args.paired_vs else []
    for p in same:
        print(f"{p}: the same policy, order and submission as {args.paired_vs} "
              f"({', '.join(run_identity(p, env))}): not paired with it")
    for metric in args.metric if args.paired_vs else []:
        rows_m = [r for r in paired_differences(episodes, args.paired_vs, metric)
                  if r["policy"] not in same]
        if rows_m:
            print(format_paired(rows_m))
        paired.extend(rows_m)
    verdicts = [gate_verdict(p, episodes, args, guard.enabled) for p in gated]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = {"results": rows, "episodes": episodes, "seed": args.seed,
               "guard": {"enabled": guard.enabled, "max_waits": guard.max_waits}}
        if gated:
            doc["gate"] = verdicts
        if args.paired_vs:
            doc["paired"] = paired
            doc["metric"] = args.metric
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 1 if any(not v["passed"] for v in verdicts) else 0


# --------------------------------------------------------------------------------------------
# --gate: a learned policy against EFT, marked for Serve (serve_apps.gate)
# --------------------------------------------------------------------------------------------

def gate_policies(args: argparse.Namespace) -> list[str]:
    """With ``--gate``: the learned policies of ``--policy`` (EFT added to it if absent);
    a clear error when there is none or the tolerance is out of range."""
    if not args.gate:
        return []
    if not 0 <= args.gate_tolerance <= 10:
        raise ValueError(f"--gate-tolerance: {args.gate_tolerance} must be in [0, 10]")
    learned = [p for p in args.policy
               if learned_artifact(p) is not None or p in shipped_policies()]
    if not learned:
        raise ValueError(f"--gate: no learned policy (an artifact directory or a shipped name) "
                         f"in --policy {args.policy}")
    if GATE_REFERENCE not in args.policy:
        args.policy = [*args.policy, GATE_REFERENCE]
    return learned


def gate_verdict(spec: str, episodes: list[dict], args: argparse.Namespace,
                 guarded: bool) -> dict:
    """``spec`` against EFT on the run's episodes, at its worst size: printed, and written
    into its artifact (not a shipped one: the test suite gates those)."""
    metric = args.metric[0]
    rows = [r for r in paired_differences(episodes, GATE_REFERENCE, metric)
            if r["policy"] == spec]
    worst = max(rows, key=lambda r: r["mean_rel_diff"])
    measured = {"rel_diff": worst["mean_rel_diff"], "ci95_half_width": worst["ci95_half_width"],
                "servers": worst["servers"], "episodes": worst["episodes"], "metric": metric,
                "by_servers": {str(r["servers"]): r["mean_rel_diff"] for r in rows},
                "seed": args.seed, "env_config": args.env_config or "configs/env/paper.yaml",
                "env_overrides": list(args.set), "guard": guarded,
                "tolerance": args.gate_tolerance,
                "passed": worst["mean_rel_diff"] <= args.gate_tolerance}
    measured["summary"] = (f"{rel(worst['mean_rel_diff'])} vs {GATE_REFERENCE} "
                           f"({METRIC_NAMES.get(metric, metric)}, N={worst['servers']}, "
                           f"{worst['episodes']} episodes)")
    artifact = learned_artifact(spec)
    where = (f"marked in {write_mark(artifact, measured)}" if artifact is not None
             else "shipped: not marked (tests/test_first_hour.py gates it)")
    print(f"gate: {spec} {measured['summary']} ± {100 * worst['ci95_half_width']:.1f} %: "
          + ("passes" if measured["passed"] else "FAILS")
          + f" the {100 * args.gate_tolerance:g} % tolerance (lower is better); {where}")
    return {"policy": spec, **measured}


def same_runs(policies: list[str], reference: str, env) -> list[str]:
    """The policies other than ``reference`` that run exactly as it does
    (:func:`scale_ray.evaluation.run_identity`): a pairing with them would compare a run with
    itself."""
    ref = run_identity(reference, env)
    return [p for p in policies if p != reference and run_identity(p, env) == ref]


# --------------------------------------------------------------------------------------------
# Your own DAG files (--dags), invalid records (--on-invalid), offered load (--load)
# --------------------------------------------------------------------------------------------

def add_dag_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dags", nargs="+", default=None, metavar="PATH",
                   help="evaluate on your own DAG files or directories (searched recursively for "
                        "*.json, *.jsonl, *.yaml, *.yml): WfFormat, WorFBench, FlowBench adjacency, "
                        "DAGBench, NESTFUL, TaskBench/GNN4TaskPlan plans or live DAG files, each "
                        "file's format detected from its content; demands from "
                        "configs/env/workloads/base.yaml unless --env-config names another env")
    p.add_argument("--dag-format", default="auto", choices=DAG_FORMATS,
                   help="with --dags: read every file as this format instead of detecting it")
    p.add_argument("--on-invalid", choices=["skip", "error"], default=None,
                   help="an invalid record or file of --dags or --workload: error aborts naming "
                        "file and record; skip skips it, counts it and logs a WARNING with the "
                        "count (default: error for --dags, the family's own rule for --workload)")
    p.add_argument("--load", type=float, default=None, metavar="RHO",
                   help="offered load instead of workload.arrival_rate_16: lambda16 = RHO x C16 / "
                        "W, with W the mean total compute (GFLOP) of the workload's DAGs and C16 "
                        "the cluster's total compute (GFLOP/s) at N=16; lambda(N) = lambda16 x "
                        "N/16 keeps it about RHO at every N")


def dags_env(args: argparse.Namespace):
    """The env of `scale-ray eval` with --dags, --dag-format, --on-invalid and --load applied;
    the workload is read here once so a bad file fails before any episode runs."""
    workload: dict = {}
    source = args.env_config
    if args.dags:
        if args.workload is not None:
            raise ValueError("--dags and --workload are exclusive")
        source = source or str(WORKLOAD_CONFIG_DIR / "base.yaml")
        workload.update(source="dags", dags=[str(Path(p).resolve()) for p in args.dags],
                        dag_format=args.dag_format)
    elif args.dag_format != "auto":
        raise ValueError("--dag-format: only with --dags")
    if args.on_invalid is not None:
        workload["on_invalid"] = {"skip": "skip", "error": "raise"}[args.on_invalid]
    if args.load is not None and not 0 < args.load <= 10:
        raise ValueError(f"--load: {args.load} must be in (0, 10]")
    if args.load is not None and any(s.split("=", 1)[0].strip() == "workload.arrival_rate_16"
                                     for s in args.set):
        raise ValueError("--load and --set workload.arrival_rate_16 are exclusive")
    env = load_env({"file": str(source or DEFAULT_ENV_CONFIG), "workload": workload}
                   if workload else source, args.set)
    if not (args.dags or args.workload or args.load is not None or args.on_invalid):
        return env
    src = make_source(env.workload)  # reads (and validates) the workload's files now
    if args.dags:
        wfs, records, skipped, per = dags_workflows(env.workload)
        print(f"dags: {len(wfs)} workflows from {sum(per.values())} files "
              f"({', '.join(f'{k} {v}' for k, v in per.items())}); {skipped} of {records} "
              f"records skipped as invalid")
        if not any(s.split("=", 1)[0].strip() == "features.workload_scale" for s in args.set):
            k = workload_scale(wfs)  # a trained policy sees the tasks in the paper's units
            env = replace(env, features={"workload_scale": k})
            print(f"dags: features.workload_scale = {k:g} (mean task compute / 4 GFLOP; "
                  f"--set features.workload_scale=K to choose)")
    if args.load is not None:
        rate = arrival_rate_for_load(env, args.load, sample_workflows(env.workload))
        env = replace(env, workload={"arrival_rate_16": rate})
        c16 = capacity_gflop_s(env, 16)
        print(f"--load {args.load:g}: lambda16 = {rate:.4g} workflows/s (W = "
              f"{args.load * c16 / rate:.4g} GFLOP per workflow, C16 = {c16:.4g} GFLOP/s; "
              f"~{rate * env.workload.horizon_s:.3g} arrivals in horizon_s at N=16)")
    return env
