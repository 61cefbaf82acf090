"""Episode traces: a JSONL writer and an independent checker that replays a trace.

Schema (one JSON object per line, times in simulated seconds):

``{"t", "event": "episode", "bandwidth_gb_s", "latency_s", "transfer_delays_start", "tiers": [{"name", "compute", "memory_gb"}]}``
``{"t", "event": "server_add", "server", "tier", "compute", "memory_gb"}``
``{"t", "event": "arrival", "workflow", "tasks": [{"task", "compute_gflop", "memory_gb", "output_gb", "parents"}]}``
``{"t", "event": "start", "task", "server"[, "transfer_s"]}``  ``{"t", "event": "finish", "task", "server"}``
``{"t", "event": "lost", "task", "server"}``  ``{"t", "event": "cancel", "task", "server"[, "reason"]}``
(runtime noise: ``start`` also has ``estimate_s`` and ``run_s``, the run's actual exec time; a
hedged copy's ``start`` has ``"hedge": true``, and the run that did not finish first ends with
``cancel``)  ``{"t", "event": "server_drain" | "server_remove" | "server_fail", "server"}``
``{"t", "event": "guard", "task", "proposed", "chosen", "reason"}`` (servers by id; ``proposed`` is
null when the learned policy named no live server)
``{"t", "event": "end", "truncated", "metrics": {...}}``

:func:`verify_trace` checks every constraint of the model from the trace alone and recomputes the
reported metrics; it shares no code with the simulator on purpose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable


class JsonlTraceWriter:
    """Writes trace events to a ``.jsonl`` file (a callable sink for the simulator)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = self.path.open("w", encoding="utf-8")

    def __call__(self, event: dict[str, Any]) -> None:
        self._fh.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


class TraceError(ValueError):
    """The trace violates a constraint of the model; the message names the line and event."""


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """Events of a JSONL trace file."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TraceError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return out


def _close(a: float, b: float, tol: float = 1e-9) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


class _Replay:
    """The state :func:`verify_trace` keeps while it replays a trace, one method per event kind;
    each raises :class:`TraceError` on a violation."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.servers: dict[int, dict[str, Any]] = {}
        self.tasks: dict[int, dict[str, Any]] = {}
        self.workflows: dict[int, dict[str, Any]] = {}
        self.busy_s = 0.0
        self.last_t = 0.0
        self.end: dict[str, Any] | None = None

    @staticmethod
    def fail(i: int, ev: dict, msg: str) -> None:
        raise TraceError(f"event {i} ({ev.get('event')} at t={ev.get('t')}): {msg}")

    def event(self, i: int, ev: dict) -> None:
        t = float(ev["t"])
        kind = ev["event"]
        if t < self.last_t - 1e-12:
            self.fail(i, ev, f"time goes backwards (previous event at {self.last_t})")
        self.last_t = t
        if self.end is not None:
            self.fail(i, ev, "event after the end of the episode")
        if kind == "episode":
            self.header = ev
        elif kind == "server_add":
            sid = ev["server"]
            if sid in self.servers:
                self.fail(i, ev, f"server {sid} added twice")
            self.servers[sid] = {"compute": ev["compute"], "memory_gb": ev["memory_gb"],
                                 "added": t, "gone": None, "draining": False, "running": None}
        elif kind in ("server_remove", "server_fail", "server_drain"):
            self.server_leaves(i, ev, t, kind)
        elif kind == "arrival":
            self.arrival(i, ev, t)
        elif kind == "start":
            self.start(i, ev, t)
        elif kind in ("finish", "lost", "cancel"):
            self.run_ends(i, ev, t, kind)
        elif kind == "end":
            self.end = ev
        elif kind == "guard":  # policies.guard replaced a learned policy's answer: no state change
            pass
        else:
            self.fail(i, ev, f"unknown event kind {kind!r}")

    def server_leaves(self, i: int, ev: dict, t: float, kind: str) -> None:
        s = self.servers.get(ev["server"])
        if s is None or s["gone"] is not None:
            self.fail(i, ev, f"server {ev['server']} is not alive")
        if kind == "server_drain":
            s["draining"] = True
            return
        if s["running"] is not None:
            self.fail(i, ev, f"server {ev['server']} still runs task {s['running']}")
        s["gone"] = t

    def arrival(self, i: int, ev: dict, t: float) -> None:
        wid, tasks = ev["workflow"], self.tasks
        if wid in self.workflows:
            self.fail(i, ev, f"workflow {wid} arrived twice")
        ids = [tk["task"] for tk in ev["tasks"]]
        self.workflows[wid] = {"arrival": t, "tasks": ids}
        for tk in ev["tasks"]:
            if tk["task"] in tasks:
                self.fail(i, ev, f"task id {tk['task']} is not unique")
            for p in tk["parents"]:
                if p not in tasks or tasks[p]["workflow"] != wid:
                    self.fail(i, ev, f"task {tk['task']} has parent {p} outside its workflow")
            tasks[tk["task"]] = {**tk, "workflow": wid, "state": "waiting", "finish": None,
                                 "finishes": 0, "server": None, "start": None, "transfer": 0.0,
                                 "runs": {}}

    def start(self, i: int, ev: dict, t: float) -> None:
        tasks, header = self.tasks, self.header
        tk = tasks.get(ev["task"])
        s = self.servers.get(ev["server"])
        if tk is None:
            self.fail(i, ev, f"task {ev['task']} never arrived")
        if s is None or s["gone"] is not None or s["draining"]:
            self.fail(i, ev, f"server {ev['server']} is not accepting tasks")
        hedge = bool(ev.get("hedge"))
        if tk["state"] == "done" or (tk["state"] == "running" and not hedge):
            self.fail(i, ev, f"task {ev['task']} is already {tk['state']}")
        if hedge and (tk["state"] != "running" or len(tk["runs"]) != 1):
            self.fail(i, ev, f"a hedged copy of task {ev['task']}, which is not running once")
        if s["running"] is not None:
            self.fail(i, ev, f"server {ev['server']} already runs task {s['running']}")
        if tk["memory_gb"] > s["memory_gb"]:
            self.fail(i, ev, f"task needs {tk['memory_gb']} GB, server has {s['memory_gb']} GB")
        delay = 0.0
        for p in tk["parents"]:
            pt = tasks[p]
            if pt["state"] != "done" or pt["finish"] > t + 1e-12:
                self.fail(i, ev, f"parent {p} of task {ev['task']} has not finished")
            if pt["server"] != ev["server"]:
                delay = max(delay, pt["output_gb"] / header.get("bandwidth_gb_s", 10.0)
                            + header.get("latency_s", 0.01))
        expected = delay if header.get("transfer_delays_start") else 0.0
        if not _close(float(ev.get("transfer_s", 0.0)), expected):
            self.fail(i, ev, f"transfer delay {ev.get('transfer_s', 0.0)} != expected {expected}")
        # a run takes compute / speed, or with run-time noise the run_s its start names
        run = expected + float(ev["run_s"] if "run_s" in ev else tk["compute_gflop"] / s["compute"])
        tk["runs"][ev["server"]] = (t, run)
        tk.update(state="running", server=ev["server"], start=t, transfer=expected)
        s["running"] = ev["task"]

    def run_ends(self, i: int, ev: dict, t: float, kind: str) -> None:
        tk = self.tasks.get(ev["task"])
        s = self.servers.get(ev["server"])
        if tk is None or ev["server"] not in tk["runs"] or s is None:
            self.fail(i, ev, f"task {ev['task']} is not running on server {ev['server']}")
        start, run = tk["runs"].pop(ev["server"])
        self.busy_s += t - start
        s["running"] = None
        if kind == "finish":
            if not _close(t - start, run):
                self.fail(i, ev, f"ran {t - start} s, expected {run} s (preempted or wrong speed)")
            tk.update(state="done", finish=t, server=ev["server"], start=start)
            tk["finishes"] += 1
        elif kind == "lost":
            if tk["runs"]:
                self.fail(i, ev, f"task {ev['task']} lost while another run goes on (a cancel)")
            tk.update(state="ready", server=None, start=None)
        elif not (tk["state"] == "done" and _close(tk["finish"], t)) and not (
                ev.get("reason") == "server_fail" and tk["runs"]):
            self.fail(i, ev, f"run of task {ev['task']} cancelled, but the task did not just "
                             f"finish and no other run goes on")

    def metrics(self) -> dict[str, Any]:
        """The episode's metrics recomputed from the replayed trace."""
        end, servers, tasks = self.end, self.servers, self.tasks
        if end is None:
            raise TraceError("trace has no 'end' event (episode not finished or file truncated)")
        t_end = float(end["t"])
        if not end.get("truncated"):
            open_tasks = [tid for tid, tk in tasks.items() if tk["finishes"] != 1]
            if open_tasks:
                raise TraceError(f"tasks {open_tasks[:10]} did not finish exactly once")
        alive_s = sum((s["gone"] if s["gone"] is not None else t_end) - s["added"]
                      for s in servers.values())
        busy_s = self.busy_s + sum(t_end - tasks[s["running"]]["runs"][sid][0]
                                   for sid, s in servers.items()
                                   if s["running"] is not None)  # still running at the cutoff
        resp, resp_all, wresp, slow = self.responses(t_end)
        return {
            "completed_tasks": len(resp),
            "arrived_tasks": len(tasks),
            "completed_workflows": len(wresp),
            "mean_task_response_s": _mean(resp),
            "censored_task_response_s": _mean(resp_all),
            "p95_task_response_s": _p95(resp),
            "mean_workflow_response_s": _mean(wresp),
            "slowdown": _mean(slow),
            "utilization": busy_s / alive_s if alive_s else 0.0,
            "makespan_s": t_end,
        }

    def responses(self, t_end: float) -> tuple[list[float], list[float], list[float], list[float]]:
        """Task responses (finished; all, censored at ``t_end``), workflow responses and
        slowdowns (response / critical path on the fastest tier that fits each task)."""
        tasks = self.tasks
        tiers = self.header.get("tiers") or [{"compute": s["compute"], "memory_gb": s["memory_gb"]}
                                             for s in self.servers.values()]
        tiers = sorted(tiers, key=lambda x: -x["compute"])
        resp, resp_all, wresp, slow = [], [], [], []
        for wf in self.workflows.values():
            done = [tasks[tid] for tid in wf["tasks"] if tasks[tid]["state"] == "done"]
            resp.extend(tk["finish"] - wf["arrival"] for tk in done)
            resp_all.extend((tasks[tid]["finish"] if tasks[tid]["state"] == "done" else t_end)
                            - wf["arrival"] for tid in wf["tasks"])
            if len(done) == len(wf["tasks"]):
                r = max(tk["finish"] for tk in done) - wf["arrival"]
                wresp.append(r)
                longest: dict[int, float] = {}
                for tid in wf["tasks"]:  # arrival lists tasks in topological order
                    tk = tasks[tid]
                    speed = next((x["compute"] for x in tiers
                                  if x["memory_gb"] >= tk["memory_gb"]), tiers[0]["compute"])
                    longest[tid] = tk["compute_gflop"] / speed + max(
                        (longest[p] for p in tk["parents"]), default=0.0)
                lb = max(longest.values())
                if lb > 0:
                    slow.append(r / lb)
        return resp, resp_all, wresp, slow


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _p95(xs: list[float]) -> float:  # numpy's default (linear) percentile
    if not xs:
        return math.nan
    ys = sorted(xs)
    k = (len(ys) - 1) * 0.95
    lo = math.floor(k)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def verify_trace(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Replay ``events``; raise :class:`TraceError` on any violation; return recomputed metrics.

    Checks: time order; readiness (parents finished, plus transfer when it delays starts); one task
    per server; memory fits; run time = demand / capacity (+ transfer); no preemption; draining and
    departed servers get no task; every arrived task finishes exactly once (lost runs excepted)
    unless the episode was truncated; the metrics in the ``end`` event equal the recomputed ones.
    """
    replay = _Replay()
    for i, ev in enumerate(events):
        replay.event(i, ev)
    metrics = replay.metrics()
    reported = replay.end.get("metrics", {})
    for key, value in metrics.items():
        if key in reported:
            rv = reported[key]
            same = (isinstance(value, float) and math.isnan(value) and rv is not None
                    and math.isnan(rv)) or _close(float(rv), float(value), 1e-7)
            if not same:
                raise TraceError(f"reported {key} = {rv} but the trace gives {value}")
    return metrics
