"""Discrete-event simulator of workflow DAGs on a heterogeneous, elastic cluster (numpy + stdlib).

Decision semantics (paper §4.1, docs/simulator.md):

* The order (``mdp.order``, envs/order.py) picks the current task from the ready set: the
  paper's longest hop-count path to a sink unless set (HEFT's upward rank, oldest workflow
  first, ...), then the task id.
* The agent picks a server slot. A *valid* pick (server accepting, idle, memory fits) starts the
  task at once and the clock does not move. Any other pick is a *wait*: it earns the invalid
  penalty and the clock advances by ``wait_dt_s`` (or to the next event), processing finishes,
  arrivals and server changes on the way.
* When the ready set is empty the clock advances to the next event.

Invariants: a server runs at most one task; a task starts only when all parents have finished
(plus the transfer when ``transfer_delays_start``); a task fits its server's memory; a started task
runs ``compute_gflop / compute`` seconds without preemption unless its server fails, in which case
it is *lost* and becomes ready again. Every arrived task finishes exactly once per episode unless
the episode is truncated.

Randomness: the workload (arrivals, DAGs) and the cluster dynamics draw from separate generators
spawned from one seed, so the same seed gives the same workload under every policy.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .config import EnvConfig
from .decision import (DONE, HOL_WAIT, READY, RUNNING, WAITING, DecisionCore,  # noqa: F401
                       Rules, ServerTable, task_vector)  # (the task states are re-exported)
from .encoding import encode_task, task_dim
from .objective import Objective
from . import order as orders
from .episode import (TaskRecord, WorkflowRecord, arrival_event, build_workflow, episode_event,
                      episode_metrics, rekey)
from .run_model import RunModel, compute_range, show_overdue
from .fork import Forking
from .programs import Submission
from .events import (ADD, ARRIVAL, FAIL, FINISH, HEDGE, JOIN, LEAVE, REMOVE, EventQueue,
                     Kind)  # noqa: F401 (Kind: re-exported for readers)
from .hedging import Hedges
from .sim_snapshot import SnapshotLoading
from .sim_view import StateView
from .sim_arrivals import Arrivals
from .sim_cluster import ClusterDynamics
from .slots import Slots
from .workload import WorkflowSpec

__all__ = ["Simulator", "StepResult", "READY", "RUNNING", "DONE", "WAITING"]  # WAITING: not ready

TraceSink = Callable[[dict[str, Any]], None]


class StepResult(NamedTuple):
    reward: float
    valid: bool
    terminated: bool
    truncated: bool


class Simulator(ClusterDynamics, Forking, SnapshotLoading, StateView):
    """One episode at a time of the workflow/cluster model. See the module docstring.

    Args:
        config: the environment configuration (cluster size is ``config.cluster.servers``).
        trace: optional callable receiving every trace event as a dict (the JSONL schema).
    """

    def __init__(self, config: EnvConfig, trace: TraceSink | None = None):
        self.cfg = config
        self.n_slots = config.padded_servers
        self.trace = trace
        c = config.cluster
        self._bw, self._lat = c.bandwidth_gb_s, c.latency_s
        # Critical-path lower bound: run time on the fastest tier whose memory fits.
        self._speed_by_memory = tuple((t.compute, t.memory_gb)
                                      for t in sorted(c.tiers, key=lambda t: -t.compute))
        counts = c.tier_counts()
        self._mean_compute = orders.mean_compute(
            t.compute for t in c.tiers for _ in range(counts.get(t.name, 0)))
        #: the ready-task order (envs.order): ranks, levels, keys, re-keys on finish
        self.order = orders.Order(config.mdp.order or orders.PAPER_ORDER, config.mdp.edf_factor)
        # Hot-path copies of config values (the config itself stays the source of truth).
        mdp = config.mdp
        #: the reward, the wait penalty and the planner's cost (envs.objective)
        self.objective = Objective(config.objective, config.reward)
        self._start_reward = self.objective.start_reward  # hot path: one bound method
        self._penalty_rate = self.objective.penalty_rate  # hot path: 0 skips the call
        self._hol = mdp.head_of_line_blocking
        self._rules = Rules(mdp.head_of_line_blocking, mdp.ask_only_startable, mdp.mask_infeasible)
        self._transfer_delays = mdp.transfer_delays_start
        self._overhead = config.runtime.overhead_s  # unseen per-run latency (envs.runtime)
        self._mask_infeasible = mdp.mask_infeasible
        self._backlog = config.features.backlog
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
        arr_ss, dag_ss, dyn_ss, run_ss = ss.spawn(4)
        self.rng_dynamics = np.random.Generator(np.random.PCG64(dyn_ss))
        cfg = self.cfg
        n = self.n_slots
        self.t = 0.0
        # The decision core (envs.decision) holds the ready queue and the server table the rules
        # and the encoder read (accepting, busy, capacity, features); the simulator keeps the
        # clock, the events and what only it needs per slot.
        self.bind_core(DecisionCore(ServerTable(n, cfg.features), self._rules))
        self._reset_records(n)
        #: what the order may read of a workflow (mdp.submission, envs.programs)
        sub = self.submission = Submission(cfg.mdp.submission, self.order,
                                           self._speed_by_memory, self._mean_compute)
        self._dynamic, self._hidden, self._per_call = sub.dynamic, sub.hidden, sub.per_call
        self._rt = RunModel(cfg.runtime, np.random.Generator(np.random.PCG64(run_ss)),
                            compute_range(cfg.workload.compute_gflop)) \
            if cfg.runtime.active else None
        self.hedges = Hedges(self._rt)  # backup copies of stragglers (envs.hedging)
        self._emit(episode_event(cfg))
        #: where workflows come from (envs.sim_arrivals): their times, their DAGs, their generators
        self.arrivals = Arrivals(cfg, np.random.Generator(np.random.PCG64(arr_ss)),
                                 np.random.Generator(np.random.PCG64(dag_ss)), arrivals)
        self._start_cluster()
        self._schedule_next_arrival()
        self._select()

    def _reset_records(self, n: int) -> None:
        """A new episode's per-slot records, tasks, workflows and counters."""
        self.bind_slots(Slots(n))
        self._pending_penalty = 0.0
        self.event_q = EventQueue()  # every pending event (envs.events)
        self.tasks: list[TaskRecord] = []
        self.workflows: list[WorkflowRecord] = []
        self.current: TaskRecord | None = None
        self.outstanding = 0
        self.open_workflows = 0
        self.decisions = 0
        self.invalid = 0
        self.lost = 0
        self.busy_seconds = 0.0
        self.alive_seconds = 0.0
        self.terminated = False
        self.truncated = False

    def bind_core(self, core: DecisionCore) -> None:
        """Decide with ``core`` (a fork's copy); the simulator's names for its server table are
        the same objects (hot paths and planners read them without an attribute hop)."""
        self.core = core
        srv = self.servers = core.servers
        self._queue = self.core.queue
        self.compute, self.memory, self.busy_until = srv.compute, srv.memory, srv.busy_until
        self.accepting = srv.accepting
        self._compute_l, self._memory_l = srv.compute_l, srv.memory_l
        self._accept_l, self._busy_l = srv.accept_l, srv.busy_l
        # hot path (starts and finishes): the power column written in place
        self._feat = srv.features.matrix
        self._idle_pf_l, self._busy_pf_l = srv.idle_pf_l, srv.busy_pf_l

    def bind_slots(self, slots: Slots) -> None:
        """Keep per-slot records in ``slots`` (a fork's copy; envs.slots); the simulator's names
        for them are the same objects (the event loop reads them without an attribute hop)."""
        self.slots = slots
        self.srv_id, self.srv_tier, self.present = slots.srv_id, slots.srv_tier, slots.present
        self.idle_w, self.busy_w = slots.idle_w, slots.busy_w
        self._sid_l, self._present_l = slots.sid_l, slots.present_l
        self._idle_w_l, self._busy_w_l = slots.idle_w_l, slots.busy_w_l
        self.running, self.run_start, self._slot_of = slots.running, slots.run_start, slots.slot_of

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
        if self._queue.deferred:  # the clock moved: tasks set aside by a wait compete again
            self._queue.requeue_deferred()

    def _tick(self, t: float) -> None:
        if t > self.t:
            dt = t - self.t
            self.alive_seconds += dt * self.slots.count
            if self._penalty_rate:
                self._pending_penalty += self.objective.penalty(dt, self.outstanding,
                                                                self.open_workflows)
            self.t = t

    def _schedule_next_arrival(self) -> None:
        nxt = self.arrivals.next_time(self.t)
        if nxt is not None:
            self.event_q.push(nxt, ARRIVAL, None, None)

    def _on_arrival(self, _a: Any, _b: Any) -> None:
        """A workflow arrives: its tasks are built (keyed by the order) and its sources queued."""
        spec = self.arrivals.next_workflow()
        rt = self._rt
        kinds = shown = None
        if rt is not None:  # deciders see hints or estimates (envs.run_model)
            kinds = rt.kinds(spec)
            shown = rt.shown(spec, kinds)
        wf, new = build_workflow(spec, len(self.workflows), len(self.tasks), self.t,
                                 self._speed_by_memory, self.order,
                                 self._mean_compute, self._bw, self._lat, shown)
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
        self._schedule_next_arrival()

    def _make_ready(self, task: TaskRecord) -> None:
        task.state = READY
        self._queue.push(task.key, task.id, task)

    def _on_finish(self, slot: int, token_task: tuple[int, TaskRecord]) -> None:
        token, task = token_task
        if task.token != token or task.state != RUNNING or self.running[slot] is not task:
            return  # stale: the task (or this run of a hedged one) was lost, or its other run won
        t = self.t
        task.state = DONE
        task.finish = t
        self.busy_seconds += t - self.run_start[slot]
        if self._rt is not None:  # an early finish frees its server at once, as seen too
            self.busy_until[slot] = t
            factor = task.factor2 if slot == task.copy_slot else task.factor
            self._rt.finished(task, self._compute_l[slot], self.srv_tier[slot],
                              task.nominal * factor / self._compute_l[slot])

        self._busy_l[slot] = False  # ServerTable.finish, inlined (hot path)
        self._feat[slot, 3] = self._idle_pf_l[slot]
        self.running[slot] = None
        self.outstanding -= 1
        wf = task.wf
        wf.done += 1
        if wf.done == wf.n:
            wf.finish = t
            self.open_workflows -= 1
            if self._hidden:
                self.submission.completed(wf)
        elif self._dynamic:  # srpt / las: the workflow's key moves (its children's too)
            self.submission.finished(wf, task, t - self.run_start[slot], self._make_ready, rekey)
        if self.trace is not None:
            self._emit({"t": t, "event": "finish", "task": task.id, "server": self._sid_l[slot]})
        if task.copy_slot >= 0:  # a hedged task: cancel its other run (envs.hedging)
            self._settle_copy(task, slot)
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
        if self._present_l[slot] and not self._accept_l[slot]:  # draining: leave now
            self._drop_server(slot, "server_remove")

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
                if self._rt is not None:
                    self._runtime_view(task)
                elif self._overhead:  # a busy server past its expected end shows OVERDUE_S
                    show_overdue(self.busy_until, self._busy_l, self.t)
                return
            if why == HOL_WAIT:  # a forced wait under head-of-line blocking: time passes
                self._wait()
                if self.t > t_cap:
                    return self._truncate()
                continue
            self.current = None
            if self.hedges.stragglers:  # nothing to place now: back up stragglers
                self.hedges.launch(self.servers, self._start_copy)
            if self.outstanding == 0 and self.arrivals.done:
                self.terminated = True
                self._emit_end()
                return
            if self._queue.deferred:
                self._wait()
            elif self.event_q:
                self._advance_to(self.event_q.peek())
            else:  # tasks outstanding, nothing can change: they fit no server that will exist
                return self._truncate()
            if self.t > t_cap:
                return self._truncate()

    def _runtime_view(self, task: TaskRecord) -> None:
        """What deciders see at this decision (``runtime`` active): the task's current estimate,
        and every busy server still busy (``RunModel.show_busy``)."""
        self._rt.refresh(task)
        self._rt.show_busy(self.busy_until, self._busy_l, self.running, self._compute_l,
                           self.srv_tier, self.t)

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

    def _occupy(self, slot: int, task: TaskRecord, until: float, ends: float) -> None:
        """A run of ``task`` starts on ``slot`` now: busy until ``until`` as deciders see it; its
        finish event at ``ends`` (plus the unseen overhead)."""
        self._busy_l[slot] = True  # ServerTable.start, inlined (hot path)
        self.busy_until[slot] = until
        self._feat[slot, 3] = self._busy_pf_l[slot]
        self.running[slot] = task
        self.run_start[slot] = self.t
        self.event_q.push(ends + self._overhead, FINISH, slot, (task.token, task))

    def _start_copy(self, task: TaskRecord, slot: int) -> None:
        """A backup copy of running ``task`` starts on idle ``slot`` (envs.hedging)."""
        t = self.t
        sid = self._sid_l[slot]
        estimate, run_s = self._rt.run_times(task, self._compute_l[slot], self.srv_tier[slot],
                                             copy=True)
        delay = 0.0
        if self._transfer_delays:
            delay = max((p.output / self._bw + self._lat for p in task.parents if p.sid != sid),
                        default=0.0)
        task.copy_slot = slot
        self._occupy(slot, task, t + delay + estimate, t + delay + run_s)
        if self.trace is not None:
            ev = {"t": t, "event": "start", "task": task.id, "server": sid, "hedge": True,
                  "estimate_s": estimate, "run_s": run_s}
            if delay:
                ev["transfer_s"] = delay
            self._emit(ev)

    def _settle_copy(self, task: TaskRecord, slot: int) -> None:
        """``task`` finished on ``slot`` while its other run went on: that run is cancelled and
        its server freed; the finishing run's server holds the result."""
        other = task.copy_slot if slot != task.copy_slot else task.slot
        won_by_copy = slot == task.copy_slot
        task.copy_slot = -1
        t = self.t
        start = self.run_start
        self.hedges.settled(won_by_copy, t - start[slot if won_by_copy else other],
                            t - start[other])
        self.busy_seconds += t - start[other]
        self._busy_l[other] = False
        self._feat[other, 3] = self._idle_pf_l[other]
        self.busy_until[other] = t
        self.running[other] = None
        if won_by_copy:
            task.slot, task.sid = slot, self._sid_l[slot]
        if self.trace is not None:
            self._emit({"t": t, "event": "cancel", "task": task.id, "server": self._sid_l[other]})
        if self._present_l[other] and not self._accept_l[other]:  # draining: leave now
            self._drop_server(other, "server_remove")

    def _on_straggler(self, _slot: int, token_task: tuple[int, TaskRecord]) -> None:
        self.hedges.seen(*token_task)

    def _wait(self) -> None:
        """A wait: the clock moves by wait_dt_s, or to the next event with that switch on."""
        if self.cfg.mdp.advance_to_next_event and self.event_q:
            self._advance_to(self.event_q.peek())
        else:
            self._advance_to(self.t + self.cfg.mdp.wait_dt_s)

    def _start(self, task: TaskRecord, slot: int) -> float:
        t = self.t
        if self._rt is None:
            exec_s = run_s = task.compute / self._compute_l[slot]
        else:  # deciders see the estimate; the run takes the actual (envs.run_model)
            exec_s, run_s = self._rt.run_times(task, self._compute_l[slot], self.srv_tier[slot])
        fp = task.first_parent
        sid = self._sid_l[slot]
        comm_s = 0.0
        if fp is not None and fp.sid != sid:
            comm_s = fp.output / self._bw + self._lat
        delay = 0.0
        if self._transfer_delays:
            delay = max((p.output / self._bw + self._lat for p in task.parents if p.sid != sid),
                        default=0.0)
        task.state = RUNNING
        task.slot = slot
        task.sid = sid
        task.start = t
        task.token += 1
        self._occupy(slot, task, t + delay + exec_s, t + delay + run_s)
        if task.hedgeable:  # runtime.hedge: watch for a straggler (envs.hedging)
            due = self.hedges.due(task, self._compute_l[slot], self.srv_tier[slot], t + delay)
            self.event_q.push(due, HEDGE, slot, (task.token, task))
        if self.trace is not None:
            ev = {"t": t, "event": "start", "task": task.id, "server": sid}
            if delay:
                ev["transfer_s"] = delay
            if self._rt is not None:
                ev["estimate_s"] = exec_s
                ev["run_s"] = run_s
            self._emit(ev)
        return self._start_reward(exec_s, comm_s, self._busy_w_l[slot])

    # ---------------------------------------------------------------- observation
    def observe(self) -> dict[str, np.ndarray]:
        """Observation of the current decision (zeros when the episode is over)."""
        f = self.cfg.features
        task = self.current
        n = self.n_slots
        if task is None:
            return {"task": np.zeros(task_dim(f), np.float32), "servers": np.zeros((n, 5), np.float32),
                    "action_mask": np.zeros(n, np.float32)}
        wf = task.wf
        # the DAG's successors and completion, or only what exists (mdp.submission)
        kids, done = self.submission.shown(task)
        if self._backlog:
            vec = task_vector(f, task.compute, task.memory_gb, kids, done,
                              task.output, self._queue.ready_count(task.id),
                              int(self.accepting.sum()), self.t - wf.arrival)
        else:
            vec = encode_task(task.compute, task.memory_gb, kids, done, task.output, f)
        fp = task.first_parent
        transfer, parent_slot = 0.0, None
        if fp is not None:
            transfer = fp.output / self._bw + self._lat
            parent_slot = self._slot_of.get(fp.sid)
        return self.servers.observe(vec, self.t, transfer, parent_slot, task.memory_gb,
                                    self._mask_infeasible)

    # ---------------------------------------------------------------- metrics
    def _truncate(self) -> None:
        """End the episode cut short (time cap, decision cap, or work no server will fit)."""
        self.current = None
        self.truncated = True
        self._emit_end()

    def _emit_end(self) -> None:
        if self.trace is not None:
            self._emit({"t": self.t, "event": "end", "truncated": self.truncated,
                        "metrics": self.metrics()})

    def metrics(self) -> dict[str, Any]:
        """Episode metrics over completed tasks/workflows (see docs/simulator.md)."""
        return episode_metrics(self)


# Event handlers by kind (ClusterDynamics handles the server events).
Simulator._HANDLERS = {FINISH: Simulator._on_finish, FAIL: Simulator._on_fail,
                       REMOVE: Simulator._on_remove, ADD: Simulator._on_add,
                       ARRIVAL: Simulator._on_arrival, JOIN: Simulator._on_join,
                       LEAVE: Simulator._on_leave, HEDGE: Simulator._on_straggler}
