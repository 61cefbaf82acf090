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
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .config import EnvConfig
from .decision import (DONE, HOL_WAIT, READY, RUNNING, WAITING, DecisionCore,  # noqa: F401
                       Rules, ServerTable)  # (the task states are re-exported)
from .objective import Objective
from . import order as orders
from .episode import (StepResult, TaskRecord, TraceSink, WorkflowRecord, arrival_event,
                      build_workflow, episode_event, episode_metrics, rekey, start_event)
from .run_model import RunModel, compute_range, show_overdue
from . import fork as forks, sim_snapshot
from .programs import Submission
from .events import ARRIVAL, FINISH, HEDGE, EventQueue, Kind  # noqa: F401 (Kind: re-exported)
from .hedging import HANDLERS as HEDGE_HANDLERS, Hedges
from .sim_view import view
from .sim_arrivals import Arrivals
from .sim_cluster import HANDLERS as SERVER_HANDLERS, Cluster
from .sim_observe import Observer
from .slots import Slots
from .workload import WorkflowSpec

if TYPE_CHECKING:
    from .snapshot import ServerState, WorkflowState

__all__ = ["Simulator", "StepResult", "READY", "RUNNING", "DONE", "WAITING"]  # WAITING: not ready


class Simulator:
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
        #: what the agent sees of a decision (envs.sim_observe)
        self.observer = Observer(config)
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
        rt = RunModel(cfg.runtime, np.random.Generator(np.random.PCG64(run_ss)),
                      compute_range(cfg.workload.compute_gflop)) if cfg.runtime.active else None
        self.bind_runs(rt, Hedges(rt), cfg.runtime.overhead_s)
        self._emit(episode_event(cfg))
        #: where workflows come from (envs.sim_arrivals): their times, their DAGs, their generators
        self.arrivals = Arrivals(cfg, np.random.Generator(np.random.PCG64(arr_ss)),
                                 np.random.Generator(np.random.PCG64(dag_ss)), arrivals)
        #: the servers that come and go (envs.sim_cluster): their generator, the runs they lost
        self.cluster = Cluster(cfg, np.random.Generator(np.random.PCG64(dyn_ss)), self.slots,
                               self.servers, self._queue, self.event_q, self.hedges)
        self.cluster.start(self.t, self.trace)
        self.arrivals.schedule(self.t, self.event_q)
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
        self.done_below = 0  # tasks below this index are all done (envs.fork.unfinished_range)
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
        if self._queue.deferred:  # the clock moved: tasks set aside by a wait compete again
            self._queue.requeue_deferred()

    def _tick(self, t: float) -> None:
        """The clock moves on to ``t`` (> ``self.t``)."""
        dt = t - self.t
        self.alive_seconds += dt * self.slots.count
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
        self.arrivals.schedule(self.t, self.event_q)

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
            other, cancelled_s = self.hedges.settle(task, slot, t, self.slots, self.servers,
                                                    self.trace)
            self.busy_seconds += cancelled_s
            if self._present_l[other] and not self._accept_l[other]:  # draining: leave now
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
        if self._present_l[slot] and not self._accept_l[slot]:  # draining: leave now
            self.cluster.drop(slot, "server_remove", t, self.trace)

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
                if self._rt is not None:  # deciders see estimates (envs.run_model)
                    self._rt.refresh(task)
                    self._rt.show_busy(self.busy_until, self._busy_l, self.running,
                                       self._compute_l, self.srv_tier, self.t)
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
        t, sid = self.t, self._sid_l[slot]
        times = self._rt.run_times(task, self._compute_l[slot], self.srv_tier[slot], copy=True)
        delay = 0.0
        if self._transfer_delays:
            delay = max((p.output / self._bw + self._lat for p in task.parents if p.sid != sid),
                        default=0.0)
        task.copy_slot = slot
        self._occupy(slot, task, t + delay + times[0], t + delay + times[1])
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
            self._emit(start_event(t, task.id, sid, delay,
                                   None if self._rt is None else (exec_s, run_s)))
        return self._start_reward(exec_s, comm_s, self._busy_w_l[slot])

    # ---------------------------------------------------------------- observation
    def observe(self) -> dict[str, np.ndarray]:
        """Observation of the current decision (zeros when the episode is over)."""
        task = self.current
        if task is None:
            return self.observer.empty()
        return self.observer.observe(task, self.t, self.submission.shown(task), self._queue,
                                     self.servers, self._slot_of)

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
        self._speed_by_memory, self._mean_compute = sim_snapshot.speeds(servers, mean_compute)
        ids = sim_snapshot.load(self, servers, workflows, focus, deferred)
        self._select()
        return sim_snapshot.focused(self.current, ids, focus)

    # ---------------------------------------------------------------- the read-only view
    # What planners, snapshots and diagnostics read (envs.sim_view).
    now = view("t", "The clock (model seconds).")
    events = view("event_q", "The pending events (envs.events.EventQueue: peek(), runs(), seq).")
    server_ids = view("_sid_l", "Per slot, the id of the server in it (-1: empty).")
    slot_by_server_id = view("_slot_of", "Server id -> its slot, for the servers present.")
    forced_waits = view("core.forced_waits", "Waits made without asking (mdp.ask_only_startable).")
    busy = view("servers.busy", "Whether each slot runs a task now, (n_slots,) bool (a copy).")
    bandwidth_gb_s = view("_bw")
    latency_s = view("_lat")
    transfer_delays = view("_transfer_delays", "mdp.transfer_delays_start: starts wait for inputs.")
    mean_compute = view("_mean_compute", "The mean server speed of HEFT's rank, unstarted work.")
    speed_by_memory = view("_speed_by_memory", "(speed, memory) by kind, fastest first.")
    dynamic_order = view("_dynamic", "Whether ready keys move as work finishes (srpt, las).")
    time_cap = view("_t_cap", "The clock at which the episode is truncated.")
    max_decisions = view("_max_decisions")
    run_model = view("_rt", "The run-time model (envs.run_model); None: nominal run times.")
    stragglers = view("hedges.stragglers", "(token, task) past their hedge quantile, uncopied.")

    @property
    def current_waits(self) -> int:
        """How often the policy's pick for the current task did not start it (its waits so far;
        what ``policies.guard`` bounds)."""
        return 0 if self.current is None else self.current.waits

    @property
    def finish_hidden(self) -> bool:
        """Whether running tasks' true ends are hidden from deciders (run-time noise, or
        ``runtime.overhead_s``): a fork or a planner's rollout ends them when expected."""
        return self._rt is not None or self._overhead > 0

    def expected_end(self, slot: int) -> float:
        """When the task running on ``slot`` ends as deciders see it (never in the past)."""
        return max(float(self.busy_until[slot]), self.t)

    def slot_of(self, sid: int) -> int | None:
        """The slot of server ``sid`` (None: not present)."""
        return self._slot_of.get(sid)


# Event handlers by kind (the stragglers': envs.hedging; the server events': envs.sim_cluster).
Simulator._HANDLERS = {FINISH: Simulator._on_finish, ARRIVAL: Simulator._on_arrival,
                       **HEDGE_HANDLERS, **SERVER_HANDLERS}
