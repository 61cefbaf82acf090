"""A fair share of the servers between groups (the scheduler service's tenants): start-time fair
queuing at the workflow level.

Each workflow of group g gets a *start tag* when it arrives: ``S = max(V, F_g)``, where ``F_g`` is
the finish tag of g's previous workflow and ``V`` the virtual time (the smallest start tag of the
unfinished workflows, or the last tag given when none is unfinished); then ``F_g = S + W``, ``W``
its work (total compute at the servers' mean speed). Ready tasks go by start tag first, then by the
configured order (``envs.order``). So a group that floods the service queues behind itself: its
later workflows get later tags, while another group's new workflow starts at ``V``, ahead of the
flood's backlog. With one group it is the plain order (tags grow with arrival, like ``fifo``).
"""

from __future__ import annotations

import heapq

__all__ = ["FairShare"]


class FairShare:
    """Start tags per group (module docstring)."""

    def __init__(self) -> None:
        self._finish: dict[str, float] = {}
        self._open: list[tuple[float, int]] = []  # (start tag, workflow id) of unfinished ones
        self._done: set[int] = set()
        self._last = 0.0

    def virtual_time(self) -> float:
        while self._open and self._open[0][1] in self._done:
            self._done.discard(heapq.heappop(self._open)[1])
        return self._open[0][0] if self._open else self._last

    def admit(self, group: str, wid: int, work: float) -> float:
        """The start tag of workflow ``wid`` of ``group`` with ``work`` (model seconds)."""
        start = max(self.virtual_time(), self._finish.get(group, 0.0))
        self._finish[group] = start + max(work, 0.0)
        self._last = start
        heapq.heappush(self._open, (start, wid))
        return start

    def finished(self, wid: int) -> None:
        """Workflow ``wid`` is done (completed, failed or cancelled)."""
        self._done.add(wid)
