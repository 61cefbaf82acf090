"""The rollout planner of Ray's resource model (``live.node_rule: lookahead[:K]``,
``policies.node_lookahead``) in the live scheduler: each ask builds the present from the
scheduler's own records as an ``envs.node_sim.Present`` and plans on it, as the node simulator's
planner plans on its episode.

The present, in model seconds (the node table's clock): the node table as the scheduler keeps it
(its runs' expected ends; a hedged task's other run a ``Copy`` that ends with it), every task of
the workflows with a task ready or running (finished ones, running ones on their nodes, waiting
ones with their unfinished parents), and the ready queue under the plain order's keys (the
fair-share tag, when on, is left out of the rollouts). A run still holding a node for a task
that is no longer running (a cancelled copy or a run of a failed workflow draining) is a
one-task request of its own that frees the node when the run is expected to end; a running task
whose run the table lost (its node gone) is ready again, as the scheduler will place it again.

Not a learned policy: it picks among the nodes where the task fits now, never waits. Should
planning raise (a bug), EFT decides that task, the error is logged and counted
(``counters["planner_errors"]``), and the scheduler thread goes on.
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from envs import order as orders
from envs.node_hedging import Copy
from envs.node_sim import NodeTask, Present, Request
from policies.node_lookahead import NodeLookahead
from policies.node_rules import eft

from .tasks import DONE, READY, RUNNING

if TYPE_CHECKING:
    from .placement import LivePlacement
    from .tasks import LiveTask

log = logging.getLogger(__name__)

__all__ = ["LiveNodePlanner", "present_of"]


class LiveNodePlanner:
    """``planner`` answering the live round's asks (``LivePlacement.round``)."""

    def __init__(self, planner: NodeLookahead, order: Callable[[], orders.Order],
                 counters: dict[str, Any]):
        self.planner, self._order, self.counters = planner, order, counters

    def ask(self, placement: "LivePlacement", t: "LiveTask", now: float,
            rng: np.random.Generator) -> int:
        """The node for ready ``t`` at model time ``now``."""
        try:
            present, task = present_of(placement, t, self._order(), now)
            return self.planner.plan(present, task)
        except Exception:  # noqa: BLE001 - a planner bug must not stop the scheduler thread
            self.counters["planner_errors"] += 1
            log.exception("node lookahead failed on task %d; EFT decides it", t.gid)
            return eft(placement.table, t, now, rng)


def present_of(placement: "LivePlacement", target: "LiveTask", order: orders.Order,
               now: float) -> tuple[Present, NodeTask]:
    """The present of ``placement`` at model time ``now`` and ``target``'s task in it (module
    docstring)."""
    mine, requests = _records(placement, _active(placement))
    ghosts: list[Request] = []
    present_table = placement.table.copy(_Runs(placement, mine, ghosts, now))
    held = {k for running in present_table.running for k in running}
    task = mine.get(target)
    if task is None or task.state != READY:
        raise RuntimeError(f"node lookahead: task {target.gid} is not ready")
    heap: list[tuple] = []
    for nt in mine.values():
        if nt.state == RUNNING and nt not in held:  # its run was lost: placed again
            nt.state = READY
        if nt.state == READY and nt is not task:
            w = nt.wf
            nt.key = order.key(nt.rank, w.arrival, w.id, w.level)
            heap.append((nt.key, nt.id, nt))
    task.key = (-math.inf,)  # the task asked about heads the queue (DecisionCore.resolve)
    heap.append((task.key, -1, task))
    heapq.heapify(heap)
    core = placement.core
    present = Present(present_table, requests + ghosts, type(placement.queue)(heap), core.rules,
                      core.node_look, order, now)
    return present, task


def _active(placement: "LivePlacement") -> list[Any]:
    """The workflows with a task ready or running (not failed), by arrival."""
    q = placement.queue
    active: dict[int, Any] = {}
    for entries in (q.heap, q.deferred, q.blocked):
        for e in entries:
            x = e[2]
            if x.state == READY and not x.wf.failed:
                active.setdefault(id(x.wf), x.wf)
    for running in placement.table.running:
        for x in running:
            if getattr(x, "state", None) == RUNNING and not x.wf.failed:
                active.setdefault(id(x.wf), x.wf)
    return sorted(active.values(), key=lambda w: (w.arrival, w.wid))


def _records(placement: "LivePlacement", active: list[Any]
             ) -> tuple[dict[Any, NodeTask], list[Request]]:
    """Each task of ``active`` as a ``NodeTask`` (live task -> it) and their requests."""
    mean_c = orders.mean_compute(s.node.compute for s in placement.alive)
    mine: dict[Any, NodeTask] = {}
    requests: list[Request] = []
    for wf in active:
        req = Request(wf.wid, wf.arrival)
        req.done, req.level = wf.done, wf.level
        for x in wf.tasks:
            c = x.prim.compute_gflop
            nt = mine[x] = NodeTask(x.gid, req, x.idx, x.prim.name, x.prim.ray_demands, c,
                                    x.kind)  # (full Ray demands: a waiting task's too)
            nt.state, nt.parents_left, nt.rank, nt.work = (x.state, len(x.waiting_for), x.rank,
                                                           c / mean_c)
            nt.waits = x.waits
            if x.state == RUNNING:
                pos = placement.position(x.server)
                nt.node, nt.start = -1 if pos is None else pos, placement.model(x.started)
            req.tasks.append(nt)
        for x in wf.tasks:
            mine[x].children = [mine[k] for k in x.children]
        requests.append(req)
    return mine, requests


class _Runs:
    """The present table's key of each run (``NodeTable.copy``'s remap, asked twice a run: its
    end, its hold): a running task's ``NodeTask`` on its node, its hedged copy a ``Copy``, any
    other run (draining) a one-task request of its own in ``ghosts``."""

    def __init__(self, placement: "LivePlacement", mine: dict[Any, NodeTask],
                 ghosts: list[Request], now: float):
        self.placement, self.mine, self.ghosts, self.now = placement, mine, ghosts, now
        self.keys: dict[tuple[int, int], Any] = {}  # (id of a live task, node) -> its key

    def __call__(self, x: Any, i: int) -> Any:
        key = self.keys.get((id(x), i))
        if key is not None:
            return key
        nt = self.mine.get(x)
        if nt is not None and nt.state == RUNNING and i == nt.node:
            key = nt
        elif nt is not None and nt.state == RUNNING and nt.copy is None and x.copy is not None:
            key = nt.copy = Copy(nt, i, self.placement.model(x.copy.started))
        else:  # a run draining: a request of its own that holds node i until the run ends
            req = Request(-1 - len(self.ghosts), self.now)
            key = NodeTask(-1, req, 0, "", x.demands, 0.0, "")
            key.state, key.node, key.start = RUNNING, i, self.now
            req.tasks.append(key)
            self.ghosts.append(req)
        self.keys[(id(x), i)] = key
        return key
