"""`scale-ray workloads`: the real-DAG workload families (envs.loaders) -- list them, print their
shape statistics (the tables of docs/workloads.md), and the measured medians behind the
``pegasus_job`` profile.

Examples::

    scale-ray workloads list
    scale-ray workloads stats                      # every family
    scale-ray workloads stats --family nestful dagbench
    scale-ray workloads stats --measured           # medians of measured WfInstances jobs
    scale-ray workloads compare --policy scale --servers 16 48 --episodes 8
                                                   # the policy vs EFT on every family
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Sequence

from envs import loaders
from scale_ray.evaluation import stderr_progress
from scale_ray.families import family_env, family_names, workload_config_path, workload_scale
from scale_ray.workload_compare import compare_family, format_compare, write_json


def skip_reasons(messages: Sequence[str]) -> dict[str, int]:
    """Counts of skipped records by failure mode."""
    kinds = (("cycle", "contains a cycle"), ("self-loop", "self-loop"),
             ("unknown tool", "which no TaskBench domain defines"),
             ("unknown link", "unknown node"), ("unknown link", "which no task node runs"),
             ("unknown link", "refers to"), ("missing field", "missing field"))
    out: dict[str, int] = {}
    for m in messages:
        kind = next((k for k, needle in kinds if needle in m), "other")
        out[kind] = out.get(kind, 0) + 1
    return out


def measured_medians() -> str:
    """Medians over the measured WfInstances jobs (the ``pegasus_job`` profile's source)."""
    res = family_env("wfinstances").workload.resources
    tasks = [t for wf in loaders.load_family("wfinstances", res) for t in wf.tasks]
    measured_mem = [t.memory_gb for t in tasks if not t.estimated]
    edges = [t.output_gb for t in tasks if t.output_gb > 0]
    return (f"WfInstances jobs: {len(tasks)}\n"
            f"median compute_gflop: {statistics.median(t.compute_gflop for t in tasks):.4g} "
            f"(mean {statistics.fmean(t.compute_gflop for t in tasks):.4g})\n"
            f"median measured memory_gb: {statistics.median(measured_mem):.4g} "
            f"({len(measured_mem)} jobs with memoryInBytes)\n"
            f"median output_gb of jobs with children: {statistics.median(edges):.4g}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "stats", "compare"],
                   help="list the families, print statistics, or compare a policy with EFT on "
                        "each (with and without the guard and the workload scale)")
    p.add_argument("--family", nargs="+", default=None, help="families (default: all)")
    p.add_argument("--measured", action="store_true",
                   help="with stats: also print the medians of the measured WfInstances jobs")
    p.add_argument("--policy", default="scale", help="with compare: the policy (default scale)")
    p.add_argument("--servers", nargs="+", type=int, default=[16, 48],
                   help="with compare: cluster sizes (default 16 48)")
    p.add_argument("--episodes", type=int, default=8, help="with compare: episodes per size")
    p.add_argument("--seed", type=int, default=0, help="with compare: base seed")
    p.add_argument("--workers", type=int, default=0,
                   help="with compare: parallel Ray workers (0: one per CPU; 1: in process)")
    p.add_argument("--json", default=None, help="with compare: write the rows here")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name in family_names():
            print(f"{name:24s} {loaders.FAMILIES[name].description}")
        return 0
    if args.action == "compare":
        return _compare(args)
    rows, reasons, scales = [], [], []
    for name in args.family or family_names():
        env = family_env(name)
        res = env.workload.resources
        workflows = loaders.load_family(name, res)
        scales.append(f"{name}: features.workload_scale {workload_scale(workflows):g} "
                      f"(configured: {env.features.workload_scale:g})")
        loaded = loaders.FAMILIES[name].load(res) if loaders.load_counts(name, res)[1] else None
        records, skipped = loaders.load_counts(name, res)
        rows.append((name, loaders.shape_stats(workflows), records, skipped))
        if loaded is not None:
            reasons.append(f"{name}: skipped {skipped} of {records}: {skip_reasons(loaded.skipped)}")
    print(loaders.format_stats(rows))
    for line in reasons + scales:
        print(line)
    if args.measured:
        print(measured_medians())
    return 0


def _compare(args: argparse.Namespace) -> int:
    if args.episodes < 2:
        raise ValueError(f"--episodes: {args.episodes} must be >= 2 (paired intervals)")
    families = args.family or family_names()
    for f in families:
        workload_config_path(f)  # fail fast on an unknown name
    rows = []
    for f in families:
        rows += compare_family(f, args.policy, args.servers, args.episodes, args.seed,
                               args.workers, stderr_progress(f"compare {f}"))
        print(format_compare(rows[-len(args.servers):], args.policy).splitlines()[-1],
              file=sys.stderr, flush=True)
    print(format_compare(rows, args.policy))
    if args.json:
        write_json(args.json, rows, {"policy": args.policy, "servers": args.servers,
                                     "episodes": args.episodes, "seed": args.seed})
    return 0
