"""Settings and errors of the live scheduler: :class:`LiveConfig` (the ``live`` section of a run
config), the executors, and the errors a workflow's handle can carry."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from envs.config import ConfigError, rng
from envs.workload import WorkflowError
from policies.guard import GuardConfig

EXECUTORS = ("task", "actor")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class LiveConfig:
    """Settings of the live scheduler (the ``live`` section of a run config)."""

    #: keys an older config may still set: a ConfigError that says why (envs.config_base.build)
    REMOVED_KEYS = {"fair_share_quantum_s": (
        "the fair share is two-level now (envs.fairshare: tenants by a virtual-time tag over "
        "the resource-seconds placed, each tenant's tasks in mdp.order), so another tenant "
        "waits for at most one running task and there is no quantum to set; delete the key "
        "(docs/serving.md, \"Fair share\")")}
    time_scale: float = field(default=1.0, metadata=rng(
        ge=0, le=1e3, doc="wall s per model s of emulated work: a primitive sleeps "
                          "compute_gflop / compute * time_scale s before its body (plus its "
                          "inputs' transfer time when the env's mdp.transfer_delays_start is "
                          "on, as in the simulator); 0: no sleep"))
    wait_s: float = field(default=0.01, metadata=rng(
        gt=0, le=10, doc="a wait pick waits this long (wall s) or until the next completion"))
    max_retries: int = field(default=3, metadata=rng(ge=0, le=100, doc="re-placements of a lost task"))
    node_refresh_s: float = field(default=0.1, metadata=rng(
        ge=0, le=60, doc="read the node set at most this often (and at once after a loss)"))
    head_of_line_blocking: bool = field(default=False, metadata=rng(
        doc="a wait holds every ready task until the next round (the paper's rule); false: only "
            "that task waits"))
    servers: Literal["auto", "scale", "ray"] = field(default="auto", metadata=rng(
        doc="where servers come from (scale_ray.live.discovery): scale: nodes with scale_* "
            "resources; ray: every alive node from what Ray reports (CPUs, GPUs, memory); auto: "
            "scale if any alive node has scale_slot, else ray"))
    model: Literal["auto", "slots", "nodes"] = field(default="auto", metadata=rng(
        doc="what a server is (envs/nodes.py: one model of the cluster): nodes, a node as Ray "
            "reports it, running every task whose Ray demands fit its free resources (num_cpus, "
            "num_gpus fractions, memory, custom resources), each task a Ray task with its own "
            "demands hard-pinned there; slots: the paper's servers, one task each "
            "(slots_per_node, scale_slot); auto: nodes when the servers come from what Ray "
            "reports (servers: ray), slots for scale server nodes. The scheduler's policy "
            "places on both (on whole nodes eft_spread keeps Ray's workers warm: "
            "results/resource_model/README.md)"))
    slots_per_node: int | None = field(default=None, metadata=rng(
        ge=1, le=1024, doc="servers per node; default: the node's scale_slot resource, or for a "
                           "plain Ray node its CPUs / task_num_cpus"))
    server_compute: float | None = field(default=None, metadata=rng(
        gt=0, le=1e9, doc="GFLOP/s of a server on a plain Ray node (times its tier's speed); "
                          "none: the mean compute of the env's tiers"))
    tier_speeds: dict[str, float] = field(default_factory=dict, metadata=rng(
        doc="relative speed of a plain node's tier by name (its shape, e.g. cpu8 or "
            "cpu8-gpu1-A100, or its scale.tier label); unlisted: 1"))
    gpu_speeds: dict[str, float] = field(default_factory=dict, metadata=rng(
        doc="model nodes: speed of GPU work on a node by its accelerator type (A100, A10G...), "
            "relative to its CPU work (times its tier speed); unlisted: 1"))
    autoscale_hints: bool = field(default=False, metadata=rng(
        doc="ask Ray's autoscaler for servers (request_resources) while the ready set stays backed "
            "up (backlog_s)"))
    sizing_apply: Literal["advise", "ray"] = field(default="advise", metadata=rng(
        doc="with env.sizing.policy set (not static), what the sizer's plan does "
            "(scale_ray.live.sizing): advise: nothing, it is shown (status, GET /v1/cluster); "
            "ray: request_resources for the nodes wanted, and the nodes it drains take no new "
            "work (Ray's idle timeout removes them)"))
    backlog_s: float = field(default=2.0, metadata=rng(
        ge=0, doc="request_resources after the ready set stays backed up this long (wall s)"))
    max_hint_bundles: int = field(default=64, metadata=rng(
        ge=1, le=100_000, doc="most bundles in one request_resources call"))
    task_num_cpus: float = field(default=1.0, metadata=rng(
        ge=0, le=1024, doc="CPUs each primitive's Ray task (or server actor) requests (the local "
                           "cluster gives a node one CPU per server); 0 lets Ray start a new "
                           "worker per task"))
    executor: str = field(default="actor", metadata=rng(
        doc="actor: every server has an actor hard-pinned to its node (max_concurrency=1) that "
            "runs its primitives, so runs reuse one leased worker; task: every primitive is a "
            "Ray task hard-pinned to the chosen node (a worker lease per run)"))
    actor_idle_s: float = field(default=10.0, metadata=rng(
        gt=0, le=86_400, doc="executor=actor: kill a server's actor after it was idle this long "
                             "(wall s), releasing its CPU so an autoscaler can remove the node"))
    actor_start_s: float = field(default=60.0, metadata=rng(
        ge=0, le=3600, doc="executor=actor: start() waits this long (wall s) for the actors of "
                           "the servers it found; one not ready by then is offered once it is"))
    workload_scale: float | None = field(default=None, metadata=rng(
        gt=0, le=1e6, doc="features.workload_scale of the workload (mean task compute / 4 GFLOP; "
                          "docs/workloads.md); none: the policy's own"))
    fair_share: bool = field(default=False, metadata=rng(
        doc="two-level fair share between submit(tenant=...) tenants (the scheduler "
            "service's): the next task placed is of the tenant with the smallest virtual-time "
            "tag over the resource-seconds placed (start-time fair queuing), then mdp.order "
            "within the tenant (envs.fairshare)"))
    worker_env_blank: tuple[str, ...] = field(default=(), metadata=rng(
        doc="environment variables every worker the scheduler starts (server actors, pinned "
            "tasks) sees empty, through its runtime_env's env_vars: secrets the cluster's "
            "processes inherited that primitives must not read (the scheduler service adds "
            "its tenant-token variables)"))
    cancel_grace_s: float = field(default=0.5, metadata=rng(
        gt=0, le=3600, doc="a run of a cancelled or failed workflow that has not stopped this "
                           "long (wall s) after ray.cancel has its server replaced: the "
                           "server's actor is killed and started again (a plain Ray task: "
                           "ray.cancel(force=True)), so the server is free"))
    cancel_force: bool = field(default=False, metadata=rng(
        doc="cancel a plain Ray task's run (executor=task, or a primitive with Ray options) "
            "with ray.cancel(force=True) at once, killing its worker; false: a "
            "KeyboardInterrupt first, force after cancel_grace_s. Actor calls (executor=actor) "
            "cannot be force-cancelled: their server's actor is replaced after cancel_grace_s"))
    program_gateway: bool = field(default=False, metadata=rng(
        doc="let a running primitive submit the next steps of its workflow's agent program "
            "with scale_ray.live.program() (scale_ray.live.gateway: one actor, no CPU, and a "
            "driver thread); the scheduler service's primitives use scale_ray.client.program()"))
    estimator: Literal["off", "online"] = field(default="off", metadata=rng(
        doc="online: learn run times per (primitive kind, node tier) from completions "
            "(envs.estimator): the policy sees the estimates instead of the declared "
            "compute_gflop, and busy servers their estimated remaining time; in Ray's "
            "resource model the node rule plans with the estimated run on each node shape "
            "(the configured speeds are the prior)"))
    hedge: Literal["off", "marked", "all"] = field(default="marked", metadata=rng(
        doc="backup copies of straggling runs (scale_ray.live.runs): marked: primitives "
            "that say hedge=True (a DAG document's hedge field); all: every task; off: none"))
    hedge_quantile: float = field(default=0.9, metadata=rng(
        gt=0, lt=1, doc="a hedgeable run that passed this quantile of its estimated run time "
                        "is a straggler: a copy starts on an idle fitting server"))
    storage: str | None = field(default=None, metadata=rng(
        doc="journal accepted workflows and finished tasks' results here, and resume them after "
            "a restart (scale_ray.live.journal): a pyarrow.fs URI or local path (s3://, gs://, "
            "an NFS mount); 'session': under the Ray session directory of the scheduler's node; "
            "none or 'off': no journal"))
    resume_attempts: int = field(default=3, metadata=rng(
        ge=1, le=100, doc="a journaled workflow is resumed after a restart at most this many "
                          "times in a row without progress (a task of it finishing, or the "
                          "scheduler that resumed it shutting down cleanly); the next restart "
                          "quarantines it: failed with WorkflowQuarantined, kept for its owner "
                          "to read and delete, never resumed again (a request that crashed "
                          "every scheduler that resumed it cannot crash them for ever)"))
    guard: GuardConfig = field(default_factory=GuardConfig, metadata=rng(
        doc="policies.guard around a learned policy: a task waits at most max_waits times "
            "while a server it fits is idle, and only for a server that would finish it sooner; "
            "otherwise EFT's choice (counted: guard_* in the summary)"))

    def __post_init__(self) -> None:
        if self.autoscale_hints and self.sizing_apply == "ray":
            raise ConfigError("autoscale_hints and sizing_apply: ray both call request_resources "
                              "(the second would undo the first): set one")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"executor must be one of {list(EXECUTORS)}, got {self.executor!r}")
        for i, name in enumerate(self.worker_env_blank):
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise ConfigError(f"worker_env_blank[{i}]: must be an environment variable name "
                                  f"(letters, digits, _; not starting with a digit), got {name!r}")
        for k, v in (self.tier_speeds | {f"gpu_speeds.{a}": x for a, x in self.gpu_speeds.items()}).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise ConfigError(f"{k if k.startswith('gpu_speeds.') else 'tier_speeds.' + k}: "
                                  f"must be a finite number > 0, got {v!r}")


def resolved_model(cfg: LiveConfig, source: str | None) -> str:
    """``cfg.model`` with ``auto`` resolved for servers from ``source`` (``scale`` / ``ray``)."""
    if cfg.model != "auto":
        return cfg.model
    return "nodes" if source == "ray" else "slots"


class TaskLostError(RuntimeError):
    """A task was lost with its node more often than ``max_retries`` allows."""


class PlacementError(RuntimeError):
    """A task ran on another node than the one it was pinned to (checked inside the task)."""


class SchedulingError(RuntimeError):
    """The scheduler could not admit, place or start a task (an error in the order, the
    policy, the decision core, or Ray's ``.options()`` / submission of its run): the task's
    workflow fails with it, naming the task and the cause; the scheduler thread goes on."""


class WorkflowQuarantined(RuntimeError):
    """A journaled workflow whose resume failed ``LiveConfig.resume_attempts`` times in a row
    (each scheduler that resumed it stopped without shutting down cleanly before any of its
    tasks finished): failed, not resumed again (``scale_ray.live.durability``)."""


class WorkflowCancelled(RuntimeError):
    """The workflow was cancelled (``LiveScheduler.cancel``, ``DELETE /v1/workflows/{id}``)."""


class Unschedulable(WorkflowError):
    """No server could ever run a task of the workflow (its demands fit no server): refused at
    submit (HTTP 422), nothing queued. The message says what is missing and how to add it."""


class NoServers(Unschedulable):
    """The scheduler has no server at all (HTTP 503): no node of the Ray cluster offers one."""
