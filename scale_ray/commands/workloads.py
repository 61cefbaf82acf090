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
from pathlib import Path
from typing import Any, Sequence

from scale_ray.config import CONFIG_DIR, load_env

WORKLOAD_CONFIG_DIR = CONFIG_DIR / "env" / "workloads"


def family_names() -> list[str]:
    """Names of the real-DAG workload families (``--list-workloads``)."""
    from envs.loaders import family_names as names
    return names()


def workload_config_path(family: str) -> tuple[Path, bool]:
    """(env config of ``family``, whether the source must be overridden). A finer family
    (``wfinstances-montage``) without its own file uses its parent's (``wfinstances.yaml``)."""
    names = family_names()
    if family not in names:
        raise ValueError(f"--workload: unknown family {family!r}; known: {', '.join(names)}")
    own = WORKLOAD_CONFIG_DIR / f"{family}.yaml"
    if own.is_file():
        return own, False
    parent = WORKLOAD_CONFIG_DIR / f"{family.split('-')[0]}.yaml"
    if parent.is_file():
        return parent, True
    raise ValueError(f"--workload: no env config for {family!r} (looked for {own} and {parent})")


def workload_env_args(family: str, env_config: str | None,
                      sets: Sequence[str]) -> tuple[str, list[str]]:
    """The ``--env-config`` and ``--set`` list that select ``family`` (for `scale-ray eval`)."""
    if env_config is not None:
        raise ValueError("--workload and --env-config are exclusive: --workload picks "
                         "configs/env/workloads/<family>.yaml (use --set to change it)")
    path, override = workload_config_path(family)
    return str(path), ([f"workload.source={family}"] if override else []) + list(sets)


def family_env(family: str, sets: Sequence[str] = ()):
    """The validated EnvConfig of ``family``."""
    path, sets2 = workload_env_args(family, None, sets)
    return load_env(path, sets2)


def workload_scale(workflows: Sequence[Any]) -> float:
    """``features.workload_scale`` for these workflows: their mean task compute over the mean
    of the paper's generator (``workload.compute_gflop.mean``, 4 GFLOP), to 3 significant
    digits. With it a trained policy sees their compute and busy times in the units it was
    trained in (docs/workloads.md, "Features that transfer")."""
    from envs.config import WorkloadConfig

    tasks = [t.compute_gflop for wf in workflows for t in wf.tasks]
    k = statistics.fmean(tasks) / WorkloadConfig().compute_gflop.mean
    return float(f"{k:.3g}")


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
    from envs.loaders import load_family
    res = family_env("wfinstances").workload.resources
    tasks = [t for wf in load_family("wfinstances", res) for t in wf.tasks]
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
    from envs import loaders

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
    import sys

    from scale_ray.evaluation import stderr_progress
    from scale_ray.workload_compare import compare_family, format_compare, write_json

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
