"""`scale-ray run-workflows`: stream workflows through the live scheduler on a Ray cluster.

Starts a local heterogeneous multi-node Ray cluster (``--cluster local-hetero``, tiers of
configs/env/paper.yaml) or connects to an existing one (``--address``), streams Poisson arrivals of
workflows (the env's random DAGs, or a DAG file replayed), places them with ``--policy`` (or Ray's
own placement with ``ray-default``) and prints response-time statistics.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
from pathlib import Path

from envs.config import DAG_FORMATS, build
from envs.config_files import read_yaml, resolve_config_path
from envs.trace import JsonlTraceWriter
from policies import default_policy, get_policy
from scale_ray.config import load_env
from scale_ray.config import parse_overrides
from scale_ray.families import WORKLOAD_CONFIG_DIR
from scale_ray.live.cluster import LocalHeteroCluster
from scale_ray.live.config import LiveConfig
from scale_ray.live.runner import (arrival_times, emulated_runtime, estimator_accuracy,
                                   make_target, parse_events, rate_for_load, stderr_progress,
                                   stream, warm_up, workload_specs)
from scale_ray.live.workflow import load_dag_file
from scale_ray.bench.validity import (MachineLoad, check, format_check, gain_line,
                                      ratio_interval)
from scale_ray.relative import rel

log = logging.getLogger(__name__)
#: the live settings of emulated runs (time_scale 0.1; LiveConfig keeps the library's defaults)
EMULATE_CONFIG = "configs/live/emulate.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", choices=["local-hetero"], default="local-hetero",
                   help="start a local multi-node cluster with the env's tiers (default)")
    p.add_argument("--address", default=None,
                   help="connect to this running Ray cluster instead (its nodes must advertise "
                        "scale_slot/scale_compute/scale_memory_gb; see docs/live.md)")
    p.add_argument("--nodes", type=int, default=16, help="servers N (tiers 2:5:1 by default)")
    p.add_argument("--servers-per-node", type=int, default=1,
                   help="pack up to K same-tier servers into one raylet (1: a raylet per server)")
    p.add_argument("--policy", nargs="+", default=[default_policy()],
                   help="heuristic name, shipped policy, artifact dir, or ray-default; several "
                        "run one after another on the same cluster and workload, compared")
    p.add_argument("--workflows", type=int, default=200, help="workflows to stream")
    p.add_argument("--rate", type=float, default=None,
                   help="arrivals per model second (default: from --load)")
    p.add_argument("--load", type=float, default=0.6,
                   help="offered compute load when --rate is not given (0.6 = 60%%)")
    p.add_argument("--live-config", default=EMULATE_CONFIG,
                   help="YAML of the live scheduler's settings (LiveConfig keys, validated as "
                        "every live section; unset keys keep LiveConfig's defaults; default: "
                        "%(default)s)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="the same as --live-set time_scale=X, "
                        f"{_field_doc(LiveConfig, 'time_scale')} (default: --live-config's)")
    p.add_argument("--dag", default=None,
                   help="DAG file to replay instead of random DAGs, in any format `scale-ray eval "
                        "--dags` reads (live JSON/YAML, WfFormat, WorFBench, FlowBench, DAGBench, "
                        "NESTFUL, TaskBench plans; detected from the content); demands of the "
                        "non-live formats from workload.resources (default: "
                        "configs/env/workloads/base.yaml)")
    p.add_argument("--dag-format", default="auto", choices=DAG_FORMATS,
                   help="force the --dag file's format instead of detecting it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-config", default=None, help="environment YAML (default: paper.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an env key (repeatable)")
    p.add_argument("--live-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a live scheduler key, e.g. max_retries=5 (repeatable)")
    p.add_argument("--kill-node-at", type=float, action="append", default=[], metavar="T",
                   help="kill a random server node at model time T (repeatable)")
    p.add_argument("--add-node-at", action="append", default=[], metavar="T[:TIER]",
                   help="add a server node (default tier medium) at model time T (repeatable)")
    p.add_argument("--hints", choices=["exact", "none"], default="exact",
                   help="what the scheduler is told of each emulated task's compute: the "
                        "workload's, or nothing (runtime.default_gflop for all; learn with "
                        "--live-set estimator=online)")
    p.add_argument("--noise", type=float, default=0.0, metavar="SIGMA",
                   help="emulated runs take compute x LogNormal(mean 1, SIGMA) (envs.runtime)")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up after this many wall s")
    p.add_argument("--json", default=None, help="write the statistics to this JSON file")
    p.add_argument("--trace", default=None, help="write the JSONL trace here")


def _dag_resources(env):
    """The demand mapping for --dag files: the env's, else configs/env/workloads/base.yaml's."""
    if env.workload.resources is not None:
        return env.workload.resources
    return load_env(WORKLOAD_CONFIG_DIR / "base.yaml").workload.resources


def _field_doc(cls, name: str) -> str:
    """A config field's ``doc``, for a CLI flag that sets it (one description, in the config)."""
    return next(f.metadata["doc"] for f in dataclasses.fields(cls) if f.name == name)


def _live_config(args: argparse.Namespace):
    """``--live-config``'s settings, then ``--time-scale``, then ``--live-set`` (validated as
    every ``live`` section)."""
    data = read_yaml(resolve_config_path(args.live_config))
    if args.time_scale is not None:
        data["time_scale"] = args.time_scale
    return build(LiveConfig, {**data, **parse_overrides(args.live_set)}, "live")


def _check_numbers(args: argparse.Namespace) -> None:
    if args.nodes < 1:
        raise ValueError(f"--nodes: {args.nodes} must be >= 1")
    if args.workflows < 1:
        raise ValueError(f"--workflows: {args.workflows} must be >= 1")
    if args.rate is not None and not (args.rate > 0 and math.isfinite(args.rate)):
        raise ValueError(f"--rate: {args.rate} must be a finite number > 0")
    if not 0 < args.load <= 10:
        raise ValueError(f"--load: {args.load} must be in (0, 10]")
    if not 0 <= args.noise <= 3:
        raise ValueError(f"--noise: {args.noise} must be in [0, 3]")


def _run_policy(spec: str, env, live, specs, times, rate: float, cluster, events,
                args: argparse.Namespace) -> dict:
    """Stream the workflows under one policy (``spec``); its statistics."""
    log.info("warm-up (a short task per server, all at once): %.1f s", warm_up(env, live))
    writer = JsonlTraceWriter(args.trace) if args.trace else None
    target = make_target(spec, env, live, args.seed, trace=writer)
    log.info("streaming %d workflows at %.3f/model s (time scale %g) under %s",
             len(specs), rate, live.time_scale, spec)
    try:
        stats = stream(target, specs, times, live.time_scale, cluster, events, args.seed,
                       stderr_progress(spec), timeout_s=args.timeout)
        stats["workflow_response_s"] = [h.response_s for h in target.handles()
                                        if h.response_s is not None]
        if getattr(target, "estimator", None) is not None:
            stats["estimator_accuracy"] = estimator_accuracy(target)
            print(format_accuracy(stats["estimator_accuracy"]), flush=True)
    finally:
        target.shutdown()
        if writer is not None:
            writer.close()
    stats.update(policy=spec, servers=env.cluster.servers, rate_per_model_s=rate,
                 time_scale=live.time_scale, raylets=len(cluster.plan()) if cluster else None)
    print(format_stats(stats), flush=True)
    return stats


def _summary(results: dict[str, dict], first: str, load: MachineLoad) -> dict:
    """The ``--json`` document: the first policy's statistics, every policy's, and the change
    against ray-default when it ran, with its 95 % interval over workflows, unless the
    comparison is invalid (``scale_ray.bench.validity``: here the machine's load; no arm has a
    twin)."""
    out = dict(results[first])
    if len(results) > 1:
        out["by_policy"] = results
        out["validity"] = check({p: None for p in results}, load)
        print(format_comparison(results, out["validity"]))
        if "ray-default" in results:
            ref = results["ray-default"]
            base = ref["mean_workflow_response_s"]
            out["rel_diff_vs_ray_default"] = {
                p: r["mean_workflow_response_s"] / base - 1.0 for p, r in results.items()
                if p != "ray-default"}
            for p, d in out["rel_diff_vs_ray_default"].items():
                interval = ratio_interval(results[p]["workflow_response_s"],
                                          ref["workflow_response_s"])
                print(gain_line(f"{p} vs ray-default, mean workflow response", d,
                                out["validity"], interval))
    return out


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    env = load_env(args.env_config, args.set, servers=args.nodes)
    live = _live_config(args)
    events = parse_events(args.kill_node_at, args.add_node_at)
    dag = load_dag_file(args.dag, _dag_resources(env), args.dag_format) if args.dag else None
    specs = workload_specs(env, args.workflows, args.seed, dag)
    rate = args.rate or rate_for_load(env, args.load, specs)
    times = arrival_times(rate, len(specs), args.seed)
    if args.noise > 0 or args.hints != "exact":
        specs = emulated_runtime(env, specs, args.hints, args.noise, args.seed)
    for spec in args.policy:  # fail on a bad --policy before starting a cluster
        if spec != "ray-default":
            get_policy(spec, env, args.seed)
    if events and len(args.policy) > 1:
        raise ValueError("--kill-node-at/--add-node-at: give a single --policy (each run would "
                         "change the cluster for the next)")
    if args.trace and len(args.policy) > 1:
        raise ValueError("--trace: give a single --policy")

    results: dict[str, dict] = {}
    load = MachineLoad()  # after each policy's run (scale_ray.bench.validity)
    cluster = None
    try:
        import ray

        if args.address:
            if events:
                raise ValueError("--kill-node-at/--add-node-at need --cluster local-hetero")
            ray.init(address=args.address)
        else:
            cluster = LocalHeteroCluster(env.cluster, args.servers_per_node)
            log.info("starting a local cluster: %d servers on %d raylets", env.cluster.servers,
                     len(cluster.plan()))
            cluster.start(progress=True)
        for spec in args.policy:
            results[spec] = _run_policy(spec, env, live, specs, times, rate, cluster, events, args)
            load.sample()
    finally:
        if cluster is not None:
            cluster.shutdown()
        else:
            import ray
            if ray.is_initialized():
                ray.shutdown()
    out = _summary(results, args.policy[0], load)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    ok = all(r["workflows_failed"] == 0 and r["workflows_completed"] == r["workflows_submitted"]
             for r in results.values())
    return 0 if ok else 1


def format_comparison(results: dict[str, dict], verdict: dict | None = None) -> str:
    """One row per policy, plus the change against ray-default when it ran (INVALID when
    ``verdict`` says the comparison is, with the line that says why)."""
    base = results.get("ray-default", {}).get("mean_workflow_response_s")
    if verdict is not None and not verdict["valid"]:
        base = None
    lines = ["", f"{'policy':<16}{'completed':>10}{'mean wf s':>11}{'p95 wf s':>10}"
                 f"{'mean task s':>13}{'mean vs ray-default':>21}"]
    for p, r in results.items():
        vs = "" if not base or p == "ray-default" else \
            rel(r['mean_workflow_response_s'] / base - 1)
        lines.append(f"{p:<16}{r['workflows_completed']:>6}/{r['workflows_submitted']:<3}"
                     f"{r['mean_workflow_response_s']:>11.3f}{r['p95_workflow_response_s']:>10.3f}"
                     f"{r['mean_task_response_s']:>13.3f}{vs:>21}")
    if verdict is not None:
        lines.append(format_check(verdict))
    return "\n".join(lines)


def format_stats(s: dict) -> str:
    """Human-readable summary of one run."""
    lines = [
        f"policy {s.get('policy')}: {s['workflows_completed']}/{s['workflows_submitted']} workflows "
        f"completed, {s['workflows_failed']} failed, in {s.get('wall_s', float('nan')):.1f} s wall",
        f"  workflow response: mean {s['mean_workflow_response_s']:.3f} s, "
        f"p95 {s['p95_workflow_response_s']:.3f} s wall "
        f"(model: mean {s['mean_workflow_response_model_s']:.2f} s, "
        f"p95 {s['p95_workflow_response_model_s']:.2f} s)",
        f"  task response: mean {s['mean_task_response_s']:.3f} s, "
        f"p95 {s['p95_task_response_s']:.3f} s wall",
    ]
    if "lost" in s:
        lines.append(f"  decisions {s['decisions']}, waits {s['waits']}, lost runs {s['lost']}, "
                     f"node refreshes {s['node_refreshes']}, guard overrides "
                     f"{s.get('guard_overrides', 0)}")
    return "\n".join(lines)


def format_accuracy(acc: dict) -> str:
    """The estimator's per-kind medians against the true ones (emulated runs)."""
    lines = ["  run-time estimator (per kind: completed runs, true / estimated median GFLOP):"]
    for kind, a in acc.items():
        lines.append(f"    {kind:<12} n={a['n']:<4} {a['true_median_gflop']:.3f} / "
                     f"{a['estimated_median_gflop']:.3f} ({rel(a['rel_err'])})")
    return "\n".join(lines)
