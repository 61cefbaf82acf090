"""`scale-ray bench runtime`: what uncertain run times cost, and what hints, the estimator and
hedging win back (envs/runtime.py, envs/estimator.py, envs/hedging.py; docs/simulator.md).

Every number is paired: the same episodes (same seeds: the same workflows, arrivals and noise
draws) under each setting, on mean / p95 / p99 workflow response.

* ``noise``: EFT (the env's order) at ``noise_sigma`` 0, 0.5, 1.0 and 0.5 with a Pareto tail,
  vs sigma 0.
* ``hints``: at sigma 0.5, each ``--policies`` entry with hints exact, kind, none and none plus
  the online estimator, vs the same policy with exact hints; and vs EFT under the same hints
  (does a policy's advantage over EFT survive?).
* ``hedge``: at sigma 1.0, EFT with every task hedgeable at each ``--quantiles`` q, vs no
  hedging; extra work = busy server-seconds / those without hedging - 1 (copies and cancelled
  runs included).
* ``families``: the same noise and hedging check on real DAG families (``--families``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from envs.config import EnvConfig
from scale_ray.config import load_env
from scale_ray.evaluation import evaluate, paired_differences, stderr_progress
from scale_ray.families import family_env
from scale_ray.relative import rel

PARTS = ("noise", "hints", "hedge", "families")
TAIL = ("runtime.noise_sigma=0.5", "runtime.tail=pareto")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--env-config", default="configs/env/realistic.yaml")
    p.add_argument("--servers", nargs="+", type=int, default=[16, 48])
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--policies", nargs="+", default=["eft", "eft@srpt", "lookahead", "scale"],
                   help="hints part: the policies compared (POLICY@ORDER allowed)")
    p.add_argument("--quantiles", nargs="+", type=float, default=[0.5, 0.75, 0.9, 0.95])
    p.add_argument("--families", nargs="+", default=["wfinstances-montage", "taskbench"],
                   help="families part: real DAG families (scale-ray eval --list-workloads)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="env override for every run, key=value (repeatable)")
    p.add_argument("--json", default=None, help="write every row and paired result here")


def _run(env_path: str, sets: list[str], policies: list[str], servers: list[int], label: str,
         args: argparse.Namespace, workload: str | None = None) -> tuple[list[dict], list[dict]]:
    env: EnvConfig = (load_env(env_path, list(args.overrides) + sets) if workload is None
                      else family_env(workload, list(args.overrides) + sets))
    rows, eps = evaluate(env, policies, servers, args.episodes, args.seed, args.workers,
                         progress=stderr_progress(label))
    for r in rows + eps:
        r["setting"] = label
        r["policy"] = f"{r['policy']}|{label}"
    return rows, eps


def _paired(eps: list[dict], ref: str) -> dict[tuple[str, int], dict[str, float]]:
    out: dict[tuple[str, int], dict[str, float]] = {}
    for metric in ("workflow", "workflow_p95", "workflow_p99"):
        for d in paired_differences(eps, ref, metric):
            out.setdefault((d["policy"], d["servers"]), {})[metric] = (d["mean_rel_diff"],
                                                                       d["ci95_half_width"])
    return out


def _fmt(p: tuple[float, float] | None) -> str:
    """A paired relative difference and its 95 % half width: ``-17.4 % lower ±1.9``."""
    return "" if p is None else f"{rel(p[0])} ±{100 * p[1]:.1f}"


def _table(title: str, rows: list[dict], eps: list[dict], ref_of: dict[str, str],
           extra: dict[str, str] | None = None) -> list[str]:
    lines = [title, f"{'setting':<34} {'N':>4} {'wf mean':>8} {'p95':>7} {'p99':>7}  "
                    f"{'mean vs ref':>20} {'p95 vs ref':>20} {'p99 vs ref':>20}  {'ref'}"]
    paired: dict[tuple[str, int], dict[str, Any]] = {}
    for ref in set(ref_of.values()):
        sel = [e for e in eps if ref_of.get(e["policy"]) == ref or e["policy"] == ref]
        paired.update(_paired(sel, ref))
    for r in rows:
        d = paired.get((r["policy"], r["servers"]), {})
        ref = ref_of.get(r["policy"], "")
        line = (f"{r['policy']:<34} {r['servers']:>4} {r['mean_workflow_response_s']:>8.3f} "
                f"{r['p95_workflow_response_s']:>7.2f} {r['p99_workflow_response_s']:>7.2f}  "
                f"{_fmt(d.get('workflow')):>20} {_fmt(d.get('workflow_p95')):>20} "
                f"{_fmt(d.get('workflow_p99')):>20}  {ref if ref != r['policy'] else '-'}")
        if extra and r["policy"] in extra:
            line += "  " + extra[r["policy"]]
        r["paired"] = {k: list(v) for k, v in d.items()}
        lines.append(line)
    return lines


def run(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"episodes": args.episodes, "seed": args.seed, "parts": {}}
    report: list[str] = []
    if "noise" in args.parts:
        settings = {"sigma0": [], "sigma0.5": ["runtime.noise_sigma=0.5"],
                    "sigma1.0": ["runtime.noise_sigma=1.0"], "sigma0.5+tail": list(TAIL)}
        rows, eps = [], []
        for label, sets in settings.items():
            r, e = _run(args.env_config, sets, ["eft"], args.servers, label, args)
            rows += r
            eps += e
        ref = {r["policy"]: "eft|sigma0" for r in rows}
        report += _table("noise: EFT, exact hints (paired vs sigma 0)", rows, eps, ref)
        out["parts"]["noise"] = rows
    if "hints" in args.parts:
        modes = {"exact": [], "kind": ["runtime.hints=kind"], "none": ["runtime.hints=none"],
                 "none+est": ["runtime.hints=none", "runtime.estimator=online"]}
        rows, eps = [], []
        for label, sets in modes.items():
            r, e = _run(args.env_config, ["runtime.noise_sigma=0.5", *sets], list(args.policies),
                        args.servers, label, args)
            rows += r
            eps += e
        ref = {r["policy"]: f"{r['policy'].split('|')[0]}|exact" for r in rows}
        report += [""] + _table("hints at sigma 0.5 (paired vs the same policy, exact hints)",
                                rows, eps, ref)
        ref_eft = {r["policy"]: f"eft|{r['setting']}" for r in rows}
        report += [""] + _table("hints at sigma 0.5 (paired vs EFT under the same hints)",
                                rows, eps, ref_eft)
        out["parts"]["hints"] = rows
    if "hedge" in args.parts:
        out["parts"]["hedge"] = _hedge(args, args.env_config, None, report)
    if "families" in args.parts:
        fam = []
        for name in args.families:
            fam += _hedge(args, args.env_config, name, report, quantiles=[0.9],
                          sigmas=(0.5, 1.0))
        out["parts"]["families"] = fam
    print("\n".join(report))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
    return 0


def _hedge(args: argparse.Namespace, env_path: str, workload: str | None, report: list[str],
           quantiles: list[float] | None = None, sigmas: tuple[float, ...] = (1.0,)) -> list[dict]:
    """EFT at each sigma without hedging and with every task hedgeable at each quantile."""
    servers = [args.servers[0]]
    rows, eps, ref, extra = [], [], {}, {}
    where = f"{workload} " if workload else ""
    for sigma in sigmas:
        base = f"{where}sigma{sigma:g}"
        r0, e0 = _run(env_path, [f"runtime.noise_sigma={sigma}"], ["eft"], servers, base, args,
                      workload)
        rows += r0
        eps += e0
        busy0 = {e["episode"]: e["busy_server_s"] for e in e0}
        for q in quantiles or args.quantiles:
            label = f"{base} hedge q={q:g}"
            r, e = _run(env_path, [f"runtime.noise_sigma={sigma}", "runtime.hedge=all",
                                   f"runtime.hedge_quantile={q}"], ["eft"], servers, label, args,
                        workload)
            rows += r
            eps += e
            ref[r[0]["policy"]] = r0[0]["policy"]
            extra_w = sum(x["busy_server_s"] for x in e) / sum(busy0.values()) - 1
            r[0]["extra_server_s_frac"] = extra_w
            extra[r[0]["policy"]] = (f"server-seconds {rel(extra_w)}, "
                                     f"{r[0]['hedge_copies']:.0f} copies/episode")
    title = f"hedging{' on ' + workload if workload else ''}: EFT, every task hedgeable " \
            f"(paired vs no hedging), N = {servers[0]}"
    report += [""] + _table(title, rows, eps, ref, extra)
    return [r for r in rows if not math.isnan(r["mean_workflow_response_s"])]
