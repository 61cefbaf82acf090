"""Cluster sizing: what a sizer is told, what it answers, and its settings (stdlib only).

A *sizer* decides how many nodes of each tier the cluster should have; the simulator asks it
every ``interval_s`` (``envs.sim_scaling``), and the sizers themselves live in
``policies.sizing`` (Ray's autoscaler emulated, the Kubernetes HPA rule, ours). A sizer reads a
:class:`SizingView` (the nodes, the nodes being launched, the work waiting and running, the
arrivals so far) and answers a :class:`Plan`: nodes to launch per tier and node ids to drain.
The simulator enforces the bounds (``min_nodes``/``max_nodes`` of each tier), launches after each
tier's ``launch_s`` and bills every node from the moment it is asked for (``envs.accounting``).
A drained node takes no new work and leaves when its runs end.

The SLO (:class:`SloConfig`) is the p95 workflow response of the requests that arrive in each
``window_s`` window; its attainment is the share of windows that meet it (``envs.accounting``).
docs/autoscale.md has the whole picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from .config_base import ConfigError, rng

__all__ = ["SloConfig", "RayAutoscalerConfig", "HpaConfig", "ModelSizerConfig", "SizingConfig",
           "NodeView", "SizingView", "Plan", "Sizer", "within_budget", "work"]


@dataclass(frozen=True)
class SloConfig:
    """The latency objective: p95 workflow response per window, and the share of windows that
    must meet it."""
    p95_s: float = field(default=60.0, metadata=rng(
        gt=0, le=1e6, doc="bound on the p95 workflow response of a window's requests, s"))
    window_s: float = field(default=300.0, metadata=rng(
        gt=0, le=86_400, doc="window length, s (requests belong to the window they arrive in)"))
    target: float = field(default=0.99, metadata=rng(
        gt=0, le=1, doc="the share of windows that must meet the bound (attainment target)"))


@dataclass(frozen=True)
class RayAutoscalerConfig:
    """Ray's autoscaler (v2) as documented: pending demand bin-packed onto node types, at most
    ``upscaling_speed`` x the running nodes of a type launching at once (at least 5), idle nodes
    terminated after ``idle_timeout_s``, ``min_workers`` per type kept."""
    update_s: float = field(default=5.0, metadata=rng(
        gt=0, le=3600, doc="seconds between reconciles (Ray: AUTOSCALER_UPDATE_INTERVAL_S, 5)"))
    upscaling_speed: float = field(default=1.0, metadata=rng(
        gt=0, le=1000, doc="Ray's upscaling_speed (1.0)"))
    max_concurrent_launches: int = field(default=10, metadata=rng(
        ge=1, le=10_000, doc="most nodes launching at once over all types (Ray: 10)"))
    idle_timeout_s: float = field(default=300.0, metadata=rng(
        ge=0, le=86_400, doc="a node idle this long is terminated (VMs: 300; KubeRay: 60)"))
    min_workers: dict[str, int] = field(default_factory=dict, metadata=rng(
        ge=0, doc="per tier, nodes never terminated for idleness"))

    def __post_init__(self) -> None:
        for k, v in self.min_workers.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"sizing.ray.min_workers.{k}: must be an integer >= 0, got {v!r}")

    def __hash__(self) -> int:
        return hash((self.update_s, self.upscaling_speed, self.max_concurrent_launches,
                     self.idle_timeout_s, tuple(sorted(self.min_workers.items()))))


@dataclass(frozen=True)
class HpaConfig:
    """The Kubernetes HPA rule per tier: desired = ceil(current x utilization / target), no
    change within ``tolerance``, scale-down to the highest recommendation of the last
    ``stabilization_s``."""
    target: float = field(default=0.6, metadata=rng(gt=0, le=1, doc="target utilization"))
    tolerance: float = field(default=0.1, metadata=rng(ge=0, lt=1, doc="HPA's tolerance (0.1)"))
    sync_s: float = field(default=15.0, metadata=rng(gt=0, le=3600, doc="seconds between syncs "
                                                     "(HPA: 15)"))
    stabilization_s: float = field(default=300.0, metadata=rng(
        ge=0, le=86_400, doc="scale-down stabilization window (HPA: 300)"))


@dataclass(frozen=True)
class ModelSizerConfig:
    """Ours (``policies.sizing.model``): the cheapest mix whose utilization at the arrival rate
    expected one launch ahead stays under ``max_utilization``, plus what drains the backlog
    within ``backlog_share`` of the SLO."""
    interval_s: float = field(default=10.0, metadata=rng(gt=0, le=3600, doc="seconds between "
                                                         "decisions"))
    trend_s: float = field(default=300.0, metadata=rng(
        gt=0, le=86_400, doc="the arrival rate is measured over this past"))
    slope_s: float = field(default=900.0, metadata=rng(
        gt=0, le=86_400, doc="its trend over this past (longer: a burst is not a trend)"))
    down_step: float = field(default=0.1, metadata=rng(
        gt=0, le=1, doc="give back at most this share of the nodes per turn"))
    max_utilization: float = field(default=0.85, metadata=rng(
        gt=0, le=1, doc="the busiest share of a resource's capacity the plan allows"))
    beta: float = field(default=1.5, metadata=rng(
        ge=0, le=100, doc="square-root staffing: capacity >= load + beta x sqrt(load), load in "
                          "capacity units (GPUs x GPU speed; CPUs x CPU speed)"))
    headroom: float = field(default=1.0, metadata=rng(
        gt=0, le=10, doc="the need (load with staffing head-room, plus backlog) times this"))
    backlog_share: float = field(default=0.5, metadata=rng(
        gt=0, le=1, doc="queued work must drain within this share of the SLO's p95 bound"))
    down_after_s: float = field(default=120.0, metadata=rng(
        ge=0, le=86_400, doc="capacity above the plan this long is given back (drained)"))
    down_margin: float = field(default=0.15, metadata=rng(
        ge=0, le=10, doc="give back only what exceeds the plan by more than this share"))


@dataclass(frozen=True)
class SizingConfig:
    """Who sizes the cluster (``env.sizing``)."""
    policy: Literal["static", "ray", "hpa", "model"] = field(default="static", metadata=rng(
        doc="static: the cluster's nodes and dynamics only; ray: Ray's autoscaler emulated; "
            "hpa: the HPA rule; model: ours (policies.sizing)"))
    slo: SloConfig = field(default_factory=SloConfig, metadata=rng(doc="the latency objective"))
    ray: RayAutoscalerConfig = field(default_factory=RayAutoscalerConfig, metadata=rng(
        doc="policy ray's settings"))
    hpa: HpaConfig = field(default_factory=HpaConfig, metadata=rng(doc="policy hpa's settings"))
    model: ModelSizerConfig = field(default_factory=ModelSizerConfig, metadata=rng(
        doc="policy model's settings"))
    budget_per_hour: float | None = field(default=None, metadata=rng(
        gt=0, le=1e9, doc="most the nodes may cost per hour (tiers' price_per_hour): launches "
                          "past it are cut, the dearest tier's first (within_budget); none: "
                          "no cap"))


@dataclass
class NodeView:
    """One node as a sizer sees it."""
    id: int
    tier: str
    accepting: bool  # False: draining
    running: int  # runs on it now
    idle_s: float  # seconds since its last run ended (0 while it runs)
    used: dict[str, float]  # resources its runs hold now
    age_s: float  # seconds since it was asked for (billing)


@dataclass
class SizingView:
    """What a sizer reads at one decision (``envs.sim_scaling.Scaling.view``)."""
    t: float
    nodes: list[NodeView]
    launching: dict[str, int]  # per tier, nodes asked for and not yet joined
    pending: list[tuple[tuple[str, float], ...]]  # demands of ready tasks not running
    queued_work: dict[str, float]  # resource-seconds (speed 1) of ready tasks not started, by kind
    waiting_work: dict[str, float]  # resource-seconds (speed 1) of tasks whose parents run
    running_work: dict[str, float]  # resource-seconds (speed 1) left of the runs
    arrivals: list[float]  # arrival times of the workflows so far (ascending)
    work_per_workflow: dict[str, float]  # mean resource-seconds (speed 1) of an arrived request


@dataclass
class Plan:
    """A sizer's answer: nodes to launch per tier, node ids to drain, and why (for traces)."""
    launch: dict[str, int] = field(default_factory=dict)
    drain: list[int] = field(default_factory=list)
    why: str = ""


class Sizer(Protocol):
    """Anything with ``interval_s``, ``reset()`` (a new episode) and ``decide(view) -> Plan``."""
    interval_s: float

    def reset(self) -> None: ...

    def decide(self, view: SizingView) -> Plan: ...


def within_budget(launch: dict[str, int], counts: dict[str, int], prices: dict[str, float],
                  budget: float | None) -> tuple[dict[str, int], bool]:
    """The launches of ``launch`` (nodes per tier) that keep the cost per hour of ``counts``
    (nodes per tier now, launching included) plus them within ``budget``: the dearest tier's
    are cut first. Returns them and whether any was cut (none: ``budget`` is None, or it
    already holds)."""
    if budget is None:
        return dict(launch), False
    spend = sum(n * prices.get(k, 0.0) for k, n in counts.items())
    out, cut = {}, False
    for k in sorted(launch, key=lambda k: prices.get(k, 0.0)):  # the cheapest first
        price, n = prices.get(k, 0.0), max(int(launch[k]), 0)
        fit = n if price <= 0 else min(n, max(0, int((budget - spend) // price + 1e-9)))
        cut |= fit < n
        if fit:
            out[k] = fit
            spend += fit * price
    return out, cut


def work(demands: tuple[tuple[str, float], ...], gpu: bool, compute: float) -> tuple[str, float]:
    """A task's work as sizing counts it: (``"GPU"``, GPU-seconds at speed 1) for GPU work,
    else (``"CPU"``, CPU-seconds at speed 1); ``compute`` its GFLOP, ``demands`` what it holds."""
    d = dict(demands)
    kind = "GPU" if gpu else "CPU"
    return kind, compute * max(d.get(kind, 1.0), 1e-9)
