"""`scale-ray gantt`: draw an episode trace (simulator or live scheduler) as a Gantt chart.

One row per server, grouped and label-coloured by tier; bars coloured by workflow; lost runs
hatched with a red edge ending at the loss; the wait from a task's (derived) ready time to its
start as a thin line under the bar. See ``scale_ray.gantt`` for what is read and what is derived.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scale_ray.gantt import draw_gantt, load_schedule


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="JSONL trace (scale-ray eval --trace-dir, run-workflows --trace)")
    p.add_argument("--out", default=None, help="PNG to write (default: TRACE with .png)")
    p.add_argument("--from", dest="t_from", type=float, default=None, metavar="T",
                   help="window start in trace seconds (default 0)")
    p.add_argument("--to", dest="t_to", type=float, default=None, metavar="T",
                   help="window end in trace seconds (default: end of the trace)")
    p.add_argument("--servers", type=int, default=None, metavar="K",
                   help="at most K rows: the K servers busiest in the window (then shown in tier "
                        "and id order); default all")
    p.add_argument("--title", default=None, help="chart title (default: the trace file name)")


def run(args: argparse.Namespace) -> int:
    if args.servers is not None and args.servers < 1:
        raise ValueError(f"--servers: {args.servers} must be >= 1")
    out = Path(args.out) if args.out else Path(args.trace).with_suffix(".png")
    sch = load_schedule(args.trace)
    s = draw_gantt(sch, out, args.t_from, args.t_to, args.servers, args.title)
    print(f"{s['out']}: {s['rows']} of {s['servers_total']} servers, {s['tasks']} tasks "
          f"({s['bars']} runs, {s['workflows']} workflows), span {s['from']:.1f}-{s['to']:.1f} s, "
          f"{s['lost']} lost runs, "
          + (f"{s['waits']} waits (derived)" if s["wait_info"] else "no wait information"))
    return 0
