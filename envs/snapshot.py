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

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Sequence

from .config import DynamicsConfig, EnvConfig
from .decision import DONE, RUNNING
from .runtime import RuntimeConfig
from .simulator import Simulator
from .episode import TaskRecord


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
    sim = _template(env, n).fork()
    return Snapshot(sim, sim.load_snapshot(servers, workflows, focus, mean_compute))


def describe(sim: Simulator) -> tuple[list[ServerState], list[WorkflowState], list[list[int]]]:
    """The present of a running simulator as a snapshot: (servers by slot, the unfinished
    workflows, and per listed task its id in ``sim``). An empty slot is a server that does not
    accept work. ``build`` of it continues like ``sim`` without future arrivals or cluster
    changes (tests/test_snapshot.py); the planner benchmark times decisions on it."""
    t, srv = sim.now, sim.servers
    servers = [ServerState(srv.compute_l[s], srv.memory_l[s],
                           max(float(sim.busy_until[s]) - t, 0.0) if srv.busy_l[s] else 0.0,
                           float(sim.idle_w[s]), float(sim.busy_w[s]), srv.accept_l[s])
               if sim.present[s] else ServerState(1.0, 0.0, accepting=False)
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
            inputs = tuple((sim.slot_by_server_id.get(p.sid, -1), p.output) for p in done)
            tasks.append(TaskState(tk.compute, tk.memory_gb, tk.output,
                                   tuple(pos[p.id] for p in tk.parents if p.state != DONE),
                                   inputs, tk.slot if tk.state == RUNNING else None))
        wf = sim.workflows[wid]
        workflows.append(WorkflowState(tuple(tasks), t - wf.arrival, wf.n))
        ids.append([tk.id for tk in listed])
    return servers, workflows, ids
