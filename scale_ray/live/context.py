"""What the parts of one live scheduler share (:class:`LiveContext`): its settings, its model
clock, its trace sink, its counters and its run-time estimator.

The scheduler (:mod:`scale_ray.live.scheduler`) makes one and hands it to each part, with the
few collaborators that part needs: intake (:mod:`scale_ray.live.admission`, programs) -> placement
(:mod:`scale_ray.live.placement`, the decision core, its fair share and the policy) ->
execution (:mod:`scale_ray.live.runs`, :mod:`scale_ray.live.completions`, the node set). No part
holds the scheduler.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from envs.config import EnvConfig
from envs.estimator import RuntimeEstimator

from .config import LiveConfig

__all__ = ["LiveContext", "Emit"]

Emit = Callable[[dict[str, Any]], None]

COUNTERS = ("decisions", "waits", "lost", "rerun_parents", "node_refreshes",
            "autoscale_requests", "tasks_started", "actors_started", "actors_reaped",
            "planner_errors", "planner_reused", "runs_cancelled", "servers_replaced",
            "hedge_copies", "hedge_wins", "scheduling_errors", "sizing_turns", "sizing_errors",
            "sizing_requests")
SECONDS = ("thread_cpu_s", "ray_client_cpu_s", "hedge_copy_s", "hedge_waste_s", "run_s")


class LiveContext:
    """One live scheduler's shared settings and state (module docstring).

    Args:
        cfg: the live configuration; env: the environment's rules and constants.
        trace: receives the trace events (None: none kept).
    """

    def __init__(self, cfg: LiveConfig, env: EnvConfig, trace: Emit | None = None) -> None:
        self.cfg, self.env, self.trace = cfg, env, trace
        #: what the parts count (``LiveScheduler.summary``)
        self.counters: dict[str, Any] = dict.fromkeys(COUNTERS, 0) | dict.fromkeys(SECONDS, 0.0)
        #: run times learned per (kind, tier) from completions (``live.estimator: online``)
        self.estimator = RuntimeEstimator() if cfg.estimator == "online" else None
        #: wall s (``perf_counter``) of model time 0
        self.origin = time.perf_counter()

    def model_time(self, wall: float) -> float:
        """Model seconds since the origin at wall time ``wall`` (``time_scale`` wall s each)."""
        dt = wall - self.origin
        ts = self.cfg.time_scale
        return dt / ts if ts > 0 else dt

    def now_model(self) -> float:
        return self.model_time(time.perf_counter())

    def emit(self, ev: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace(ev)
