"""What enters the live scheduler: a submitted workflow (:class:`Admission`: its tasks' order
keys from ``envs.order``, behind their fair-share start tags when ``fair_share`` is on, their
dependencies, the tasks that finished before a restart (``Durability.resume``), the ready ones
queued for placement) and a change of the node set (:class:`NodeEvents`: servers added, servers
gone with their runs lost, server actors that answered).

Both are parts of :class:`scale_ray.live.scheduler.LiveScheduler` (mixins over its
scheduler-thread state: ``placement``, ``order``, ``_fair``, ``_next_gid``, ``_nodes``, ``cfg``).
"""

from __future__ import annotations

import time
from typing import Any

from envs import order as orders

from .handles import WorkflowHandle
from .tasks import DONE, LiveTask, LiveWorkflow


class Admission:
    """Admitting workflows (scheduler thread only)."""

    def _admit(self, h: WorkflowHandle) -> None:
        spec = h.workflow.spec
        # the order's times are model seconds, as in the simulator (envs.order.Order)
        prog = h.program  # a step of an agent program arrives when its program did
        wf = h.live_record = LiveWorkflow(h, h.submitted_wall, self._model_time(
            h.submitted_wall) if prog is None else prog.arrival)
        order, c = self.order, self.env.cluster
        servers = [(s.node.compute, s.node.memory_gb) for s in self.alive_servers] or [
            (t.compute, t.memory_gb) for t in self._tiers]
        mean_c = self._mean_compute = orders.mean_compute(c for c, _ in servers)
        gflop, kids = [ts.compute_gflop for ts in spec.tasks], spec.children()
        ranks = order.ranks(gflop, [ts.output_gb for ts in spec.tasks], kids, mean_c,
                            c.bandwidth_gb_s, c.latency_s)
        wf.wid = self._next_gid
        wf.level = order.level(wf.arrival, gflop, [t.memory_gb for t in spec.tasks],
                               [t.parents for t in spec.tasks], orders.by_speed(servers), mean_c)
        if prog is not None:  # its program's tie breaker and service (scale_ray.live.programs)
            prog.admitted(wf, order, self._next_gid)
        tags = None
        if self._fair is not None:  # start tags by work first (scale_ray.live.fairshare)
            in_order = sorted(range(len(gflop)), key=lambda i: (-ranks[i], i))
            works = [g / mean_c for g in gflop]
            if self.placement.pooled:  # resource-seconds: x the share of an average node held
                table = self.placement.table
                works = [w * table.dominant_share(c.primitive.ray_demands)
                         for w, c in zip(works, h.workflow.calls)]
            tags = self._fair.admit(h.tenant, works, in_order,
                                    (t.share for t, _ in self._running.values()))
        done = h.resumed_tasks or {}  # finished before a restart (Durability.resume)
        for i, call in enumerate(h.workflow.calls):
            t = LiveTask(self._next_gid, i, wf, call)
            self._next_gid += 1
            t.rank = ranks[i]
            if tags is not None:
                t.share = tags[i]
            t.key = self._key(t)
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
        if self.trace is not None:
            self._trace_arrival(h, wf)
        for t in wf.tasks:
            if t.state != DONE and not t.waiting_for:
                self.placement.push(t)
        if wf.done == len(wf.tasks) and not h.done():  # every task finished before a restart
            h.record_completion(time.perf_counter())

    def _trace_arrival(self, h: WorkflowHandle, wf: LiveWorkflow) -> None:
        """The trace's ``arrival`` event (a program's step: its program's first step, start)."""
        prog = h.program
        self._emit({"t": self._now_model(), "event": "arrival", "workflow": h.id,
                    "name": h.workflow.spec.name, "tasks": [
                        {"task": t.gid, "compute_gflop": t.prim.compute_gflop,
                         "memory_gb": t.prim.memory_gb, "output_gb": t.prim.output_gb,
                         "parents": [p.gid for p in t.parents]} for t in wf.tasks],
                    **({} if prog is None else {"program": prog.handles[0].id,
                                                "program_start": prog.arrival})})

    def _key(self, t: LiveTask) -> tuple:
        """A task's ready-queue key: the order's (``envs.order.Order``), behind its fair-share
        start tag when ``fair_share`` is on."""
        wf = t.wf
        key = self.order.key(t.rank, wf.arrival, wf.wid, wf.level)
        return key if self._fair is None else (t.share, *key)


class NodeEvents:
    """Node-set changes (scheduler thread only)."""

    def _refresh(self, force: bool = False) -> None:
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
            self.runs.server_gone(srv, f"node {srv.node.node_id[:12]} is gone")
            self._emit({"t": self._now_model(), "event": "server_fail", "server": srv.sid,
                        "node": srv.node.node_id})
        if added or gone:  # (a task that fit nowhere may fit a new node: queued again)
            self._set_alive(self._nodes.alive())

    def _check_probes(self, ray: Any) -> None:
        """Servers whose starting actor answered are offered again. A failed start forces a
        node refresh (which drops a node that is gone) and is retried, still masked, after
        ``nodes.ACTOR_RETRY_S`` (a dying node fails every start until the GCS drops it)."""
        failed = self._nodes.check_probes(ray)
        if failed:
            self._refresh(force=True)
            self._nodes.back_off(failed)
