"""A fair share of the servers between tenants (``LiveScheduler.submit(tenant=...)``, the
scheduler service's tenants): start-time fair queuing by *work*, tagged per task.

Each task gets a *start tag*. A tenant's workflow that arrives is laid out in the configured
order (``envs.order``: its tasks by descending rank) as a sequence of work: its first task's tag
is ``S = max(V, F_g)`` and each next task's tag is the previous one's plus that task's work ``w``
(compute at the servers' mean speed, model s; in Ray's resource model times the largest share of
an average node its demands hold, ``NodeTable.dominant_share``: resource-seconds); ``F_g`` (the tenant's finish tag) moves to the end
of the sequence. ``V``, the virtual time, is the smallest tag of a task running now (or, with
nothing running, the largest tag ever started). Ready tasks go by tag first, then by the
configured order.

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
(its tag is lifted to ``V``), and a flooding tenant queues behind itself. With one tenant the tags
grow with arrival and, within a workflow, with rank: the plain order.

An agent program's later step (scale_ray/live/programs.py) goes on from where its program's
earlier steps' tags ended, lifted to ``V`` as any newcomer: ahead of the tenant's newer
workflows (tagged behind the tenant's finish tag, each step queued behind them, which undid
program-aware ordering in the service). The lift to ``V`` still orders the steps of one
tenant's programs by when they were submitted, not by their programs' arrival, so the fair
share keeps part of per-call ordering (LangGraph agents through the service, with and without
it: results/programs/README.md). The tenant's finish tag still moves by the step's work.

Reference: Goyal, Vin, Cheng, "Start-time fair queueing" (SIGCOMM '96), with the multi-server
virtual time of the oldest packet in service.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

__all__ = ["FairShare"]


class FairShare:
    """Start tags per task of each tenant (module docstring)."""

    def __init__(self, quantum_s: float = 0.0) -> None:
        if not quantum_s >= 0:
            raise ValueError(f"quantum_s must be >= 0, got {quantum_s!r}")
        self.quantum_s = float(quantum_s)
        self._finish: dict[str, float] = {}
        self._last_started = 0.0
        self.last_end = 0.0  # where the last admitted workflow's tags ended (admit)


    def virtual_time(self, running: Iterable[float]) -> float:
        """``V``: the smallest tag among ``running`` (the tags of the runs in progress), else
        the largest tag ever started."""
        return min(running, default=self._last_started)

    def admit(self, tenant: str, works: Sequence[float], order: Sequence[int],
              running: Iterable[float], after: float | None = None) -> list[float]:
        """The start tags of a new workflow of ``tenant``: ``works[i]`` is task i's work (model
        s, >= 0), ``order`` its task indices in the configured order, ``running`` the tags of
        the runs in progress. ``after``: the workflow is a later step of an agent program whose
        earlier steps' tags ended at ``after`` (:attr:`last_end` after their admit): its tags go
        on from there (at least ``V``), where they would be had the program come as one
        workflow, so the tenant's own newer workflows do not pass it; the tenant is charged
        its work all the same (its finish tag moves by it). :attr:`last_end`: where this
        workflow's tags end."""
        v = self.virtual_time(running)
        own = max(v, self._finish.get(tenant, 0.0))
        start = own if after is None else max(v, after)
        q, done = self.quantum_s, 0.0
        tags = [0.0] * len(works)
        for i in order:  # the work before task i, in whole steps of q (exact with q = 0)
            tags[i] = start + (q * math.floor(done / q) if q > 0 else done)
            done += max(works[i], 0.0)
        self._finish[tenant] = own + done
        self.last_end = start + done
        return tags

    def started(self, tag: float) -> None:
        """A task with start tag ``tag`` started a run."""
        if tag > self._last_started:
            self._last_started = tag
