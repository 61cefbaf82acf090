"""The decision core: one placement round, shared by the simulator, Serve and the live runtime.

A *placement round* happens at one instant. Ready tasks are taken in first-level order
(:class:`ReadyQueue`: the key the caller gives, e.g. ``(-rank, workflow arrival)``, then the task
id); for each one, in order:

1. a task that no longer is ready (finished, lost, cancelled) is dropped from the queue;
2. a task whose memory fits no accepting server is *blocked*: set aside until the server set
   changes (:meth:`ReadyQueue.requeue_blocked`);
3. with ``ask_only_startable``, a task that no accepting idle server fits waits without asking
   the policy (a *forced wait*);
4. otherwise the policy is asked (:meth:`ServerTable.observe` builds its observation with the one
   encoder, ``envs.encoding``) and its pick is *valid* when the server is accepting, idle and
   fits the task (:meth:`ServerTable.can_start`): the task starts there. Any other pick is a
   *wait*: the task's ``waits`` grows by one.

A wait (forced or not) ends the round under ``head_of_line_blocking`` (the paper: the whole
ready set waits); without it only that task is *deferred* (skipped until the clock moves:
:meth:`ReadyQueue.requeue_deferred`) and the next one is placed.

Who drives it: the simulator steps through a round one decision at a time (the agent acts between
:meth:`DecisionCore.next_task` and :meth:`DecisionCore.resolve`) and owns the clock; Serve's
``/v1/schedule`` and the live scheduler call :meth:`DecisionCore.run_round` with the policy.
Each keeps its own clock and executor; the rules live here only.

Ray's resource model (``envs.nodes``): a :class:`envs.nodes.NodeTable` in place of the
:class:`ServerTable` (``pooled``) runs every task whose demands fit a node's free resources; its
``fits_now`` is the valid pick and its ``_demand_state`` steps 2 and 3 (every task has demands);
a round there sets aside at most :data:`NODE_LOOK` tasks that fit no node now.

Demands beyond memory (the live scheduler: a task's Ray options, e.g. GPUs): a table given
per-server capacities (:meth:`ServerTable.set_caps`) also checks each task's ``demands``
(sorted ``(resource, amount)`` pairs) wherever it checks memory: in 2, 3, 4 and the action mask.
Without capacities (the simulator, Serve) nothing but memory is checked.

NumPy and stdlib only. Tasks are any objects with ``state`` (this module's :data:`READY` ...),
``memory_gb`` and ``waits`` attributes (and ``demands`` where the table has capacities); :meth:`ReadyQueue.push` takes their order key and an
integer tie breaker (the task id).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Generator, NamedTuple

import numpy as np

from .config import FeatureConfig
from .encoding import ServerFeatures, encode_task, with_backlog

READY, RUNNING, DONE, WAITING = range(4)  # task states shared by every driver of the core

# What next_task found when it returns no task to ask about.
EMPTY, HOL_WAIT = 0, 1

# Ray's resource model: a round stops after this many ready tasks that fit no node now were set
# aside (the rest keep their place for the next round), so a round under a backlog of any size
# costs O(NODE_LOOK) and not O(backlog); a smaller task deeper in the queue than that waits for
# the next round. Like a batch scheduler's backfill depth (Slurm's bf_max_job_test).
NODE_LOOK = 64


class Rules(NamedTuple):
    """The decision switches (``mdp`` in the env config; Serve and live carry the same)."""
    head_of_line_blocking: bool = True
    ask_only_startable: bool = False
    mask_infeasible: bool = True


class ReadyQueue:
    """Ready tasks in first-level order, plus the tasks a wait set aside (*deferred*, back at the
    next clock move) and those that fit no accepting server (*blocked*, back when the server set
    changes). The heap holds ``(key, tie, task)`` entries; a task pushed twice is harmless (stale
    or duplicate entries are dropped when they reach the top)."""

    __slots__ = ("heap", "deferred", "blocked", "_deferred_heap")

    def __init__(self, heap: list[tuple] | None = None, deferred: list[tuple] | None = None,
                 deferred_is_heap: bool = False) -> None:
        self.heap: list[tuple] = [] if heap is None else heap  # a heap (heapq)
        self.deferred: list[tuple] = [] if deferred is None else deferred
        self.blocked: list[tuple] = []
        self._deferred_heap = deferred_is_heap  # the deferred list is a heap (defer_all)

    @property
    def deferred_is_heap(self) -> bool:
        """Whether the deferred list is kept as a heap (after ``defer_all``)."""
        return self._deferred_heap

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, key: tuple, tie: int, task: Any) -> None:
        """Make ``task`` ready (its ``state`` must be :data:`READY`)."""
        heapq.heappush(self.heap, (key, tie, task))

    def defer_head(self) -> None:
        """Set the top task aside until :meth:`requeue_deferred` (a wait without blocking)."""
        self.deferred.append(heapq.heappop(self.heap))
        self._deferred_heap = False

    def block_head(self) -> None:
        """Set the top task aside until :meth:`requeue_blocked` (it fits no server now)."""
        self.blocked.append(heapq.heappop(self.heap))

    def defer_all(self) -> None:
        """Set every task aside until :meth:`requeue_deferred` (no server is idle) without
        walking them: the heap becomes the deferred list whole; only the tasks deferred one by
        one earlier in this round are pushed into it."""
        big = self.heap
        if self.deferred:
            for e in self.deferred:
                heapq.heappush(big, e)
        self.deferred = big
        self.heap = []
        self._deferred_heap = True

    def requeue_deferred(self) -> None:
        """The clock moved: deferred tasks compete again. When the deferred list is a whole
        heap (:meth:`defer_all`) the new arrivals are pushed into it instead, so requeueing a
        backlog costs no more than the tasks that arrived meanwhile."""
        d = self.deferred
        if not d:
            return
        h = self.heap
        if self._deferred_heap and len(d) > len(h):
            for e in h:
                heapq.heappush(d, e)
            self.heap = d
        else:
            for e in d:
                heapq.heappush(h, e)
        self.deferred = []
        self._deferred_heap = False

    def requeue_blocked(self) -> None:
        """The server set changed: blocked tasks may fit now."""
        if self.blocked:
            for e in self.blocked:
                if e[2].state == READY:
                    heapq.heappush(self.heap, e)
            self.blocked.clear()

    def ready_count(self, tie: int) -> int:
        """Ready tasks in the heap, the one with tie breaker ``tie`` included
        (``features.backlog``; tasks deferred in this round are not counted)."""
        return len({i for _, i, tk in self.heap if tk.state == READY} | {tie})

    def copy(self, remap: Callable[[Any], Any]) -> "ReadyQueue":
        """An independent queue with every task replaced by ``remap(task)`` (same heap order)."""
        q = ReadyQueue([(k, i, remap(t)) for k, i, t in self.heap],
                       [(k, i, remap(t)) for k, i, t in self.deferred], self._deferred_heap)
        q.blocked = [(k, i, remap(t)) for k, i, t in self.blocked]
        return q


class ServerTable:
    """Per-slot server state the rules and the encoder read: capacity, whether it accepts work,
    whether it is busy and until when, and the incremental feature matrix
    (:class:`envs.encoding.ServerFeatures`). Slots without a server are not accepting.

    Scalars are mirrored in Python lists (the decision loop reads those: numpy scalar access
    costs several times more); the arrays serve the vectorised observation. ``busy_until`` is in
    the driver's clock; :meth:`observe` renders remaining times against ``now``.
    """

    pooled = False  # one task per slot (envs.nodes.NodeTable: Ray's resource model)

    def __init__(self, n: int, features: FeatureConfig):
        self.n = n
        self.f = features
        self.compute = np.zeros(n)
        self.memory = np.zeros(n)
        self.busy_until = np.zeros(n)
        self.accepting = np.zeros(n, dtype=bool)
        self.accept_f = np.zeros(n, dtype=np.float32)  # float copy of accepting (the plain mask)
        self.compute_l = [0.0] * n
        self.memory_l = [0.0] * n
        self.accept_l = [False] * n
        self.busy_l = [False] * n
        self.idle_pf_l = [0.0] * n  # normalised power feature when idle / busy
        self.busy_pf_l = [0.0] * n
        self.features = ServerFeatures(n, features)
        self.max_accept_mem = 0.0
        self.caps: list[dict[str, float]] | None = None  # per-slot capacities for demands
        self._eligible: dict[tuple, np.ndarray] = {}

    @property
    def busy(self) -> np.ndarray:
        """Whether each slot runs a task now, (n,) bool (a copy of ``busy_l``)."""
        return np.array(self.busy_l, dtype=bool)

    # ------------------------------------------------------------------ state changes
    def set_server(self, slot: int, compute: float, memory_gb: float, idle_w: float,
                   busy_w: float, accepting: bool = True) -> None:
        """A server takes ``slot`` (idle)."""
        self.compute[slot] = compute
        self.memory[slot] = memory_gb
        self.busy_until[slot] = 0.0
        self.compute_l[slot] = compute
        self.memory_l[slot] = memory_gb
        self.busy_l[slot] = False
        f = self.features
        self.idle_pf_l[slot] = f.power_feature(idle_w)
        self.busy_pf_l[slot] = f.power_feature(busy_w)
        f.set_server(slot, compute, memory_gb, idle_w)
        self.set_accepting(slot, accepting)

    def set_servers(self, compute: np.ndarray, memory_gb: np.ndarray, power_w: np.ndarray,
                    busy_power_w: np.ndarray, accepting: np.ndarray,
                    remaining_s: np.ndarray) -> None:
        """Fill every slot at once from arrays (a request's or a node set's servers; the clock
        is 0, so ``remaining_s`` are the busy-until times). ``power_w``: the current draw."""
        self.compute[:] = compute
        self.memory[:] = memory_gb
        self.busy_until[:] = remaining_s
        self.accepting[:] = accepting
        self.accept_f[:] = accepting
        # lists refilled in place: a driver may hold references to them
        self.compute_l[:] = self.compute.tolist()
        self.memory_l[:] = self.memory.tolist()
        self.accept_l[:] = self.accepting.tolist()
        self.busy_l[:] = (self.busy_until > 0.0).tolist()
        f = self.features
        self.busy_pf_l[:] = [f.power_feature(w) for w in np.asarray(busy_power_w).tolist()]
        f.set_servers(self.compute, self.memory, power_w)
        self.refresh()

    def set_accepting(self, slot: int, accepting: bool) -> None:
        self.accepting[slot] = accepting
        self.accept_l[slot] = accepting
        self.accept_f[slot] = 1.0 if accepting else 0.0
        self.refresh()

    def clear(self, slot: int) -> None:
        """The server leaves ``slot``."""
        self.busy_l[slot] = False
        self.busy_until[slot] = 0.0
        self.features.clear(slot)
        self.set_accepting(slot, False)

    def set_caps(self, caps: list[dict[str, float]] | None) -> None:
        """Per-slot capacities (resource -> amount) that tasks' ``demands`` are checked against
        (None: demands are not checked)."""
        self.caps = caps
        self._eligible = {}

    def eligible(self, demands: tuple[tuple[str, float], ...]) -> np.ndarray:
        """Slots whose capacities cover ``demands`` (cached per demand set)."""
        m = self._eligible.get(demands)
        if m is None:
            caps = self.caps or []
            m = np.zeros(self.n, dtype=bool)
            for i, c in enumerate(caps[:self.n]):
                m[i] = all(c.get(k, 0.0) >= v - 1e-9 for k, v in demands)
            self._eligible[demands] = m
        return m

    def _demand_state(self, demands: tuple, memory_gb: float) -> int:
        """For a task with ``demands``: 0 no accepting server fits it, 1 one fits but none is
        idle, 2 an accepting idle server fits it."""
        ok = np.flatnonzero(self.eligible(demands) & self.accepting & (self.memory >= memory_gb))
        if not ok.size:
            return 0
        busy = self.busy_l
        return 2 if any(not busy[i] for i in ok.tolist()) else 1

    def refresh(self) -> None:
        acc = self.memory[self.accepting]
        self.max_accept_mem = float(acc.max()) if acc.size else 0.0

    def start(self, slot: int, until: float) -> None:
        """Slot ``slot`` runs a task until ``until`` (busy power)."""
        self.busy_l[slot] = True
        self.busy_until[slot] = until
        self.features.matrix[slot, 3] = self.busy_pf_l[slot]

    def finish(self, slot: int) -> None:
        """Slot ``slot`` is idle again (idle power)."""
        self.busy_l[slot] = False
        self.features.matrix[slot, 3] = self.idle_pf_l[slot]

    # ------------------------------------------------------------------ the rules
    def can_start(self, slot: int, memory_gb: float) -> bool:
        """The valid pick: accepting, idle and the memory fits."""
        return (0 <= slot < self.n and self.accept_l[slot] and not self.busy_l[slot]
                and self.memory_l[slot] >= memory_gb)

    def max_idle_memory(self) -> float:
        """The largest memory of an accepting idle server; -1 when none is idle (one pass
        over the servers: the cost of a round never depends on the backlog)."""
        best = -1.0
        for acc, busy, mem in zip(self.accept_l, self.busy_l, self.memory_l):
            if acc and not busy and mem > best:
                best = mem
        return best

    def startable(self, memory_gb: float) -> bool:
        """Whether some accepting, idle server fits ``memory_gb`` now."""
        for acc, busy, mem in zip(self.accept_l, self.busy_l, self.memory_l):
            if acc and not busy and mem >= memory_gb:
                return True
        return False

    def observe(self, task: np.ndarray, now: float, transfer_s: float, parent_slot: int | None,
                memory_gb: float, mask_infeasible: bool, demands: tuple = ()
                ) -> dict[str, np.ndarray]:
        """The observation of placing a task (its feature vector ``task``,
        :func:`task_vector`) on these servers at time ``now``; ``transfer_s`` applies to every
        server but ``parent_slot``. The action mask: accepting servers (with ``mask_infeasible``,
        those the task fits: memory, and ``demands`` where the table has capacities)."""
        if mask_infeasible:
            fit = (self.memory >= memory_gb) & self.accepting
            if demands and self.caps is not None:
                fit &= self.eligible(demands)
            mask = fit.astype(np.float32)
        else:
            mask = self.accept_f.copy()
        return {"task": task,
                "servers": self.features.render(self.busy_until, now, transfer_s, parent_slot),
                "action_mask": mask}

    def copy(self) -> "ServerTable":
        """An independent table in this one's state (the simulator's fork)."""
        out = object.__new__(ServerTable)
        out.__dict__.update(self.__dict__)
        for k in ("compute", "memory", "busy_until", "accepting", "accept_f"):
            setattr(out, k, getattr(self, k).copy())
        for k in ("compute_l", "memory_l", "accept_l", "busy_l", "idle_pf_l", "busy_pf_l"):
            setattr(out, k, list(getattr(self, k)))
        out.features = self.features.copy()
        return out


def task_vector(f: FeatureConfig, compute_gflop: float, memory_gb: float, successors: int,
                completion_ratio: float, output_gb: float, ready_tasks: int = 1,
                accepting_servers: int = 0, workflow_age_s: float = 0.0) -> np.ndarray:
    """The task's features (``envs.encoding.encode_task``, with the backlog columns when
    ``features.backlog``)."""
    vec = encode_task(compute_gflop, memory_gb, successors, completion_ratio, output_gb, f)
    if f.backlog:
        vec = with_backlog(vec, ready_tasks, accepting_servers, workflow_age_s, f)
    return vec


class DecisionCore:
    """A :class:`ReadyQueue` and a :class:`ServerTable` under :class:`Rules` (module docstring).

    Counters: ``forced_waits`` (waits made without asking), ``waits`` (picks that did not start
    their task), ``decisions`` (policy answers), ``look_stops`` (rounds ``node_look`` ended).
    """

    def __init__(self, servers: ServerTable, rules: Rules):
        self.servers = servers
        self.rules = rules
        self._hol = rules.head_of_line_blocking  # hot path: plain attributes
        self._only_startable = rules.ask_only_startable
        self.queue = ReadyQueue()
        self.forced_waits = 0
        self.waits = 0
        self.decisions = 0
        self._looked = 0  # tasks set aside this round in Ray's resource model (NODE_LOOK)
        #: the most tasks a round in Ray's resource model sets aside (NODE_LOOK; 0: no bound)
        self.node_look = NODE_LOOK
        self.look_stops = 0  # rounds that node_look ended with tasks left unlooked at

    def next_task(self) -> tuple[Any, int]:
        """``(task, EMPTY)``: the next task to ask the policy about (it stays on top of the
        queue until :meth:`resolve`), or ``(None, EMPTY)`` when no ready task is left this
        round, or ``(None, HOL_WAIT)`` when a forced wait under head-of-line blocking ends it."""
        queue = self.queue
        heap = queue.heap
        servers = self.servers
        idle_mem = None  # largest memory of an accepting idle server, read once per call
        while heap:
            entry = heap[0]
            task = entry[2]
            if task.state != READY or entry[0] is not task.key and entry[0] != task.key:
                heapq.heappop(heap)  # stale: no longer ready, or re-keyed (a newer entry exists)
                continue
            memory = task.memory_gb
            if memory > servers.max_accept_mem:  # fits no accepting server: set aside
                queue.block_head()
                continue
            if servers.caps is not None and task.demands:  # demands beyond memory (live)
                fit = servers._demand_state(task.demands, memory)
                if fit == 0:
                    queue.block_head()
                    continue
                if fit == 1 and self._only_startable:
                    if servers.pooled and not self._hol:
                        if self._looked >= self.node_look > 0:
                            self.look_stops += 1
                            return None, EMPTY  # the rest keep their place (NODE_LOOK)
                        self._looked += 1
                    self.forced_waits += 1
                    if self._hol:
                        return None, HOL_WAIT
                    queue.defer_head()
                    continue
                return task, EMPTY
            if self._only_startable:
                if idle_mem is None:
                    idle_mem = servers.max_idle_memory()
                if memory > idle_mem:  # no accepting idle server fits it: a forced wait
                    self.forced_waits += 1
                    if self._hol:
                        return None, HOL_WAIT
                    if idle_mem < 0.0:  # no server is idle: every ready task waits, unwalked
                        queue.defer_all()
                        return None, EMPTY
                    queue.defer_head()
                    continue
            return task, EMPTY
        return None, EMPTY

    def resolve(self, task: Any, slot: int) -> bool:
        """Apply the pick ``slot`` for ``task`` (the one :meth:`next_task` returned). True: the
        pick is valid and the task left the queue; the caller starts it (and marks the server
        busy with :meth:`ServerTable.start`). False: a wait (counted on the task); without
        head-of-line blocking the task is deferred, with it the round is over."""
        self.decisions += 1
        srv = self.servers
        if srv.pooled:  # Ray's resource model (envs.nodes): the demands fit the free resources
            ok = srv.fits_now(slot, task.demands)
        else:  # one task per slot: can_start, inlined (hot path)
            ok = (0 <= slot < srv.n and srv.accept_l[slot] and not srv.busy_l[slot]
                  and srv.memory_l[slot] >= task.memory_gb
                  and (srv.caps is None or not task.demands or srv.eligible(task.demands)[slot]))
        if ok:
            heapq.heappop(self.queue.heap)
            return True
        task.waits += 1
        self.waits += 1
        if not self._hol:
            self.queue.defer_head()
        return False

    def run_round(self, ask: Callable[[Any], int], start: Callable[[Any, int], None],
                  waited: Callable[[Any, str], None] | None = None) -> None:
        """One whole round at this instant: ``ask(task) -> slot`` (observe, policy, guard),
        ``start(task, slot)`` for a valid pick (it must mark the server busy), ``waited(task,
        reason)`` for a task left unplaced (reason ``wait``, or ``blocked`` behind a
        head-of-line wait). Deferred tasks are requeued at the end (the caller's clock moves
        before the next round). :meth:`round` is the same round as a generator."""
        steps = self.round(start, waited)
        try:
            task = next(steps)
            while True:
                task = steps.send(ask(task))
        except StopIteration:
            pass

    def round(self, start: Callable[[Any, int], None],
              waited: Callable[[Any, str], None] | None = None) -> Generator[Any, int, None]:
        """:meth:`run_round` for a caller that is asked instead of asking (a gym env stepping
        one pick at a time): it yields each task to place and is sent the pick."""
        self._looked = 0
        while True:
            task, why = self.next_task()
            if task is None:
                if why == HOL_WAIT and waited is not None:
                    self._report_hol(waited)
                break
            slot = yield task
            if self.resolve(task, slot):
                start(task, slot)
                continue
            if self._hol:
                if waited is not None:
                    self._report_hol(waited)
                break
        if waited is not None:
            for _, _, t in self.queue.deferred:
                waited(t, "wait")
        self.queue.requeue_deferred()

    def _report_hol(self, waited: Callable[[Any, str], None]) -> None:
        """Under head-of-line blocking: the top task waits, every ready task behind it too."""
        heap = sorted(e for e in self.queue.heap if e[2].state == READY)
        for i, (_, _, t) in enumerate(heap):
            waited(t, "wait" if i == 0 else "blocked")
