"""A fair share of the servers between tenants (``LiveScheduler.submit(tenant=...)``, the
scheduler service's tenants): start-time fair queuing by *work*, tagged per task.

Each task gets a *start tag*. A tenant's workflow that arrives is laid out in the configured
order (``envs.order``: its tasks by descending rank) as a sequence of work: its first task's tag
is ``S = max(V, F_g)`` and each next task's tag is the previous one's plus that task's work ``w``
(compute at the servers' mean speed, model s; in Ray's resource model times the largest share of
an average node its demands hold, ``NodeTable.dominant_share``: resource-seconds); ``F_g`` (the
tenant's finish tag) moves to the end of the sequence. ``V``, the virtual time, is the smallest
tag of a task running now (or, with nothing running, the largest tag ever started). Ready tasks
go by tag first, then by the configured order.

A workflow's tags advance in steps of ``quantum_s`` of its work (``LiveConfig.
fair_share_quantum_s``): its tasks within one step share a tag, so a workflow smaller than a
step is one tag and runs in the configured order, not interleaved task by task with another
tenant's (exact per-task tags did that to two equal clients: a longer mean workflow response
than the plain order), while another tenant's task waits behind at most one step of a flooding
tenant's work (spread over the servers) plus the run in progress.

So a tenant gets servers in proportion to the work it asked for, not to its number of
workflows: one 10,000-task workflow holds tags ``S .. S + sum(w)``, and another tenant's new
workflow starts at ``V``, the tag of the oldest run in progress, so it is placed at the next free
server (a tie goes to the older workflow, i.e. at most one task). An idle tenant banks no credit
(its tag is lifted to ``V``), and a flooding tenant queues behind itself.

Two levels (:class:`TenantOrder`): the tags say *when* a tenant's turn comes, the configured
order says *which* of its calls takes it. A task that becomes ready joins its tenant's queued
ready tasks, and the tags they hold are dealt out again in ``mdp.order`` (only the few whose
order differs from their tags' order move, at most :data:`LANE_LOOK`): the tenant holds the same
tags, so the share between tenants is unchanged, while within a tenant its oldest program goes
first under ``fifo`` as without the fair share. An agent program's later step
(scale_ray/live/programs.py) is tagged as any new workflow of its tenant and, being of an older
program, takes the tenant's earliest queued tag. With one tenant, the order is the plain order.

Reference: Goyal, Vin, Cheng, "Start-time fair queueing" (SIGCOMM '96), with the multi-server
virtual time of the oldest packet in service.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any, Iterable, Sequence

from .tasks import READY

__all__ = ["FairShare", "TenantOrder", "LANE_LOOK"]

# TenantOrder: the most queued tasks of a tenant whose tags one newly ready task re-deals (the
# cost of a push stays O(LANE_LOOK) under any backlog; beyond it the order is approximate)
LANE_LOOK = 64


class FairShare:
    """Start tags per task of each tenant (module docstring)."""

    def __init__(self, quantum_s: float = 0.0) -> None:
        if not quantum_s >= 0:
            raise ValueError(f"quantum_s must be >= 0, got {quantum_s!r}")
        self.quantum_s = float(quantum_s)
        self._finish: dict[str, float] = {}
        self._last_started = 0.0

    def virtual_time(self, running: Iterable[float]) -> float:
        """``V``: the smallest tag among ``running`` (the tags of the runs in progress), else
        the largest tag ever started."""
        return min(running, default=self._last_started)

    def admit(self, tenant: str, works: Sequence[float], order: Sequence[int],
              running: Iterable[float]) -> list[float]:
        """The start tags of a new workflow of ``tenant``: ``works[i]`` is task i's work (model
        s, >= 0), ``order`` its task indices in the configured order, ``running`` the tags of
        the runs in progress."""
        start = max(self.virtual_time(running), self._finish.get(tenant, 0.0))
        q, done = self.quantum_s, 0.0
        tags = [0.0] * len(works)
        for i in order:  # the work before task i, in whole steps of q (exact with q = 0)
            tags[i] = start + (q * math.floor(done / q) if q > 0 else done)
            done += max(works[i], 0.0)
        self._finish[tenant] = start + done
        return tags

    def started(self, tag: float) -> None:
        """A task with start tag ``tag`` started a run."""
        if tag > self._last_started:
            self._last_started = tag


class TenantOrder:
    """The fair share's second level (module docstring): per tenant, its queued ready tasks
    sorted by their order key (the ready-queue key without the tag), whose tags are kept in
    that order. Tasks are live records (``share``, ``key`` = ``(share, *order key)``, ``gid``,
    ``state``, ``wf``, ``lane``: their entry); an entry whose task started, finished or was
    queued again is dropped when met."""

    def __init__(self) -> None:
        self._lanes: dict[str, list[tuple[tuple, int, Any]]] = {}
        self._clean_at: dict[str, int] = {}

    @staticmethod
    def _live(e: tuple) -> bool:
        t = e[2]
        return t.state == READY and t.lane is e and not t.wf.failed

    def enter(self, t: Any) -> list[Any]:
        """``t`` is about to be queued: it joins its tenant's lane and the tags of the lane's
        tasks out of order with it are dealt out again in order (``t``'s ``share`` and
        ``key`` may change). Returns the other tasks whose tags changed: queue them again."""
        t.lane = None  # queued again (a dynamic order's re-key): its old entry is dead
        tenant = t.wf.handle.tenant
        lane = self._lanes.setdefault(tenant, [])
        if len(lane) > self._clean_at.get(tenant, LANE_LOOK):  # dead entries: amortised O(1)
            lane[:] = [e for e in lane if self._live(e)]
            self._clean_at[tenant] = 2 * max(len(lane), LANE_LOOK)
        okey, s = t.key[1:], t.share
        p = bisect_left(lane, (okey, t.gid))
        older: list[Any] = []  # before t in the order but holding later tags
        i = p - 1
        while i >= 0 and len(older) < LANE_LOOK:
            if not self._live(lane[i]):
                del lane[i]
                p -= 1
            elif lane[i][2].share > s:
                older.append(lane[i][2])
            else:
                break
            i -= 1
        members = older[::-1] + [t]
        j = p
        while not older and j < len(lane) and len(members) <= LANE_LOOK:
            if not self._live(lane[j]):  # after t in the order but holding earlier tags
                del lane[j]
            elif lane[j][2].share < s:
                members.append(lane[j][2])
                j += 1
            else:
                break
        t.lane = entry = (okey, t.gid, t)
        lane.insert(p, entry)
        changed = []
        for u, tag in zip(members, sorted(u.share for u in members)):
            if u.share != tag:
                u.share, u.key = tag, (tag, *u.key[1:])
                if u is not t:
                    changed.append(u)
        return changed
