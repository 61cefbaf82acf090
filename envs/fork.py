"""A cheap, independent copy of a running :class:`envs.simulator.Simulator`: :func:`fork`
(``sim.fork()`` delegates to it) and the watermark it starts from (:func:`unfinished_range`).
Plain functions of the simulator's public attributes and its parts' ``copy()``.

Planners (``policies.lookahead``) try an action on a copy of the simulator and roll the copy
forward; the original must not notice. ``copy.deepcopy`` would copy every task of the episode
(and the trace sink); :func:`fork` copies only what can still change:

* unfinished tasks (``state != DONE``) and unfinished workflows, with their links remapped to the
  copies (a finished task is never written again, so both simulators share it; its ``children``
  may name the original's objects, which nothing reads once a task is done);
* the event heap, the decision core (its ready queue with the deferred and blocked lists, and its
  table of nodes with their free resources and runs, ``envs.nodes.NodeTable.copy``);
* the arrivals (``envs.sim_arrivals.Arrivals.copy``: their generators, process and source) and
  the node dynamics (``envs.sim_cluster.Cluster.copy``: their generator, the node ids, the lost
  count);
* the run-time model and the hedging part (``Simulator.bind_runs``: their copies), the encoder
  (its scratch rows);
* counters, the clock, the nodes' busy periods and the watermark ``done_below``.

The fork has no trace sink. Continuing the fork with the same actions gives exactly the
original's future (tests/test_lookahead.py), and stepping the fork leaves the original alone.
With run-time noise (``runtime``, envs/run_model.py) the fork cannot see the truth: its running
tasks end at their estimated ends and its new runs take their estimates.

Each part copies itself; every other attribute of the simulator must be immutable
(:func:`immutable`: plain values, the frozen configuration, the order and the objective), and is
shared. Any other value makes :func:`fork` raise ``TypeError`` naming the attribute, so
a new piece of simulator state cannot be shared silently. No attribute is named here.
"""

from __future__ import annotations

import copy
from types import MethodType
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .decision import DONE, DecisionCore
from .episode import TaskRecord, WorkflowRecord
from .events import FINISH

if TYPE_CHECKING:
    from .simulator import Simulator

_PLAIN = (int, float, bool, str, type(None), np.integer, np.floating, np.bool_)


def immutable(v: object) -> bool:
    """Whether ``v`` can be shared by a simulator and its fork: a plain value, a tuple of such,
    a frozen dataclass (the configuration, the order), an object whose class says it is never
    written after construction (``IMMUTABLE = True``: the objective), or a method of one."""
    if isinstance(v, _PLAIN):
        return True
    if isinstance(v, tuple):
        return all(immutable(x) for x in v)
    if isinstance(v, MethodType):
        return immutable(v.__self__)
    params = getattr(type(v), "__dataclass_params__", None)
    return (params is not None and params.frozen) or getattr(type(v), "IMMUTABLE", False)


def copy_rng(src: np.random.Generator, into: np.random.Generator | None) -> np.random.Generator:
    """An independent generator in ``src``'s state (``into`` reused when given: cheaper)."""
    if into is None:
        into = np.random.Generator(type(src.bit_generator)())
    into.bit_generator.state = src.bit_generator.state
    return into


def copy_source(src):
    """The workload source with its own buffers (lists are copied, templates shared)."""
    out = copy.copy(src)
    for k, v in vars(out).items():
        if isinstance(v, list) and k != "workflows":  # ListSource.workflows never changes
            setattr(out, k, list(v))
    return out


def unfinished_range(sim: "Simulator") -> int:
    """Index of the first task of ``sim`` that is not done (``sim.done_below``, a watermark:
    tasks before it are all done). Cheap: the watermark only moves forward."""
    lo = sim.done_below
    tasks = sim.tasks
    n = len(tasks)
    while lo < n and tasks[lo].state == DONE:
        lo += 1
    sim.done_below = lo
    return lo


def fork(sim: "Simulator", rngs: Sequence[np.random.Generator] | None = None) -> "Simulator":
    """An independent simulator in ``sim``'s state (``sim.fork()``; see the module docstring).

    ``rngs``: three generators (arrivals, workload, dynamics) the fork may take over, in place
    of new ones (their states are overwritten with ``sim``'s); a planner reuses them across
    forks.
    """
    new = object.__new__(type(sim))
    r = rngs or (None, None, None)
    # the parts, each copied by its own copy(); then every other attribute must be
    # immutable (shared)
    new.trace = None
    new.arrivals = sim.arrivals.copy(r[:2])
    tasks = _copy_work(sim, new)

    def m(task):
        return tasks[task.id] if task is not None else None

    new.current = m(sim.current)
    core = object.__new__(DecisionCore)
    core.__dict__.update(sim.core.__dict__)  # rules and counters (plain values)
    core.table = sim.table.copy(lambda t, _i: tasks[t.id])
    core.queue = sim.core.queue.copy(lambda t: tasks[t.id])  # same order: still a heap
    new.bind_core(core)
    new.submission = sim.submission.copy()
    new.busy_since = list(sim.busy_since)
    new.idle_since = list(sim.idle_since)
    new.scaling = new.sizer = None  # a fork does not size (envs.sim_scaling)
    new.resource_s = None if sim.resource_s is None else list(sim.resource_s)
    new.encoder = sim.encoder.copy()
    _copy_runs(sim, new, tasks)
    new.cluster = sim.cluster.copy(r[2], core.table, core.queue, new.event_q, new.hedges, new)
    nd = new.__dict__
    for k, v in sim.__dict__.items():
        if k in nd:
            continue
        if immutable(v):
            nd[k] = v
        else:
            raise TypeError(f"envs.fork: Simulator.{k} ({type(v).__name__}) is mutable state "
                            f"this module does not know how to copy; keep it in a part that "
                            f"copies itself (envs/fork.py)")
    return new


def _copy_work(sim: "Simulator", new: "Simulator") -> list[TaskRecord]:
    """``new``'s workflows and tasks: copies of ``sim``'s unfinished ones (relinked to each
    other), the finished ones shared. Returns ``new.tasks`` (indexed by task id)."""
    tasks = list(sim.tasks)
    workflows = list(sim.workflows)
    wf_map: dict[int, WorkflowRecord] = {}
    copies: list[tuple[TaskRecord, TaskRecord]] = []
    lo = new.done_below = unfinished_range(sim)
    tnew = TaskRecord.__new__
    wnew = WorkflowRecord.__new__
    for i in range(lo, len(tasks)):
        t = tasks[i]
        if t.state == DONE:
            continue
        w = t.wf
        wc = wf_map.get(w.id)
        if wc is None:
            wc = wnew(WorkflowRecord)
            wc.id, wc.arrival, wc.n, wc.done = w.id, w.arrival, w.n, w.done
            wc.lower_bound, wc.finish, wc.level = w.lower_bound, w.finish, w.level
            wc.kind = w.kind
            wc.tasks = w.tasks  # the originals; relinked to the copies below
            wf_map[w.id] = wc
            workflows[w.id] = wc
        c = tnew(TaskRecord)
        c.id, c.wf, c.compute, c.memory_gb = t.id, wc, t.compute, t.memory_gb
        c.output = t.output
        c.key, c.pending, c.state, c.slot, c.sid = t.key, t.pending, t.state, t.slot, t.sid
        c.start, c.finish, c.token, c.first_parent, c.waits = (t.start, t.finish, t.token,
                                                               t.first_parent, t.waits)
        c.rank = t.rank
        c.nominal, c.kind, c.hint, c.factor, c.factor2 = (t.nominal, t.kind, t.hint, t.factor,
                                                          t.factor2)
        c.expected, c.copy_slot, c.hedgeable = t.expected, t.copy_slot, t.hedgeable
        c.demands, c.copy_start, c.gpu, c.run_from = t.demands, t.copy_start, t.gpu, t.run_from
        tasks[i] = c
        copies.append((t, c))
    for t, c in copies:  # links: unfinished parents/children are the copies (same ids)
        c.parents = [tasks[p.id] for p in t.parents]
        c.children = [tasks[ch.id] for ch in t.children]
    for wc in wf_map.values():  # finished tasks are shared (never mutated again)
        wc.tasks = [tasks[tk.id] for tk in wc.tasks]
    new.tasks = tasks
    new.workflows = workflows
    return tasks


def _copy_runs(sim: "Simulator", new: "Simulator", tasks: list[TaskRecord]) -> None:
    """``new``'s run-time model, hedging state and event heap, pointing at ``tasks``."""
    rt = sim.run_model
    rt = None if rt is None else rt.copy()  # its runs take their estimates
    # and no unseen overhead (runtime.overhead_s)
    new.bind_runs(rt, sim.hedges.copy(lambda tk: tasks[tk.id], rt), 0.0)
    hidden = sim.finish_hidden

    def run(ev: tuple) -> tuple:
        t, kind, seq, slot, (tok, task) = ev
        if kind == FINISH and hidden:
            # with run-time noise or overhead a running task ends, in the fork, when it is
            # estimated to (the true finish stays hidden: envs.run_model)
            t = sim.expected_end(slot, task)
        return t, kind, seq, slot, (tok, tasks[task.id])

    new.event_q = sim.event_q.copy(run, reorder=hidden)
