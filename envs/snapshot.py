"""A :class:`envs.simulator.Simulator` built from a snapshot of the present: nodes with their runs'
remaining time, and the unfinished tasks of the workflows in flight (``build``).

A planner that acts on the simulator's state (``policies.lookahead``) runs wherever the present
can be described this way: the placement service's ``/v1/schedule`` request and the live
scheduler's own record of its servers and tasks. The simulator starts at time 0 = now; no
workflow arrives after the snapshot and the cluster does not change (no failures, joins or
leaves). Nodes keep their order: position ``i`` is ``servers[i]``; a server of one slot (the
paper's: compute, memory, power) unless it gives its node (``ServerState.spec``, Ray's
resources).

Per workflow, the finished parents a task lists in ``inputs`` become finished stand-in tasks on
the server that holds their output (or on no present server: every server pays the transfer),
so transfers delay starts exactly as in the simulator. A running task finishes when its server
says (``ServerState.remaining_s``, or its own ``TaskState.remaining_s``). A busy server without a
listed running task (work the snapshot does not describe) runs a stand-in until its
``remaining_s`` (a node's: each of its ``held`` runs, ``(demands, remaining_s)``).

``focus`` names the task the caller is deciding about: it becomes the simulator's current task
whatever its first-level rank (it is put first in the ready queue), so the planner answers the
question the caller asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Protocol, Sequence

from .config import DynamicsConfig, EnvConfig
from .decision import DONE, RUNNING
from .nodes import NodeSpec
from .runtime import RuntimeConfig
from .simulator import Simulator
from .episode import TaskRecord


@dataclass(frozen=True, slots=True)
class ServerState:
    """One node now: a server of one slot (``compute``, ``memory_gb``, power) or ``spec``'s
    node. ``remaining_s``: time until its current task ends (0: idle); ``held``: runs the
    snapshot lists no task for, ``(demands, remaining_s)`` (a node's)."""
    compute: float
    memory_gb: float
    remaining_s: float = 0.0
    idle_w: float = 0.0
    busy_w: float = 0.0
    accepting: bool = True
    spec: NodeSpec | None = None
    held: tuple[tuple[tuple, float], ...] = ()

    @property
    def slotted(self) -> bool:
        """A server of one slot (one task at a time)."""
        return self.spec is None or "slot" in self.spec.resources

    def node(self, i: int) -> NodeSpec:
        """Its node (``envs.nodes``)."""
        if self.spec is not None:
            return self.spec
        return NodeSpec("server", {"slot": 1.0, "memory": float(self.memory_gb)}, self.compute,
                        self.compute, "", {}, self.idle_w, self.busy_w)


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
    demands: tuple = ()  # what it holds on a node (envs.demands; default: a slot and memory)
    remaining_s: float | None = None  # running: until its end (default: its server's)


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
          focus: tuple[int, int] | None = None, mean_compute: float | None = None,
          deferred: Sequence[tuple[int, int]] = ()) -> Snapshot:
    """The simulator of the snapshot (module docstring), at its first decision: ``focus``'s
    (workflow, task) positions when given (the task must be ready), else the first-level head.

    ``env`` gives the rules (transfers, masking, first level, wait step), the bandwidth and the
    feature constants; its cluster and dynamics are replaced by ``servers`` and stillness.
    ``mean_compute``: the mean speed HEFT's upward rank uses (default: of the accepting
    servers). ``deferred``: (workflow, task) positions of ready tasks that wait until the clock
    moves (a planner's defers earlier in this round). Raises ValueError naming the bad field of
    the snapshot."""
    n = len(servers)
    if n == 0:
        raise ValueError("servers: at least one server is needed")
    sim = _template(env, n).fork()
    return Snapshot(sim, sim.load_snapshot(servers, workflows, focus, mean_compute, deferred))


class TaskGraph(Protocol):
    """How :func:`workflow_state` reads one record of tasks (the simulator's, the live
    scheduler's): a task's sizes, its parents, whether it is done and when it finished, where
    a finished task's output is held and where a running task runs (server positions)."""

    def sizes(self, t: Any) -> tuple[float, float, float]:
        """(compute_gflop, memory_gb, output_gb)."""

    def demands(self, t: Any) -> tuple:
        """What ``t`` holds on a node (``envs.demands``)."""

    def remaining_s(self, t: Any) -> float | None:
        """Running ``t``'s time left (None: its server's)."""

    def parents(self, t: Any) -> Sequence[Any]: ...

    def first_parent(self, t: Any) -> Any: ...

    def done(self, t: Any) -> bool: ...

    def finish(self, t: Any) -> float: ...

    def held_at(self, t: Any) -> int:
        """Position of the server holding finished ``t``'s output (-1: none present)."""

    def running_on(self, t: Any) -> int | None:
        """Position of the server running ``t`` (None: not running)."""


def workflow_state(listed: Sequence[Any], graph: TaskGraph, age_s: float,
                   size: int) -> WorkflowState:
    """The snapshot of one workflow from its unfinished tasks ``listed`` (the one builder the
    simulator, the live scheduler and so the planners share): each task's unfinished parents
    as positions in ``listed``, its finished parents as inputs (server position, output GB) in
    finishing order with the transfer source (its first parent) first, and its server when
    running."""
    pos = {id(x): j for j, x in enumerate(listed)}
    tasks = []
    for x in listed:
        parents = graph.parents(x)
        done = sorted((p for p in parents if graph.done(p)), key=graph.finish)
        fp = graph.first_parent(x)
        if fp is not None and fp in done:  # the transfer source first
            done.remove(fp)
            done.insert(0, fp)
        tasks.append(TaskState(*graph.sizes(x),
                               tuple(pos[id(p)] for p in parents if not graph.done(p)),
                               tuple((graph.held_at(p), graph.sizes(p)[2]) for p in done),
                               graph.running_on(x), graph.demands(x), graph.remaining_s(x)))
    return WorkflowState(tuple(tasks), age_s, size)


class _SimulatorTasks:
    """The simulator's tasks as a :class:`TaskGraph` (read through its public view)."""

    def __init__(self, sim: Simulator):
        self.slot_of = sim.slot_by_server_id
        self.sim = sim

    def sizes(self, t: TaskRecord) -> tuple[float, float, float]:
        return t.compute, t.memory_gb, t.output

    def demands(self, t: TaskRecord) -> tuple:
        return t.demands

    def remaining_s(self, t: TaskRecord) -> float | None:
        if t.state != RUNNING:
            return None
        return max(self.sim.expected_end(t.slot, t) - self.sim.now, 0.0)

    def parents(self, t: TaskRecord) -> Sequence[TaskRecord]:
        return t.parents

    def first_parent(self, t: TaskRecord) -> TaskRecord | None:
        return t.first_parent

    def done(self, t: TaskRecord) -> bool:
        return t.state == DONE

    def finish(self, t: TaskRecord) -> float:
        return t.finish

    def held_at(self, t: TaskRecord) -> int:
        return self.slot_of.get(t.sid, -1)

    def running_on(self, t: TaskRecord) -> int | None:
        return t.slot if t.state == RUNNING else None


def describe(sim: Simulator) -> tuple[list[ServerState], list[WorkflowState], list[list[int]]]:
    """The present of a running simulator as a snapshot: (servers by slot, the unfinished
    workflows, and per listed task its id in ``sim``). An empty slot is a server that does not
    accept work. ``build`` of it continues like ``sim`` without future arrivals or cluster
    changes (tests/test_snapshot.py); the planner benchmark times decisions on it."""
    t, table = sim.now, sim.table
    servers = []
    for s in range(sim.n_slots):
        spec = table.specs[s]
        if spec is None:
            servers.append(ServerState(1.0, 0.0, accepting=False))
            continue
        slot = "slot" in spec.resources
        servers.append(ServerState(
            table.cpu_speed[s], table.memory_l[s],
            max(float(table.busy_until[s]) - t, 0.0) if table.running[s] else 0.0,
            table.idle_w[s], table.busy_w[s], table.accept_l[s], None if slot else spec))
    by_wf: dict[int, list[TaskRecord]] = {}
    for tk in sim.tasks:
        if tk.state != DONE:
            by_wf.setdefault(tk.wf.id, []).append(tk)
    graph = _SimulatorTasks(sim)
    workflows, ids = [], []
    for wid in sorted(by_wf):
        wf = sim.workflows[wid]
        workflows.append(workflow_state(by_wf[wid], graph, t - wf.arrival, wf.n))
        ids.append([tk.id for tk in by_wf[wid]])
    return servers, workflows, ids
