"""The live runtime's side of the decision core (``envs.decision``) over the one table of nodes
(``envs.nodes``).

:class:`LivePlacement` keeps the alive servers as the table's nodes (a server *accepts* work once
its actor answers: ``offered``): a server of one slot (a ``scale_slot`` server, or a slot of a
plain node under ``live.model: slots``) is a node ``{slot: 1, memory: M}`` plus its share of the
node's resources, a whole Ray node (``live.model: nodes``) its resources; every run holds its
task's demands there until it ends (:meth:`LivePlacement.release`), in model seconds (wall s /
``time_scale``), as the simulator's. The rules of a placement round are the core's: the live
runtime asks the policy only when some node can start the task now (``ask_only_startable``); a
task no node could ever hold is set aside until the server set changes or an actor answers. A
round runs only after something changed (a task became ready or was re-keyed, a run ended, the
servers or an actor changed), as the simulator runs one at each event.

:class:`LiveState` is a decision as a policy sees it (``policies.base.State``): the table, the
task, the model clock, its input's node, and the observation the policy's encoder makes of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from envs.config import FeatureConfig
from envs.decision import DecisionCore, ReadyQueue, Rules
from envs.fairshare import FairQueue, FairShare
from envs.encoding import TaskFacts, make_encoder
from envs.nodes import NodeTable
from envs.run_model import residual_s, show_overdue

from .cluster import server_spec
from .context import LiveContext
from .tasks import READY, RUNNING, WAITING

if TYPE_CHECKING:
    from .nodes import LiveServer
    from .tasks import LiveTask


class LiveState:
    """One decision of the live runtime (``policies.base.State``): ``now`` in model seconds,
    ``wall`` the wall time (``perf_counter``) of the round that asks."""

    __slots__ = ("placement", "table", "task", "now", "wall", "parent", "transfer_s",
                 "transfer_delays")

    def __init__(self, placement: "LivePlacement", task: "LiveTask", wall: float):
        self.placement, self.table, self.task = placement, placement.table, task
        self.now, self.wall = placement.model(wall), wall
        fp = task.first_parent
        pos = placement.position(fp.last_server) if fp is not None else None
        self.parent = -1 if pos is None else pos
        self.transfer_s = 0.0 if fp is None else placement.network.transfer_s(fp.prim.output_gb)
        self.transfer_delays = placement.transfer_delays

    def facts(self) -> TaskFacts:
        t, p = self.task, self.placement
        wf, prim = t.wf, t.prim
        return TaskFacts(p.shown(t), prim.memory_gb, len(t.children), wf.done / len(wf.tasks),
                         prim.output_gb, self.transfer_s, self.parent,
                         p.queue.ready_count(t.gid) if p.features.backlog else 1,
                         self.now - wf.arrival)

    def observe(self) -> dict[str, np.ndarray]:
        return self.placement.encoder.observe(self.table, self.task, self.facts(), self.now)

    def simulator(self) -> Any:
        raise RuntimeError("the live runtime's planner plans on a snapshot "
                           "(scale_ray.live.planning)")


class LivePlacement:
    """Decision-core state of one :class:`scale_ray.live.scheduler.LiveScheduler`.

    Args:
        ctx: the scheduler's settings (``head_of_line_blocking``, the env's network and
            transfer rule), model clock and estimator (``live.estimator: online``: the rules
            plan with its run per kind and node shape, the configured speeds its prior).
        features: the encoder constants of the policy's observations.
        encoder: the policy's observation (``env.encoder``).
    """

    def __init__(self, ctx: LiveContext, features: FeatureConfig, encoder: str = "paper"):
        self.ctx = ctx
        self.features, self.encoder_name = features, encoder
        self.network = ctx.env.cluster.network
        self.transfer_delays = ctx.env.mdp.transfer_delays_start
        ts = ctx.cfg.time_scale
        self._ts = ts if ts > 0 else 1.0
        self.core = DecisionCore(NodeTable([]), Rules(ctx.cfg.head_of_line_blocking,
                                                      ask_only_startable=True,
                                                      mask_infeasible=True))
        self.encoder = make_encoder(encoder, features, 0, True)
        self.alive: list[LiveServer] = []
        self._pos: dict[int, int] = {}
        #: the servers are slots (one task each) or whole Ray nodes (their tasks' full Ray
        #: requests): what a run holds on its node (``LiveTask.demands``)
        self.slotted = True
        self.changed = True  # a round only after something changed (module docstring)
        self.estimator = est = ctx.estimator
        # the compute (GFLOP) the policy is shown for a task: its declared one, or the
        # estimator's of its kind
        self.shown: Callable[[Any], float] = (
            (lambda t: t.prim.compute_gflop) if est is None
            else (lambda t: est.gflop(t.prim.kind, t.prim.compute_gflop)))
        #: the two-level fair share between tenants (``live.fair_share``; None: off): the
        #: core's queue takes the smallest-tag tenant's task first (``envs.fairshare``)
        self.fair: FairShare | None = None
        if ctx.cfg.fair_share:
            self.fair = FairShare(alive=lambda t: (t.state == RUNNING or t.state == READY)
                                  and not t.wf.failed)
            self.core.queue = FairQueue(self.fair, lambda t: t.wf.handle.tenant,
                                        lambda t: t.work)

    @property
    def origin(self) -> float:
        """Wall s (``perf_counter``) of model time 0 (the scheduler's clock), so that the
        table's times and the rules' ``now`` are the model seconds a workflow's arrival is in."""
        return self.ctx.origin

    @origin.setter
    def origin(self, wall: float) -> None:
        self.ctx.origin = wall

    @property
    def queue(self) -> ReadyQueue:
        return self.core.queue

    @property
    def table(self) -> NodeTable:
        return self.core.table

    # ------------------------------------------------------------------ servers
    def set_alive(self, alive: list[LiveServer], slotted: bool | None = None) -> None:
        """The servers the policy sees, in this order (a node-set change); ``slotted``: whether
        they are slots (None: as before)."""
        if slotted is not None and slotted != self.slotted:
            self.slotted = slotted
            q = self.queue
            for e in q.entries():  # what a run holds changed
                e[2].demands = self.demands_of(e[2])
        self.alive = alive
        self._pos = {id(s): i for i, s in enumerate(alive)}
        self.changed = True
        specs = [server_spec(s.node, not self.slotted) for s in alive]
        table = NodeTable(specs, shapes=specs)
        if self.estimator is not None:
            est = self.estimator
            table.estimate = lambda t, i, run: est.duration(t.kind, alive[i].node.tier, run)
        for i, s in enumerate(alive):
            table.set_accepting(i, s.offered)
            for t, until in s.running.items():  # the runs already there hold theirs
                table.start(i, t, t.demands, self.model(until))
        self.core.table = table
        self.encoder = make_encoder(self.encoder_name, self.features, len(alive), True)
        self.queue.requeue_blocked()  # a task that fit nowhere may fit a new server

    def set_encoder(self, features: FeatureConfig, encoder: str) -> None:
        """Encode with ``features`` and ``encoder`` (a new policy's)."""
        self.features, self.encoder_name = features, encoder
        self.encoder = make_encoder(encoder, features, len(self.alive), True)

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
        return self.ctx.model_time(wall)

    def position(self, srv: LiveServer | None) -> int | None:
        return None if srv is None else self._pos.get(id(srv))

    def release(self, srv: LiveServer, t: LiveTask, now: float) -> None:
        """``t``'s run on ``srv`` ended or was stopped: the resources it held there are free."""
        if srv.release(t, now):
            i = self._pos.get(id(srv))
            if i is not None:  # (a node gone: the table was rebuilt without it)
                self.table.finish(t, i)
            self.changed = True

    def hold(self, srv: LiveServer, t: LiveTask) -> None:
        """A run of ``t`` started on ``srv`` outside a round (a hedged copy) holds its demands
        there until it is released."""
        i = self._pos.get(id(srv))
        if i is not None:
            t.demands = t.demands or self.demands_of(t)
            self.table.start(i, t, t.demands, self.model(srv.running[t]))

    # ------------------------------------------------------------------ tasks
    def demands_of(self, t: LiveTask) -> tuple:
        """What a run of ``t`` holds on one of these servers (``envs.demands.Request``)."""
        r = t.prim.request
        return r.on_slot() if self.slotted else r.on_nodes()

    def push(self, t: LiveTask) -> None:
        """``t`` is ready (a task of a failed workflow is not queued)."""
        if t.wf.failed:
            t.state = WAITING
            return
        t.state = READY
        t.demands = self.demands_of(t)
        self.rekey(t)

    def rekey(self, t: LiveTask) -> None:
        """Ready ``t`` is queued (again, under a new order key: a dynamic order; the queue
        drops the older entry when it reaches the top; with the fair share, in its tenant's
        lane)."""
        self.queue.push(t.key, t.gid, t)
        self.changed = True

    def refresh(self, now: float) -> None:
        """A run past its expected end at wall time ``now`` never looks done
        (``envs.run_model.show_overdue``, the simulator's rule): it shows the estimator's
        expected residual life (``live.estimator: online``), else ``OVERDUE_S`` left."""
        show_overdue(self.table, self.model(now),
                     None if self.estimator is None else self._residual)

    def _residual(self, t: LiveTask, i: int, now: float) -> float:
        """An overdue run's expected time left (model s; ``envs.run_model.residual_s``)."""
        expected = t.prim.compute_gflop / self.table.speed(i, t.demands)
        started = t.copy.started if t.copy is not None and t.copy.server is self.alive[i] \
            else t.started
        return residual_s(self.estimator, t.prim.kind, self.alive[i].node.tier, expected,
                          now - self.model(started))

    def state(self, t: LiveTask, now: float) -> LiveState:
        """The decision of placing ``t`` at wall time ``now``."""
        return LiveState(self, t, now)

    def round(self, now: Callable[[], float], ask: Callable[[Any, LiveState], int],
              start: Callable[[Any, Any], None],
              failed: Callable[[Any, str, Exception], None] | None = None) -> None:
        """One placement round (when something changed): ``ask(task, state) -> position``
        (the policy, its guard), ``start(task, server)`` runs a valid pick; its demands are
        taken on the table here.

        ``failed(task, stage, error)``: an error while deciding on a task (``stage``
        ``place``: the policy, the encoder, the decision core) or starting it (``start``:
        Ray's ``.options()``, the submission) is that task's: it leaves the queue, nothing is
        held for it, ``failed`` is told (the caller fails its workflow) and the round goes on
        with the next task. Without ``failed`` the error propagates."""
        if not self.changed:
            return
        self.changed = False
        table = self.table
        self.refresh(now())

        def ask_node(t: LiveTask) -> int:
            if failed is None:
                return ask(t, self.state(t, now()))
            try:
                return ask(t, self.state(t, now()))
            except Exception as e:  # noqa: BLE001 - this task's, not the round's
                failed(t, "place", e)
                return 0  # (a position the core can resolve; the task is no longer ready)

        def start_node(t: LiveTask, i: int) -> None:
            if t.state != READY:  # its workflow failed while it was decided on
                return
            srv = self.alive[i]
            if failed is None:
                start(t, srv)
            else:
                try:
                    start(t, srv)
                except Exception as e:  # noqa: BLE001 - nothing was held for it yet
                    failed(t, "start", e)
                    return
            table.start(i, t, t.demands, self.model(srv.running.get(t, now())))

        while True:
            try:
                self.core.run_round(ask_node, start_node)
                return
            except Exception as e:
                # raised by the core (its table, the queue) while the task at the head of the
                # queue was looked at: that task's; every other task keeps its place
                queue = self.queue
                if failed is None or not queue.heap:
                    raise
                t = queue.heap[0][2]
                queue.drop_head()
                failed(t, "place", e)
