"""Two-level fair share between tenants: the decision core's rule (``envs.decision``), used by
the live runtime and the scheduler service (``live.fair_share``).

Level one, *which tenant*: start-time fair queuing over resource-seconds (Goyal, Vin, Cheng,
SIGCOMM '96, with the multi-server virtual time of the oldest run in service). Every tenant has
a virtual-time **tag**. When one of its tasks is placed, the task's start tag is the tenant's tag
and the tag advances by the task's work / the tenant's weight (work: resource-seconds, its run
at the servers' mean speed x the largest share of an average node it holds, at least
:data:`MIN_SHARE`). The system virtual time ``V`` is the smallest start tag of a task placed and
not finished (with none: the largest start tag ever placed). Whenever a tenant's next task takes
its place in the queue its tag is lifted to ``max(tag, V)``: a tenant that was idle (or had
nothing that could be placed) starts at ``V``, so it banks no credit.

Level two, *which of its tasks*: the configured order (``envs.order``: the task's queue key,
``fifo`` by default: oldest workflow first).

:class:`FairQueue` is a :class:`envs.decision.ReadyQueue` that keeps each tenant's ready tasks
in a lane (a heap by order key) and only each tenant's best task, its *head*, in the core's heap,
keyed ``(tenant tag, order key)``. So the core takes the head of the tenant with the smallest
tag; a head that fits no server now is deferred (or set aside) as any task and the tenant's next
task takes its place, so the next task placed is the one of the smallest-tag tenant that has a
ready task that fits (within the core's ``NODE_LOOK``). Placing a head charges its tenant and
seats the tenant's next task, under the new tag.

Another tenant's task, queued while one tenant's big workflow runs, has tag ``V`` (the oldest
running start tag), strictly below the big tenant's tag, so it takes the next server that frees:
it waits for at most one running task of the big workflow, at any time scale and cluster size.
With equal weights, busy tenants get equal resource-seconds (to one task). A hedged copy is not
charged; a task placed again (its run lost) is charged again.

Tasks are any objects with the core's ``state``, ``key``, ``demands`` and ``waits`` plus a
writable ``share`` (its start tag once placed).
"""

from __future__ import annotations

import heapq
from itertools import chain
from typing import Any, Callable, Iterable

from .decision import READY, RUNNING, ReadyQueue

__all__ = ["FairShare", "FairQueue", "MIN_SHARE"]

# the least share of an average node a task is charged at (a num_cpus: 0 task is not free)
MIN_SHARE = 1 / 16


class FairShare:
    """The tenants' virtual-time tags (module docstring). ``weights``: a tenant's weight (> 0;
    unlisted tenants 1): its tag advances by work / weight. ``alive(task)``: whether a placed
    task still counts for ``V`` (default: its ``state`` is READY, placed but not started yet,
    or RUNNING; the live runtime also drops a task whose workflow failed or was cancelled)."""

    def __init__(self, weights: dict[str, float] | None = None,
                 alive: Callable[[Any], bool] | None = None) -> None:
        self._alive = alive or (lambda t: t.state == RUNNING or t.state == READY)
        self.tags: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        for tenant, w in (weights or {}).items():
            self.set_weight(tenant, w)
        self._running: list[tuple[float, int, Any]] = []  # heap: (start tag, seq, task)
        self._seq = 0
        self._last = 0.0  # the largest start tag placed (V with nothing running)

    def set_weight(self, tenant: str, weight: float) -> None:
        if not weight > 0 or weight == float("inf"):
            raise ValueError(f"fair share weight of {tenant!r} must be finite and > 0, "
                             f"got {weight!r}")
        self.weights[tenant] = float(weight)

    def virtual_time(self) -> float:
        """``V``: the smallest start tag of a task placed and not finished (``alive``, its
        ``share`` still that tag), else the largest start tag ever placed."""
        heap = self._running
        alive = self._alive
        while heap:
            tag, _, t = heap[0]
            if t.share == tag and alive(t):
                return tag
            heapq.heappop(heap)
        return self._last

    def lift(self, tenant: str) -> float:
        """The tenant's next task takes its place in the queue: its tag becomes
        ``max(tag, V)`` (no credit banked while idle); returns it."""
        tag = max(self.tags.get(tenant, 0.0), self.virtual_time())
        self.tags[tenant] = tag
        return tag

    def charge(self, tenant: str, task: Any, work: float) -> float:
        """``task`` of ``tenant`` is placed: its start tag (``task.share``) is the tenant's tag,
        which advances by ``work`` / its weight; returns the start tag."""
        tag = self.tags.get(tenant)
        if tag is None:
            tag = self.lift(tenant)
        task.share = tag
        self._seq += 1
        heapq.heappush(self._running, (tag, self._seq, task))
        if tag > self._last:
            self._last = tag
        self.tags[tenant] = tag + max(work, 0.0) / self.weights.get(tenant, 1.0)
        return tag


class FairQueue(ReadyQueue):
    """The ready queue of the two-level fair share (module docstring).

    Args:
        fair: the tenants' tags.
        tenant_of: a task's tenant.
        work_of: what placing a task charges its tenant (resource-seconds).

    ``heap`` holds the tenants' heads as ``((tag, order key), tie, task)``; ``lanes`` a heap of
    ``(order key, tie, task)`` per tenant; deferred and set-aside entries are heads that were
    taken off. An entry whose task is no longer ready or was re-keyed is dropped when met."""

    __slots__ = ("fair", "tenant_of", "work_of", "lanes", "heads")

    def __init__(self, fair: FairShare, tenant_of: Callable[[Any], str],
                 work_of: Callable[[Any], float]) -> None:
        super().__init__()
        self.fair, self.tenant_of, self.work_of = fair, tenant_of, work_of
        self.lanes: dict[str, list[tuple]] = {}
        self.heads: dict[str, tuple] = {}

    # ------------------------------------------------------------------ the core's calls
    def fresh(self, entry: tuple) -> bool:
        """Whether a heap entry is its tenant's seated head and still ready."""
        t = entry[2]
        return t.state == READY and self.heads.get(self.tenant_of(t)) is entry

    def push(self, key: tuple, tie: int, task: Any) -> None:
        """``task`` is ready (or re-keyed) under order key ``key``: it joins its tenant's lane,
        and takes the tenant's seat if it goes before the seated head."""
        tenant = self.tenant_of(task)
        lane = self.lanes.get(tenant)
        if lane is None:
            lane = self.lanes[tenant] = []
        heapq.heappush(lane, (key, tie, task))
        head = self.heads.get(tenant)
        if head is None:
            self._seat(tenant)
        elif head[2] is task or (key, tie) < (head[0][1], head[1]):
            self._unseat(tenant)
            self._seat(tenant)

    def drop_head(self) -> None:
        e = heapq.heappop(self.heap)
        self._vacate(e)

    def pop_head(self) -> tuple:
        """A valid pick: the head leaves the queue, its tenant is charged and its next task
        seated."""
        e = heapq.heappop(self.heap)
        t = e[2]
        tenant = self.tenant_of(t)
        if self.heads.get(tenant) is e:
            del self.heads[tenant]
            self.fair.charge(tenant, t, self.work_of(t))
            self._seat(tenant)
        return e

    def defer_head(self) -> None:
        e = heapq.heappop(self.heap)
        self.deferred.append(e)
        self._deferred_heap = False
        self._vacate(e)

    def block_head(self) -> None:
        e = heapq.heappop(self.heap)
        self.blocked.append(e)
        self._vacate(e)

    def defer_all(self) -> None:
        """No server can start anything: every seated head is deferred (the lanes wait)."""
        self.deferred.extend(self.heap)
        self.heap.clear()
        self.heads.clear()
        self._deferred_heap = False

    def requeue_deferred(self) -> None:
        d = self.deferred
        if d:
            self.deferred = []
            self._return(d)
        self._deferred_heap = False

    def requeue_blocked(self) -> None:
        b = self.blocked
        if b:
            self.blocked = []
            self._return(b)

    def ready_count(self, tie: int) -> int:
        return len({i for _, i, t in self.entries() if t.state == READY} | {tie})

    def entries(self) -> Iterable[tuple]:
        return chain(list(self.heap), list(self.deferred), list(self.blocked),
                     *[list(lane) for lane in list(self.lanes.values())])

    def copy(self, remap: Callable[[Any], Any]) -> ReadyQueue:
        """A plain queue of every ready task under its order key (a planner's snapshot)."""
        seen, out = set(), []
        for e in self.entries():
            t = e[2]
            if t.state == READY and id(t) not in seen:
                seen.add(id(t))
                out.append((t.key, e[1], remap(t)))
        heapq.heapify(out)
        return ReadyQueue(out)

    # ------------------------------------------------------------------ seats
    def _seat(self, tenant: str) -> None:
        """Seat the tenant's best ready task of its lane (under its tag, lifted to ``V``)."""
        lane = self.lanes.get(tenant)
        while lane:
            key, tie, t = heapq.heappop(lane)
            if t.state == READY and (key is t.key or key == t.key):
                e = ((self.fair.lift(tenant), key), tie, t)
                self.heads[tenant] = e
                heapq.heappush(self.heap, e)
                return
        self.heads.pop(tenant, None)
        if lane is not None:
            del self.lanes[tenant]

    def _unseat(self, tenant: str) -> None:
        """The seated head goes back to its lane (its heap entry is dropped when met)."""
        e = self.heads.pop(tenant, None)
        if e is not None:
            heapq.heappush(self.lanes.setdefault(tenant, []), (e[0][1], e[1], e[2]))

    def _vacate(self, e: tuple) -> None:
        """Heap entry ``e`` left the heap: if it was its tenant's head, the next task sits."""
        tenant = self.tenant_of(e[2])
        if self.heads.get(tenant) is e:
            del self.heads[tenant]
            self._seat(tenant)

    def _return(self, entries: list[tuple]) -> None:
        """Deferred or set-aside heads compete again: back to their lanes, seats re-dealt."""
        touched = set()
        for (_, key), tie, t in entries:
            tenant = self.tenant_of(t)
            touched.add(tenant)  # a head that is no longer ready still frees its tenant's seat
            if t.state == READY:
                heapq.heappush(self.lanes.setdefault(tenant, []), (key, tie, t))
        for tenant in touched:
            self._unseat(tenant)
            self._seat(tenant)
