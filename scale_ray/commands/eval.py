"""`scale-ray eval`: fixed-seed evaluation of heuristics and trained policies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from policies import default_policy
from scale_ray.config import load_env
from scale_ray.evaluation import (evaluate, format_paired, format_table, paired_differences,
                                  stderr_progress)


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
                   help="also print each policy's mean response relative to POLICY (one of "
                        "--policy) on the same episodes, with a 95%% confidence interval")
    p.add_argument("--workload", default=None, metavar="FAMILY",
                   help="evaluate on a real-DAG family (its configs/env/workloads/ config; "
                        "see --list-workloads and docs/workloads.md)")
    p.add_argument("--list-workloads", action="store_true",
                   help="print the real-DAG workload family names, one a line, and exit")


def run(args: argparse.Namespace) -> int:
    if args.list_workloads:
        from scale_ray.commands.workloads import family_names
        print("\n".join(family_names()))
        return 0
    if args.workload is not None:
        from scale_ray.commands.workloads import workload_env_args
        args.env_config, args.set = workload_env_args(args.workload, args.env_config, args.set)
    if args.episodes < 1:
        raise ValueError(f"--episodes: {args.episodes} must be >= 1")
    for n in args.servers:
        if n < 1:
            raise ValueError(f"--servers: {n} must be >= 1")
    if args.paired_vs is not None and args.paired_vs not in args.policy:
        raise ValueError(f"--paired-vs: {args.paired_vs!r} is not one of --policy {args.policy}")
    env = load_env(args.env_config, args.set)
    rows, episodes = evaluate(env, args.policy, args.servers, args.episodes, args.seed,
                              args.workers, args.trace_dir, stderr_progress("eval"))
    print(format_table(rows))
    paired = paired_differences(episodes, args.paired_vs) if args.paired_vs else []
    if paired:
        print(format_paired(paired))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = {"results": rows, "episodes": episodes, "seed": args.seed}
        if args.paired_vs:
            doc["paired"] = paired
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0
