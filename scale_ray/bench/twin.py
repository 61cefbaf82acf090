"""The simulator twin of a live run: the same arrivals (workflow specs and model times) replayed
in the simulator under each policy, its prediction printed next to the live number.

The live benches (``bench live``, ``bench service``) emulate work: a primitive of c GFLOP on a
server of C GFLOP/s sleeps ``c / C x time_scale`` wall seconds, plus (with the env's
``mdp.transfer_delays_start``, as realistic.yaml) its inputs' transfer time when a parent ran on
another server. The twin's env is the live setting's env with the live scheduler's switches
(masking, asking only when a task can start, no head-of-line blocking, a waiting task placed
again at the next event) and the same cluster; its responses are in model seconds, the live ones
are converted (wall / ``time_scale``).

Gains are relative to a reference policy (``eft@hop``: EFT under the paper's order) run on the
same arrivals: ``gain = 1 - response(policy) / response(reference)``, in the live run and in the
twin; the *twin gap* is their difference in percentage points. Ray's default placement has no
twin (the simulator does not model Ray's scheduler).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from envs.config import EnvConfig, replace
from envs.workflow import WorkflowSpec
from scale_ray.config import load_env
from scale_ray.evaluation import run_episode
from scale_ray.explain import explain, load_episodes
from scale_ray.relative import rel

#: settings of the live benches: (env file, overrides, default time scale, the policies measured)
SETTINGS = {
    "paper": (None, (), 0.1),
    # realistic tiers and load (configs/env/realistic.yaml: lambda16 = 1.14, transfers delay
    # starts, fifo, workflow objective); the live scheduler emulates the transfers too
    "realistic": ("configs/env/realistic.yaml", (), 0.25),
}
REFERENCE = "eft@hop"
NO_TWIN = frozenset({"ray-default"})
METRICS = ("mean_workflow_response_s", "p95_workflow_response_s", "p99_workflow_response_s")


def add_setting_arguments(p: Any, what: str) -> None:
    """``--setting``, ``--load`` and ``--time-scale`` of the live benches; ``what``: what the
    realistic setting measures there."""
    p.add_argument("--setting", choices=sorted(SETTINGS) + ["agents", "autoscale", "programs"],
                   default="paper",
                   help="paper: paper.yaml's workload at --load; realistic: configs/env/"
                        f"realistic.yaml's workload at its own arrival rate, {what}; agents: "
                        "configs/env/agents.yaml in Ray's resource model (bench live only: "
                        "node rules and Ray default, each next to its node-simulator twin); "
                        "programs: configs/env/programs.yaml's requests run by agents that "
                        "submit call by call, one by one vs as programs (bench live only); "
                        "autoscale: configs/env/autoscale.yaml on nodes that come and go, our "
                        "sizing vs Ray's autoscaler path (bench live only)")
    p.add_argument("--load", type=float, default=None,
                   help="offered compute load (default: 0.6 for paper; realistic: the env's "
                        "own arrival rate)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="wall s per model s of emulated work (default: 0.1 paper, 0.25 "
                        "realistic)")


def add_runtime_arguments(p: Any, where: str) -> None:
    """``--hints``, ``--noise``, ``--estimator`` and ``--hedge`` of the live benches."""
    p.add_argument("--hints", choices=["exact", "none"], default="exact",
                   help=f"{where}: what the scheduler is told of each task's compute (none: "
                        f"runtime.default_gflop for all; with --estimator online it learns)")
    p.add_argument("--noise", type=float, default=0.0, metavar="SIGMA",
                   help=f"{where}: emulated runs take compute x LogNormal(mean 1, SIGMA); a "
                        f"hedged copy draws its own factor (envs.runtime)")
    p.add_argument("--estimator", choices=["off", "online"], default="off",
                   help=f"{where}: live.estimator (and the twins' runtime.estimator)")
    p.add_argument("--hedge", choices=["off", "marked", "all"], default="off",
                   help=f"{where}: live.hedge (and the twins' runtime.hedge)")
    p.add_argument("--twin-overhead", type=float, default=0.0, metavar="S",
                   help="the twins' runs end S model s after their run time, unseen by their "
                        "deciders (runtime.overhead_s): what live adds per run (bench live "
                        "--trace-dir measures it and also prints a twin with it)")


def runtime_env(env: EnvConfig, args: Any, overhead: float | None = None) -> EnvConfig:
    """The env of the twins: the live runs' noise, hints, estimator and hedging, and the run
    overhead (``overhead``, else ``--twin-overhead``) (:func:`add_runtime_arguments`; absent:
    none)."""
    hints, noise = getattr(args, "hints", "exact"), getattr(args, "noise", 0.0)
    est, hedge = getattr(args, "estimator", "off"), getattr(args, "hedge", "off")
    if overhead is None:
        overhead = getattr(args, "twin_overhead", 0.0)
    if not 0 <= noise <= 3:
        raise ValueError(f"--noise: {noise} must be in [0, 3]")
    if not 0 <= overhead <= 10:
        raise ValueError(f"--twin-overhead: {overhead} must be in [0, 10] model s")
    if (hints, noise, est, hedge, overhead) == ("exact", 0.0, "off", "off", 0.0):
        return env
    return replace(env, runtime={"hints": hints, "noise_sigma": noise, "estimator": est,
                                 "hedge": hedge, "overhead_s": overhead})


def resolve_setting(args: Any) -> None:
    """Fill ``args.time_scale`` and ``args.load`` with the setting's defaults."""
    if args.time_scale is None:
        args.time_scale = SETTINGS[args.setting][2]
    if args.load is None and args.setting == "paper":
        args.load = 0.6


def setting_env(setting: str, servers: int) -> EnvConfig:
    """The env of a live bench setting at ``servers`` servers (a clear error for another
    name)."""
    if setting not in SETTINGS:
        raise ValueError(f"--setting: {setting!r} is not one of {sorted(SETTINGS)}")
    path, overrides, _ = SETTINGS[setting]
    env = load_env(path, list(overrides), servers=servers)
    # the live scheduler's own switches (scale_ray.live.placement); it places again at the next
    # completion or arrival, so a task that cannot start waits for the next event, not for
    # the paper's 0.1-s wait step (which idled freed servers: twin EFT + hop 17.45 s vs
    # 15.14 s on seed 2's stream, results/live_twin/README.md)
    return replace(env, mdp={"mask_infeasible": True, "ask_only_startable": True,
                             "head_of_line_blocking": False, "advance_to_next_event": True})


def predict(env: EnvConfig, policy: str, specs: Sequence[WorkflowSpec],
            times_model: Sequence[float], seed: int = 0, trace_path: str | None = None
            ) -> dict[str, Any]:
    """The simulator's metrics for ``policy`` on exactly these arrivals (``trace_path``: its
    JSONL trace, for ``scale-ray explain`` next to the live one)."""
    arrivals = [(float(t), s) for t, s in zip(times_model, specs)]
    return run_episode(env, policy, 0, seed, trace_path, arrivals=arrivals)


def live_model(stats: dict[str, Any], time_scale: float) -> dict[str, float]:
    """A live summary's workflow response statistics in model seconds."""
    ts = time_scale if time_scale > 0 else 1.0
    return {k: stats.get(k, math.nan) / ts for k in METRICS}


def compare(live: dict[str, dict[str, float]], twin: dict[str, dict[str, Any]],
            reference: str = REFERENCE) -> list[dict[str, Any]]:
    """One row per policy: live and twin mean/p95/p99 (model s), each one's relative difference
    to ``reference`` (value / reference - 1) and the gap in points (live - twin)."""
    rows = []
    ref_live = live.get(reference, {}).get("mean_workflow_response_s", math.nan)
    ref_twin = twin.get(reference, {}).get("mean_workflow_response_s", math.nan)
    for p, lv in live.items():
        tw = twin.get(p)
        row: dict[str, Any] = {"policy": p, **{f"live_{k}": lv[k] for k in METRICS}}
        row["live_rel_diff_vs_ref"] = lv["mean_workflow_response_s"] / ref_live - 1.0
        if tw is not None:
            row.update({f"twin_{k}": tw[k] for k in METRICS})
            row["twin_rel_diff_vs_ref"] = tw["mean_workflow_response_s"] / ref_twin - 1.0
            row["twin_gap_points"] = 100.0 * (row["live_rel_diff_vs_ref"]
                                              - row["twin_rel_diff_vs_ref"])
            row["twin_error"] = lv["mean_workflow_response_s"] / tw["mean_workflow_response_s"] - 1
        rows.append(row)
    return rows


def headline(rows: list[dict[str, Any]], default: str, policy: str) -> dict[str, float]:
    """The --json top-level keys: ``rel_diff_vs_hop`` (``default``, EFT under the default
    order, vs EFT + hop; live mean workflow response, value / reference - 1),
    ``rel_diff_vs_ray_default`` (``policy`` vs Ray's default) and ``max_twin_gap_points`` (over
    every policy with a twin)."""
    by = {r["policy"]: r for r in rows}
    ray = by.get("ray-default", {}).get("live_mean_workflow_response_s", math.nan)
    return {
        "rel_diff_vs_hop": by[default]["live_rel_diff_vs_ref"] if default in by else math.nan,
        "rel_diff_vs_ray_default": (by[policy]["live_mean_workflow_response_s"] / ray - 1.0
                                    if policy in by else math.nan),
        "max_twin_gap_points": max_gap(rows),
    }


def max_gap(rows: list[dict[str, Any]]) -> float:
    """The largest |live - twin| relative difference, in points, over the policies with a
    twin."""
    gaps = [abs(r["twin_gap_points"]) for r in rows if "twin_gap_points" in r
            and r["policy"] != REFERENCE]
    return max(gaps) if gaps else math.nan


def calibrated(env: EnvConfig, args: Any, live: dict[str, dict[str, float]],
               specs: Sequence[WorkflowSpec], times_model: Sequence[float], seed: int,
               why_by_policy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The twin again, each policy's with the run overhead its live run measured
    (``run_overhead_s``: dispatch, the actor call, the completion seen; more for a policy whose
    planning keeps the scheduler thread busy) as ``runtime.overhead_s``: every run ends that
    much later, unseen by the deciders. How much of the gap the overhead explains; a
    360-workflow stream is chaotic at this scale (gains move by points for 0.01 s per run)."""
    overhead = {p: max(0.0, w["run_overhead_s"]) for p, w in why_by_policy.items()
                if math.isfinite(w.get("run_overhead_s", math.nan))}
    twin = {p: predict(runtime_env(env, args, overhead=overhead.get(p, 0.0)), p, specs,
                       times_model, seed) for p in live if p not in NO_TWIN}
    rows = compare(live, twin)
    return {"overhead_s": overhead, "rows": rows, "max_twin_gap_points": max_gap(rows)}


def format_calibrated(c: dict[str, Any]) -> str:
    ov = ", ".join(f"{p} {v:.4f}" for p, v in c["overhead_s"].items())
    parts = [f"{r['policy']} {rel(r['twin_rel_diff_vs_ref'])} (gap {r['twin_gap_points']:+.1f})"
             for r in c["rows"] if "twin_gap_points" in r and r["policy"] != REFERENCE]
    return (f"twin with each policy's measured run overhead ({ov} model s per run), mean vs "
            f"{REFERENCE}: " + ", ".join(parts)
            + f"; max gap {c['max_twin_gap_points']:.1f} points")


def format_rows(rows: list[dict[str, Any]], reference: str = REFERENCE) -> str:
    head = (f"{'policy':<22}{'live mean':>10}{'twin':>8}{'live p95':>10}{'twin':>8}"
            f"{'live p99':>10}{'twin':>8}{'live vs ref':>16}{'twin vs ref':>16}{'gap pts':>9}")
    lines = [f"workflow response, model s; mean vs {reference} (live and its twin):", head]
    for r in rows:
        def g(k: str, fmt: str = "{:.2f}") -> str:
            v = r.get(k)
            return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)
        lines.append(
            f"{r['policy']:<22}{g('live_mean_workflow_response_s'):>10}"
            f"{g('twin_mean_workflow_response_s'):>8}{g('live_p95_workflow_response_s'):>10}"
            f"{g('twin_p95_workflow_response_s'):>8}{g('live_p99_workflow_response_s'):>10}"
            f"{g('twin_p99_workflow_response_s'):>8}"
            f"{rel(r.get('live_rel_diff_vs_ref', math.nan)):>16}"
            f"{rel(r.get('twin_rel_diff_vs_ref', math.nan)):>16}"
            f"{g('twin_gap_points', '{:+.1f}'):>9}")
    return "\n".join(lines)


def run_overhead(trace_path: str) -> dict[str, float]:
    """Per finished run of a live trace: its duration minus its nominal one (GFLOP / the
    server's GFLOP/s + its transfer), model s: what dispatch, the actor call and the result's
    return add to every run. ``runs``: how many runs had the numbers."""
    extra = []
    for ep in load_episodes(trace_path):
        for r in ep.runs:
            spec = ep.server_specs.get(r.server)
            if r.outcome != "done" or r.task not in ep.need or spec is None:
                continue
            extra.append((r.end - r.start) - (ep.need[r.task][0] / spec[0] + r.transfer_s))
    return {"runs": len(extra),
            "mean_extra_s": float(sum(extra) / len(extra)) if extra else math.nan}


def why(live_trace: str, twin_trace: str, live_stats: dict[str, Any],
        time_scale: float) -> dict[str, Any]:
    """Where a policy's live response departs from its twin, measured apart: the difference of
    each ``scale-ray explain`` part (live - twin, mean per workflow, model s), the run overhead
    per task (:func:`run_overhead`), and the scheduler thread's CPU per decision (planning and
    bookkeeping; model s)."""
    lv, tw = explain(live_trace, top=0)["totals"], explain(twin_trace, top=0)["totals"]
    ts = time_scale if time_scale > 0 else 1.0
    decisions = max(1, int(live_stats.get("decisions", 0)))
    return {
        "response_gap_s": lv["response_s"]["mean"] - tw["response_s"]["mean"],
        "parts_gap_s": {p: lv["parts"][p]["mean"] - tw["parts"][p]["mean"] for p in lv["parts"]},
        "run_overhead_s": run_overhead(live_trace)["mean_extra_s"],
        "cpu_per_decision_s": live_stats.get("thread_cpu_s", math.nan) / decisions / ts,
        "cpu_per_decision_wall_ms": 1e3 * live_stats.get("thread_cpu_s", math.nan) / decisions,
    }


def format_why(by_policy: dict[str, dict[str, Any]]) -> str:
    lines = ["why live departs from the twin (mean per workflow, model s; live - twin):"]
    for p, w in by_policy.items():
        g = w["parts_gap_s"]
        lines.append(
            f"  {p:<20} {w['response_gap_s']:+.3f} = queue {g['queue_ready_s']:+.3f}, slower "
            f"server {g['slower_server_s']:+.3f}, best-tier run {g['critical_path_fastest_s']:+.3f}"
            f", transfer {g['transfer_s']:+.3f}, lost {g['lost_run_s'] + g['wait_parent_s']:+.3f};"
            f" run overhead {w['run_overhead_s']:+.3f} per task; scheduler CPU "
            f"{w['cpu_per_decision_wall_ms']:.1f} ms wall ({w['cpu_per_decision_s']:.4f} model "
            f"s) per decision")
    return "\n".join(lines)
