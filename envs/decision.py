"""The decision core: one placement round, shared by the simulator, Serve and the live runtime.

A *placement round* happens at one instant. Ready tasks are taken in first-level order
(:class:`ReadyQueue`: the key the order gives, ``envs.order``, then the task id); for each one,
in order:

1. a task that no longer is ready (finished, lost, cancelled) is dropped from the queue;
2. a task no accepting node could ever hold is *blocked*: set aside until the node set changes
   (:meth:`ReadyQueue.requeue_blocked`);
3. with ``ask_only_startable``, a task that no node can start now waits without asking the
   policy (a *forced wait*);
4. otherwise the policy is asked and its pick is *valid* when the task's demands fit the node's
   free resources now (:meth:`envs.nodes.NodeTable.fits_now`; on the paper's servers of one
   slot: the server is idle and its memory fits): the task starts there. Any other pick is a
   *wait*: the task's ``waits`` grows by one.

A wait (forced or not) ends the round under ``head_of_line_blocking`` (the paper: the whole
ready set waits); without it only that task is *deferred* (skipped until the clock moves:
:meth:`ReadyQueue.requeue_deferred`) and the next one is placed. When no node can start
anything (:meth:`envs.nodes.NodeTable.full`) the whole queue is deferred at once; otherwise a
round sets aside at most :data:`NODE_LOOK` tasks that fit no node now, so a round under a backlog
of any size costs O(NODE_LOOK), not O(backlog).

Who drives it: the simulator steps through a round one decision at a time (the agent acts between
:meth:`DecisionCore.next_task` and :meth:`DecisionCore.resolve`) and owns the clock; Serve's
``/v1/schedule`` and the live runtime call :meth:`DecisionCore.run_round` with the policy.
Each keeps its own clock and executor; the rules live here and in the table only.

The two-level fair share between tenants (``envs.fairshare.FairQueue``) is a ready queue of this
core: only each tenant's best task sits in the heap, keyed by its tenant's virtual-time tag.

Stdlib only (the table: numpy). Tasks are any objects with ``state`` (this module's
:data:`READY` ...), ``key``, ``demands`` and ``waits`` attributes; :meth:`ReadyQueue.push` takes
their order key and an integer tie breaker (the task id).
"""

from __future__ import annotations

import heapq
from itertools import chain
from typing import Any, Callable, Generator, Iterable, NamedTuple

from .nodes import NodeTable

READY, RUNNING, DONE, WAITING = range(4)  # task states shared by every driver of the core

# What next_task found when it returns no task to ask about.
EMPTY, HOL_WAIT = 0, 1

# A round stops after this many ready tasks that fit no node now were set aside (the rest keep
# their place for the next round), so a round under a backlog of any size costs O(NODE_LOOK) and
# not O(backlog); a smaller task deeper in the queue than that waits for the next round. Like a
# batch scheduler's backfill depth (Slurm's bf_max_job_test).
NODE_LOOK = 64


class Rules(NamedTuple):
    """The decision switches (``mdp`` in the env config; Serve and live carry the same)."""
    head_of_line_blocking: bool = True
    ask_only_startable: bool = False
    mask_infeasible: bool = True
    node_look: int = NODE_LOOK  # the most tasks a round sets aside that fit no node now (0: all)


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

    #: a queue whose heap entries need more than the core's staleness check (``key`` and
    #: ``state``): ``fresh(entry) -> bool`` (``envs.fairshare.FairQueue``); None: the core's
    fresh: Callable[[tuple], bool] | None = None

    def push(self, key: tuple, tie: int, task: Any) -> None:
        """Make ``task`` ready (its ``state`` must be :data:`READY`)."""
        heapq.heappush(self.heap, (key, tie, task))

    def drop_head(self) -> None:
        """Drop the top entry (stale: its task is no longer ready, or was re-keyed)."""
        heapq.heappop(self.heap)

    def pop_head(self) -> tuple:
        """The top task was placed: it leaves the queue."""
        return heapq.heappop(self.heap)

    def entries(self) -> Iterable[tuple]:
        """Every entry held (queued, deferred, set aside; stale ones too), a snapshot."""
        return chain(list(self.heap), list(self.deferred), list(self.blocked))

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


class DecisionCore:
    """A :class:`ReadyQueue` and a :class:`envs.nodes.NodeTable` under :class:`Rules` (module
    docstring).

    Counters: ``forced_waits`` (waits made without asking), ``waits`` (picks that did not start
    their task), ``decisions`` (policy answers), ``look_stops`` (rounds :data:`NODE_LOOK` ended).
    """

    def __init__(self, table: NodeTable, rules: Rules):
        self.table = table
        self.rules = rules
        self._hol = rules.head_of_line_blocking  # hot path: plain attributes
        self._only_startable = rules.ask_only_startable
        self.queue = ReadyQueue()
        self.forced_waits = 0
        self.waits = 0
        self.decisions = 0
        self._looked = 0  # tasks set aside this round (NODE_LOOK)
        #: the most tasks a round sets aside that fit no node now (NODE_LOOK; 0: no bound)
        self.node_look = rules.node_look
        self.look_stops = 0  # rounds that node_look ended with tasks left unlooked at

    def next_task(self) -> tuple[Any, int]:
        """``(task, EMPTY)``: the next task to ask the policy about (it stays on top of the
        queue until :meth:`resolve`), or ``(None, EMPTY)`` when no ready task is left this
        round, or ``(None, HOL_WAIT)`` when a forced wait under head-of-line blocking ends it."""
        queue = self.queue
        heap = queue.heap
        table = self.table
        fresh = queue.fresh
        while heap:
            entry = heap[0]
            task = entry[2]
            if (task.state != READY or entry[0] is not task.key and entry[0] != task.key) \
                    if fresh is None else not fresh(entry):
                queue.drop_head()  # stale: no longer ready, or re-keyed (a newer entry exists)
                continue
            d = task.demands
            if not table.could_hold(d):  # no accepting node could ever hold it: set aside
                queue.block_head()
                continue
            if self._only_startable and not table.fits_somewhere(d):  # none can start it now
                if self._hol:
                    self.forced_waits += 1
                    return None, HOL_WAIT
                if table.full():  # no node can start anything: every ready task waits, unwalked
                    self.forced_waits += 1
                    queue.defer_all()
                    return None, EMPTY
                if self._looked >= self.node_look > 0:
                    self.look_stops += 1
                    return None, EMPTY  # the rest keep their place (NODE_LOOK)
                self._looked += 1
                self.forced_waits += 1
                queue.defer_head()
                continue
            return task, EMPTY
        return None, EMPTY

    def resolve(self, task: Any, node: int) -> bool:
        """Apply the pick ``node`` for ``task`` (the one :meth:`next_task` returned). True: the
        pick is valid and the task left the queue; the caller starts it (and takes its demands on
        the table). False: a wait (counted on the task); without head-of-line blocking the task
        is deferred, with it the round is over."""
        self.decisions += 1
        if self.table.fits_now(node, task.demands):
            self.queue.pop_head()
            return True
        task.waits += 1
        self.waits += 1
        if not self._hol:
            self.queue.defer_head()
        return False

    def run_round(self, ask: Callable[[Any], int], start: Callable[[Any, int], None],
                  waited: Callable[[Any, str], None] | None = None) -> None:
        """One whole round at this instant: ``ask(task) -> node`` (the policy), ``start(task,
        node)`` for a valid pick (it must take the task's demands on the table), ``waited(task,
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
            node = yield task
            if self.resolve(task, node):
                start(task, node)
                continue
            if self._hol:
                if waited is not None:
                    self._report_hol(waited)
                break
        if waited is not None:
            for _, _, t in self.queue.deferred:
                waited(t, "wait")
        self.queue.requeue_deferred()

    def new_round(self) -> None:
        """A caller stepping :meth:`next_task` itself starts a round (:data:`NODE_LOOK`)."""
        self._looked = 0

    def _report_hol(self, waited: Callable[[Any, str], None]) -> None:
        """Under head-of-line blocking: the top task waits, every ready task behind it too."""
        heap = sorted(e for e in self.queue.heap if e[2].state == READY)
        for i, (_, _, t) in enumerate(heap):
            waited(t, "wait" if i == 0 else "blocked")
