"""Discrete-event simulator of workflow DAGs on a heterogeneous, elastic cluster (numpy + stdlib).

Decision semantics (paper §4.1, DESIGN.md §3):

* A first level picks the current task from the ready set: longest hop-count path to a sink
  (or HEFT upward rank), ties by workflow arrival time, then task id.
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
import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .config import EnvConfig, ServerEventConfig, TierConfig
from .encoding import ServerFeatures, task_dim, with_backlog
from .workload import ArrivalProcess, WorkflowSpec, make_source

# Event kinds, in the order they are processed at equal times.
FINISH, FAIL, REMOVE, ADD, ARRIVAL, JOIN, LEAVE = range(7)

READY, RUNNING, DONE, WAITING = range(4)  # task states (WAITING = parents unfinished)

TraceSink = Callable[[dict[str, Any]], None]


class _Task:
    __slots__ = ("id", "wf", "compute", "memory", "output", "parents", "children", "key",
                 "pending", "state", "slot", "sid", "start", "finish", "token", "first_parent",
                 "waits")

    def __init__(self, tid: int, wf: "_Workflow", compute: float, memory: float, output: float):
        self.id = tid
        self.wf = wf
        self.compute = compute
        self.memory = memory
        self.output = output
        self.parents: list[_Task] = []
        self.children: list[_Task] = []
        self.key: tuple = ()
        self.pending = 0            # unfinished parents
        self.state = WAITING
        self.slot = -1              # slot while running
        self.sid = -1               # id of the server it last ran on (kept after finishing)
        self.start = math.nan
        self.finish = math.nan
        self.token = 0              # bumps on every start; stale finish events are ignored
        self.first_parent: _Task | None = None  # first parent to finish (paper's transfer source)
        self.waits = 0              # policy picks that did not start it (invalid actions)


class _Workflow:
    __slots__ = ("id", "arrival", "n", "done", "lower_bound", "finish")

    def __init__(self, wid: int, arrival: float, n: int, lower_bound: float):
        self.id = wid
        self.arrival = arrival
        self.n = n
        self.done = 0
        self.lower_bound = lower_bound
        self.finish = math.nan


class StepResult(NamedTuple):
    reward: float
    valid: bool
    terminated: bool
    truncated: bool


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
        self._speed_by_memory = [(t.compute, t.memory_gb)
                                 for t in sorted(c.tiers, key=lambda t: -t.compute)]
        self._mean_compute = (sum(t.compute * n for t, n in zip(c.tiers, c.tier_counts().values()))
                              / max(1, c.servers))
        # Hot-path copies of config values (the config itself stays the source of truth).
        r, mdp = config.reward, config.mdp
        self._reward_consts = (r.w1, r.t0_s, r.w2, r.t0c_s, r.w3, r.e0_j)
        self._invalid_penalty = r.invalid_penalty
        self._penalty_rate = r.wait_penalty_per_s if r.kind == "response" else 0.0
        self._hol = mdp.head_of_line_blocking
        self._ask_only_startable = mdp.ask_only_startable
        self._transfer_delays = mdp.transfer_delays_start
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
        arr_ss, dag_ss, dyn_ss = ss.spawn(3)
        self.rng_arrivals = np.random.Generator(np.random.PCG64(arr_ss))
        self.rng_workload = np.random.Generator(np.random.PCG64(dag_ss))
        self.rng_dynamics = np.random.Generator(np.random.PCG64(dyn_ss))
        cfg = self.cfg
        n = self.n_slots
        self.t = 0.0
        self.srv_id = np.full(n, -1, dtype=np.int64)
        self.srv_tier = [""] * n
        self.compute = np.zeros(n)
        self.memory = np.zeros(n)
        self.idle_w = np.zeros(n)
        self.busy_w = np.zeros(n)
        self.busy_until = np.zeros(n)
        self.present = np.zeros(n, dtype=bool)    # alive (possibly draining)
        self.accepting = np.zeros(n, dtype=bool)  # alive and not draining
        self._accept_f = np.zeros(n, dtype=np.float32)  # float copy of accepting (the mask)
        # Python-list mirrors of per-slot scalars: the decision loop reads these (numpy scalar
        # access costs several times more); the arrays serve the vectorised observation.
        self._sid_l = [-1] * n
        self._compute_l = [0.0] * n
        self._memory_l = [0.0] * n
        self._idle_w_l = [0.0] * n
        self._busy_w_l = [0.0] * n
        self._idle_pf_l = [0.0] * n  # normalised power feature of the slot when idle / busy
        self._busy_pf_l = [0.0] * n
        self._busy_l = [False] * n
        self._accept_l = [False] * n
        self._present_l = [False] * n
        self._features = ServerFeatures(n, cfg.features)
        self._feat = self._features._feat  # hot path: power column written in place (col 3)
        self.running: list[_Task | None] = [None] * n
        self.run_start = [0.0] * n                # when the slot's current run began
        self._slot_of: dict[int, int] = {}
        self._next_server_id = 0
        self._max_accept_mem = 0.0
        self._present_count = 0
        self._pending_penalty = 0.0
        self._events: list[tuple] = []
        self._seq = 0
        self._ready: list[tuple] = []
        self._deferred: list[_Task] = []
        self._blocked: list[_Task] = []
        self.tasks: list[_Task] = []
        self.workflows: list[_Workflow] = []
        self.current: _Task | None = None
        self.outstanding = 0
        self.arrivals_done = False
        self.decisions = 0
        self.invalid = 0
        self.forced_waits = 0  # waits made without asking (mdp.ask_only_startable)
        self.lost = 0
        self.busy_seconds = 0.0
        self.alive_seconds = 0.0
        self.terminated = False
        self.truncated = False
        self._source = make_source(cfg.workload)
        self._emit({"t": 0.0, "event": "episode", "bandwidth_gb_s": self._bw, "latency_s": self._lat,
                    "transfer_delays_start": cfg.mdp.transfer_delays_start,
                    "tiers": [{"name": t.name, "compute": t.compute, "memory_gb": t.memory_gb}
                              for t in cfg.cluster.tiers]})
        n0 = cfg.cluster.servers
        self._arrivals = ArrivalProcess(cfg.workload.arrival_rate_16 * n0 / 16.0,
                                        cfg.workload.rate_schedule, cfg.workload.horizon_s,
                                        self.rng_arrivals)
        for tier, count in cfg.cluster.tier_counts().items():
            for _ in range(count):
                self._add_server(cfg.cluster.tier(tier))
        for ev in cfg.dynamics.events:
            kind = {"add": ADD, "remove": REMOVE, "fail": FAIL}[ev.kind]
            for _ in range(ev.count):
                self._push(ev.t, kind, ev, None)
        d = cfg.dynamics
        if d.join_rate_s > 0:
            self._push(self.rng_dynamics.exponential(1 / d.join_rate_s), JOIN, None, None)
        if d.leave_rate_s > 0:
            self._push(self.rng_dynamics.exponential(1 / d.leave_rate_s), LEAVE, None, None)
        self._scripted: list[tuple[float, WorkflowSpec]] | None = None
        if arrivals is not None:
            self._scripted = sorted(arrivals, key=lambda tw: tw[0])[::-1]  # pop() from the end
            if any(t < 0 or not math.isfinite(t) for t, _ in self._scripted):
                raise ValueError("arrivals: times must be finite and >= 0")
        self._schedule_next_arrival(0.0)
        self._select()

    def fork(self) -> "Simulator":
        """An independent simulator in this one's state, without a trace (``envs.fork``)."""
        from .fork import fork
        return fork(self)

    def _schedule_next_arrival(self, t: float) -> None:
        if self._scripted is not None:
            nxt = self._scripted[-1][0] if self._scripted else None
        else:
            nxt = self._arrivals.next_time(t)
        if nxt is None:
            self.arrivals_done = True
        else:
            self._push(nxt, ARRIVAL, None, None)

    # ---------------------------------------------------------------- events
    def _push(self, t: float, kind: int, a: Any, b: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, a, b))

    def _emit(self, event: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace(event)

    def _advance_to(self, t_target: float) -> None:
        """Process every event with time <= t_target, then set the clock to t_target."""
        ev = self._events
        handlers = self._HANDLERS
        while ev and ev[0][0] <= t_target:
            t, kind, _, a, b = heapq.heappop(ev)
            if t > self.t:  # _tick(t), inlined (hot path)
                dt = t - self.t
                self.alive_seconds += dt * self._present_count
                if self._penalty_rate:
                    self._pending_penalty += self._penalty_rate * self.outstanding * dt
                self.t = t
            handlers[kind](self, a, b)
        if t_target > self.t:
            self._tick(t_target)
        if self._deferred:  # the clock moved: tasks set aside by a wait compete again
            for task in self._deferred:
                heapq.heappush(self._ready, (task.key, task.id, task))
            self._deferred.clear()

    def _tick(self, t: float) -> None:
        if t > self.t:
            dt = t - self.t
            self.alive_seconds += dt * self._present_count
            if self._penalty_rate:
                self._pending_penalty += self._penalty_rate * self.outstanding * dt
            self.t = t

    def _on_finish(self, slot: int, token_task: tuple[int, _Task]) -> None:
        token, task = token_task
        if task.token != token or task.state != RUNNING:
            return  # stale: the task was lost with its server
        t = self.t
        task.state = DONE
        task.finish = t
        self.busy_seconds += t - self.run_start[slot]
        self._busy_l[slot] = False
        self.running[slot] = None
        self._feat[slot, 3] = self._idle_pf_l[slot]
        self.outstanding -= 1
        wf = task.wf
        wf.done += 1
        if wf.done == wf.n:
            wf.finish = t
        if self.trace is not None:
            self._emit({"t": t, "event": "finish", "task": task.id, "server": self._sid_l[slot]})
        for child in task.children:
            if child.first_parent is None:
                child.first_parent = task
            child.pending -= 1
            if child.pending == 0:  # _make_ready(child), inlined (hot path)
                child.state = READY
                heapq.heappush(self._ready, (child.key, child.id, child))
        if self._present_l[slot] and not self._accept_l[slot]:  # draining: leave now
            self._drop_server(slot, "server_remove")

    def _on_fail(self, ev: ServerEventConfig | None, server: int | None) -> None:
        slot = self._pick_server(ev, server)
        if slot is None:
            return
        task = self.running[slot]
        sid = int(self.srv_id[slot])
        tier = self.srv_tier[slot]
        if task is not None:
            self.busy_seconds += self.t - self.run_start[slot]
            task.state = READY
            task.slot = -1
            task.sid = -1
            task.start = math.nan
            self.lost += 1
            self._emit({"t": self.t, "event": "lost", "task": task.id, "server": sid})
            self.running[slot] = None
            self._busy_l[slot] = False
            self._make_ready(task)
        self._drop_server(slot, "server_fail")
        if self.cfg.dynamics.rejoin_after_s is not None:
            self._push(self.t + self.cfg.dynamics.rejoin_after_s, ADD, tier, None)

    def _on_remove(self, ev: ServerEventConfig | None, server: int | None) -> None:
        slot = self._pick_server(ev, server)
        if slot is None:
            return
        if self._busy_l[slot]:
            self.accepting[slot] = False  # drain: finish the current task first
            self._accept_l[slot] = False
            self._accept_f[slot] = 0.0
            self._refresh_capacity()
            self._emit({"t": self.t, "event": "server_drain", "server": int(self.srv_id[slot])})
        else:
            self._drop_server(slot, "server_remove")

    def _on_add(self, ev: ServerEventConfig | str, _: Any) -> None:
        tier = ev if isinstance(ev, str) else ev.tier
        self._add_server(self.cfg.cluster.tier(tier))

    def _on_arrival(self, _a: Any, _b: Any) -> None:
        if self._scripted is not None:
            spec = self._scripted.pop()[1]
        else:
            spec = self._source.next_workflow(self.rng_workload)
        self._spawn_workflow(spec)
        self._schedule_next_arrival(self.t)

    def _on_join(self, _a: Any, _b: Any) -> None:
        tiers = self.cfg.cluster.tiers
        w = np.array([t.ratio for t in tiers], dtype=float)
        tier = tiers[int(self.rng_dynamics.choice(len(tiers), p=w / w.sum()))]
        if self._n_present < self.n_slots:
            self._add_server(tier)
        self._push(self.t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.join_rate_s),
                   JOIN, None, None)

    def _on_leave(self, _a: Any, _b: Any) -> None:
        self._on_remove(None, None)
        self._push(self.t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.leave_rate_s),
                   LEAVE, None, None)

    _HANDLERS = {FINISH: _on_finish, FAIL: _on_fail, REMOVE: _on_remove, ADD: _on_add,
                 ARRIVAL: _on_arrival, JOIN: _on_join, LEAVE: _on_leave}

    # ---------------------------------------------------------------- servers
    @property
    def busy(self) -> np.ndarray:
        """Whether each slot runs a task now, (n_slots,) bool (a copy; the decision loop keeps a
        list)."""
        return np.array(self._busy_l, dtype=bool)

    @property
    def _n_present(self) -> int:
        return self._present_count

    def _refresh_capacity(self) -> None:
        acc = self.memory[self.accepting]
        self._max_accept_mem = float(acc.max()) if acc.size else 0.0
        self._present_count = int(self.present.sum())

    def _add_server(self, tier: TierConfig) -> None:
        free = np.flatnonzero(~self.present)
        if free.size == 0:
            raise RuntimeError(f"no free server slot: the observation is padded to {self.n_slots} "
                               f"servers (set env.n_max higher)")
        slot = int(free[0])
        sid = self._next_server_id
        self._next_server_id += 1
        self.srv_id[slot] = sid
        self.srv_tier[slot] = tier.name
        self.compute[slot] = tier.compute
        self.memory[slot] = tier.memory_gb
        self.idle_w[slot] = tier.idle_w
        self.busy_w[slot] = tier.busy_w
        self.busy_until[slot] = 0.0
        self.present[slot] = True
        self.accepting[slot] = True
        self._sid_l[slot] = sid
        self._compute_l[slot] = tier.compute
        self._memory_l[slot] = tier.memory_gb
        self._idle_w_l[slot] = tier.idle_w
        self._busy_w_l[slot] = tier.busy_w
        self._idle_pf_l[slot] = self._features.power_feature(tier.idle_w)
        self._busy_pf_l[slot] = self._features.power_feature(tier.busy_w)
        self._busy_l[slot] = False
        self._accept_l[slot] = True
        self._present_l[slot] = True
        self._accept_f[slot] = 1.0
        self._features.set_server(slot, tier.compute, tier.memory_gb, tier.idle_w)
        self._slot_of[sid] = slot
        self._refresh_capacity()
        self._emit({"t": self.t, "event": "server_add", "server": sid, "tier": tier.name,
                    "compute": tier.compute, "memory_gb": tier.memory_gb})
        if self.cfg.dynamics.fail_rate_per_server_s > 0:
            t_fail = self.t + self.rng_dynamics.exponential(1 / self.cfg.dynamics.fail_rate_per_server_s)
            self._push(t_fail, FAIL, None, sid)
        if self._blocked:  # a task that fit nowhere may fit here
            for task in self._blocked:
                heapq.heappush(self._ready, (task.key, task.id, task))
            self._blocked.clear()

    def _drop_server(self, slot: int, event: str) -> None:
        sid = int(self.srv_id[slot])
        self.present[slot] = False
        self.accepting[slot] = False
        self._sid_l[slot] = -1
        self._busy_l[slot] = False
        self._accept_l[slot] = False
        self._present_l[slot] = False
        self._accept_f[slot] = 0.0
        self.busy_until[slot] = 0.0
        self._features.clear(slot)
        self.srv_id[slot] = -1
        del self._slot_of[sid]
        self._refresh_capacity()
        self._emit({"t": self.t, "event": event, "server": sid})

    def _pick_server(self, ev: ServerEventConfig | None, server: int | None) -> int | None:
        """Slot targeted by a remove/fail: a given id, else a random accepting server (of a tier)."""
        if server is None and ev is not None:
            server = ev.server
        if server is not None:
            return self._slot_of.get(server)  # already gone: nothing to do
        cand = self.present & self.accepting
        if ev is not None and ev.tier is not None:
            cand &= np.array([t == ev.tier for t in self.srv_tier])
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return None
        return int(idx[int(self.rng_dynamics.integers(0, idx.size))])

    # ---------------------------------------------------------------- workflows
    def _spawn_workflow(self, spec: WorkflowSpec) -> None:
        t = self.t
        wid = len(self.workflows)
        specs = spec.tasks
        n = len(specs)
        base = len(self.tasks)
        wf = _Workflow(wid, t, n, 0.0)
        new = [_Task(base + i, wf, ts.compute_gflop, ts.memory_gb, ts.output_gb)
               for i, ts in enumerate(specs)]
        # One forward pass: links, and the critical-path lower bound (each task on the fastest
        # configured tier whose memory fits it).
        longest = [0.0] * n
        speeds = self._speed_by_memory
        for i, ts in enumerate(specs):
            task = new[i]
            before = 0.0
            for p in ts.parents:
                parent = new[p]
                task.parents.append(parent)
                parent.children.append(task)
                if longest[p] > before:
                    before = longest[p]
            task.pending = len(ts.parents)
            speed = speeds[0][0]
            for sp, mem in speeds:
                if mem >= ts.memory_gb:
                    speed = sp
                    break
            longest[i] = ts.compute_gflop / speed + before
        wf.lower_bound = max(longest)
        if self.cfg.mdp.first_level == "hop":
            ranks = [0] * n  # longest hop count to a sink
            for i in range(n - 1, -1, -1):
                for child in new[i].children:
                    r = ranks[child.id - base] + 1
                    if r > ranks[i]:
                        ranks[i] = r
        else:
            ranks = spec.upward_ranks(self._mean_compute, self._bw, self._lat)
        for i, task in enumerate(new):
            task.key = (-ranks[i], t)
        self.workflows.append(wf)
        self.tasks.extend(new)
        self.outstanding += n
        if self.trace is not None:
            self._emit({"t": t, "event": "arrival", "workflow": wid, "tasks": [
                {"task": tk.id, "compute_gflop": tk.compute, "memory_gb": tk.memory,
                 "output_gb": tk.output, "parents": [p.id for p in tk.parents]} for tk in new]})
        for task in new:
            if task.pending == 0:
                self._make_ready(task)

    def _make_ready(self, task: _Task) -> None:
        task.state = READY
        heapq.heappush(self._ready, (task.key, task.id, task))

    # ---------------------------------------------------------------- decisions
    def _select(self) -> None:
        """Set ``self.current`` to the first-level pick, advancing the clock while nothing is ready."""
        t_cap = self._t_cap
        while True:
            ready = self._ready
            while ready:
                task = ready[0][2]
                if task.state != READY:
                    heapq.heappop(ready)
                    continue
                if task.memory > self._max_accept_mem:  # fits no live server: set aside
                    heapq.heappop(ready)
                    self._blocked.append(task)
                    continue
                if self._ask_only_startable and not self._startable(task.memory):
                    # Every action would be a wait: make it without asking (no decision, no
                    # penalty; time still costs under reward.kind response).
                    self.forced_waits += 1
                    if self._hol:
                        self._wait()
                        if self.t > t_cap:
                            self.current = None
                            self.truncated = True
                            self._emit_end()
                            return
                    else:
                        heapq.heappop(ready)
                        self._deferred.append(task)
                    continue
                self.current = task
                return
            self.current = None
            if self.outstanding == 0 and self.arrivals_done:
                self.terminated = True
                self._emit_end()
                return
            if self._deferred:
                self._wait()
            elif self._events:
                self._advance_to(self._events[0][0])
            else:  # tasks outstanding, nothing can change: they fit no server that will exist
                self.truncated = True
                self._emit_end()
                return
            if self.t > t_cap:
                self.truncated = True
                self._emit_end()
                return

    def _startable(self, memory_gb: float) -> bool:
        """Whether some accepting, idle server fits ``memory_gb`` now."""
        for acc, busy, mem in zip(self._accept_l, self._busy_l, self._memory_l):
            if acc and not busy and mem >= memory_gb:
                return True
        return False

    @property
    def current_waits(self) -> int:
        """How often the policy's pick for the current task did not start it (its waits so far;
        what ``policies.guard`` bounds)."""
        return 0 if self.current is None else self.current.waits

    def is_valid(self, slot: int) -> bool:
        """Whether picking ``slot`` now starts the current task."""
        task = self.current
        return (task is not None and 0 <= slot < self.n_slots and self._accept_l[slot]
                and not self._busy_l[slot] and self._memory_l[slot] >= task.memory)

    def step(self, slot: int) -> StepResult:
        """Apply the agent's pick for the current task. See the module docstring."""
        task = self.current
        if task is None:
            raise RuntimeError("the episode is over: call reset()")
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"action {slot} is out of range; allowed: 0..{self.n_slots - 1}")
        self.decisions += 1
        self._pending_penalty = 0.0
        if (self._accept_l[slot] and not self._busy_l[slot]
                and self._memory_l[slot] >= task.memory):
            reward = self._start(task, slot)
            valid = True
        else:
            reward = self._invalid_penalty
            valid = False
            self.invalid += 1
            task.waits += 1
            if not self._hol:
                heapq.heappop(self._ready)  # current task is the heap top
                self._deferred.append(task)
            else:
                self._wait()
        self._select()
        if self.current is not None and (self.decisions >= self._max_decisions
                                         or self.t > self._t_cap):
            self.truncated = True
            self.current = None
            self._emit_end()
        return StepResult(reward - self._pending_penalty, valid, self.terminated, self.truncated)

    def _wait(self) -> None:
        """A wait: the clock moves by wait_dt_s, or to the next event with that switch on."""
        if self.cfg.mdp.advance_to_next_event and self._events:
            self._advance_to(self._events[0][0])
        else:
            self._advance_to(self.t + self.cfg.mdp.wait_dt_s)

    def _start(self, task: _Task, slot: int) -> float:
        heapq.heappop(self._ready)
        t = self.t
        exec_s = task.compute / self._compute_l[slot]
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
        self._busy_l[slot] = True
        self.busy_until[slot] = t + delay + exec_s
        self.running[slot] = task
        self.run_start[slot] = t
        self._feat[slot, 3] = self._busy_pf_l[slot]
        self._seq += 1  # _push, inlined (hot path)
        heapq.heappush(self._events, (t + delay + exec_s, FINISH, self._seq, slot, (task.token, task)))
        if self.trace is not None:
            ev = {"t": t, "event": "start", "task": task.id, "server": sid}
            if delay:
                ev["transfer_s"] = delay
            self._emit(ev)
        w1, t0, w2, t0c, w3, e0 = self._reward_consts
        reward = w1 * math.exp(-exec_s / t0)
        if comm_s:
            reward -= w2 * comm_s / t0c
        if w3:
            reward -= w3 * self._busy_w_l[slot] * exec_s / e0
        return reward

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
        # encode_task inlined (hot path); the max(., 0) clamp is dropped because a validated
        # WorkflowSpec has no negative demand, so the values are the same bit for bit.
        c = f.clip
        feat_task = np.array((min(task.compute / f.compute_unit, c),
                              min(task.memory / f.memory_gb, c),
                              min(len(task.children) / f.successors, c),
                              min(wf.done / wf.n, c),
                              min(task.output / f.output_gb, c)), dtype=np.float32)
        if self._backlog:
            feat_task = self._with_backlog(feat_task, task)
        fp = task.first_parent
        transfer, parent_slot = 0.0, None
        if fp is not None:
            transfer = fp.output / self._bw + self._lat
            parent_slot = self._slot_of.get(fp.sid)
        servers = self._features.render(self.busy_until, self.t, transfer, parent_slot)
        if self._mask_infeasible:
            mask = ((self.memory >= task.memory) & self.accepting).astype(np.float32)
        else:
            mask = self._accept_f.copy()
        return {"task": feat_task, "servers": servers, "action_mask": mask}

    def _with_backlog(self, feat_task: np.ndarray, task: _Task) -> np.ndarray:
        """features.backlog (``envs.encoding.with_backlog``): ready tasks (the current one
        included) per accepting server, and the age of the task's workflow (now - arrival)."""
        ready = len({tid for _, tid, tk in self._ready if tk.state == READY} | {task.id})
        return with_backlog(feat_task, ready, int(self.accepting.sum()), self.t - task.wf.arrival,
                            self.cfg.features)

    # ---------------------------------------------------------------- metrics
    def _emit_end(self) -> None:
        if self.trace is not None:
            self._emit({"t": self.t, "event": "end", "truncated": self.truncated,
                        "metrics": self.metrics()})

    def metrics(self) -> dict[str, Any]:
        """Episode metrics over completed tasks/workflows (see docs/simulator.md)."""
        resp = [tk.finish - tk.wf.arrival for tk in self.tasks if tk.state == DONE]
        # every arrived task; an unfinished one (truncated episode) counts its age at the end, a
        # lower bound of its response: no survivor bias when a policy leaves tasks unfinished
        resp_all = [(tk.finish if tk.state == DONE else self.t) - tk.wf.arrival for tk in self.tasks]
        wfs = [w for w in self.workflows if w.done == w.n]
        wresp = [w.finish - w.arrival for w in wfs]
        slow = [(w.finish - w.arrival) / w.lower_bound for w in wfs if w.lower_bound > 0]
        # busy / alive server-seconds; a task still running at the cutoff (a truncated episode)
        # counts its time so far
        busy = self.busy_seconds + sum(self.t - self.run_start[slot]
                                       for slot, tk in enumerate(self.running) if tk is not None)
        return {
            "completed_tasks": len(resp),
            "arrived_tasks": len(self.tasks),
            "completed_workflows": len(wfs),
            "mean_response_s": float(np.mean(resp)) if resp else math.nan,
            "censored_response_s": float(np.mean(resp_all)) if resp_all else math.nan,
            "p95_response_s": float(np.percentile(resp, 95)) if resp else math.nan,
            "mean_workflow_response_s": float(np.mean(wresp)) if wresp else math.nan,
            "slowdown": float(np.mean(slow)) if slow else math.nan,
            "utilization": float(busy / self.alive_seconds) if self.alive_seconds else 0.0,
            "makespan_s": float(self.t),
            "decisions": self.decisions,
            "invalid_rate": self.invalid / self.decisions if self.decisions else 0.0,
            "lost_tasks": self.lost,
            "truncated": self.truncated,
        }
