"""What enters the live scheduler: a submitted workflow (:class:`Admission`: its tasks' order
keys from ``envs.order``, what placing each charges its tenant when ``fair_share`` is on
(``envs.fairshare``), their dependencies, the tasks that finished before a restart
(``Durability.resume``), the ready ones queued for placement) and a change of the node set (:class:`NodeEvents`: servers added, servers
gone with their runs lost, server actors that answered).

Both are parts of :class:`scale_ray.live.scheduler.LiveScheduler` (``sched.admission``,
``sched.node_events``), used on its scheduler thread only; what each needs of the rest comes in
through its constructor.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any, Callable

from envs import order as orders
from envs.fairshare import MIN_SHARE

from .context import LiveContext
from .handles import WorkflowHandle
from .nodes import LiveServer, NodeSet
from .placement import LivePlacement
from .tasks import DONE, READY, LiveTask, LiveWorkflow

WAKE_LOOK = 256  # waiting tasks looked at to wake reaped servers (NodeSet.wake)

class Admission:
    """Admitting workflows (scheduler thread only).

    Args:
        ctx: the scheduler's settings (its env's tiers stand in for the servers while none is
            offered), clock and trace.
        order: the ready-task order now (a callable: a policy swap may change it).
        placement: the placement round (``push``; its servers, its ``table`` for
            resource-seconds).

    Owns the task ids (``next_gid``) and ``costs``, how the order priced work at the last
    admission (``envs.order.Costs`` of the offered servers; a dynamic order's re-key uses it).
    """

    def __init__(self, ctx: LiveContext, order: Callable[[], orders.Order],
                 placement: LivePlacement) -> None:
        self.env, self._order, self.placement = ctx.env, order, placement
        self._fair = placement.fair
        self._ctx = ctx
        self.next_gid = 0
        self.costs = orders.Costs()

    def _costs(self) -> orders.Costs:
        """The order's prices of the live servers, else of the configured tiers."""
        nodes = [(s.node.compute, s.node.gpu_compute or s.node.compute, s.node.memory_gb,
                  any(k == "GPU" for k, _ in s.node.caps)) for s in self.placement.alive]
        if not nodes:
            nodes = [(nd.cpu_speed, nd.gpu_speed, nd.memory_gb, bool(nd.resources.get("GPU")))
                     for nd in self.env.cluster.nodes()]
        return orders.Costs.of(nodes, self.env.cluster.network)

    def work_s(self, workflow: Any, costs: orders.Costs | None = None,
               floor: float = 0.0) -> list[float]:
        """Each call's work in resource-seconds: its run at the servers' mean speed for its
        kind of work (model s; ``costs``, else the live servers' now) times the largest share
        of an average node what it holds there takes (1 a slot in the paper's model; DRF's
        weighing), at least ``floor``. The fair share charges it (``floor``
        ``envs.fairshare.MIN_SHARE``) and the service's quotas count it."""
        costs = costs or self._costs()
        placement = self.placement
        table = placement.table
        out = []
        for ts, c in zip(workflow.spec.tasks, workflow.calls):
            r = c.primitive.request
            held = r.on_slot() if placement.slotted else r.on_nodes()
            out.append(costs.work_s(ts.compute_gflop, r.gpu > 0)
                       * max(table.dominant_share(held), floor))
        return out

    def admit(self, h: WorkflowHandle) -> None:
        """Build ``h``'s live record (keys, parents, tasks finished before a restart) and queue
        its ready tasks."""
        spec = h.workflow.spec
        # the order's times are model seconds, as in the simulator (envs.order.Order)
        prog = h.program  # a step of an agent program arrives when its program did
        wf = h.live_record = LiveWorkflow(h, h.submitted_wall, self._ctx.model_time(
            h.submitted_wall) if prog is None else prog.arrival)
        order = self._order()
        costs = self.costs = self._costs()
        calls = h.workflow.calls
        graph = orders.Graph([ts.compute_gflop for ts in spec.tasks],
                             [ts.memory_gb for ts in spec.tasks],
                             [ts.output_gb for ts in spec.tasks],
                             [c.primitive.request.gpu > 0 for c in calls], spec.children(),
                             [ts.parents for ts in spec.tasks])
        wf.wid = self.next_gid
        if prog is not None:  # a step of a program keys as its program (scale_ray.live.programs)
            prog.admitted(wf, self.next_gid)
        # a step of a program: its program's service so far (las) and tie breaker
        keyed = order.arrive(graph, wf.arrival, wf.wid, costs,
                             prog.attained if prog is not None else 0.0)
        ranks = keyed.ranks
        wf.level = keyed.level
        # what placing each task charges its tenant (envs.fairshare)
        works = self.work_s(h.workflow, costs, MIN_SHARE) if self._fair is not None else None
        done = h.resumed_tasks or {}  # finished before a restart (Durability.resume)
        for i, call in enumerate(h.workflow.calls):
            t = LiveTask(self.next_gid, i, wf, call)
            self.next_gid += 1
            t.rank = ranks[i]
            if works is not None:
                t.work = works[i]
            t.key = self.key(t)
            t.parents = [wf.tasks[p] for p in spec.tasks[i].parents]
            t.waiting_for = {p.idx for p in t.parents if p.state != DONE}
            t.runs = h.prior_runs.get(i, 0)
            for p in t.parents:
                p.children.append(t)
            if i in done:
                t.value_ref, node, finished = done[i]
                t.state = DONE
                wf.done += 1
                h.record_task_done(i, t.value_ref, node, finished)
            wf.tasks.append(t)
        h.resumed_tasks = None
        if self._ctx.trace is not None:
            self._trace_arrival(h, wf)
        for t in wf.tasks:
            if t.state != DONE and not t.waiting_for:
                self.placement.push(t)
        if wf.done == len(wf.tasks) and not h.done():  # every task finished before a restart
            h.record_completion(time.perf_counter())

    def _trace_arrival(self, h: WorkflowHandle, wf: LiveWorkflow) -> None:
        """The trace's ``arrival`` event (a program's step: its program's first step, start)."""
        prog = h.program
        self._ctx.emit({"t": self._ctx.now_model(), "event": "arrival", "workflow": h.id,
                        "name": h.workflow.spec.name, "tasks": [
                            {"task": t.gid, "compute_gflop": t.prim.compute_gflop,
                             "memory_gb": t.prim.memory_gb, "output_gb": t.prim.output_gb,
                             "parents": [p.gid for p in t.parents]} for t in wf.tasks],
                        **({} if prog is None else {"program": prog.handles[0].id,
                                                    "program_start": prog.arrival})})

    def key(self, t: LiveTask) -> tuple:
        """A task's ready-queue key: the order's (``envs.order.Order``); with the fair share,
        its place among its tenant's tasks (``envs.fairshare.FairQueue``)."""
        wf = t.wf
        return self._order().key(t.rank, wf.arrival, wf.wid, wf.level)


class NodeEvents:
    """Node-set changes (scheduler thread only).

    Args:
        ctx: the scheduler's clock and trace.
        nodes: the node set (``refresh``, ``check_probes``, ``back_off``).
        server_gone: a server is gone (its runs are lost).
        set_alive: the servers offered from now on (``LiveScheduler.set_alive``).
    """

    def __init__(self, ctx: LiveContext, nodes: NodeSet,
                 server_gone: Callable[[LiveServer, str], None],
                 set_alive: Callable[[list[LiveServer]], None]) -> None:
        self._nodes, self._server_gone, self._set_alive = nodes, server_gone, set_alive
        self._now_model, self._emit = ctx.now_model, ctx.emit

    def refresh(self, force: bool = False) -> None:
        """Read the node set (when due, or ``force``): servers added and gone are traced, a
        gone server's runs lost, the offered servers updated."""
        change = self._nodes.refresh(force)
        if change is None:  # not due
            return
        added, gone = change
        for srv in added:
            n = srv.node
            self._emit({"t": self._now_model(), "event": "server_add", "server": srv.sid,
                        "tier": n.tier, "compute": n.compute, "memory_gb": n.memory_gb,
                        "node": n.node_id, "slot": srv.slot})
        for srv in gone:
            self._server_gone(srv, f"node {srv.node.node_id[:12]} is gone")
            self._emit({"t": self._now_model(), "event": "server_fail", "server": srv.sid,
                        "node": srv.node.node_id})
        if added or gone:  # (a task that fit nowhere may fit a new node: queued again)
            self._set_alive(self._nodes.alive())

    def check_probes(self, ray: Any) -> None:
        """Servers whose starting actor answered are offered again. A failed start forces a
        node refresh (which drops a node that is gone) and is retried, still masked, after
        ``nodes.ACTOR_RETRY_S`` (a dying node fails every start until the GCS drops it)."""
        failed = self._nodes.check_probes(ray)
        if failed:
            self.refresh(force=True)
            self._nodes.back_off(failed)

    def tend_actors(self, ray: Any, queue: Any, alive: list[LiveServer]) -> None:
        """A round's care of the server actors: answered probes, cold starts retried, idle
        actors reaped, reaped servers woken for the tasks that wait (``queue``: the ready
        queue; up to ``WAKE_LOOK`` of its tasks, so a round stays O(1) under any backlog)."""
        nodes = self._nodes
        if nodes.probes:
            self.check_probes(ray)
        if nodes.cold:
            nodes.retry_cold()
        nodes.reap(alive)
        if nodes.reaped and (queue.heap or queue.deferred or queue.blocked):
            waiting = islice(queue.entries(), WAKE_LOOK)
            nodes.wake([e[2].prim.memory_gb for e in waiting if e[2].state == READY], alive)
