"""Discrete-event simulator of workflow DAGs on a heterogeneous, elastic cluster of nodes
(numpy + stdlib): the one simulator, of the paper's servers of one slot and of Ray's nodes
alike (``envs.nodes``).

Decision semantics (paper §4.1, docs/simulator.md):

* The order (``mdp.order``, envs/order.py) picks the current task from the ready set: the
  paper's longest hop-count path to a sink unless set (HEFT's upward rank, oldest workflow
  first, ...), then the task id.
* The agent picks a node. A *valid* pick (the node accepts work and the task's demands fit its
  free resources: on a server of one slot, it is idle and the memory fits) starts the task at
  once and the clock does not move. Any other pick is a *wait*: it earns the invalid penalty
  and the clock advances by ``wait_dt_s`` (or to the next event), processing finishes,
  arrivals and node changes on the way.
* When the ready set is empty the clock advances to the next event.

Invariants: a node holds at most its resources (a server of one slot runs at most one task); a
task starts only when all parents have finished (plus the transfer when
``transfer_delays_start``); a started task runs ``compute / speed`` seconds without preemption
unless its node fails, in which case it is *lost* and becomes ready again. Every arrived task
finishes exactly once per episode unless the episode is truncated.

Randomness: the workload (arrivals, DAGs) and the cluster dynamics draw from separate generators
spawned from one seed, so the same seed gives the same workload under every policy.

The parts the simulator owns (each copies itself for a fork): the decision core with its table
and ready queue (``envs.decision``), the events (``envs.events``), the arrivals
(``envs.sim_arrivals``), the node dynamics (``envs.sim_cluster``), the run model and hedging
(``envs.run_model``, ``envs.hedging``), what the order may read (``envs.programs``), the encoder
(``envs.encoding``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from . import fork as forks, order as orders, sim_snapshot
from .config import EnvConfig
from .decision import (DONE, HOL_WAIT, READY, RUNNING, WAITING, DecisionCore,  # noqa: F401
                       Rules)  # (the task states are re-exported)
from .demands import CPU, GPU
from .encoding import TaskFacts, make_encoder
from .episode import (StepResult, TaskRecord, TraceSink, WorkflowRecord, arrival_event,
                      build_workflow, episode_event, episode_metrics, rekey, start_event)
from .events import ARRIVAL, FINISH, HEDGE, EventQueue, Kind  # noqa: F401 (Kind: re-exported)
from .hedging import HANDLERS as HEDGE_HANDLERS, Hedges
from .nodes import NodeTable
from .objective import Objective
from .programs import Submission
from .run_model import RunModel, compute_range, show_overdue
from .sim_arrivals import Arrivals
from .sim_cluster import HANDLERS as NODE_HANDLERS, Cluster
from .sim_scaling import HANDLERS as SIZE_HANDLERS, Scaling
from .sizing import Sizer
from .accounting import slo_report
from .workload import WorkflowSpec

if TYPE_CHECKING:
    from .snapshot import ServerState, WorkflowState

__all__ = ["Simulator", "StepResult", "READY", "RUNNING", "DONE", "WAITING"]


def costs_of(cfg: EnvConfig) -> orders.Costs:
    """The cluster of ``cfg`` as the order prices work (``envs.order.Costs``): mean speeds over
    its nodes at ``cluster.servers``; the fastest node for each memory (the critical-path
    bound) over every tier, one with no node at this size included (the trace verifier's)."""
    nodes = orders.Costs.of(((nd.cpu_speed, nd.gpu_speed, nd.memory_gb,
                              bool(nd.resources.get(GPU))) for nd in cfg.cluster.nodes()),
                            cfg.cluster.network)
    tiers = orders.Costs.of(((nd.cpu_speed, nd.gpu_speed, nd.memory_gb,
                              bool(nd.resources.get(GPU)))
                             for nd in (t.spec() for t in cfg.cluster.tiers)))
    return orders.Costs(nodes.mean_cpu, nodes.mean_gpu, tiers.fastest, tiers.fastest_gpu,
                        nodes.network)


class Simulator:
    """One episode at a time of the workflow/cluster model. See the module docstring.

    Args:
        config: the environment configuration (cluster size is ``config.cluster.servers``).
        trace: optional callable receiving every trace event as a dict (the JSONL schema).
        sizer: who sizes the cluster (``envs.sizing.Sizer``, e.g. ``policies.sizing.make_sizer``);
            none: the cluster's nodes and dynamics only. Needs ``config.sizing.policy`` set
            (its bounds pad the node table).
    """

    def __init__(self, config: EnvConfig, trace: TraceSink | None = None,
                 sizer: Sizer | None = None):
        if sizer is not None and config.sizing.policy == "static":
            raise ValueError("Simulator(sizer=...): set env.sizing.policy (its tiers' max_nodes "
                             "bound the node table)")
        self.cfg = config
        self.sizer = sizer
        self.n_slots = config.padded_servers
        c = config.cluster
        self.network = c.network
        self._slotted = c.slotted
        self._shapes = tuple(t.spec() for t in c.tiers)
        #: the cluster as the order prices work (its initial nodes)
        self.costs = costs_of(config)
        mdp = config.mdp
        #: the ready-task order (envs.order): ranks, levels, keys, re-keys on finish
        self.order = orders.make(mdp.order or orders.PAPER_ORDER, mdp.edf_factor)
        #: the reward, the wait penalty and the planner's cost (envs.objective)
        self.objective = Objective(config.objective, config.reward)
        self._start_reward = self.objective.start_reward  # hot path: one bound method
        self._penalty_rate = self.objective.penalty_rate  # hot path: 0 skips the call
        self._hol = mdp.head_of_line_blocking
        self._rules = Rules(mdp.head_of_line_blocking, mdp.ask_only_startable, mdp.mask_infeasible,
                            mdp.node_look)
        self._transfer_delays = mdp.transfer_delays_start
        #: what a learned policy sees (envs.encoding: env.encoder)
        self.encoder = make_encoder(config.encoder, config.features, self.n_slots,
                                    mdp.mask_infeasible)
        self._max_decisions = mdp.max_decisions
        self._t_cap = config.workload.horizon_s * mdp.max_time_factor
        self.trace = None  # the constructor's warm-up episode is not traced
        self.reset(0)
        self.trace = trace

    # ---------------------------------------------------------------- episode control
    def reset(self, seed: int | np.random.SeedSequence | None,
              arrivals: Sequence[tuple[float, WorkflowSpec]] | None = None) -> None:
        """Start a new episode. ``seed`` fixes workload and dynamics (None: fresh entropy).

        ``arrivals``: an explicit list of ``(time_s, workflow)`` replacing the Poisson process
        (hand-built scenarios, replays of recorded traces).
        """
        ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        # the fourth stream (run-time noise) leaves the first three as they always were
        arr_ss, dag_ss, dyn_ss, run_ss, launch_ss = ss.spawn(5)
        cfg = self.cfg
        self.t = 0.0
        table = NodeTable([], capacity=self.n_slots, shapes=self._shapes)
        self.bind_core(DecisionCore(table, self._rules))
        self._reset_records()
        #: what the order may read of a workflow (mdp.submission, envs.programs)
        sub = self.submission = Submission(cfg.mdp.submission, self.order, self.costs)
        self._dynamic, self._hidden, self._per_call = sub.dynamic, sub.hidden, sub.per_call
        rt = RunModel(cfg.runtime, np.random.Generator(np.random.PCG64(run_ss)),
                      compute_range(cfg.workload.compute_gflop)) if cfg.runtime.active else None
        if rt is not None and rt.speeds is not None:  # runtime.speeds learned: rules plan
            specs = table.specs  # with the learned runs (the node set may change: read live)
            table.estimate = lambda task, i, _run: rt.planned_s(task, specs[i].name)
        self.bind_runs(rt, Hedges(rt), cfg.runtime.overhead_s)
        self._emit(episode_event(cfg))
        #: where workflows come from (envs.sim_arrivals): their times, their DAGs, their generators
        self.arrivals = Arrivals(cfg, np.random.Generator(np.random.PCG64(arr_ss)),
                                 np.random.Generator(np.random.PCG64(dag_ss)), arrivals)
        #: the nodes that come and go (envs.sim_cluster): their generator, the runs they lost
        self.cluster = Cluster(cfg, np.random.Generator(np.random.PCG64(dyn_ss)), table,
                               self._queue, self.event_q, self.hedges, self)
        self.cluster.start(self.t, self.trace)
        #: the sizer's turns (envs.sim_scaling); None: nobody sizes the cluster
        self.scaling = None if self.sizer is None else Scaling(
            cfg, self.sizer, np.random.Generator(np.random.PCG64(launch_ss)), self,
            self.cluster)
        if self.scaling is not None:
            self.sizer.reset()
            self.scaling.start(self.t)
        self.arrivals.schedule(self.t, self.event_q)
        self._select()

    def _reset_records(self) -> None:
        """A new episode's tasks, workflows and counters."""
        self._pending_penalty = 0.0
        self.event_q = EventQueue()  # every pending event (envs.events)
        self.tasks: list[TaskRecord] = []
        self.workflows: list[WorkflowRecord] = []
        self.current: TaskRecord | None = None
        self.outstanding = 0
        self.open_workflows = 0
        self.decisions = 0
        self.invalid = 0
        self.done_below = 0  # tasks below this index are all done (envs.fork.unfinished_range)
        self.busy_seconds = 0.0
        self.alive_seconds = 0.0
        self.busy_since = [0.0] * self.n_slots  # when each busy node became busy
        self.idle_since = [0.0] * self.n_slots  # when each idle node became idle
        # resource-seconds of the runs on Ray nodes (cpu / gpu utilization); None: slot servers
        self.resource_s = None if self._slotted else [0.0, 0.0]
        self.terminated = False
        self.truncated = False

    def bind_core(self, core: DecisionCore) -> None:
        """Decide with ``core`` (a fork's copy); the simulator's names for its table are the
        same objects (hot paths and planners read them without an attribute hop)."""
        self.core = core
        table = self.table = core.table
        self._queue = core.queue
        self.busy_until = table.busy_until
        self._accept_l, self._present_l = table.accept_l, table.present_l
        self._running = table.running

    def bind_runs(self, rt: RunModel | None, hedges: Hedges, overhead_s: float) -> None:
        """Runs take ``rt``'s times (None: their nominal ones) and ``overhead_s`` more, unseen;
        ``hedges`` backs up their stragglers (a fork: copies, estimates, no overhead)."""
        self._rt, self.hedges, self._overhead = rt, hedges, overhead_s

    # ---------------------------------------------------------------- events
    def _emit(self, event: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace(event)

    def _advance_to(self, t_target: float) -> None:
        """Process every event with time <= t_target, then set the clock to t_target."""
        ev = self.event_q.heap  # popped here, the simulator's loop (pushed: EventQueue.push)
        handlers = self._HANDLERS
        while ev and ev[0][0] <= t_target:
            t, kind, _, a, b = heapq.heappop(ev)
            if t > self.t:
                self._tick(t)
            handlers[kind](self, a, b)
        if t_target > self.t:
            self._tick(t_target)
        self.core.new_round()  # the clock moved: a new placement round
        if self._queue.deferred:  # the clock moved: tasks set aside by a wait compete again
            self._queue.requeue_deferred()

    def _tick(self, t: float) -> None:
        """The clock moves on to ``t`` (> ``self.t``)."""
        dt = t - self.t
        self.alive_seconds += dt * self.cluster.count
        if self._penalty_rate:
            self._pending_penalty += self.objective.penalty(dt, self.outstanding,
                                                            self.open_workflows)
        self.t = t

    def _on_arrival(self, _a: Any, _b: Any) -> None:
        """A workflow arrives: its tasks are built (keyed by the order) and its sources queued."""
        spec = self.arrivals.next_workflow()
        rt = self._rt
        kinds = shown = None
        if rt is not None:  # deciders see hints or estimates (envs.run_model)
            kinds = rt.kinds(spec)
            shown = rt.shown(spec, kinds)
        wf, new = build_workflow(spec, len(self.workflows), len(self.tasks), self.t, self.order,
                                 self.costs, shown, self._slotted)
        wf.kind = spec.name  # the order sees the calls that exist, not the DAG (envs.programs)
        if self._hidden:
            self.submission.arrived(wf, new, self.t)
        if rt is not None:
            rt.arrive(new, spec, kinds, shown)
        self.workflows.append(wf)
        self.tasks.extend(new)
        self.outstanding += len(new)
        self.open_workflows += 1
        if self.trace is not None:
            self._emit(arrival_event(self.t, wf.id, new, rt is not None))
        for task in new:
            if task.pending == 0:
                self._make_ready(task)
        self.arrivals.schedule(self.t, self.event_q)

    def _make_ready(self, task: TaskRecord) -> None:
        task.state = READY
        self._queue.push(task.key, task.id, task)

    def _on_finish(self, slot: int, token_task: tuple[int, TaskRecord]) -> None:
        token, task = token_task
        if task.token != token or task.state != RUNNING or task not in self._running[slot]:
            return  # stale: the task (or this run of a hedged one) was lost, or its other run won
        t = self.t
        task.state = DONE
        task.finish = t
        copy = slot == task.copy_slot
        if self._rt is not None:
            speed = self.table.speed(slot, task.demands)
            self._rt.finished(task, speed, self.table.specs[slot].name,
                              task.nominal * (task.factor2 if copy else task.factor) / speed)
        self.end_run(task, slot, task.copy_start if copy else task.run_from)
        self.outstanding -= 1
        wf = task.wf
        wf.done += 1
        if wf.done == wf.n:
            wf.finish = t
            self.open_workflows -= 1
            if self._hidden:
                self.submission.completed(wf)
        elif self._dynamic:  # srpt / las: the workflow's key moves (its children's too)
            self.submission.finished(wf, task, t - (task.copy_start if copy else task.run_from),
                                     self._make_ready, rekey)
        if self.trace is not None:
            self._emit({"t": t, "event": "finish", "task": task.id, "server": self.table.ids[slot]})
        if task.copy_slot >= 0:  # a hedged task: cancel its other run (envs.hedging)
            other = self.hedges.settle(task, slot, t, self)
            if self._present_l[other] and not self._accept_l[other] \
                    and not self._running[other]:  # draining: leave now
                self.cluster.drop(other, "server_remove", t, self.trace)
        heap = self._queue.heap
        for child in task.children:
            if child.first_parent is None:
                child.first_parent = task
            child.pending -= 1
            if child.pending == 0:  # _make_ready(child), inlined (hot path)
                child.state = READY
                if self._per_call:  # submitted now, alone (envs.programs)
                    child.key = self.submission.call_key(child, t)
                heapq.heappush(heap, (child.key, child.id, child))
        if self._present_l[slot] and not self._accept_l[slot] and not self._running[slot]:
            self.cluster.drop(slot, "server_remove", t, self.trace)  # drained: leave now

    def end_run(self, task: TaskRecord, node: int, started: float) -> None:
        """A run of ``task`` on ``node`` since ``started`` ended (finished, cancelled or lost):
        its resources are free; a node left idle adds its busy time."""
        table = self.table
        table.finish(task, node)
        if self.resource_s is not None:  # resource-seconds on Ray nodes
            d = dict(task.demands)
            ran = self.t - started
            self.resource_s[0] += d.get(CPU, 0.0) * ran
            self.resource_s[1] += d.get(GPU, 0.0) * ran
        if not self._running[node]:
            self.busy_seconds += self.t - self.busy_since[node]
            self.idle_since[node] = self.t

    def busy_now(self) -> float:
        """Node-seconds the busy nodes have been busy so far (their current busy period)."""
        t, since, busy = self.t, self.busy_since, self.table.busy
        return sum(t - since[i] for i in np.flatnonzero(busy).tolist())

    def resource_use(self) -> dict[str, float]:
        """On Ray nodes: CPU and GPU utilization (resource-seconds of the runs / the initial
        cluster's capacity x makespan) and ``look_stops`` (rounds that ``mdp.node_look`` ended,
        ``envs.decision``); {} on servers of one slot."""
        if self.resource_s is None:
            return {}
        cpus = sum(float(nd.resources.get(CPU, 0.0)) for nd in self.cfg.cluster.nodes())
        gpus = sum(float(nd.resources.get(GPU, 0.0)) for nd in self.cfg.cluster.nodes())
        cpu_s, gpu_s = self.resource_s
        for i in np.flatnonzero(self.table.busy).tolist():  # runs still going: so far
            for task in self._running[i]:
                d = dict(task.demands)
                ran = self.t - (task.copy_start if i == task.copy_slot else task.run_from)
                cpu_s += d.get(CPU, 0.0) * ran
                gpu_s += d.get(GPU, 0.0) * ran
        t = self.t
        return {"cpu_utilization": cpu_s / (cpus * t) if cpus and t else 0.0,
                "gpu_utilization": gpu_s / (gpus * t) if gpus and t else 0.0,
                "look_stops": self.core.look_stops}

    # ---------------------------------------------------------------- decisions
    def _select(self) -> None:
        """Set ``self.current`` to the first-level pick (``envs.decision``: stale tasks dropped,
        tasks that fit nowhere set aside, forced waits made), advancing the clock while nothing
        is to be asked."""
        t_cap = self._t_cap
        next_task = self.core.next_task
        while True:
            task, why = next_task()
            if task is not None:
                self.current = task
                if self._rt is not None:  # deciders see estimates (envs.run_model); an
                    self._rt.refresh(task)  # overdue run its learned residual, else OVERDUE_S
                    show_overdue(self.table, self.t, None if self._rt.estimator is None
                                 else self._rt.residual(self.table))
                elif self._overhead:  # a run past its expected end shows OVERDUE_S left
                    show_overdue(self.table, self.t)
                return
            if why == HOL_WAIT:  # a forced wait under head-of-line blocking: time passes
                self._wait()
                if self.t > t_cap:
                    return self._truncate()
                continue
            self.current = None
            if self.hedges.stragglers:  # nothing to place now: back up stragglers
                self.hedges.launch(self.table, self._start_copy)
            if self.outstanding == 0 and self.arrivals.done:
                self.terminated = True
                self._emit_end()
                return
            if self._queue.deferred:
                self._wait()
            elif self.event_q:
                self._advance_to(self.event_q.peek())
            else:  # tasks outstanding, nothing can change: they fit no node that will exist
                return self._truncate()
            if self.t > t_cap:
                return self._truncate()

    def step(self, slot: int) -> StepResult:
        """Apply the agent's pick for the current task. See the module docstring."""
        task = self.current
        if task is None:
            raise RuntimeError("the episode is over: call reset()")
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"action {slot} is out of range; allowed: 0..{self.n_slots - 1}")
        self.decisions += 1
        self._pending_penalty = 0.0
        if self.core.resolve(task, slot):  # valid: the task left the queue
            reward = self._start(task, slot)
            valid = True
        else:  # a wait, counted on the task; deferred, or (head-of-line blocking) time passes
            reward = self.objective.invalid_penalty
            valid = False
            self.invalid += 1
            if self._hol:
                self._wait()
        self._select()
        if self.current is not None and (self.decisions >= self._max_decisions
                                         or self.t > self._t_cap):
            self._truncate()
        return StepResult(reward - self._pending_penalty, valid, self.terminated, self.truncated)

    def occupy(self, slot: int, task: TaskRecord, until: float, ends: float) -> None:
        """A run of ``task`` starts on ``slot`` now: it holds its demands there until ``until``
        as deciders see it; its finish event at ``ends`` (plus the unseen overhead)."""
        if not self._running[slot]:
            self.busy_since[slot] = self.t
        self.table.start(slot, task, task.demands, until)
        self.event_q.push(ends + self._overhead, FINISH, slot, (task.token, task))

    def _start_copy(self, task: TaskRecord, slot: int) -> None:
        """A backup copy of running ``task`` starts on ``slot`` (envs.hedging)."""
        t, sid = self.t, self.table.ids[slot]
        times = self._rt.run_times(task, self.table.speed(slot, task.demands),
                                   self.table.specs[slot].name, copy=True)
        delay = 0.0
        if self._transfer_delays:
            delay = self.network.start_delay(((p.sid, p.output) for p in task.parents), sid)
        task.copy_slot, task.copy_start = slot, t
        self.occupy(slot, task, t + delay + times[0], t + delay + times[1])
        if self.trace is not None:
            self._emit(start_event(t, task.id, sid, delay, times, hedge=True))

    def _wait(self) -> None:
        """A wait: the clock moves by wait_dt_s, or to the next event with that switch on."""
        if self.cfg.mdp.advance_to_next_event and self.event_q:
            self._advance_to(self.event_q.peek())
        else:
            self._advance_to(self.t + self.cfg.mdp.wait_dt_s)

    def _start(self, task: TaskRecord, slot: int) -> float:
        t = self.t
        table = self.table
        speed = table.cpu_speed[slot] if not task.gpu else table.gpu_speed[slot]
        if self._rt is None:
            exec_s = run_s = task.compute / speed
        else:  # deciders see the estimate; the run takes the actual (envs.run_model)
            exec_s, run_s = self._rt.run_times(task, speed, table.specs[slot].name)
        fp = task.first_parent
        sid = table.ids[slot]
        comm_s = 0.0
        if fp is not None and fp.sid != sid:
            comm_s = self.network.transfer_s(fp.output)
        delay = 0.0
        if self._transfer_delays:
            delay = self.network.start_delay(((p.sid, p.output) for p in task.parents), sid)
        task.state = RUNNING
        task.slot = slot
        task.sid = sid
        task.start = task.run_from = t
        task.token += 1
        self.occupy(slot, task, t + delay + exec_s, t + delay + run_s)
        if task.hedgeable:  # runtime.hedge: watch for a straggler (envs.hedging)
            due = self.hedges.due(task, speed, table.specs[slot].name, t + delay)
            self.event_q.push(due, HEDGE, slot, (task.token, task))
        if self.trace is not None:
            self._emit(start_event(t, task.id, sid, delay,
                                   None if self._rt is None else (exec_s, run_s)))
        return self._start_reward(exec_s, comm_s, table.busy_w[slot])

    # ---------------------------------------------------------------- what a policy sees
    @property
    def task(self) -> TaskRecord | None:
        """The task being placed (``current``)."""
        return self.current

    @property
    def now(self) -> float:
        """The clock (model seconds)."""
        return self.t

    @property
    def parent(self) -> int:
        """The node holding the current task's first finished parent's output (-1: none)."""
        fp = self.current.first_parent
        if fp is None:
            return -1
        return self.cluster.slot_of.get(fp.sid, -1)

    @property
    def transfer_s(self) -> float:
        """The transfer of the current task's first finished parent's output (0: none)."""
        fp = self.current.first_parent
        return 0.0 if fp is None else self.network.transfer_s(fp.output)

    def facts(self) -> TaskFacts:
        """The current task as the encoder reads it (``envs.encoding.TaskFacts``)."""
        task = self.current
        kids, done = self.submission.shown(task)
        fp = task.first_parent
        transfer, parent = 0.0, -1
        if fp is not None:
            transfer = self.network.transfer_s(fp.output)
            parent = self.cluster.slot_of.get(fp.sid, -1)
        ready = self._queue.ready_count(task.id) if self.cfg.features.backlog else 1
        return TaskFacts(task.compute, task.memory_gb, kids, done, task.output, transfer,
                         parent, ready, self.t - task.wf.arrival)

    def observe(self) -> dict[str, np.ndarray]:
        """Observation of the current decision (``env.encoder``; zeros when the episode is
        over)."""
        task = self.current
        if task is None:
            return self.encoder.empty()
        return self.encoder.observe(self.table, task, self.facts(), self.t)

    def simulator(self) -> "Simulator":
        """The present as a simulator a planner forks: this one."""
        return self

    # ---------------------------------------------------------------- metrics
    def _truncate(self) -> None:
        """End the episode cut short (time cap, decision cap, or work no node will fit)."""
        self.current = None
        self.truncated = True
        self._emit_end()

    def _emit_end(self) -> None:
        if self.trace is not None:
            self._emit({"t": self.t, "event": "end", "truncated": self.truncated,
                        "metrics": self.metrics()})

    def metrics(self) -> dict[str, Any]:
        """Episode metrics over completed tasks/workflows (see docs/simulator.md); with a sizer
        or prices, the cost and the SLO's attainment too (docs/autoscale.md)."""
        m = episode_metrics(self)
        c = self.cfg
        if self.scaling is not None or any(t.price_per_hour for t in c.cluster.tiers):
            m.update(self.cluster.billing.totals(self.t))
            slo = slo_report(self.workflows, c.sizing.slo, c.workload.horizon_s)
            m.update({f"slo_{k}": v for k, v in slo.items()})
            if self.scaling is not None:
                m.update(self.scaling.metrics())
        return m

    # ---------------------------------------------------------------- forks and snapshots
    def fork(self, rngs: Sequence[np.random.Generator] | None = None) -> "Simulator":
        """An independent copy in this state (``envs.fork.fork``, which says what it copies)."""
        return forks.fork(self, rngs)

    def unfinished_range(self) -> int:
        """Index of the first task not done (``envs.fork.unfinished_range``)."""
        return forks.unfinished_range(self)

    def drop_arrivals(self) -> None:
        """No more workflows arrive (a planner's rollout that ignores future work)."""
        self.event_q.drop(ARRIVAL)
        self.arrivals.stop()

    def load_snapshot(self, servers: Sequence[ServerState], workflows: Sequence[WorkflowState],
                      focus: tuple[int, int] | None = None, mean_compute: float | None = None,
                      deferred: Sequence[tuple[int, int]] = ()) -> list[list[int]]:
        """Take a snapshot's present (``envs.sim_snapshot.load``, which says how) and stop at its
        first decision, ``focus``'s task when given; returns the listed tasks' ids."""
        self.costs = sim_snapshot.costs(servers, self.network, mean_compute)
        self.submission = Submission(self.cfg.mdp.submission, self.order, self.costs)
        ids = sim_snapshot.load(self, servers, workflows, focus, deferred)
        self._select()
        return sim_snapshot.focused(self.current, ids, focus)

    # ---------------------------------------------------------------- the read-only view
    @property
    def events(self) -> EventQueue:
        """The pending events (``envs.events.EventQueue``: peek(), runs(), seq)."""
        return self.event_q

    @property
    def server_ids(self) -> list:
        """Per node position, the id of the node in it (None: empty)."""
        return self.table.ids

    @property
    def slot_by_server_id(self) -> dict:
        """Node id -> its position, for the nodes present."""
        return self.cluster.slot_of

    @property
    def forced_waits(self) -> int:
        """Waits made without asking (mdp.ask_only_startable)."""
        return self.core.forced_waits

    @property
    def transfer_delays(self) -> bool:
        """mdp.transfer_delays_start: starts wait for inputs."""
        return self._transfer_delays

    @property
    def mean_compute(self) -> float:
        """The mean CPU speed of HEFT's rank and of unstarted work's estimate."""
        return self.costs.mean_cpu

    @property
    def dynamic_order(self) -> bool:
        """Whether ready keys move as work finishes (srpt, las)."""
        return self._dynamic

    @property
    def time_cap(self) -> float:
        """The clock at which the episode is truncated."""
        return self._t_cap

    @property
    def max_decisions(self) -> int:
        return self._max_decisions

    @property
    def run_model(self) -> RunModel | None:
        """The run-time model (envs.run_model); None: nominal run times."""
        return self._rt

    @property
    def stragglers(self) -> list:
        """(token, task) past their hedge quantile, uncopied."""
        return self.hedges.stragglers

    @property
    def finish_hidden(self) -> bool:
        """Whether running tasks' true ends are hidden from deciders (run-time noise, or
        ``runtime.overhead_s``): a fork or a planner's rollout ends them when expected."""
        return self._rt is not None or self._overhead > 0

    def expected_end(self, slot: int, task: Any = None) -> float:
        """When ``task``'s run on ``slot`` ends as deciders see it (its only run there when
        None; never in the past)."""
        run = self._running[slot]
        end = run.get(task, 0.0) if task is not None else max(run.values(), default=0.0)
        return max(end, self.t)

    def slot_of(self, sid: int) -> int | None:
        """The position of node ``sid`` (None: not present)."""
        return self.cluster.slot_of.get(sid)

    def is_busy(self, slot: int) -> bool:
        """Whether node ``slot`` runs a task now."""
        return bool(self._running[slot])


# Event handlers by kind (the stragglers': envs.hedging; the node events': envs.sim_cluster).
Simulator._HANDLERS = {FINISH: Simulator._on_finish, ARRIVAL: Simulator._on_arrival,
                       **HEDGE_HANDLERS, **NODE_HANDLERS, **SIZE_HANDLERS}
