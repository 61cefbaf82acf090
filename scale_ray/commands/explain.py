"""`scale-ray explain`: where a trace's workflow response time goes.

Each completed workflow's response (its last finish - its arrival) is split along its realised
critical path into run time on the best fitting tier, time lost to slower servers (by tier),
transfer, queue-while-ready (by tier), lost-run and other time; the parts sum to the response.
Prints the totals and the workflows that queued longest, with what the cluster was doing when
their longest-queued path task became ready; for a live trace of agent programs, each program's
response (start to last step's end) split the same way plus the agent's turn-around. See
``scale_ray.explain``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from scale_ray.explain import explain

LABELS = {"critical_path_fastest_s": "run on best tier", "slower_server_s": "slower server",
          "transfer_s": "transfer", "queue_ready_s": "queue while ready",
          "lost_run_s": "lost runs", "wait_parent_s": "other wait"}
SHORT = {"critical_path_fastest_s": "best-tier run", "slower_server_s": "slower server",
         "transfer_s": "transfer", "queue_ready_s": "queue", "lost_run_s": "lost",
         "wait_parent_s": "other"}
BY_TIER = {"slower_server_s": "slower_server_by_tier_s", "queue_ready_s": "queue_ready_by_tier_s"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="JSONL trace (scale-ray eval --trace-dir, run-workflows --trace)")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="show the K workflows that queued longest (default 5)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="write the per-workflow records and the totals to this JSON file")


def _wf(rec: dict[str, Any], multi: bool) -> str:
    name = f" ({rec['name']})" if rec.get("name") else ""
    return (f"episode {rec['episode']} workflow {rec['workflow']}" if multi
            else f"workflow {rec['workflow']}") + name


def format_report(rep: dict[str, Any]) -> str:
    """The plain-text report of :func:`scale_ray.explain.explain`'s result."""
    tot = rep["totals"]
    kind = "live" if tot["live"] else "simulator"
    eps = f"{tot['episodes']} episodes" if tot["episodes"] > 1 else "1 episode"
    lines = [f"{Path(rep['trace']).name}: {tot['workflows']} completed workflows of "
             f"{tot['arrived_workflows']} arrived ({kind} trace, {eps}, {tot['servers']} servers"
             + (" in all)" if tot["episodes"] > 1 else ")"),
             f"mean workflow response {tot['response_s']['mean']:.3f} s "
             f"(sum {tot['response_s']['sum']:.1f} s; its path's runs on the best tier "
             f"{tot['parts']['critical_path_fastest_s']['mean']:.3f} s), on its critical path:",
             f"  {'part':<26}{'mean s':>10}{'share':>9}"]
    for key, label in LABELS.items():
        s = tot["parts"][key]
        lines.append(f"  {label:<26}{s['mean']:>z10.3f}{s['share']:>z9.1%}")  # z: no "-0.000"
        if key in BY_TIER and len(tot[BY_TIER[key]]) > 1:
            for tier, st in tot[BY_TIER[key]].items():
                lines.append(f"    {'on ' + tier:<24}{st['mean']:>z10.3f}{st['share']:>z9.1%}")
    run = tot["critical_path_run_s"]
    lines.append(f"  (best tier + slower server = critical-path run {run['mean']:.3f} s, "
                 f"{run['share']:.1%}; parts sum to the response within "
                 f"{tot['max_sum_error_s']:.1e} s)")
    if tot["unbounded_runs"]:
        lines.append(f"  ({tot['unbounded_runs']} path runs lack task or tier compute: counted "
                     f"whole as run on best tier)")
    if rep.get("programs"):
        pt = tot["programs"]
        lines += ["", f"{pt['count']} agent programs (all steps completed): mean response "
                      f"{pt['response_s']['mean']:.3f} s, start to last step's end; on the chain "
                      f"of steps that ended each:",
                  f"  {'agent turn-around':<26}{pt['agent_s']['mean']:>z10.3f}"
                  f"{pt['agent_s']['share']:>z9.1%}"]
        for key, label in LABELS.items():
            lines.append(f"  {label:<26}{pt[key]['mean']:>z10.3f}{pt[key]['share']:>z9.1%}")
    if rep["top"]:
        multi = tot["episodes"] > 1
        lines += ["", f"The {len(rep['top'])} workflows that waited longest (queue while ready "
                      f"on the critical path):"]
        for rec in rep["top"]:
            parts = " + ".join(f"{SHORT[k]} {rec[k]:z.2f}" for k in SHORT
                               if rec[k] or k not in ("lost_run_s", "wait_parent_s"))
            lines.append(f"  {_wf(rec, multi)}: response {rec['response_s']:.2f} s = {parts}; "
                         f"{len(rec['path'])} runs on its path of {rec['tasks']} tasks")
            q = rec["longest_queue"]
            c = q.get("context", {})
            lines.append(f"    longest queue: task {q['task']} ready at {q['ready']:.2f} s, "
                         f"started {q['start']:.2f} s on server {q['server']} ({q['tier']}) "
                         f"after {q['queue_s']:.2f} s")
            if c:
                lines.append(f"    when it became ready: {c['busy_servers']}/{c['alive_servers']} "
                             f"servers busy, {c['ready_waiting']} ready tasks already waiting; "
                             f"{c['started_between']} other tasks started while it waited")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rep = explain(args.trace, args.top)
    print(format_report(rep))
    if args.json_out:
        out = Path(args.json_out)
        data = {k: rep[k] for k in ("trace", "totals", "workflows", "programs")}
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        except OSError as e:
            raise ValueError(f"{out}: cannot write ({e.strerror or e})") from None
        print(f"wrote {out} ({len(rep['workflows'])} workflows)")
    return 0
