"""The scheduler service's settings: :class:`SchedulerArgs` (``args:`` in
configs/serve/scheduler.yaml, fixed for a replica's life) and :class:`SchedulerTuning`
(``user_config``: policy swaps, retention, quotas; applied without a restart)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from envs.config import rng
from policies import default_policy
from scale_ray.live import LiveConfig

from .gate import PolicyGate
from .errors import DEFAULT_MAX_BODY_BYTES
from .placement import builder_args
from .tenants import TOKENS_FILE_VAR, TOKENS_VAR

__all__ = ["SchedulerTuning", "SchedulerArgs", "Emulation", "parse_args", "SERVICE_LIVE_DEFAULTS",
           "MIN_TASK_SHARE"]

MIN_TASK_SHARE = 1 / 16  # the least share of a node a task is charged for (docs/serving.md)


@dataclass(frozen=True)
class Emulation:
    """What the scheduler is shown of declared run times, and how emulated tasks (no
    ``primitive``) run (``emulation:`` of the app args)."""
    hints: Literal["declared", "none"] = field(default="declared", metadata=rng(
        doc="none: the scheduler is shown the env's runtime.default_gflop for every task and "
            "learns run times with live.estimator: online; a declared compute_gflop then only "
            "sets how long an emulated run takes (clients cannot buy priority with it)"))
    noise_sigma: float = field(default=0.0, metadata=rng(
        ge=0, le=3, doc="an emulated run takes its declared compute x LogNormal(mean 1, sigma), "
                        "a hedged copy its own draw; seeded by the workflow and task names, so "
                        "a resumed workflow draws the same"))


@dataclass(frozen=True)
class SchedulerTuning:
    """Run-time settings (the deployment's ``user_config``; changing them restarts nothing)."""
    policy: str | None = field(default=None, metadata=rng(
        doc="swap to this heuristic name / shipped artifact / artifact dir; none: keep the current"))
    retain_finished: int = field(default=10_000, metadata=rng(
        ge=1, le=10_000_000, doc="finished workflows kept for GET (oldest forgotten first)"))
    result_ttl_s: float = field(default=3600.0, metadata=rng(
        gt=0, le=1e7, doc="a completed workflow's result is released this long after it "
                          "finished (GET then says result_expired); its record stays"))
    max_tasks: int = field(default=10_000, metadata=rng(ge=1, le=1_000_000, doc=(
        "tasks per submitted workflow, and per agent program (its steps together)")))
    max_body_bytes: int = field(default=DEFAULT_MAX_BODY_BYTES, metadata=rng(
        ge=1024, le=1 << 30, doc="request body cap; a larger body is a 413"))
    max_inflight_workflows: int = field(default=10_000, metadata=rng(
        ge=1, le=10_000_000, doc="unfinished workflows of all tenants; past it a submit is a 429"))
    max_inflight_per_tenant: int = field(default=1_000, metadata=rng(
        ge=1, le=10_000_000, doc="unfinished workflows of one tenant; past it a 429"))
    max_queued_tasks: int = field(default=200_000, metadata=rng(
        ge=1, le=100_000_000, doc="tasks of unfinished workflows of all tenants; past it a 429"))
    max_queued_tasks_per_tenant: int = field(default=50_000, metadata=rng(
        ge=1, le=100_000_000, doc="tasks of unfinished workflows of one tenant; past it a 429"))
    max_queued_work_s: float = field(default=4e7, metadata=rng(
        gt=0, le=1e12, doc="resource-seconds of unfinished workflows of all tenants (each task's "
                           "run at the mean node speed x the largest share of an average node "
                           "its Ray demands hold, at least min_task_share; a slot in the "
                           "paper's model); past it a 429"))
    max_queued_work_s_per_tenant: float = field(default=1e7, metadata=rng(
        gt=0, le=1e12, doc="resource-seconds of unfinished workflows of one tenant (as "
                           "max_queued_work_s); past it a 429"))
    min_task_share: float = field(default=MIN_TASK_SHARE, metadata=rng(
        gt=0, le=1, doc="a task is charged against the resource-second quotas at least its run "
                        "at the servers' mean speed x this share of a node, however little it "
                        "asks for (num_cpus: 0 still takes a worker and a run's time); 1/16: "
                        "one CPU of a 16-CPU node"))
    retry_after_s: int = field(default=5, metadata=rng(
        ge=1, le=3600, doc="Retry-After of a 429"))
    max_task_gflop: float = field(default=1e5, metadata=rng(
        gt=0, le=1e12, doc="compute_gflop of one task; over it a submit is a 422 too_large"))
    max_task_run_s: float = field(default=3600.0, metadata=rng(
        gt=0, le=1e9, doc="model s one task's compute_gflop takes on the slowest server (the "
                          "emulated run, x time_scale in wall s); over it a 422 too_large"))
    max_task_memory_gb: float = field(default=4096.0, metadata=rng(
        ge=0, le=1e9, doc="memory_gb of one task; over it a 422 too_large"))
    max_args_bytes: int = field(default=1 << 20, metadata=rng(
        ge=2, le=1 << 30, doc="an HTTP task's args and kwargs as compact JSON, bytes; over it "
                              "a 422 too_large"))
    max_args_depth: int = field(default=32, metadata=rng(
        ge=0, le=120, doc="container levels inside an HTTP task's args (or kwargs) list; "
                          "deeper is a 422 too_large (a body is at most 128 levels deep anyway: "
                          "serve_apps.errors.MAX_JSON_DEPTH)"))


@dataclass(frozen=True)
class SchedulerArgs:
    """Application arguments (``args:`` in configs/serve/scheduler.yaml)."""
    policy: str = field(default_factory=default_policy, metadata=rng(
        doc="heuristic name, shipped artifact name or artifact directory"))
    env_config: str | None = field(default=None, metadata=rng(
        doc="env YAML: tiers (trace header), bandwidth, latency, encoder settings"))
    live: LiveConfig = field(default_factory=LiveConfig, metadata=rng(
        doc="the live scheduler's settings (scale_ray.live.LiveConfig)"))
    primitives: tuple[str, ...] = field(default=(), metadata=rng(
        doc="functions HTTP clients may name, each marked @primitive(http=True) in the "
            "operator's code: module:function, or module:* (every marked public function of "
            "the module); checked at deploy (serve_apps.tools); empty: emulated tasks only"))
    trace: str | None = field(default=None, metadata=rng(
        doc="append the JSONL trace (scale-ray gantt reads it) to this file on the replica's node"))
    emulation: Emulation = field(default_factory=Emulation, metadata=rng(
        doc="declared run times hidden from the scheduler, noise of emulated runs"))
    policy_gate: PolicyGate = field(default_factory=PolicyGate, metadata=rng(
        doc="a learned policy serves only if scale-ray eval --gate measured it within "
            "tolerance of EFT (serve_apps.gate): {tolerance, force}"))
    plaintext_tokens: bool = field(default=False, metadata=rng(
        doc="accept plaintext tenant=token entries in SCALE_SCHEDULER_TOKENS / the tokens "
            "file; false: sha256: entries only (serve_apps.tenants: a plaintext variable is in "
            "/proc/<pid>/environ of every Ray process of its user)"))
    metrics_tenant_names: bool = field(default=False, metadata=rng(
        doc="label per-tenant metrics with tenant names; false: t- + 8 hex of the name's "
            "SHA-256 (serve_apps.tenants.tenant_label), so the metrics port shows no names"))
    tuning: SchedulerTuning = field(default=SchedulerTuning(), metadata=rng(
        doc="scheduler knobs (SchedulerTuning)"))


# the service's defaults where they differ from the library's LiveConfig: tenants share the
# servers fairly, and accepted workflows are journaled under the Ray session directory
SERVICE_LIVE_DEFAULTS = {"fair_share": True, "storage": "session"}
# read by the replica only: every worker the service starts sees them empty
SECRET_VARS = (TOKENS_VAR, TOKENS_FILE_VAR)


def parse_args(args: Mapping[str, Any] | None) -> SchedulerArgs:
    """Validate builder args (``serve_apps.placement.builder_args``); ``live`` gets
    :data:`SERVICE_LIVE_DEFAULTS` for what it does not set, and its ``worker_env_blank`` always
    holds the tenant-token variables (no task reads a token from its environment)."""
    data = dict(args or {})
    live = data.get("live")
    if live is None or isinstance(live, Mapping):
        live = {**SERVICE_LIVE_DEFAULTS, **(live or {})}
        blank = live.get("worker_env_blank") or ()
        if isinstance(blank, (list, tuple)):
            live["worker_env_blank"] = tuple(dict.fromkeys([*blank, *SECRET_VARS]))
        data["live"] = live
    return builder_args(SchedulerArgs, data, ("policy", "env_config", "trace"))
