"""``scale-ray bench live --setting programs`` (issue 47, item 3): agents that really submit call
by call, live, next to the simulator's twin.

Each request of configs/env/programs.yaml (ReAct loops, plans with re-plans, routers) is run by an
agent in the driver: it submits the calls that can run (their parents answered), each as its own
one-call workflow with its parents' answers as arguments, and submits the next ones when answers
come back (``WorkflowHandle.add_done_callback``). Two ways on the same requests and arrival
times, EFT placement, ``fifo``:

* ``per_call``: every call a new workflow (``LiveScheduler.submit``): it arrives when submitted;
* ``program``: the request's calls are steps of one agent program (``LiveScheduler.program``):
  they keep the request's arrival (scale_ray/live/programs.py).

A request's response is from its arrival to its last call's end (model s: wall / time_scale).
The twin replays the same arrivals in the simulator under ``mdp.submission: per_call`` and
``program`` (envs/programs.py). Transfers do not delay starts here (a call's parents ran in other
workflows, so the live scheduler does not know where its inputs are); the twin is set the same.
``--json`` has ``program_vs_per_call_rel_diff`` (live, mean workflow response, program /
per_call - 1, per run), the twin's, and ``max_twin_gap_points`` (the largest |live - twin| of
that difference, in points).
"""

from __future__ import annotations

import heapq
import json
import math
import queue
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from envs.config import EnvConfig, replace
from envs.workflow import WorkflowSpec
from policies import get_policy
from scale_ray.config import load_env
from scale_ray.live import LiveConfig, LiveScheduler, Primitive
from scale_ray.live.cluster import LocalHeteroCluster
from scale_ray.live.runner import arrival_times, rate_for_load, workload_specs
from scale_ray.live.workflow import emulated_body
from scale_ray.relative import rel

from .twin import predict

MODES = ("per_call", "program")
CONFIG = "configs/env/programs.yaml"


def programs_env(servers: int) -> EnvConfig:
    """programs.yaml at ``servers`` servers with the live scheduler's switches, EFT + fifo,
    starts not delayed by transfers (module docstring)."""
    env = load_env(CONFIG, ["mdp.transfer_delays_start=false"], servers=servers)
    return replace(env, mdp={"mask_infeasible": True, "ask_only_startable": True,
                             "head_of_line_blocking": False, "advance_to_next_event": True,
                             "order": "fifo", "submission": "dag"})  # live: each call a DAG


class _Agent:
    """One request run call by call."""

    def __init__(self, spec: WorkflowSpec, arrival_wall: float, program: Any):
        self.spec = spec
        self.arrival_wall = arrival_wall
        self.program = program
        self.kids = spec.children()
        self.pending = [len(t.parents) for t in spec.tasks]
        self.values: list[Any] = [None] * len(spec.tasks)
        self.left = len(spec.tasks)
        self.end_wall = 0.0


def _submit(sched: LiveScheduler, agent: _Agent, i: int, done: queue.SimpleQueue) -> None:
    t = agent.spec.tasks[i]
    prim = Primitive(emulated_body, t.compute_gflop, t.memory_gb, t.output_gb,
                     t.name or f"t{i}", emulate=True)
    call = prim.bind(i, *(agent.values[p] for p in t.parents))
    target = agent.program.submit if agent.program is not None else sched.submit
    h = target([call], name=f"{agent.spec.name}.{i}")
    h.add_done_callback(lambda h, a=agent, i=i: done.put((a, i, h)))


def run_live(env: EnvConfig, specs: Sequence[WorkflowSpec], times: Sequence[float],
             time_scale: float, mode: str, timeout_s: float = 900.0) -> list[float]:
    """Each request's response (model s), its agent submitting call by call (``mode``)."""
    done: queue.SimpleQueue = queue.SimpleQueue()
    agents: list[_Agent] = []
    with LiveScheduler(get_policy("eft", env), env, LiveConfig(time_scale=time_scale)) as sched:
        t0 = time.perf_counter()
        due = [(t0 + float(t) * time_scale, k) for k, t in enumerate(times)]
        heapq.heapify(due)
        left = len(specs)
        while left:
            now = time.perf_counter()
            if now - t0 > timeout_s:
                raise TimeoutError(f"bench live --setting programs: {left} requests unfinished "
                                   f"after {timeout_s:.0f} s ({mode})")
            while due and due[0][0] <= now:  # a request arrives: its agent submits the sources
                _, k = heapq.heappop(due)
                prog = sched.program(specs[k].name) if mode == "program" else None
                agent = _Agent(specs[k], t0 + float(times[k]) * time_scale, prog)
                agents.append(agent)
                for i, n in enumerate(agent.pending):
                    if n == 0:
                        _submit(sched, agent, i, done)
            wait = max(0.0, due[0][0] - time.perf_counter()) if due else 0.5
            try:
                agent, i, h = done.get(timeout=min(wait, 0.5))
            except queue.Empty:
                continue
            agent.values[i] = h.result(timeout=0)  # a failed call raises here
            agent.end_wall = max(agent.end_wall, h.finished_wall)
            agent.left -= 1
            for c in agent.kids[i]:  # the answer is in: the calls it unblocks
                agent.pending[c] -= 1
                if agent.pending[c] == 0:
                    _submit(sched, agent, c, done)
            if agent.left == 0:
                left -= 1
                if agent.program is not None:
                    agent.program.close()
    ts = time_scale if time_scale > 0 else 1.0
    return [(a.end_wall - a.arrival_wall) / ts for a in agents]


def _stats(resp: Sequence[float]) -> dict[str, float]:
    r = np.asarray(resp, dtype=float)
    return {"mean_workflow_response_s": float(r.mean()),
            "p95_workflow_response_s": float(np.percentile(r, 95)),
            "p99_workflow_response_s": float(np.percentile(r, 99))}


def run_programs(args: Any) -> int:
    """``bench live --setting programs`` (module docstring)."""
    ts = args.time_scale if args.time_scale is not None else 0.25
    env = programs_env(args.servers)
    runs: list[dict[str, Any]] = []
    cluster = LocalHeteroCluster(env.cluster, args.servers_per_node)
    t_start = time.perf_counter()
    try:
        cluster.start(progress=True)
        for k in range(args.runs):
            seed = args.seed + k
            specs = workload_specs(env, args.workflows, seed)
            rate = (rate_for_load(env, args.load, specs) if args.load is not None
                    else env.workload.arrival_rate_16 * env.cluster.servers / 16.0)
            times = arrival_times(rate, len(specs), seed)
            row: dict[str, Any] = {"seed": seed, "requests": len(specs),
                                   "calls": sum(len(s.tasks) for s in specs)}
            for mode in MODES:
                row[mode] = _stats(run_live(env, specs, times, ts, mode, args.timeout_s))
                twin = predict(replace(env, mdp={"submission": mode}), "eft", specs, times, seed)
                row[f"twin_{mode}"] = {k: twin[k] for k in row[mode]}
            m = "mean_workflow_response_s"
            row["program_vs_per_call_rel_diff"] = row["program"][m] / row["per_call"][m] - 1
            row["twin_program_vs_per_call_rel_diff"] = (row["twin_program"][m] /
                                                        row["twin_per_call"][m] - 1)
            row["twin_gap_points"] = 100 * (row["program_vs_per_call_rel_diff"]
                                            - row["twin_program_vs_per_call_rel_diff"])
            runs.append(row)
            print(format_run(row), flush=True)
    finally:
        cluster.shutdown()
    out = {"setting": "programs", "servers": env.cluster.servers, "time_scale": ts,
           "workflows": args.workflows, "runs": runs,
           "program_vs_per_call_rel_diff": [r["program_vs_per_call_rel_diff"] for r in runs],
           "twin_program_vs_per_call_rel_diff": [r["twin_program_vs_per_call_rel_diff"]
                                                 for r in runs],
           "max_twin_gap_points": max((abs(r["twin_gap_points"]) for r in runs),
                                      default=math.nan),
           "total_s": time.perf_counter() - t_start}
    print(f"program-aware vs per call, live: "
          f"{', '.join(rel(d) for d in out['program_vs_per_call_rel_diff'])}; twin: "
          f"{', '.join(rel(d) for d in out['twin_program_vs_per_call_rel_diff'])}; max twin gap "
          f"{out['max_twin_gap_points']:.1f} points ({out['total_s']:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def format_run(row: dict[str, Any]) -> str:
    lines = [f"seed {row['seed']}: {row['requests']} requests, {row['calls']} calls; workflow "
             f"response, model s (mean / p95 / p99), live and twin:"]
    for mode in MODES:
        live, twin = row[mode], row[f"twin_{mode}"]
        lines.append(f"  {mode:<9} live " + " / ".join(f"{v:.2f}" for v in live.values())
                     + "   twin " + " / ".join(f"{v:.2f}" for v in twin.values()))
    lines.append(f"  program vs per_call: live {rel(row['program_vs_per_call_rel_diff'])}, "
                 f"twin {rel(row['twin_program_vs_per_call_rel_diff'])} (gap "
                 f"{row['twin_gap_points']:+.1f} points)")
    return "\n".join(lines)
