"""How a :class:`envs.simulator.Simulator` takes a snapshot of the present: :func:`load`, a plain
function of the simulator's public attributes and parts (``sim.load_snapshot(...)`` computes the
cluster's speeds with :func:`speeds`, calls it, moves to the first decision and checks it with
:func:`focused`). The snapshot's types and ``build`` / ``describe`` are in ``envs.snapshot``."""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Sequence

from . import order as orders
from .decision import DONE, READY, RUNNING, DecisionCore
from .episode import TaskRecord, WorkflowRecord, build_workflow
from .nodes import NodeTable
from .sim_cluster import Cluster
from .timing import Network
from .workflow import TaskSpec, WorkflowSpec, kahn_order

if TYPE_CHECKING:
    from .simulator import Simulator
    from .snapshot import ServerState, WorkflowState

__all__ = ["costs", "focused", "load", "topological"]


def costs(servers: Sequence["ServerState"], network: Network,
          mean_compute: float | None = None) -> orders.Costs:
    """The snapshot's cluster as the order prices work: the fastest per memory over every node,
    the mean speed over the accepting ones (``mean_compute`` when given)."""
    nodes = [s.node(i) for i, s in enumerate(servers)]
    acc = [nd for nd, s in zip(nodes, servers) if s.accepting] or nodes
    whole = orders.Costs.of(((nd.cpu_speed, nd.gpu_speed, nd.memory_gb,
                              bool(nd.resources.get("GPU"))) for nd in nodes), network)
    mean = orders.Costs.of(((nd.cpu_speed, nd.gpu_speed, nd.memory_gb,
                             bool(nd.resources.get("GPU"))) for nd in acc), network)
    return orders.Costs(mean_compute or mean.mean_cpu, mean.mean_gpu, whole.fastest,
                        whole.fastest_gpu, network)


def load(sim: "Simulator", servers: Sequence["ServerState"], workflows: Sequence["WorkflowState"],
         focus: tuple[int, int] | None = None,
         deferred: Sequence[tuple[int, int]] = ()) -> list[list[int]]:
    """Take the snapshot's present (``envs.snapshot``): ``sim`` (an empty simulator of
    ``len(servers)`` slots, no arrivals, no dynamics, its speeds those of :func:`speeds`) gets
    its servers and unfinished work, ``focus``'s task when given on top of the ready queue.
    Returns per workflow the simulator's task id of each listed task. ``deferred``: ready tasks
    that wait this instant (set aside until the clock moves, as a wait without head-of-line
    blocking leaves them). Raises ValueError naming the bad field of the snapshot."""
    n = len(servers)
    sim.terminated = False  # (the template found nothing to do)
    specs = [s.node(i) for i, s in enumerate(servers)]
    table = NodeTable(specs, shapes=specs)  # node ids: the positions
    for i, s in enumerate(servers):
        if not s.accepting:
            table.set_accepting(i, False)
    sim.bind_core(DecisionCore(table, sim.core.rules))
    old = sim.cluster
    sim.cluster = Cluster(old.cfg, old.rng_dynamics, table, sim.core.queue, sim.event_q,
                          sim.hedges, sim)
    sim.cluster.slot_of, sim.cluster.next_id, sim.cluster.count = {i: i for i in range(n)}, n, n
    sim.busy_since = [0.0] * n
    busy_by_task = [False] * n
    ids: list[list[int]] = []
    for w, wf in enumerate(workflows):
        ids.append(_workflow(sim, w, wf, servers, busy_by_task))
    for i, s in enumerate(servers):  # busy servers running work the snapshot does not list
        for demands, remaining in s.held:
            _stand_in(sim, i, remaining, demands)
        if s.remaining_s > 0 and not busy_by_task[i] and not s.held:
            _stand_in(sim, i, s.remaining_s, (("slot", 1.0),) if s.slotted else ())
    if deferred:
        _defer_listed(sim, [ids[w][j] for w, j in deferred], deferred)
    if focus is not None:
        w, j = focus
        task = sim.tasks[ids[w][j]]
        if task.state != READY:
            raise ValueError(f"workflows[{w}].tasks[{j}]: not ready (running, or parents "
                             f"unfinished)")
        task.key = (-math.inf, -math.inf)
        sim.core.queue.push(task.key, task.id, task)  # on top; its older entry: stale, dropped
    return ids


def focused(current: TaskRecord | None, ids: list[list[int]],
            focus: tuple[int, int] | None) -> list[list[int]]:
    """``ids``, once the simulator's first decision (``current``) is ``focus``'s task when one
    is given; else ValueError."""
    if focus is not None and (current is None or current.id != ids[focus[0]][focus[1]]):
        raise ValueError(f"workflows[{focus[0]}].tasks[{focus[1]}]: no accepting server can "
                         f"take it now, so it cannot be decided")
    return ids


def _defer_listed(sim: "Simulator", tids: list[int], where: Sequence[tuple[int, int]]) -> None:
    """Move ready tasks ``tids`` from the ready heap to the deferred list (:func:`load`'s
    ``deferred``)."""
    for tid, (w, j) in zip(tids, where):
        if sim.tasks[tid].state != READY:
            raise ValueError(f"workflows[{w}].tasks[{j}]: deferred but not ready")
    out = set(tids)
    q = sim.core.queue
    q.deferred.extend(e for e in q.heap if e[1] in out)
    q.heap[:] = [e for e in q.heap if e[1] not in out]
    heapq.heapify(q.heap)


def _workflow(sim: "Simulator", w: int, wf: "WorkflowState", servers: Sequence["ServerState"],
              busy: list[bool]) -> list[int]:
    """Workflow ``w`` of the snapshot into ``sim``; the simulator's ids of its listed tasks."""
    n = len(servers)
    listed = wf.tasks
    if not listed:
        raise ValueError(f"workflows[{w}].tasks: at least one task")
    size = len(listed) if wf.size is None else wf.size
    if size < len(listed):
        raise ValueError(f"workflows[{w}].size: {size} is smaller than the {len(listed)} "
                         f"listed tasks")
    inputs = [(j, k, inp) for j, t in enumerate(listed) for k, inp in enumerate(t.inputs)]
    m = len(inputs)  # finished stand-ins first, then the listed tasks
    specs = [TaskSpec(1e-9, 0.0, out) for _, _, (_, out) in inputs]
    for j, t in enumerate(listed):
        for p in t.parents:
            if not 0 <= p < len(listed) or p == j:
                raise ValueError(f"workflows[{w}].tasks[{j}].parents: {p} is not another "
                                 f"listed task")
        own = [k for k, (jj, _, _) in enumerate(inputs) if jj == j]
        specs.append(TaskSpec(t.compute_gflop, t.memory_gb, t.output_gb,
                              tuple(own) + tuple(m + p for p in t.parents)))
    spec, pos = topological(specs, w)  # pos: listed index -> spec index
    wfo, new = build_workflow(spec, len(sim.workflows), len(sim.tasks), -wf.age_s, sim.order,
                              sim.costs, None, servers[0].slotted)
    for j, t in enumerate(listed):  # the demands a task holds, when the snapshot gives them
        if t.demands:
            task = new[pos[m + j]]
            task.demands, task.gpu = t.demands, any(k == "GPU" for k, _ in t.demands)
    wfo.n = size + m
    wfo.done = size - len(listed) + m
    sim.workflows.append(wfo)
    sim.open_workflows += 1
    sim.tasks.extend(new)
    for k, (_, _, (slot, _)) in enumerate(inputs):  # finished parents: on their server
        st = new[pos[k]]
        st.state, st.finish, st.start = DONE, -wf.age_s, -wf.age_s
        st.sid = sim.server_ids[slot] if 0 <= slot < n else -1
    for j, t in enumerate(listed):
        task = new[pos[m + j]]
        for k, (jj, _, _) in enumerate(inputs):
            if jj == j and task.first_parent is None:
                task.first_parent = new[pos[k]]
        task.pending = sum(1 for p in task.parents if p.state != DONE)
        if t.server is not None:
            if task.pending:
                raise ValueError(f"workflows[{w}].tasks[{j}].server: a running task cannot "
                                 f"have unfinished parents")
            if not 0 <= t.server < n:
                raise ValueError(f"workflows[{w}].tasks[{j}].server: {t.server} is out of "
                                 f"range 0..{n - 1}")
            if busy[t.server] and servers[t.server].slotted:
                raise ValueError(f"workflows[{w}].tasks[{j}].server: server {t.server} "
                                 f"already runs another listed task")
            busy[t.server] = True
            _run_until(sim, task, t.server, servers[t.server].remaining_s
                       if t.remaining_s is None else t.remaining_s)
        elif task.pending == 0:
            task.state = READY
            sim.core.queue.push(task.key, task.id, task)
        sim.outstanding += 1
    return [new[pos[m + j]].id for j in range(len(listed))]


def _run_until(sim: "Simulator", task: TaskRecord, slot: int, remaining: float | None) -> None:
    """``task`` runs on ``slot`` until ``remaining`` seconds from now."""
    until = max(remaining or 0.0, 1e-9)
    if not sim.table.has_room(slot, task.demands):
        raise ValueError(f"servers[{slot}]: the runs listed on it hold more than it has")
    task.state, task.slot, task.sid = RUNNING, slot, sim.server_ids[slot]
    task.start = task.run_from = 0.0
    task.token += 1
    sim.occupy(slot, task, until, until)


def _stand_in(sim: "Simulator", slot: int, remaining: float, demands: tuple) -> None:
    """An unlisted run on ``slot`` for ``remaining`` seconds holding ``demands`` (a one-task
    workflow)."""
    wf = WorkflowRecord(len(sim.workflows), 0.0, 1, 0.0)
    task = TaskRecord(len(sim.tasks), wf, 0.0, 0.0, 0.0, demands)
    task.key = (0, 0.0)
    sim.workflows.append(wf)
    sim.open_workflows += 1
    sim.tasks.append(task)
    sim.outstanding += 1
    _run_until(sim, task, slot, remaining)


def topological(specs: list[TaskSpec], w: int) -> tuple[WorkflowSpec, list[int]]:
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
    return WorkflowSpec(tuple(
        specs[old]._replace(parents=tuple(sorted(new_of[p] for p in specs[old].parents)))
        for old in order)), new_of
