"""Autoscaler hints of the live scheduler (``autoscale_hints: true``).

When ready tasks have waited ``backlog_s`` with no idle server, or some task fits no alive server,
the scheduler asks Ray's autoscaler for one server bundle per busy server and per waiting task
(``ray.autoscaler.sdk.request_resources``; a task larger than every alive server asks for its
memory too), at most every ``backlog_s`` and at most ``max_hint_bundles`` bundles; once nothing
waits it withdraws the request (an empty one), so idle nodes can be released.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from .cluster import SLOT_RESOURCE
from .config import LiveConfig
from .tasks import READY

if TYPE_CHECKING:
    from .nodes import LiveServer
    from .placement import LivePlacement
    from .tasks import LiveTask

log = logging.getLogger(__name__)


class AutoscaleHints:
    """The hint state of one scheduler (its thread only)."""

    def __init__(self, cfg: LiveConfig, counters: dict[str, Any]):
        self.cfg = cfg
        self.counters = counters
        self._backlog_since: float | None = None
        self._hinted = False

    def update(self, placement: LivePlacement, alive: list[LiveServer]) -> None:
        if not self.cfg.autoscale_hints:
            return
        now = time.perf_counter()
        queue = placement.queue
        max_mem = max((s.node.memory_gb for s in alive), default=0.0)
        # whether any task is ready: stops at the first (no walk of a backlog every round)
        waiting = any(e[2].state == READY for e in queue.heap) or any(
            e[2].state == READY for e in queue.blocked) or any(
            e[2].state == READY for e in queue.deferred)
        idle = any(s.task is None for s in alive)
        # set aside because it fits no alive server (not only one whose actor is starting)
        misfit = any(e[2].prim.memory_gb > max_mem for e in queue.blocked)
        if waiting and (not idle or misfit):
            if self._backlog_since is None:
                self._backlog_since = now
            if now - self._backlog_since >= self.cfg.backlog_s:  # at most every backlog_s
                backlog = [e[2] for e in queue.entries() if e[2].state == READY]
                self._request(backlog, alive, max_mem)
                self._backlog_since = now  # re-request at most every backlog_s
        else:
            self._backlog_since = None
            if self._hinted and not waiting:
                self._request([], alive, max_mem)

    def _request(self, backlog: list[LiveTask], alive: list[LiveServer], max_mem: float) -> None:
        from ray.autoscaler.sdk import request_resources

        busy = sum(1 for s in alive if s.task is not None)
        bundles = [{SLOT_RESOURCE: 1.0}] * busy
        for t in backlog:
            b = {SLOT_RESOURCE: 1.0}
            if t.prim.memory_gb > max_mem:
                b["scale_memory_gb"] = float(t.prim.memory_gb)
            bundles.append(b)
        bundles = bundles[: self.cfg.max_hint_bundles]
        request_resources(bundles=bundles)
        self._hinted = bool(bundles)
        self.counters["autoscale_requests"] += 1
        log.info("autoscaler hint: %d server bundles", len(bundles))
