"""Where a trace's workflow response time goes: its realised critical path, split into parts.

Reads any episode trace (``envs/trace.py`` JSONL: ``scale-ray eval --trace-dir``, or the live
scheduler's ``run-workflows --trace``). A file may hold several episodes (one per ``episode``
header, e.g. a Simulator reset several times with one writer); workflows are keyed by
``(episode, workflow)``.

**Runs and ready times** (as :mod:`scale_ray.gantt` derives them): a run is a ``start`` closed by
``finish``, ``lost`` or nothing. A run's *ready* time is the latest of its *gates*: the
workflow's ``arrival``; each parent's latest ``finish`` before the start; the task's own latest
``lost`` run; the task's latest ``output_lost`` (live: its result died with its node). The gate
with the latest time (ties: parent, own loss, output loss, arrival) is the run's *predecessor*:
the parent's finishing run, the lost run, the task's previous (finished, now wasted) run, or none.

**The path** of a completed workflow (every task finished): start at the run whose ``finish`` is
the workflow's last, and follow predecessors back until the gate is the arrival. Consecutive path
runs touch (a run's ready time is its predecessor's end; for an output loss, the loss time), so
``response = finish - arrival`` is the sum over path runs of ``(start - ready) + (end - start)``
plus the output-loss gaps, and the parts below sum to it exactly (to float rounding):

* ``critical_path_fastest_s``: what the path's finished runs would take on the best server:
  each task's ``compute_gflop`` over the compute of the fastest tier whose ``memory_gb`` fits the
  task's (else the fastest tier), the rule of the simulator's critical-path lower bound (so the
  sum over a path is at most that bound). Tiers: the ``episode`` header's ``tiers`` (simulator
  and live traces both list ``{name, compute, memory_gb}``), else the ``server_add`` events'
  compute and memory. A run whose task or tiers lack these numbers counts here whole
  (``end - start - transfer``) and adds 0 below; ``totals.unbounded_runs`` counts such runs,
* ``slower_server_s``: the rest of those runs' ``end - start - transfer``: time lost to running on
  a slower server than the best fitting tier (0 on it; negative only by float rounding); by the
  tier of the server the run went to (``slower_server_by_tier_s``). In live traces it also holds
  a run's overhead beyond its model duration (dispatch, sleeping), so it is > 0 on the best tier
  too. ``critical_path_run_s`` (kept in every record and the totals, not a part) is the sum of
  these two,
* ``transfer_s``: their ``transfer_s`` (simulator with ``transfer_delays_start``; else 0). In the
  trace a transfer occupies the server after ``start``, so it is part of ``end - start``,
* ``queue_ready_s``: ``start - ready`` of every path run: ready but not yet started; by the tier
  of the server that run went to (``queue_ready_by_tier_s``),
* ``lost_run_s``: ``end - start`` of path runs whose work was thrown away: lost runs, and finished
  runs whose output was lost before the workflow used it (live),
* ``wait_parent_s``: the rest: from a wasted run's finish to the loss of its output. 0 in
  simulator traces.

Cluster context of a path run's queueing (``context``): servers busy and alive at its ready
time, tasks already ready and waiting then, tasks started after it became ready and before it.

**Agent programs** (a live trace whose ``arrival`` events name a ``program`` and its
``program_start``: steps of ``LiveScheduler.program``): a program whose steps all completed
responds from its start to its last step's end. That is split along its *chain*: the step that
ended last, the step that ended last before that one arrived, and so on back; the chain's steps'
parts above, plus ``agent_s``: from each chain step's end to the next one's arrival and from
the start to the first's (the agent reading an answer and submitting its next step; a held
step's wait for its parent). Parts and ``agent_s`` sum to the response.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scale_ray.gantt import OUTCOME, UNKNOWN_TIER, Run, as_int, as_num, end_run, start_run

PARTS = ("critical_path_fastest_s", "slower_server_s", "transfer_s", "queue_ready_s", "lost_run_s",
         "wait_parent_s")
_PRIO = {"arrival": 0, "output_lost": 1, "lost": 2, "parent": 3}


@dataclass
class PathRun(Run):
    """A :class:`scale_ray.gantt.Run` with the gate that made it ready and that gate's run."""
    seq: int = 0  # line of its latest event: its start, then its finish (orders tied gates)
    gate: str = "arrival"  # "arrival" | "parent" | "lost" | "output_lost"
    pred: PathRun | None = None


@dataclass
class Episode:
    index: int
    tiers: list[str] = field(default_factory=list)
    server_tier: dict[int, str] = field(default_factory=dict)
    server_span: dict[int, list[float]] = field(default_factory=dict)  # [added, gone]
    workflows: dict[int, dict[str, Any]] = field(default_factory=dict)
    runs: list[PathRun] = field(default_factory=list)
    live: bool = False
    truncated: bool = False
    t_end: float = 0.0
    tier_specs: list[tuple[float, float]] = field(default_factory=list)  # header (compute, memory)
    server_specs: dict[int, tuple[float, float]] = field(default_factory=dict)
    need: dict[int, tuple[float, float]] = field(default_factory=dict)  # task -> (gflop, memory)

    def best_speed(self, task: int) -> float | None:
        """Compute of the fastest tier whose memory fits ``task`` (else the fastest tier), as the
        simulator's lower bound; None where the task's or the tiers' numbers are missing."""
        specs = sorted(self.tier_specs or self.server_specs.values(), key=lambda x: -x[0])
        if task not in self.need or not specs:
            return None
        return next((c for c, m in specs if m >= self.need[task][1]), specs[0][0])


def _spec(d: dict[str, Any], compute: str) -> tuple[float, float] | None:
    """``(d[compute], d["memory_gb"])`` where the first is a number > 0 (memory: 0 if missing)."""
    c = as_num(d, compute)
    return (c, as_num(d, "memory_gb") or 0.0) if c is not None and c > 0 else None


def read_events(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, event)`` of a JSONL trace; ValueError starting with the path (and the line)
    for a missing, unreadable or non-text file, or a line that is not a timed trace event."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text (UTF-8) file, so not a JSONL trace") from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not a trace: line {i} is not valid JSON "
                             f"({e.msg})") from None
        if not isinstance(ev, dict) or not isinstance(ev.get("event"), str):
            raise ValueError(f"{path}:{i}: not a trace: line {i} is not a trace event "
                             f"(a JSON object with an 'event' name)")
        if as_num(ev, "t") is None:
            raise ValueError(f"{path}:{i}: {ev['event']} event without a numeric time 't'")
        out.append((i, ev))
    if not out:
        raise ValueError(f"{path}: no events (empty file), not a trace")
    return out


class _EpisodeReader:
    """One episode of a trace, event by event (:func:`load_episodes`): its runs and their gates."""

    def __init__(self, index: int, path: str | Path):
        self.ep, self.path = Episode(index), path
        self.parents: dict[int, list[int]] = {}
        self.task_wf: dict[int, int] = {}
        self.last_done: dict[int, PathRun] = {}  # task -> its latest finished run
        self.requeue: dict[int, tuple[float, str, int, PathRun | None]] = {}  # lost/output_lost
        self.running: dict[tuple[int, int], PathRun] = {}  # (task, server): hedged: two runs

    def header(self, ev: dict) -> None:
        ep = self.ep
        ep.tiers = [str(x["name"]) for x in ev.get("tiers") or []
                    if isinstance(x, dict) and x.get("name") is not None]
        ep.live = "time_scale" in ev
        ep.tier_specs = [x for x in (_spec(x, "compute") for x in ev.get("tiers") or []
                                     if isinstance(x, dict)) if x is not None]

    def event(self, i: int, ev: dict, kind: str, t: float) -> None:
        ep = self.ep
        ep.t_end = max(ep.t_end, t)
        if kind == "server_add" and as_int(ev, "server") is not None:
            ep.server_tier[ev["server"]] = str(ev.get("tier") or UNKNOWN_TIER)
            ep.server_span[ev["server"]] = [t, math.inf]
            if (spec := _spec(ev, "compute")) is not None:
                ep.server_specs[ev["server"]] = spec
        elif kind in ("server_remove", "server_fail") and ev.get("server") in ep.server_span:
            ep.server_span[ev["server"]][1] = t
        elif kind == "arrival" and as_int(ev, "workflow") is not None:
            self.arrival(ev, t)
        elif kind == "start":
            self.start(i, ev, t)
        elif kind in OUTCOME and "task" in ev:  # (a live trace's workflow cancel has none)
            run = end_run(self.running, ev, f"{self.path}:{i}")
            run.end, run.outcome = t, OUTCOME[kind]
            if kind == "finish":
                run.seq, self.last_done[run.task] = i, run  # seq: the line that made it a gate
            elif kind == "lost":
                self.requeue[run.task] = (t, "lost", i, run)
        elif kind == "output_lost" and as_int(ev, "task") is not None:
            self.requeue[ev["task"]] = (t, "output_lost", i, self.last_done.get(ev["task"]))
        elif kind == "end":
            ep.truncated = bool(ev.get("truncated"))

    def arrival(self, ev: dict, t: float) -> None:
        ep = self.ep
        tids = [tk["task"] for tk in ev.get("tasks") or []
                if isinstance(tk, dict) and as_int(tk, "task") is not None]
        ep.workflows[ev["workflow"]] = {"arrival": t, "tasks": tids, "name": ev.get("name"),
                                        "program": as_int(ev, "program"),
                                        "program_start": as_num(ev, "program_start")}
        for tk in ev.get("tasks") or []:
            if isinstance(tk, dict) and as_int(tk, "task") is not None:
                self.parents[tk["task"]] = [p for p in tk.get("parents") or []
                                            if isinstance(p, int)]
                self.task_wf[tk["task"]] = ev["workflow"]
                if (need := _spec(tk, "compute_gflop")) is not None:
                    ep.need[tk["task"]] = need

    def start(self, i: int, ev: dict, t: float) -> None:
        ep = self.ep
        tid, sid = as_int(ev, "task"), as_int(ev, "server")
        if tid is None or sid is None:
            raise ValueError(f"{self.path}:{i}: start event without integer 'task' and 'server'")
        start_run(self.running, ev, tid, sid, f"{self.path}:{i}")
        ep.server_tier.setdefault(sid, UNKNOWN_TIER)
        run = PathRun(tid, sid, t, transfer_s=as_num(ev, "transfer_s") or 0.0,
                      workflow=self.task_wf.get(tid), seq=i)
        if run.workflow is not None:  # gates: (time, priority, line, kind, run)
            gates = [(ep.workflows[run.workflow]["arrival"], 0, 0, "arrival", None)]
            gates += [(p.end, 3, p.seq, "parent", p) for p in
                      (self.last_done.get(q) for q in self.parents.get(tid, [])) if p is not None]
            if tid in self.requeue:
                rt, rk, rline, rrun = self.requeue[tid]
                gates.append((rt, _PRIO[rk], rline, rk, rrun))
            best = max(gates, key=lambda g: g[:3])
            run.ready, run.gate, run.pred = best[0], best[3], best[4]
        self.running[(tid, sid)] = run
        ep.runs.append(run)


def load_episodes(path: str | Path) -> list[Episode]:
    """Episodes of the trace at ``path`` with every run and its gate (see the module doc)."""
    eps: list[Episode] = []
    reader = _EpisodeReader(0, path)
    for i, ev in read_events(path):
        kind, t = ev["event"], float(ev["t"])
        if kind == "episode":
            ep = reader.ep
            if ep.runs or ep.workflows or ep.server_tier:
                eps.append(ep)
                reader = _EpisodeReader(len(eps), path)
            reader.header(ev)
        reader.event(i, ev, kind, t)
    eps.append(reader.ep)
    return eps


def _tier(ep: Episode, run: Run) -> str:
    return ep.server_tier.get(run.server, UNKNOWN_TIER)


def explain_workflow(ep: Episode, wid: int,
                     done: dict[int, list[PathRun]]) -> dict[str, Any] | None:
    """The record of workflow ``wid`` (None unless every task finished); ``done``: finished runs
    by task."""
    wf = ep.workflows[wid]
    if not wf["tasks"] or any(tid not in done for tid in wf["tasks"]):
        return None
    last = max((r for tid in wf["tasks"] for r in done[tid]), key=lambda r: (r.end, r.seq))
    arrival = wf["arrival"]
    rec: dict[str, Any] = {"episode": ep.index, "workflow": wid, "name": wf["name"],
                           "tasks": len(wf["tasks"]), "arrival": arrival, "finish": last.end,
                           "response_s": last.end - arrival, **{p: 0.0 for p in PARTS},
                           "critical_path_run_s": 0.0, "unbounded_runs": 0,
                           "queue_ready_by_tier_s": {}, "slower_server_by_tier_s": {}}
    path: list[dict[str, Any]] = []
    run: PathRun | None = last
    wasted = False
    while run is not None:
        dur, queue = run.end - run.start, run.start - run.ready
        tier, fastest = _tier(ep, run), None
        if run.outcome == "lost" or wasted:
            rec["lost_run_s"] += dur
        else:
            net, speed = dur - run.transfer_s, ep.best_speed(run.task)
            fastest = net if speed is None else ep.need[run.task][0] / speed
            rec["unbounded_runs"] += int(speed is None)
            rec["critical_path_run_s"] += net
            rec["critical_path_fastest_s"] += fastest
            rec["slower_server_s"] += net - fastest
            slow = rec["slower_server_by_tier_s"]
            slow[tier] = slow.get(tier, 0.0) + (net - fastest)
            rec["transfer_s"] += run.transfer_s
        rec["queue_ready_s"] += queue
        by_tier = rec["queue_ready_by_tier_s"]
        by_tier[tier] = by_tier.get(tier, 0.0) + queue
        path.append({"task": run.task, "server": run.server, "tier": tier, "ready": run.ready,
                     "fastest_s": fastest,
                     "start": run.start, "end": run.end, "transfer_s": run.transfer_s,
                     "queue_s": queue, "outcome": "wasted" if wasted else run.outcome,
                     "gate": run.gate, "gate_task": run.pred.task if run.pred else None})
        wasted = run.gate == "output_lost"
        if wasted and run.pred is not None:
            rec["wait_parent_s"] += run.ready - run.pred.end
        elif run.gate not in ("parent", "lost"):  # arrival, or an output loss with no run known
            rec["wait_parent_s"] += run.ready - arrival
        run = run.pred
    rec["path"] = path[::-1]
    rec["longest_queue"] = max(rec["path"], key=lambda s: s["queue_s"])
    return rec


def le(a: np.ndarray, x: float) -> int:
    """How many of the sorted ``a`` are <= x."""
    return int(np.searchsorted(a, x, "right"))


def lt(a: np.ndarray, x: float) -> int:
    """How many of the sorted ``a`` are < x."""
    return int(np.searchsorted(a, x, "left"))


class _Cluster:
    """Counts at a time ``t`` over one episode's runs and servers (sorted arrays)."""

    def __init__(self, ep: Episode):
        self.starts = np.sort([r.start for r in ep.runs])
        self.ends = np.sort([r.end for r in ep.runs if r.end is not None])
        timed = [r for r in ep.runs if r.ready is not None]
        self.ready = np.sort([r.ready for r in timed])
        self.timed_starts = np.sort([r.start for r in timed])
        self.added = np.sort([a for a, _ in ep.server_span.values()])
        self.gone = np.sort([g for _, g in ep.server_span.values()])

    def context(self, step: dict[str, Any]) -> dict[str, int]:
        t, s = step["ready"], step["start"]
        waiting = le(self.ready, t) - le(self.timed_starts, t) - (1 if s > t else 0)
        return {"busy_servers": le(self.starts, t) - le(self.ends, t),
                "alive_servers": le(self.added, t) - le(self.gone, t),
                "ready_waiting": waiting,
                "started_between": lt(self.starts, s) - lt(self.starts, t)}


def _stats(values: list[float], total: float) -> dict[str, float]:
    s = math.fsum(values)
    return {"sum": s, "mean": s / len(values), "share": s / total if total > 0 else 0.0}


def explain(path: str | Path, top: int = 5) -> dict[str, Any]:
    """Per-workflow records, totals and the ``top`` workflows by ``queue_ready_s``."""
    if top < 0:
        raise ValueError(f"--top: {top} must be >= 0")
    eps = load_episodes(path)
    records: list[dict[str, Any]] = []
    tiers: list[str] = []
    for ep in eps:
        done: dict[int, list[PathRun]] = {}
        for r in ep.runs:
            if r.outcome == "done":
                done.setdefault(r.task, []).append(r)
        cluster = _Cluster(ep)
        tiers += [x for x in ep.tiers + list(ep.server_tier.values()) if x not in tiers]
        for wid in ep.workflows:
            rec = explain_workflow(ep, wid, done)
            if rec is not None:
                rec["longest_queue"]["context"] = cluster.context(rec["longest_queue"])
                records.append(rec)
    arrived = sum(len(ep.workflows) for ep in eps)
    if not arrived:
        raise ValueError(f"{path}: no 'arrival' events, so no workflow to explain "
                         f"(is this an episode trace?)")
    if not records:
        cut = " (the episode was truncated)" if any(ep.truncated for ep in eps) else ""
        raise ValueError(f"{path}: no completed workflow: {arrived} arrived, none finished all "
                         f"its tasks{cut}")
    resp = [r["response_s"] for r in records]
    total = math.fsum(resp)

    def by_tier(key: str) -> dict[str, dict[str, float]]:
        used = [x for x in tiers if any(x in r[key] for r in records)]
        return {x: _stats([r[key].get(x, 0.0) for r in records], total) for x in used}

    totals = {"workflows": len(records), "arrived_workflows": arrived, "episodes": len(eps),
              "live": any(ep.live for ep in eps),
              "servers": sum(len(ep.server_tier) for ep in eps),
              "response_s": _stats(resp, total),
              "parts": {p: _stats([r[p] for r in records], total) for p in PARTS},
              "critical_path_run_s": _stats([r["critical_path_run_s"] for r in records], total),
              "queue_ready_by_tier_s": by_tier("queue_ready_by_tier_s"),
              "slower_server_by_tier_s": by_tier("slower_server_by_tier_s"),
              "unbounded_runs": sum(r["unbounded_runs"] for r in records),
              "max_sum_error_s": max(abs(math.fsum(r[p] for p in PARTS) - r["response_s"])
                                     for r in records)}
    ranked = sorted(records, key=lambda r: (-r["queue_ready_s"], -r["response_s"],
                                            r["episode"], r["workflow"]))
    programs = program_records(eps, records)
    if programs:
        p_total = math.fsum(r["response_s"] for r in programs)
        totals["programs"] = {"count": len(programs), **{k: _stats(
            [r[k] for r in programs], p_total) for k in ("response_s", "agent_s", *PARTS)}}
    return {"trace": str(path), "totals": totals, "top": ranked[:top], "workflows": records,
            "programs": programs}


def program_records(eps: list[Episode], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per agent program whose arrived steps all completed (module docstring)."""
    done = {(r["episode"], r["workflow"]): r for r in records}
    steps: dict[tuple[int, int], list[tuple[dict, dict | None]]] = {}
    for ep in eps:
        for wid, wf in ep.workflows.items():
            if wf.get("program") is not None and wf.get("program_start") is not None:
                steps.setdefault((ep.index, wf["program"]), []).append(
                    (wf, done.get((ep.index, wid))))
    out = []
    for (epi, pid), got in sorted(steps.items()):
        if any(r is None for _, r in got):
            continue
        recs = [r for _, r in got]
        start = min(wf["program_start"] for wf, _ in got)
        cur = max(recs, key=lambda r: (r["finish"], r["workflow"]))
        chain, agent = [cur], 0.0
        while True:
            before = [r for r in recs if r["finish"] <= cur["arrival"]]
            if not before:
                agent += cur["arrival"] - start
                break
            prev = max(before, key=lambda r: (r["finish"], r["workflow"]))
            agent += cur["arrival"] - prev["finish"]
            chain.append(prev)
            cur = prev
        out.append({"episode": epi, "program": pid, "steps": len(recs),
                    "chain": [r["workflow"] for r in chain[::-1]], "start": start,
                    "finish": chain[0]["finish"], "response_s": chain[0]["finish"] - start,
                    "agent_s": agent, **{p: math.fsum(r[p] for r in chain) for p in PARTS}})
    return out
