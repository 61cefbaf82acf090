"""The simulator's episode record: tasks and workflows as it tracks them, a workflow's arrival
(links, first-level key, critical-path lower bound), what a step returns, the trace events it
builds and the episode metrics."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

from . import order as orders
from .decision import DONE, READY, WAITING
from .demands import CPU, GPU, Request
from .workload import TaskSpec, WorkflowSpec

if TYPE_CHECKING:  # annotations only: the simulator imports this module
    from .config import EnvConfig
    from .simulator import Simulator


#: where the simulator sends trace events (envs.trace's JSONL schema, one dict each)
TraceSink = Callable[[dict[str, Any]], None]


class StepResult(NamedTuple):
    """What ``Simulator.step`` returns."""
    reward: float
    valid: bool
    terminated: bool
    truncated: bool


class TaskRecord:
    __slots__ = ("id", "wf", "compute", "memory_gb", "output", "parents", "children", "key",
                 "pending", "state", "slot", "sid", "start", "finish", "token", "first_parent",
                 "waits", "rank", "nominal", "kind", "hint", "factor", "factor2", "expected",
                 "copy_slot", "hedgeable", "demands", "copy_start", "gpu", "run_from")

    def __init__(self, tid: int, wf: "WorkflowRecord", compute: float, memory_gb: float,
                 output: float, demands: tuple = (), gpu: bool = False):
        self.id = tid
        self.wf = wf
        self.compute = compute
        self.memory_gb = memory_gb
        self.output = output
        self.demands = demands      # what it holds on a node (envs.demands)
        self.gpu = gpu              # GPU work (its node's GPU speed)
        self.parents: list[TaskRecord] = []
        self.children: list[TaskRecord] = []
        self.key: tuple = ()
        self.pending = 0            # unfinished parents
        self.state = WAITING
        self.slot = -1              # slot while running
        self.sid = -1               # id of the server it last ran on (kept after finishing)
        self.start = math.nan
        self.finish = math.nan
        self.token = 0              # bumps on every start; stale finish events are ignored
        self.first_parent: TaskRecord | None = None  # first parent to finish (paper's transfer source)
        self.waits = 0              # policy picks that did not start it (invalid actions)
        self.rank = 0.0             # within-workflow rank of its order key (envs.order.ranks)
        # run times (envs.runtime; unused with the defaults). ``compute`` is what deciders see:
        # the hint or the estimate; ``nominal`` the true mean compute, ``factor`` its run's
        # noise (``factor2``: a hedged copy's), ``expected`` the hint-implied exec s of its run.
        self.nominal = compute
        self.kind = ""
        self.hint = compute
        self.factor = 1.0
        self.factor2 = 1.0
        self.expected = 0.0
        self.copy_slot = -1         # node of its hedged copy while one runs (envs.hedging)
        self.copy_start = math.nan  # when that copy started
        self.run_from = math.nan    # when the run on ``slot`` started (a copy's, once it took over)
        self.hedgeable = False


class WorkflowRecord:
    __slots__ = ("id", "arrival", "n", "done", "lower_bound", "finish", "level", "tasks", "kind")

    def __init__(self, wid: int, arrival: float, n: int, lower_bound: float):
        self.id = wid
        self.arrival = arrival
        self.n = n
        self.done = 0
        self.lower_bound = lower_bound
        self.finish = math.nan
        self.level = 0.0            # its order level (envs.order: deadline, work left, service)
        self.tasks: list[TaskRecord] = []
        self.kind = ""              # its program kind (the spec's name; envs.programs learns per kind)


_SLOT = (("slot", 1.0),)
_CPU = ((CPU, 1.0),)


def task_demands(ts: TaskSpec, slotted: bool) -> tuple:
    """What task ``ts`` holds on a node (``envs.demands``): on servers of one slot (the paper's)
    a slot, its memory and what its options name; on Ray nodes its Ray request."""
    if not ts.demands:  # the paper's workloads: a slot and memory, or Ray's default CPU
        m = ts.memory_gb
        if slotted:
            return (("memory", m), _SLOT[0]) if m > 0 else _SLOT
        return (_CPU[0], ("memory", m)) if m > 0 else _CPU
    req = Request(dict(ts.demands).get(CPU), ts.demands, ts.memory_gb)
    return req.on_slot() if slotted else req.on_nodes()


def build_workflow(spec: WorkflowSpec, wid: int, base: int, t: float, order: orders.Order,
                   costs: orders.Costs, shown: Sequence[float] | None = None,
                   slotted: bool = True) -> tuple[WorkflowRecord, list[TaskRecord]]:
    """Workflow ``wid`` arriving at ``t`` with task ids from ``base``: linked tasks with their
    demands (:func:`task_demands`), each keyed for the ready queue by ``order``
    (:meth:`envs.order.Order.arrive`), and the critical-path lower bound (``costs``). ``shown``:
    the computes deciders see (``envs.runtime`` hints; default the spec's): the tasks'
    ``compute`` and the order keys use them, the lower bound the spec's."""
    specs = spec.tasks
    n = len(specs)
    wf = WorkflowRecord(wid, t, n, 0.0)
    comp = [ts.compute_gflop for ts in specs] if shown is None else list(shown)
    gpu = [bool(ts.demands) and any(k == GPU for k, _ in ts.demands) for ts in specs]
    new = [TaskRecord(base + i, wf, comp[i], ts.memory_gb, ts.output_gb,
                      task_demands(ts, slotted), gpu[i]) for i, ts in enumerate(specs)]
    wf.tasks = new
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, ts in enumerate(specs):
        task = new[i]
        for p in ts.parents:
            parent = new[p]
            task.parents.append(parent)
            parent.children.append(task)
            kids[p].append(i)
        task.pending = len(ts.parents)
    mems = [ts.memory_gb for ts in specs]
    parents = [ts.parents for ts in specs]
    wf.lower_bound = costs.lower_bound_s([ts.compute_gflop for ts in specs], mems, gpu, parents)
    keyed = order.arrive(orders.Graph(comp, mems, [ts.output_gb for ts in specs], gpu, kids,
                                      parents), t, wid, costs)
    wf.level = keyed.level
    for i, task in enumerate(new):
        task.rank = keyed.ranks[i]
        task.key = keyed.keys[i]
    return wf, new


def episode_event(cfg: "EnvConfig") -> dict[str, Any]:
    """The trace's first event (envs.trace): the network and the tiers."""
    c = cfg.cluster
    return {"t": 0.0, "event": "episode", "bandwidth_gb_s": c.bandwidth_gb_s,
            "latency_s": c.latency_s, "transfer_delays_start": cfg.mdp.transfer_delays_start,
            "tiers": [{"name": t.name, "compute": t.compute, "memory_gb": t.memory_gb}
                      for t in c.tiers]}


def start_event(t: float, task: int, server: int, transfer_s: float,
                times: tuple[float, float] | None, hedge: bool = False) -> dict[str, Any]:
    """The trace's ``start`` event (envs.trace); ``times``: (estimate, run) seconds with a
    run-time model; ``hedge``: a backup copy's (envs.hedging)."""
    ev = {"t": t, "event": "start", "task": task, "server": server}
    if hedge:
        ev["hedge"] = True
        ev["estimate_s"], ev["run_s"] = times
    if transfer_s:
        ev["transfer_s"] = transfer_s
    if times is not None and not hedge:
        ev["estimate_s"], ev["run_s"] = times
    return ev


def arrival_event(t: float, wid: int, tasks: list[TaskRecord], kinds: bool) -> dict[str, Any]:
    """The trace's ``arrival`` event (envs.trace) of workflow ``wid`` with ``tasks``; ``kinds``:
    with each task's run-time kind and the compute deciders see (a run-time model)."""
    return {"t": t, "event": "arrival", "workflow": wid, "tasks": [
        {"task": tk.id, "compute_gflop": tk.nominal, "memory_gb": tk.memory_gb,
         "output_gb": tk.output, "parents": [p.id for p in tk.parents]}
        | ({"kind": tk.kind, "shown_gflop": tk.compute} if kinds else {}) for tk in tasks]}


def rekey(wf: WorkflowRecord, order: orders.Order, task: TaskRecord, run_s: float,
          costs: orders.Costs, push: Any) -> None:
    """A dynamic order (``srpt``, ``las``): ``task`` of ``wf`` finished after ``run_s``
    seconds; the workflow's level moves (:meth:`envs.order.Order.on_finish`), every unfinished
    task gets its new key and the ready ones are pushed again (``push(task)``; the queue drops
    their older entries)."""
    wf.level = level = order.on_finish(wf.level, costs.work_s(task.compute, task.gpu), run_s)
    key = order.key
    for tk in wf.tasks:
        st = tk.state
        if st == DONE:
            continue
        tk.key = key(tk.rank, wf.arrival, wf.id, level)
        if st == READY:
            push(tk)


def episode_metrics(sim: "Simulator") -> dict[str, Any]:
    """Episode metrics over completed tasks/workflows (see docs/simulator.md)."""
    resp = [tk.finish - tk.wf.arrival for tk in sim.tasks if tk.state == DONE]
    # every arrived task; an unfinished one (truncated episode) counts its age at the end, a
    # lower bound of its response: no survivor bias when a policy leaves tasks unfinished
    resp_all = [(tk.finish if tk.state == DONE else sim.t) - tk.wf.arrival for tk in sim.tasks]
    wfs = [w for w in sim.workflows if w.done == w.n]
    wresp = [w.finish - w.arrival for w in wfs]
    # every arrived workflow; an unfinished one counts its age at the end (a lower bound)
    wresp_all = [(w.finish if w.done == w.n else sim.t) - w.arrival for w in sim.workflows]
    slow = [(w.finish - w.arrival) / w.lower_bound for w in wfs if w.lower_bound > 0]
    # busy / alive node-seconds (a node is busy while it runs a task); a node still busy at the
    # cutoff (a truncated episode) counts its time so far
    busy = sim.busy_seconds + sim.busy_now()
    return {
        "completed_tasks": len(resp),
        "arrived_tasks": len(sim.tasks),
        "completed_workflows": len(wfs),
        "mean_task_response_s": float(np.mean(resp)) if resp else math.nan,
        "censored_task_response_s": float(np.mean(resp_all)) if resp_all else math.nan,
        "p95_task_response_s": float(np.percentile(resp, 95)) if resp else math.nan,
        "mean_workflow_response_s": float(np.mean(wresp)) if wresp else math.nan,
        "p95_workflow_response_s": float(np.percentile(wresp, 95)) if wresp else math.nan,
        "p99_workflow_response_s": float(np.percentile(wresp, 99)) if wresp else math.nan,
        "censored_workflow_response_s": float(np.mean(wresp_all)) if wresp_all else math.nan,
        "censored_p95_workflow_response_s": (float(np.percentile(wresp_all, 95)) if wresp_all
                                             else math.nan),
        "censored_p99_workflow_response_s": (float(np.percentile(wresp_all, 99)) if wresp_all
                                             else math.nan),
        "completed_workflows_ratio": len(wfs) / len(sim.workflows) if sim.workflows else math.nan,
        "slowdown": float(np.mean(slow)) if slow else math.nan,
        "utilization": float(busy / sim.alive_seconds) if sim.alive_seconds else 0.0,
        "makespan_s": float(sim.t),
        "decisions": sim.decisions,
        "invalid_rate": sim.invalid / sim.decisions if sim.decisions else 0.0,
        "lost_tasks": sim.cluster.lost,
        "truncated": sim.truncated,
    } | (sim.hedges.metrics() if sim.cfg.runtime.hedge != "off" else {}) | (
        {"busy_server_s": float(busy)} if sim.cfg.runtime.active else {}) | sim.resource_use()
