"""Program-aware scheduling vs the same calls submitted one by one (issue 47, item 3): every order
under the three ``mdp.submission`` modes (``envs.programs``) with EFT placement, paired episodes
(same seeds, same requests), at several sizes and offered loads, on one or more settings.

For each (setting, load, N, order) it prints workflow response mean / p95 / p99 under ``dag``
(the order given the whole DAG: clairvoyant), ``program`` (calls seen as they come, grouped by
program; estimates learned online) and ``per_call`` (each call alone), and two paired
differences with 95 % t-intervals: ``program`` vs ``per_call`` (what knowing the program buys)
and ``program`` vs ``dag`` (what not knowing the future costs), and the first from the other
side, ``per_call`` / ``program`` - 1 (what per-call submission costs: the sign in which issue
47's probe stated its numbers; not the negative of the first, as each is a mean of ratios with
its own denominator). The JSON has every row, the per-episode metrics and
``fifo_program_vs_per_call_rel_diff``: program-aware ``fifo`` / ``fifo`` per call - 1 on mean
workflow response, per setting, load and size.

    scale-ray bench programs --configs configs/env/realistic.yaml configs/env/programs.yaml \\
        --servers 16 48 --loads 0.6 0.8 --episodes 30 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from envs.config import replace
from envs.config_files import load_env
from envs.loaders.dags import arrival_rate_for_load
from envs.order import ORDERS
from envs.programs import SUBMISSIONS
from envs.workload import sample_workflows
from scale_ray.evaluation import evaluate, paired_differences, stderr_progress
from scale_ray.relative import rel

#: what the JSON keeps of each episode
EPISODE_KEYS = ("policy", "servers", "episode", "mean_workflow_response_s",
                "p95_workflow_response_s", "p99_workflow_response_s", "mean_task_response_s",
                "arrived_tasks", "completed_workflows", "utilization")
METRICS = {"workflow": "mean_workflow_response_s", "workflow_p95": "p95_workflow_response_s",
           "workflow_p99": "p99_workflow_response_s"}
#: the paired differences of each row: (mode, reference) -> mode / reference - 1
PAIRS = (("program", "per_call"), ("program", "dag"), ("per_call", "program"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", nargs="+",
                   default=["configs/env/realistic.yaml", "configs/env/programs.yaml"],
                   help="env settings (each with its own workload)")
    p.add_argument("--servers", nargs="+", type=int, default=[16, 48], help="cluster sizes")
    p.add_argument("--loads", nargs="+", type=float, default=[0.6, 0.8],
                   help="offered loads (eval --load: lambda16 = RHO x C16 / mean GFLOP)")
    p.add_argument("--orders", nargs="+", default=["fifo", "las", "edf", "srpt"],
                   choices=ORDERS, help="ready-task orders (EFT placement)")
    p.add_argument("--policy", default="eft", help="the decider under every order and mode "
                   "(eft; lookahead: its rollouts hold only the calls that exist under program "
                   "and per_call, so static orders only)")
    p.add_argument("--episodes", type=int, default=30, help="paired episodes (seeds 0..E-1)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the evaluation set")
    p.add_argument("--workers", type=int, default=2, help="parallel workers (1: in process)")
    p.add_argument("--json", default=None, help="write rows, pairs and episodes here")


def _rel(pairs: list[dict], policy: str, n: int, metric: str) -> dict[str, Any]:
    r = next(x for x in pairs if x["policy"] == policy and x["servers"] == n
             and x["metric"] == metric)
    return {"mean_rel_diff": r["mean_rel_diff"], "ci95_half_width": r["ci95_half_width"],
            "better": r["better"], "worse": r["worse"]}


def measure(env, orders: list[str], servers: list[int], episodes: int, seed: int,
            workers: int, label: str, policy: str = "eft") -> tuple[list[dict], list[dict]]:
    """The rows of one setting at one load (module docstring) and its per-episode metrics."""
    specs = [f"{policy}@{o}+{m}" for o in orders for m in SUBMISSIONS]
    rows, eps = evaluate(env, specs, servers, episodes, base_seed=seed, workers=workers,
                         progress=stderr_progress(label))
    by = {(r["policy"], r["servers"]): r for r in rows}
    out = []
    for n in servers:
        for o in orders:
            row: dict[str, Any] = {"order": o, "servers": n}
            for m in SUBMISSIONS:
                r = by[(f"{policy}@{o}+{m}", n)]
                row[m] = {k: r[v] for k, v in METRICS.items()}
            for mode, ref in PAIRS:
                a, b = f"{policy}@{o}+{mode}", f"{policy}@{o}+{ref}"
                mine = [e for e in eps if e["policy"] in (a, b) and e["servers"] == n]
                for metric in ("workflow", "workflow_p99"):
                    pairs = paired_differences(mine, b, metric)
                    row[f"{mode}_vs_{ref}_{metric}"] = _rel(pairs, a, n, metric)
            out.append(row)
    return out, eps


def _pct(d: dict[str, Any]) -> str:
    return f"{rel(d['mean_rel_diff'], 2)} ± {100 * d['ci95_half_width']:.2f}"


def format_rows(rows: list[dict]) -> str:
    head = (f"{'setting':<12} {'load':>4} {'N':>4} {'order':<5} "
            f"{'dag mean/p95/p99':>19} {'program':>19} {'per_call':>19}  "
            f"{'program vs per_call: mean':>28} {'p99':>28}  {'program vs dag: mean':>28} "
            f"{'p99':>28}")
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = ["/".join(f"{r[m][k]:.2f}" for k in METRICS) for m in SUBMISSIONS]
        lines.append(
            f"{r['setting']:<12} {r['load']:>4g} {r['servers']:>4} {r['order']:<5} "
            f"{cells[0]:>19} {cells[1]:>19} {cells[2]:>19}  "
            f"{_pct(r['program_vs_per_call_workflow']):>28} "
            f"{_pct(r['program_vs_per_call_workflow_p99']):>28}  "
            f"{_pct(r['program_vs_dag_workflow']):>28} {_pct(r['program_vs_dag_workflow_p99']):>28}")
    lines += ["", "per call / program - 1 (what submitting call by call costs; the sign of "
              "issue 47's probe):", f"{'setting':<12} {'load':>4} {'N':>4} {'order':<5} "
              f"{'mean':>28} {'p99':>28}"]
    lines += [f"{r['setting']:<12} {r['load']:>4g} {r['servers']:>4} {r['order']:<5} "
              f"{_pct(r['per_call_vs_program_workflow']):>28} "
              f"{_pct(r['per_call_vs_program_workflow_p99']):>28}" for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.episodes < 2:
        raise ValueError("--episodes: at least 2 (paired intervals)")
    for load in args.loads:
        if not 0 < load <= 10:
            raise ValueError(f"--loads: {load} must be in (0, 10]")
    t0 = time.perf_counter()
    rows: list[dict] = []
    episodes: list[dict] = []
    for path in args.configs:
        base = load_env(path)
        setting = path.rsplit("/", 1)[-1].removesuffix(".yaml")
        wfs = sample_workflows(base.workload)
        for load in args.loads:
            rate = arrival_rate_for_load(base, load, wfs)
            env = replace(base, workload={"arrival_rate_16": rate})
            print(f"{setting}: load {load:g}, lambda16 = {rate:.4g} workflows/s", flush=True)
            got, eps = measure(env, args.orders, args.servers, args.episodes, args.seed,
                               args.workers, f"{setting} load {load:g}", args.policy)
            rows += [r | {"setting": setting, "load": load, "arrival_rate_16": rate} for r in got]
            episodes += [{k: e[k] for k in EPISODE_KEYS} | {"setting": setting, "load": load}
                         for e in eps]
    print(format_rows(rows))
    print(f"({len(episodes)} episodes, {time.perf_counter() - t0:.0f} s; workflow response in "
          f"model s; differences: mean over paired episodes of mode / reference - 1, 95 % "
          f"t-interval)")
    if args.json:
        fifo = {f"{r['setting']}@{r['load']:g}/N={r['servers']}":
                r["program_vs_per_call_workflow"]["mean_rel_diff"]
                for r in rows if r["order"] == "fifo"}
        with open(args.json, "w") as f:
            json.dump({"policy": args.policy, "rows": rows,
                       "fifo_program_vs_per_call_rel_diff": fifo,
                       "episodes": args.episodes, "seed": args.seed, "episodes_metrics": episodes},
                      f, indent=1)
        print(f"wrote {args.json}")
    return 0
