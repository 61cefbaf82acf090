"""A :class:`envs.simulator.Simulator` built from a snapshot of the present: servers with their
remaining busy time, and the unfinished tasks of the workflows in flight (``build``).

A planner that acts on the simulator's state (``policies.lookahead``) runs wherever the present
can be described this way: the placement service's ``/v1/schedule`` request and the live
scheduler's own record of its servers and tasks. The simulator starts at time 0 = now; no
workflow arrives after the snapshot and the cluster does not change (no failures, joins or
leaves). Servers keep their order: slot ``i`` is ``servers[i]``.

Per workflow, the finished parents a task lists in ``inputs`` become finished stand-in tasks on
the server that holds their output (or on no present server: every server pays the transfer),
so transfers delay starts exactly as in the simulator. A running task finishes when its server
says (``ServerState.remaining_s``). A busy server without a listed running task (work the
snapshot does not describe) runs a stand-in until its ``remaining_s``.

``focus`` names the task the caller is deciding about: it becomes the simulator's current task
whatever its first-level rank (it is put first in the ready queue), so the planner answers the
question the caller asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Sequence

from .config import DynamicsConfig, EnvConfig
from .runtime import RuntimeConfig
from .fork import fork
from .decision import DONE, READY, RUNNING
from .episode import TaskRecord, WorkflowRecord, build_workflow
from .sim_cluster import FINISH
from .simulator import Simulator
from . import order as orders
from .workflow import TaskSpec, WorkflowSpec, kahn_order


@dataclass(frozen=True, slots=True)
class ServerState:
    """One server now. ``remaining_s``: time until its current task ends (0: idle)."""
    compute: float
    memory_gb: float
    remaining_s: float = 0.0
    idle_w: float = 0.0
    busy_w: float = 0.0
    accepting: bool = True


@dataclass(frozen=True, slots=True)
class TaskState:
    """An unfinished task. ``parents``: positions of its unfinished parents in the workflow's
    task list; ``inputs``: its finished parents as (server position or -1 = on no present
    server, output GB), the first being its transfer source; ``server``: the position of the
    server running it (None: not started)."""
    compute_gflop: float
    memory_gb: float
    output_gb: float = 0.0
    parents: tuple[int, ...] = ()
    inputs: tuple[tuple[int, float], ...] = ()
    server: int | None = None


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """A workflow's unfinished tasks; ``age_s``: now minus its arrival; ``size``: its total
    task count, finished ones included (default: the listed tasks)."""
    tasks: tuple[TaskState, ...]
    age_s: float = 0.0
    size: int | None = None


@dataclass(slots=True)
class Snapshot:
    """The built simulator and where each listed task went: ``ids[w][j]`` is the simulator's
    task id of ``workflows[w].tasks[j]``."""
    sim: Simulator
    ids: list[list[int]] = field(default_factory=list)


_STILL = DynamicsConfig()  # no failures, joins or leaves
_EXACT = RuntimeConfig()  # envs.runtime off: a snapshot's runs take what it says


@lru_cache(maxsize=8)
def _template(env: EnvConfig, n: int) -> Simulator:
    """An empty simulator of ``n`` servers under ``env``'s rules (no arrivals, no dynamics);
    :func:`build` forks it (a fork is ~10x cheaper than validating a config and a reset)."""
    # a snapshot holds what deciders see (estimates), so its runs take exactly those
    sim = Simulator(replace(env.with_servers(n), n_max=n, dynamics=_STILL, runtime=_EXACT))
    sim.reset(0, arrivals=[])  # no arrivals: the snapshot's work only
    return sim


def build(env: EnvConfig, servers: Sequence[ServerState], workflows: Sequence[WorkflowState],
          focus: tuple[int, int] | None = None, mean_compute: float | None = None) -> Snapshot:
    """The simulator of the snapshot (module docstring), at its first decision: ``focus``'s
    (workflow, task) positions when given (the task must be ready), else the first-level head.

    ``env`` gives the rules (transfers, masking, first level, wait step), the bandwidth and the
    feature constants; its cluster and dynamics are replaced by ``servers`` and stillness.
    ``mean_compute``: the mean speed HEFT's upward rank uses (default: of the accepting
    servers). Raises ValueError naming the bad field of the snapshot."""
    n = len(servers)
    if n == 0:
        raise ValueError("servers: at least one server is needed")
    sim = fork(_template(env, n))
    sim.terminated = False  # (the template found nothing to do)
    acc = [s.compute for s in servers if s.accepting] or [s.compute for s in servers]
    sim._mean_compute = mean_compute or orders.mean_compute(acc)
    srv = sim.servers
    for i, s in enumerate(servers):
        sim.idle_w[i], sim.busy_w[i] = s.idle_w, s.busy_w
        sim._idle_w_l[i], sim._busy_w_l[i] = s.idle_w, s.busy_w
        srv.set_server(i, s.compute, s.memory_gb, s.idle_w, s.busy_w, s.accepting)
    sim._speed_by_memory = sorted(((s.compute, s.memory_gb) for s in servers), key=lambda x: -x[0])
    busy_by_task = [False] * n
    snap = Snapshot(sim)
    for w, wf in enumerate(workflows):
        snap.ids.append(_add_workflow(sim, w, wf, servers, busy_by_task))
    for i, s in enumerate(servers):  # busy servers running work the snapshot does not list
        if s.remaining_s > 0 and not busy_by_task[i]:
            _stand_in(sim, i, s.remaining_s)
    if focus is not None:
        w, j = focus
        task = sim.tasks[snap.ids[w][j]]
        if task.state != READY:
            raise ValueError(f"workflows[{w}].tasks[{j}]: not ready (running, or parents unfinished)")
        task.key = (-math.inf, -math.inf)
        sim._queue.push(task.key, task.id, task)  # on top; its older entry is dropped as stale
    sim._select()
    if focus is not None and (sim.current is None or sim.current.id != snap.ids[focus[0]][focus[1]]):
        raise ValueError(f"workflows[{focus[0]}].tasks[{focus[1]}]: no accepting server can take "
                         f"it now, so it cannot be decided")
    return snap


def _add_workflow(sim: Simulator, w: int, wf: WorkflowState, servers: Sequence[ServerState],
                  busy: list[bool]) -> list[int]:
    n = len(servers)
    listed = wf.tasks
    if not listed:
        raise ValueError(f"workflows[{w}].tasks: at least one task")
    size = len(listed) if wf.size is None else wf.size
    if size < len(listed):
        raise ValueError(f"workflows[{w}].size: {size} is smaller than the {len(listed)} listed tasks")
    inputs = [(j, k, inp) for j, t in enumerate(listed) for k, inp in enumerate(t.inputs)]
    m = len(inputs)  # finished stand-ins first, then the listed tasks
    specs = [TaskSpec(1e-9, 0.0, out) for _, _, (_, out) in inputs]
    for j, t in enumerate(listed):
        for p in t.parents:
            if not 0 <= p < len(listed) or p == j:
                raise ValueError(f"workflows[{w}].tasks[{j}].parents: {p} is not another listed task")
        own = [k for k, (jj, _, _) in enumerate(inputs) if jj == j]
        specs.append(TaskSpec(t.compute_gflop, t.memory_gb, t.output_gb,
                              tuple(own) + tuple(m + p for p in t.parents)))
    spec, pos = _topological(specs, w)  # pos: listed index -> spec index
    wfo, new = build_workflow(spec, len(sim.workflows), len(sim.tasks), -wf.age_s,
                              sim._speed_by_memory, sim._order, sim._mean_compute,
                              sim._bw, sim._lat, sim._edf_factor)
    wfo.n = size + m
    wfo.done = size - len(listed) + m
    sim.workflows.append(wfo)
    sim.open_workflows += 1
    sim.tasks.extend(new)
    for k, (_, _, (slot, _)) in enumerate(inputs):  # finished parents: on their server
        st = new[pos[k]]
        st.state, st.finish, st.start = DONE, -wf.age_s, -wf.age_s
        st.sid = sim._sid_l[slot] if 0 <= slot < n else -1
    for j, t in enumerate(listed):
        task = new[pos[m + j]]
        for k, (jj, _, _) in enumerate(inputs):
            if jj == j and task.first_parent is None:
                task.first_parent = new[pos[k]]
        task.pending = sum(1 for p in task.parents if p.state != DONE)
        if t.server is not None:
            if task.pending:
                raise ValueError(f"workflows[{w}].tasks[{j}].server: a running task cannot have "
                                 f"unfinished parents")
            if not 0 <= t.server < n:
                raise ValueError(f"workflows[{w}].tasks[{j}].server: {t.server} is out of range "
                                 f"0..{n - 1}")
            if busy[t.server]:
                raise ValueError(f"workflows[{w}].tasks[{j}].server: server {t.server} already "
                                 f"runs another listed task")
            busy[t.server] = True
            _run(sim, task, t.server, servers[t.server].remaining_s)
        elif task.pending == 0:
            task.state = READY
            sim._queue.push(task.key, task.id, task)
        sim.outstanding += 1
    return [new[pos[m + j]].id for j in range(len(listed))]


def _topological(specs: list[TaskSpec], w: int) -> tuple[WorkflowSpec, list[int]]:
    """A :class:`WorkflowSpec` of ``specs`` (parents given as indices into ``specs``, in any
    order) in a parents-first order, and old index -> new index; a cycle raises ValueError."""
    n = len(specs)
    if all(p < i for i, t in enumerate(specs) for p in t.parents):
        # already parents-first: keep the caller's order (it breaks first-level ties)
        return WorkflowSpec(tuple(specs)), list(range(n))
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, t in enumerate(specs):
        for p in t.parents:
            kids[p].append(i)
    order = kahn_order(kids)
    if len(order) != n:
        raise ValueError(f"workflows[{w}].tasks: the parents form a cycle")
    new_of = [0] * n
    for new, old in enumerate(order):
        new_of[old] = new
    return WorkflowSpec(tuple(specs[old]._replace(parents=tuple(sorted(new_of[p] for p in specs[old].parents)))
                              for old in order)), new_of


def _run(sim: Simulator, task: TaskRecord, slot: int, remaining: float | None) -> None:
    """``task`` runs on ``slot`` until ``remaining`` seconds from now."""
    until = max(remaining or 0.0, 1e-9)
    task.state, task.slot, task.sid, task.start = RUNNING, slot, sim._sid_l[slot], 0.0
    task.token += 1
    sim.servers.start(slot, until)
    sim.running[slot] = task
    sim.run_start[slot] = 0.0
    sim._push(until, FINISH, slot, (task.token, task))


def _stand_in(sim: Simulator, slot: int, remaining: float) -> None:
    wf = WorkflowRecord(len(sim.workflows), 0.0, 1, 0.0)
    task = TaskRecord(len(sim.tasks), wf, 0.0, 0.0, 0.0)
    task.key = (0, 0.0)
    sim.workflows.append(wf)
    sim.open_workflows += 1
    sim.tasks.append(task)
    sim.outstanding += 1
    _run(sim, task, slot, remaining)


def describe(sim: Simulator) -> tuple[list[ServerState], list[WorkflowState], list[list[int]]]:
    """The present of a running simulator as a snapshot: (servers by slot, the unfinished
    workflows, and per listed task its id in ``sim``). An empty slot is a server that does not
    accept work. ``build`` of it continues like ``sim`` without future arrivals or cluster
    changes (tests/test_snapshot.py); the planner benchmark times decisions on it."""
    t = sim.t
    servers = [ServerState(sim._compute_l[s], sim._memory_l[s],
                           max(float(sim.busy_until[s]) - t, 0.0) if sim._busy_l[s] else 0.0,
                           sim._idle_w_l[s], sim._busy_w_l[s], sim._accept_l[s])
               if sim._present_l[s] else ServerState(1.0, 0.0, accepting=False)
               for s in range(sim.n_slots)]
    by_wf: dict[int, list[TaskRecord]] = {}
    for tk in sim.tasks:
        if tk.state != DONE:
            by_wf.setdefault(tk.wf.id, []).append(tk)
    workflows, ids = [], []
    for wid in sorted(by_wf):
        listed = by_wf[wid]
        pos = {tk.id: j for j, tk in enumerate(listed)}
        tasks = []
        for tk in listed:
            done = sorted((p for p in tk.parents if p.state == DONE), key=lambda p: p.finish)
            if tk.first_parent is not None and tk.first_parent in done:  # the transfer source
                done.remove(tk.first_parent)
                done.insert(0, tk.first_parent)
            inputs = tuple((sim._slot_of.get(p.sid, -1), p.output) for p in done)
            tasks.append(TaskState(tk.compute, tk.memory_gb, tk.output,
                                   tuple(pos[p.id] for p in tk.parents if p.state != DONE),
                                   inputs, tk.slot if tk.state == RUNNING else None))
        wf = sim.workflows[wid]
        workflows.append(WorkflowState(tuple(tasks), t - wf.arrival, wf.n))
        ids.append([tk.id for tk in listed])
    return servers, workflows, ids
