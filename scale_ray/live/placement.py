"""The live scheduler's side of the decision core (``envs.decision``).

:class:`LivePlacement` keeps the alive servers in the core's server table (a server *accepts*
work once its actor answers: ``offered``), the ready tasks in the core's queue, and turns the
scheduler's wall clock into the encoder's model seconds (remaining busy time = estimated finish
- now, divided by ``time_scale``, never 0 for a busy server). The rules of a placement round are
the core's: the live scheduler always masks servers a task does not fit (memory, and the demands
of its Ray options against each server's capacities: ``NodeInfo.caps``), and asks the policy
only when some accepting idle server fits the task (``ask_only_startable``); a task that fits
no accepting server is set aside until the server set changes or a server's actor answers.

In Ray's resource model (``LiveConfig.model: nodes``, :meth:`LivePlacement.use_model`) the core's
table is an ``envs.nodes.NodeTable`` of the whole nodes: a task may start where its full Ray
demands fit what is free, the node rule (``policies.node_rules``) picks, and every run holds
its demands until it ends (:meth:`LivePlacement.release`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from envs.config import FeatureConfig
from envs.decision import DecisionCore, ReadyQueue, Rules, ServerTable, task_vector
from envs.encoding import ServerView, TaskView
from envs.nodes import NodeTable
from policies.node_learned import node_decider

from .cluster import node_spec
from .node_planning import LiveNodePlanner
from .tasks import READY, WAITING

if TYPE_CHECKING:
    from .fairshare import TenantOrder
    from .nodes import LiveServer
    from .tasks import LiveTask


class LivePlacement:
    """Decision-core state of one :class:`scale_ray.live.scheduler.LiveScheduler`."""

    def __init__(self, features: FeatureConfig, bandwidth_gb_s: float, latency_s: float,
                 head_of_line_blocking: bool, time_scale: float):
        self.features = features
        self._bw, self._lat = bandwidth_gb_s, latency_s
        self._ts = time_scale if time_scale > 0 else 1.0
        #: wall s (perf_counter) of model time 0: the scheduler's clock_origin, so that the
        #: node table's times and the rules' ``now`` are the model seconds a workflow's arrival
        #: is in (a learned node policy reads the difference: a request's age)
        self.origin = 0.0
        self.core = DecisionCore(ServerTable(0, features),
                                 Rules(head_of_line_blocking, ask_only_startable=True,
                                       mask_infeasible=True))
        self.alive: list[LiveServer] = []
        self._pos: dict[int, int] = {}
        # Ray's resource model (LiveConfig.model: nodes): a NodeTable, placed by a node rule
        self.pooled = False
        self.rule: Callable[..., int] | None = None
        self.planner: LiveNodePlanner | None = None  # node_rule lookahead (node_planning)
        # Ray's resource model: a round only after something changed (a task became ready or
        # was re-keyed, a run ended, the node set or an actor changed), as the simulator runs
        # one at each event; the node rules read no clock between events
        self.changed = True
        self._rng = np.random.default_rng(0)
        # Ray's resource model with LiveConfig.estimator online: the node rules plan with the
        # estimator's run per kind and node shape (the configured speeds are its prior)
        self.estimator: Any = None
        self.max_memory = 0.0  # largest memory of an alive server (offered or not)
        # the compute (GFLOP) the policy is shown for a task; default its declared compute
        self.shown: Callable[[Any], float] = lambda t: t.prim.compute_gflop
        #: the fair share's second level: a tenant's tags in the configured order (None: off)
        self.lanes: TenantOrder | None = None

    @property
    def queue(self) -> ReadyQueue:
        return self.core.queue

    @property
    def table(self) -> ServerTable | NodeTable:
        return self.core.servers

    def use_model(self, pooled: bool, rule: str, order: Callable[[], Any],
                  counters: dict[str, Any]) -> None:
        """Ray's resource model (``pooled``: servers are whole nodes, placed by the node rule
        ``rule``, ``policies.node_learned.node_decider``; the planner reads the ready-queue
        ``order`` and counts its errors in ``counters``) or the slot model from now on;
        :meth:`set_alive` builds the table. Queued tasks switch their demands with it (the
        model follows where the servers come from, which an empty cluster does not tell yet)."""
        self.pooled = pooled
        self.rule = node_decider(rule) if pooled else None
        self.planner = (LiveNodePlanner(self.rule, order, counters)
                        if hasattr(self.rule, "plan") else None)
        self.changed = True
        q = self.queue
        for entries in (q.heap, q.deferred, q.blocked):
            for e in entries:
                e[2].pooled = pooled

    # ------------------------------------------------------------------ servers
    def set_alive(self, alive: list[LiveServer]) -> None:
        """The servers the policy sees, in this order (a node-set change)."""
        self.alive = alive
        self._pos = {id(s): i for i, s in enumerate(alive)}
        self.changed = True
        self.max_memory = max((s.node.memory_gb for s in alive), default=0.0)
        if self.pooled:  # the nodes' resources; the runs already on them hold theirs
            table = NodeTable([node_spec(s.node) for s in alive])
            if self.estimator is not None:
                est = self.estimator
                table.estimate = lambda t, i, run: est.duration(t.kind, alive[i].node.tier,
                                                                 run)
            for i, s in enumerate(alive):
                table.set_accepting(i, s.offered)
                for t, until in s.running.items():  # expected ends, wall -> model s
                    table.start(i, t, t.demands, self.model(until))
            self.core.servers = table
            self.queue.requeue_blocked()
            return
        self.core.servers = ServerTable(len(alive), self.features)
        self.core.servers.set_caps([dict(s.node.caps) for s in alive])  # tasks' Ray demands
        self.sync(0.0)
        self.queue.requeue_blocked()  # a task that fit nowhere may fit a new server

    def set_features(self, features: FeatureConfig) -> None:
        """Encode with ``features`` (a new policy); :meth:`set_alive` rebuilds the table."""
        self.features = features

    def set_offered(self, srv: LiveServer, offered: bool) -> None:
        """``srv``'s actor answered (True) or is starting again (False)."""
        srv.offered = offered
        self.changed = True
        i = self._pos.get(id(srv))
        if i is not None:
            self.table.set_accepting(i, offered)
            if offered:
                self.queue.requeue_blocked()

    def model(self, wall: float) -> float:
        """Model seconds at wall time ``wall`` (``perf_counter``), from :attr:`origin`."""
        return (wall - self.origin) / self._ts

    def position(self, srv: LiveServer | None) -> int | None:
        return None if srv is None else self._pos.get(id(srv))

    def release(self, srv: LiveServer, t: LiveTask, now: float) -> None:
        """``t``'s run on ``srv`` ended or was stopped: the server (and, in Ray's resource
        model, the node's resources it held) free again."""
        if srv.release(t, now) and self.pooled:
            i = self._pos.get(id(srv))
            if i is not None:  # (a node gone: the table was rebuilt without it)
                self.table.finish(t, i)
            self.changed = True

    def hold(self, srv: LiveServer, t: LiveTask) -> None:
        """In Ray's resource model: a run of ``t`` started on ``srv`` outside a round (a hedged
        copy) holds its demands there until it is released."""
        i = self._pos.get(id(srv))
        if self.pooled and i is not None:
            self.table.start(i, t, t.demands, self.model(srv.running[t]))

    def sync(self, now: float) -> None:
        """The table at wall time ``now``: busy servers' remaining model seconds and power."""
        if self.pooled:  # the node table is kept as runs start and end
            return
        alive = self.alive
        n = len(alive)
        remaining = np.zeros(n)
        power = np.empty(n)
        for i, s in enumerate(alive):
            if s.task is None:
                power[i] = s.node.idle_w
            else:  # busy: estimated time left, never 0 (0 means idle to the policy)
                remaining[i] = max((s.busy_until - now) / self._ts, 1e-3)
                power[i] = s.node.busy_w
        self.table.set_servers(
            np.fromiter((s.node.compute for s in alive), float, n),
            np.fromiter((s.node.memory_gb for s in alive), float, n), power,
            np.fromiter((s.node.busy_w for s in alive), float, n),
            np.fromiter((s.offered for s in alive), bool, n), remaining)

    # ------------------------------------------------------------------ tasks
    def push(self, t: LiveTask) -> None:
        """``t`` is ready (a task of a failed workflow is not queued)."""
        if t.wf.failed:
            t.state = WAITING
            return
        t.state = READY
        t.pooled = self.pooled  # its demands: the full Ray request in Ray's resource model
        self.rekey(t)

    def rekey(self, t: LiveTask) -> None:
        """Ready ``t`` is queued (again, under a new order key: a dynamic order; the queue
        drops the older entry when it reaches the top). With the fair share, its tenant's
        tags are dealt out in order first (``lanes``): the tasks whose tags moved are queued
        again too."""
        if self.lanes is not None:
            for u in self.lanes.enter(t):
                self.queue.push(u.key, u.gid, u)
        self.queue.push(t.key, t.gid, t)
        self.changed = True

    def views(self, t: LiveTask, now: float) -> tuple[TaskView, list[ServerView]]:
        """The task and the alive servers as the encoder's plain descriptions at wall time
        ``now`` (``envs.encoding.encode(*views)`` equals :meth:`observe`; a test checks it)."""
        views = []
        for s in self.alive:
            if s.task is None:
                rem, power = 0.0, s.node.idle_w
            else:
                rem, power = max((s.busy_until - now) / self._ts, 1e-3), s.node.busy_w
            views.append(ServerView(s.node.compute, s.node.memory_gb, rem, power,
                                    accepting=s.offered))
        fp = t.first_parent
        wf = t.wf
        # A finished parent whose server is gone: every server pays the transfer (as in the
        # simulator), hence has_parent.
        return TaskView(self.shown(t), t.prim.memory_gb, t.prim.output_gb, len(t.children),
                        wf.done / len(wf.tasks), self.position(fp and fp.last_server),
                        fp.prim.output_gb if fp is not None else 0.0,
                        has_parent=fp is not None, ready_tasks=self.queue.ready_count(t.gid),
                        workflow_age_s=(now - wf.arrival_wall) / self._ts), views

    def observe(self, t: LiveTask, now: float) -> dict[str, np.ndarray]:
        """The observation of placing ``t`` at wall time ``now`` (the table synced to ``now``)."""
        self.sync(now)
        fp = t.first_parent
        transfer = 0.0 if fp is None else fp.prim.output_gb / self._bw + self._lat
        wf, prim, f = t.wf, t.prim, self.features
        vec = task_vector(f, self.shown(t), prim.memory_gb, len(t.children),
                          wf.done / len(wf.tasks), prim.output_gb,
                          self.queue.ready_count(t.gid) if f.backlog else 1,
                          int(self.table.accepting.sum()) if f.backlog else 0,
                          (now - wf.arrival_wall) / self._ts)
        return self.table.observe(vec, 0.0, transfer, self.position(fp and fp.last_server),
                                  prim.memory_gb, True, prim.demands)

    def round(self, now: Callable[[], float], ask: Callable[[Any, dict], int],
              start: Callable[[Any, Any], None]) -> None:
        """One placement round: ``ask(task, observation) -> position`` (policy and guard),
        ``start(task, server)`` runs a valid pick (its server is marked busy here)."""
        table = self.table
        if self.pooled:
            if not self.changed:
                return
            self.changed = False
            rule, rng, planner = self.rule, self._rng, self.planner

            def ask_node(t: LiveTask) -> int:  # times in model s, as the rules' run times
                if planner is not None:
                    return planner.ask(self, t, self.model(now()), rng)
                return rule(table, t, self.model(now()), rng)

            def start_node(t: LiveTask, i: int) -> None:
                srv = self.alive[i]
                start(t, srv)
                table.start(i, t, t.demands, self.model(srv.running.get(t, now())))

            self.core.run_round(ask_node, start_node)
            return
        self.sync(now())

        def ask_core(t: LiveTask) -> int:
            return ask(t, self.observe(t, now()))

        def start_core(t: LiveTask, i: int) -> None:
            srv = self.alive[i]
            start(t, srv)
            table.start(i, 1.0)  # busy; its remaining time is read again at the next sync

        self.core.run_round(ask_core, start_core)
