"""The live scheduler: workflow primitives as real Ray tasks, each placed by a Policy.

One scheduler thread owns all state (ready set, its record of what runs where, handles). Each
round it: takes new submissions; collects finished tasks (``ray.wait``); reads the live node set
(``ray.nodes()``, at most every ``node_refresh_s`` and at once after any lost task); then, while
tasks are ready, takes them in the first-level order (longest hop-count path to a sink, ties by
workflow arrival, then task id: the simulator's key), encodes the task and the live servers with
the one encoder (``envs.encoding.encode``), asks the policy, and runs the task on the chosen
server with its parents' results passed as object refs. A server runs one primitive at a time
(``scale_slot`` servers per node).

Executors: with ``executor="actor"`` (default) every server has one actor hard-pinned to its node
(``NodeAffinitySchedulingStrategy(soft=False)``, ``max_concurrency=1``, no restarts) and a task
is a call of that actor, so successive runs reuse its leased worker; an actor is offered to the
policy once it answers, and killed after ``actor_idle_s`` idle so that the node's CPU is free
for the autoscaler. With ``executor="task"`` every task is a plain Ray task hard-pinned to the
chosen node (a worker lease per run: about half the throughput on a small machine).

A pick of a busy server is a *wait*: with ``head_of_line_blocking`` (the paper's semantics) the
whole ready set waits for the next completion or ``wait_s``; without it (default here) only that
task waits and the next ready task is placed. When no server is idle every pick would be a wait,
so the policy is not asked.

Elasticity and failures: a node that appears is used from the next decision; a node that
disappears (dead, removed) is never chosen again and its running tasks are *lost* (so is a run
whose server actor died; that server is offered again once a new actor answers): they become
ready again and are placed elsewhere, at most ``max_retries`` times, then the workflow fails with
:class:`TaskLostError`. Ray's own retries are off (``max_retries=0``) so a primitive runs only when
this scheduler says so; a stale result of a lost run is ignored, so no task completes twice.
Results of primitives themselves raising propagate to the workflow's handle unchanged.

Times: traces and ``*_model_s`` metrics are in model seconds (wall seconds / ``time_scale``),
response times without suffix are wall-clock seconds measured by the driver.
"""

from __future__ import annotations

import heapq
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from envs.config import ConfigError, EnvConfig, build, rng
from envs.encoding import ServerFeatures, ServerView, TaskView, encode_task, with_backlog
from envs.workload import WorkflowError, WorkflowSpec
from policies.base import Policy
from policies.guard import GuardConfig, guard_summary, make_guard

from .cluster import COMPUTE_LABEL, SLOT_RESOURCE, TIER_LABEL, NodeInfo, live_nodes
from .workflow import Call, CollectedWorkflow, collect, from_spec

log = logging.getLogger(__name__)

TraceSink = Callable[[dict[str, Any]], None]

WAITING, READY, RUNNING, DONE = range(4)
EXECUTORS = ("task", "actor")
ACTOR_RETRY_S = 1.0  # pause before starting a server's actor again after a failed start


@dataclass(frozen=True)
class LiveConfig:
    """Settings of the live scheduler (the ``live`` section of a run config)."""
    time_scale: float = field(default=1.0, metadata=rng(
        ge=0, le=1e3, doc="wall s per model s of emulated work: a primitive sleeps "
                          "compute_gflop / compute * time_scale s before its body; 0: no sleep"))
    wait_s: float = field(default=0.01, metadata=rng(
        gt=0, le=10, doc="a wait pick waits this long (wall s) or until the next completion"))
    max_retries: int = field(default=3, metadata=rng(ge=0, le=100, doc="re-placements of a lost task"))
    node_refresh_s: float = field(default=0.1, metadata=rng(
        ge=0, le=60, doc="read the node set at most this often (and at once after a loss)"))
    head_of_line_blocking: bool = False
    slots_per_node: int | None = field(default=None, metadata=rng(
        ge=1, le=1024, doc="servers per node; default: the node's scale_slot resource"))
    autoscale_hints: bool = False
    backlog_s: float = field(default=2.0, metadata=rng(
        ge=0, doc="request_resources after the ready set stays backed up this long (wall s)"))
    max_hint_bundles: int = field(default=64, metadata=rng(ge=1, le=100_000))
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
    guard: GuardConfig = field(default_factory=GuardConfig, metadata=rng(
        doc="policies.guard around a learned policy: a task waits at most max_waits times "
            "while a server it fits is idle, and only for a server that would finish it sooner; "
            "otherwise EFT's choice (counted: guard_* in the summary)"))

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ConfigError(f"executor must be one of {list(EXECUTORS)}, got {self.executor!r}")


class TaskLostError(RuntimeError):
    """A task was lost with its node more often than ``max_retries`` allows."""


class PlacementError(RuntimeError):
    """A task ran on another node than the one it was pinned to (checked inside the task)."""


# Ray errors that mean "the run was lost, not the primitive's fault": retried by the scheduler.
def _system_errors() -> tuple[type, ...]:
    import ray.exceptions as rex

    names = ("NodeDiedError", "WorkerCrashedError", "TaskUnschedulableError", "ObjectLostError",
             "LocalRayletDiedError", "RaySystemError", "ObjectFetchTimedOutError",
             "OwnerDiedError", "ReferenceCountingAssertionError", "OutOfMemoryError",
             # executor=actor: the server's actor died (node gone, worker crashed) or could
             # not be placed (its node left before the actor started)
             "RayActorError", "ActorUnschedulableError")
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


def _lost_output(err: BaseException) -> bool:
    import ray.exceptions as rex

    return isinstance(err, getattr(rex, "ObjectLostError", ()))


def _wrap_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The Ray task body around a primitive: placement check, emulated run time, the call.

    ``meta = (expected_node_id | None, sleep_s, gflop_scaled)``: with ``gflop_scaled`` > 0 (Ray's
    own placement) the sleep is computed from the capacity label of the node it landed on.
    Returns ``(value, node_id)``; the scheduler waits on the small second part only.
    """
    def run(meta: tuple[str | None, float, float], *args: Any, **kwargs: Any) -> tuple[Any, str]:
        import ray

        expected, sleep_s, gflop_scaled = meta
        ctx = ray.get_runtime_context()
        node = ctx.get_node_id()
        if expected is not None and node != expected:
            raise PlacementError(f"pinned to node {expected} but running on {node}")
        if gflop_scaled > 0:
            sleep_s = gflop_scaled / float(ctx.get_node_labels()[COMPUTE_LABEL])
        if sleep_s > 0:
            time.sleep(sleep_s)
        return fn(*args, **kwargs), node

    run.__name__ = getattr(fn, "__name__", "primitive")
    run.__qualname__ = run.__name__
    return run


def _server_actor_class() -> Any:
    """The Ray actor class of one server (``executor=actor``): it holds the server's primitive
    bodies (sent once per body with ``register``) and runs them one at a time with ``run``; being
    an actor, it keeps its leased worker, so a run costs an actor call instead of a lease."""
    import ray

    class ScaleServer:
        def __init__(self) -> None:
            self._bodies: dict[int, Callable[..., Any]] = {}

        def register(self, key: int, body: Callable[..., Any]) -> None:
            self._bodies[key] = body

        @ray.method(num_returns=2)
        def run(self, key: int, meta: tuple, *args: Any, **kwargs: Any) -> tuple[Any, str]:
            return self._bodies[key](meta, *args, **kwargs)

    return ray.remote(ScaleServer)


class _RemoteCache:
    """One ``ray.remote`` function per primitive body (Ray exports each once), and its pinned
    variants: ``.options()`` validates every option on each call (it cost about as much as the
    submission itself here), so the scheduler builds one per (body, node, name) and reuses it."""

    def __init__(self, num_cpus: float) -> None:
        self.num_cpus = num_cpus
        self._fns: dict[int, Any] = {}
        self._bodies: dict[int, Callable[..., Any]] = {}
        self._keep: list[Any] = []
        self._pinned: dict[tuple[int, str, str], Any] = {}
        self._actor_cls: Any = None

    def actor(self, node_id: str) -> Any:
        """A new server actor hard-pinned to ``node_id``; Ray never restarts or retries it (a
        lost run is the scheduler's to place again)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._actor_cls is None:
            self._actor_cls = _server_actor_class()
        return self._actor_cls.options(
            num_cpus=self.num_cpus, max_concurrency=1, max_restarts=0, max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()

    def body(self, fn: Callable[..., Any]) -> tuple[int, Callable[..., Any]]:
        """(key, task body) of a primitive, for a server actor's ``register``."""
        key = id(fn)
        b = self._bodies.get(key)
        if b is None:
            b = self._bodies[key] = _wrap_body(fn)
            self._keep.append(fn)
        return key, b

    def pinned(self, fn: Callable[..., Any], node_id: str, name: str) -> Any:
        """``get(fn)`` hard-pinned to ``node_id`` (NodeAffinitySchedulingStrategy, soft=False)."""
        key = (id(fn), node_id, name)
        rf = self._pinned.get(key)
        if rf is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            rf = self.get(fn).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), name=name)
            self._pinned[key] = rf
        return rf

    def forget_node(self, node_id: str) -> None:
        """Drop the pinned variants of a node that left the cluster."""
        for key in [k for k in self._pinned if k[1] == node_id]:
            del self._pinned[key]

    def get(self, fn: Callable[..., Any]) -> Any:
        key = id(fn)
        rf = self._fns.get(key)
        if rf is None:
            import ray

            rf = ray.remote(num_returns=2, max_retries=0, num_cpus=self.num_cpus)(_wrap_body(fn))
            self._fns[key] = rf
            self._keep.append(fn)  # keep id() stable
        return rf


# ------------------------------------------------------------------------------------------------
# Handles
# ------------------------------------------------------------------------------------------------

class WorkflowFailed(RuntimeError):
    """The workflow did not complete; ``__cause__`` is the task's error."""


class WorkflowHandle:
    """A submitted workflow: wait for it, read its results and response times.

    ``result()`` returns the output's value (a list for several outputs); ``get(call)`` the value
    of any call of the workflow (a per-result handle); ``ref(call)`` its ObjectRef.
    """

    def __init__(self, wid: int, wf: CollectedWorkflow, submitted_wall: float):
        self.id = wid
        self.name = wf.spec.name
        self.workflow = wf
        self.submitted_wall = submitted_wall
        self.finished_wall: float | None = None
        self.error: BaseException | None = None
        self.task_finish_wall: list[float | None] = [None] * len(wf.calls)
        self.task_nodes: list[str | None] = [None] * len(wf.calls)
        self.task_attempts: list[int] = [0] * len(wf.calls)
        self._refs: list[Any] = [None] * len(wf.calls)
        self._index = {id(c): i for i, c in enumerate(wf.calls)}
        self._done = threading.Event()

    # -- set by the scheduler thread
    def _task_done(self, i: int, ref: Any, node: str, now: float) -> None:
        if self.task_finish_wall[i] is not None:
            raise AssertionError(f"workflow {self.id} task {i} completed twice")  # invariant
        self._refs[i] = ref
        self.task_nodes[i] = node
        self.task_finish_wall[i] = now

    def _complete(self, now: float, error: BaseException | None = None) -> None:
        self.finished_wall = now
        self.error = error
        self._done.set()

    # -- public
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the workflow completed or failed; False on timeout."""
        return self._done.wait(timeout)

    def _check(self, timeout: float | None) -> None:
        if not self._done.wait(timeout):
            raise TimeoutError(f"workflow {self.id} ({self.name!r}) not done after {timeout} s")
        if self.error is not None:
            raise WorkflowFailed(f"workflow {self.id} ({self.name!r}) failed: {self.error}") \
                from self.error

    def ref(self, call: Call | int) -> Any:
        """ObjectRef of one call's result (after the workflow completed)."""
        self._check(None if self.done() else 0)
        i = call if isinstance(call, int) else self._index.get(id(call))
        if i is None:
            raise KeyError(f"{call!r} is not part of workflow {self.id}")
        return self._refs[i]

    def get(self, call: Call | int, timeout: float | None = None) -> Any:
        """Value of one call's result."""
        import ray

        self._check(timeout)
        return ray.get(self.ref(call))

    def result(self, timeout: float | None = None) -> Any:
        """Value of the output (a list when the workflow has several outputs)."""
        import ray

        self._check(timeout)
        vals = ray.get([self._refs[i] for i in self.workflow.outputs])
        return vals[0] if len(vals) == 1 else vals

    @property
    def response_s(self) -> float | None:
        """Wall seconds from submission to the last task's completion."""
        if self.finished_wall is None or self.error is not None:
            return None
        return self.finished_wall - self.submitted_wall

    def task_response_s(self) -> list[float | None]:
        """Per task: wall seconds from the workflow's submission to the task's completion."""
        return [None if f is None else f - self.submitted_wall for f in self.task_finish_wall]


# ------------------------------------------------------------------------------------------------
# Scheduler state
# ------------------------------------------------------------------------------------------------

class _Server:
    __slots__ = ("sid", "node", "slot", "task", "busy_until", "alive", "actor", "bodies",
                 "idle_since", "probe", "offered", "retry_at")

    def __init__(self, sid: int, node: NodeInfo, slot: int):
        self.sid = sid
        self.node = node
        self.slot = slot
        self.task: _Task | None = None
        self.busy_until = 0.0
        self.alive = True
        self.actor: Any = None          # executor=actor: this server's actor (None: not started)
        self.bodies: set[int] = set()   # primitive bodies registered with that actor
        self.idle_since = 0.0
        self.probe: Any = None          # readiness ref of a starting actor
        self.offered = True             # unmasked for the policy (False while its actor starts)
        self.retry_at = 0.0             # a failed actor start is retried from then on


class _Task:
    __slots__ = ("gid", "idx", "wf", "call", "key", "state", "waiting_for", "children", "parents",
                 "value_ref", "server", "token", "attempts", "first_parent", "last_server",
                 "waits")

    def __init__(self, gid: int, idx: int, wf: "_Workflow", call: Call):
        self.gid = gid
        self.idx = idx
        self.wf = wf
        self.call = call
        self.key: tuple = ()
        self.state = WAITING
        self.waiting_for: set[int] = set()
        self.children: list[_Task] = []
        self.parents: list[_Task] = []
        self.value_ref: Any = None
        self.server: _Server | None = None
        self.token = 0
        self.attempts = 0
        self.first_parent: _Task | None = None
        self.last_server: _Server | None = None  # where its result was produced
        self.waits = 0  # policy answers that did not start it (bounded by the guard)

    @property
    def prim(self):
        return self.call.primitive


class _Workflow:
    __slots__ = ("handle", "tasks", "done", "failed", "arrival_wall")

    def __init__(self, handle: WorkflowHandle, arrival_wall: float):
        self.handle = handle
        self.tasks: list[_Task] = []
        self.done = 0
        self.failed = False
        self.arrival_wall = arrival_wall


def _percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else math.nan


def summarize(handles: Sequence[WorkflowHandle], time_scale: float) -> dict[str, Any]:
    """Response-time statistics over ``handles`` (the ``--json`` keys of run-workflows)."""
    done = [h for h in handles if h.done() and h.error is None]
    failed = [h for h in handles if h.done() and h.error is not None]
    wresp = [h.response_s for h in done]
    tresp = [r for h in done for r in h.task_response_s() if r is not None]
    ts = time_scale if time_scale > 0 else 1.0
    out = {
        "workflows_submitted": len(handles),
        "workflows_completed": len(done),
        "workflows_failed": len(failed),
        "tasks_completed": len(tresp),
        "mean_workflow_response_s": float(np.mean(wresp)) if wresp else math.nan,
        "p95_workflow_response_s": _percentile(wresp, 95),
        "mean_task_response_s": float(np.mean(tresp)) if tresp else math.nan,
        "p95_task_response_s": _percentile(tresp, 95),
    }
    for k in ("mean_workflow_response_s", "p95_workflow_response_s", "mean_task_response_s",
              "p95_task_response_s"):
        out[k[:-2] + "_model_s"] = out[k] / ts
    return out


class LiveScheduler:
    """Places workflow primitives as Ray tasks with ``policy`` (see the module docstring).

    Args:
        policy: any :class:`policies.Policy` (heuristic, artifact, Serve client adapter).
        env: supplies the feature constants, bandwidth/latency and the tier table (power draw,
            trace header); default: ``EnvConfig()``.
        config: :class:`LiveConfig` (or a mapping validated into one).
        trace: optional sink receiving the simulator's JSONL trace events plus ``node`` ids.

    Requires ``ray.init`` (connected to a cluster with scale server nodes). Use ``start()``,
    ``submit(...)`` any number of times from any thread, then ``shutdown()`` (or ``with``).
    """

    def __init__(self, policy: Policy, env: EnvConfig | None = None,
                 config: LiveConfig | dict | None = None, trace: TraceSink | None = None):
        self.policy = policy
        self.env = env or EnvConfig()
        # the encoder constants the policy was trained with (an artifact records them), as Serve
        self.features = getattr(policy, "features", None) or self.env.features
        self.cfg: LiveConfig = build(LiveConfig, config, "live") if not isinstance(
            config, LiveConfig) else config
        if self.cfg.workload_scale is not None:
            self.features = replace(self.features, workload_scale=self.cfg.workload_scale)
        self._guard = make_guard(policy, self.cfg.guard, self.features,
                                 self.env.mdp.transfer_delays_start)
        self.trace = trace
        self._tiers = tuple(self.env.cluster.tiers)
        self._remote = _RemoteCache(self.cfg.task_num_cpus)
        self._actors = self.cfg.executor == "actor"
        self._last_reap = 0.0
        self._probes: dict[Any, _Server] = {}
        self._cold: list[_Server] = []  # failed actor starts, retried after a pause
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._handles: list[WorkflowHandle] = []
        self._error: BaseException | None = None
        # scheduler-thread state
        self._servers: dict[tuple[str, int], _Server] = {}
        self._set_alive([])
        self._nodes_seen: dict[str, NodeInfo] = {}
        self._snapshot_max_mem = 0.0
        self._last_refresh = -math.inf
        self._ready: list[tuple] = []
        self._blocked: list[_Task] = []
        self._running: dict[Any, tuple[_Task, int]] = {}
        self._next_gid = 0
        self._next_sid = 0
        self._t0 = time.perf_counter()
        self._backlog_since: float | None = None
        self._hinted = False
        self.counters = {"decisions": 0, "waits": 0, "lost": 0, "rerun_parents": 0,
                         "node_refreshes": 0, "autoscale_requests": 0, "tasks_started": 0,
                         "actors_started": 0, "actors_reaped": 0, "thread_cpu_s": 0.0}
        self.node_tasks: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LiveScheduler":
        """Read the node set, emit the trace header, start the scheduler thread."""
        if self._thread is not None:
            return self
        self._t0 = time.perf_counter()
        self.policy.reset(None)
        self._emit({"t": 0.0, "event": "episode", "bandwidth_gb_s": self.env.cluster.bandwidth_gb_s,
                    "latency_s": self.env.cluster.latency_s, "transfer_delays_start": False,
                    "time_scale": self.cfg.time_scale, "policy": self.policy.name,
                    "tiers": [{"name": t.name, "compute": t.compute, "memory_gb": t.memory_gb}
                              for t in self._tiers]})
        self._refresh(force=True)
        if self._probes:
            import ray

            ray.wait(list(self._probes), num_returns=len(self._probes),
                     timeout=self.cfg.actor_start_s, fetch_local=False)
            self._check_probes(ray)
            if self._probes:
                log.warning("%d of %d server actors not ready after actor_start_s=%g s (does "
                            "every node have %g CPUs per server?); they are offered once ready",
                            len(self._probes), len(self._servers), self.cfg.actor_start_s,
                            self.cfg.task_num_cpus)
        self._thread = threading.Thread(target=self._loop, name="scale-live-scheduler", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the scheduler thread (running Ray tasks are not cancelled; with
        ``executor=actor`` the server actors are killed, which ends their runs)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._stop_actors()
        self._emit({"t": self._now_model(), "event": "end", "truncated": bool(self.pending()),
                    "metrics": self.summary()})

    def __enter__(self) -> "LiveScheduler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ public API
    def submit(self, workflow: Call | Sequence[Call] | WorkflowSpec | CollectedWorkflow,
               name: str = "") -> WorkflowHandle:
        """Validate ``workflow`` and queue it; returns its handle at once.

        Raises :class:`WorkflowError` (nothing runs) for a cycle, an unknown parent (DAG files),
        or a task that fits no node: memory above every live node's and every configured tier's.
        """
        if self._error is not None:
            raise RuntimeError("the scheduler thread died") from self._error
        if self._thread is None:
            raise RuntimeError("LiveScheduler.submit: call start() first (or use `with`)")
        if isinstance(workflow, CollectedWorkflow):
            wf = workflow
        elif isinstance(workflow, WorkflowSpec):
            wf = from_spec(workflow)
        else:
            wf = collect(workflow, name)
        self._check_fits(wf)
        with self._lock:
            wid = len(self._handles)
            h = WorkflowHandle(wid, wf, time.perf_counter())
            self._handles.append(h)
        self._inbox.put(h)
        return h

    def handles(self) -> list[WorkflowHandle]:
        with self._lock:
            return list(self._handles)

    def pending(self) -> int:
        """Workflows submitted but not finished."""
        return sum(1 for h in self.handles() if not h.done())

    def drain(self, timeout: float | None = None, progress: Callable[[int, int], None] | None = None
              ) -> bool:
        """Wait until every submitted workflow finished; False on timeout."""
        return _drain(self, "the scheduler thread", timeout, progress)

    def summary(self) -> dict[str, Any]:
        """Response-time statistics plus the scheduler's counters."""
        out = summarize(self.handles(), self.cfg.time_scale)
        out.update(self.counters)
        out.update(guard_summary(self._guard))
        out["policy"] = self.policy.name
        out["servers_alive"] = len(self._alive)
        out["tasks_per_node"] = dict(self.node_tasks)
        return out

    # ------------------------------------------------------------------ validation
    def _check_fits(self, wf: CollectedWorkflow) -> None:
        tier_max = max((t.memory_gb for t in self._tiers), default=math.inf)
        live_max = self._snapshot_max_mem
        limit = tier_max if self.cfg.autoscale_hints else min(tier_max, live_max)
        for i, t in enumerate(wf.spec.tasks):
            if t.memory_gb > limit:
                raise WorkflowError(
                    f"workflow {wf.spec.name!r}: task {i} ({t.name!r}) needs memory_gb="
                    f"{t.memory_gb:g}, which fits no node (largest live node: {live_max:g} GB, "
                    f"largest configured tier: {tier_max:g} GB)")

    # ------------------------------------------------------------------ loop
    def _now_model(self) -> float:
        dt = time.perf_counter() - self._t0
        return dt / self.cfg.time_scale if self.cfg.time_scale > 0 else dt

    def _emit(self, ev: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace(ev)

    def _loop(self) -> None:
        import ray

        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set():
                self._take_submissions(block=not self._running and not self._ready
                                       and not self._blocked)
                self._refresh()
                self._dispatch()
                self._hints()
                if self._actors:
                    if self._probes:
                        self._check_probes(ray)
                    if self._cold:
                        self._retry_cold()
                    self._reap()
                if self._running:
                    self._collect(ray, timeout=self.cfg.wait_s)
                elif self._ready or self._blocked:
                    time.sleep(self.cfg.wait_s)
                # CPU the scheduler thread used (includes Ray client calls it makes)
                self.counters["thread_cpu_s"] = time.thread_time() - cpu0
        except BaseException as e:  # surface to submit()/drain() instead of dying silently
            log.exception("live scheduler thread failed")
            self._error = e
            for h in self.handles():
                if not h.done():
                    h._complete(time.perf_counter(), e)

    def _take_submissions(self, block: bool) -> None:
        try:
            h = self._inbox.get(timeout=self.cfg.wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._admit(h)
            try:
                h = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, h: WorkflowHandle) -> None:
        spec = h.workflow.spec
        wf = _Workflow(h, h.submitted_wall)
        if self.policy.first_level == "upward_rank":
            tiers = self._tiers
            mean_c = sum(t.compute for t in tiers) / len(tiers)
            ranks = [-r for r in spec.upward_ranks(mean_c, self.env.cluster.bandwidth_gb_s,
                                                   self.env.cluster.latency_s)]
        else:
            ranks = [-r for r in spec.hop_ranks()]
        for i, call in enumerate(h.workflow.calls):
            t = _Task(self._next_gid, i, wf, call)
            self._next_gid += 1
            t.key = (ranks[i], h.submitted_wall)
            t.parents = [wf.tasks[p] for p in spec.tasks[i].parents]
            t.waiting_for = {p.idx for p in t.parents}
            for p in t.parents:
                p.children.append(t)
            wf.tasks.append(t)
        if self.trace is not None:
            self._emit({"t": self._now_model(), "event": "arrival", "workflow": h.id,
                        "name": spec.name, "tasks": [
                            {"task": t.gid, "compute_gflop": t.prim.compute_gflop,
                             "memory_gb": t.prim.memory_gb, "output_gb": t.prim.output_gb,
                             "parents": [p.gid for p in t.parents]} for t in wf.tasks]})
        for t in wf.tasks:
            if not t.waiting_for:
                self._make_ready(t)

    def _make_ready(self, t: _Task) -> None:
        t.state = READY
        heapq.heappush(self._ready, (t.key, t.gid, t))

    # ------------------------------------------------------------------ nodes
    def _refresh(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_refresh < self.cfg.node_refresh_s:
            return
        self._last_refresh = now
        self.counters["node_refreshes"] += 1
        nodes = live_nodes(self._tiers)
        alive_ids = {n.node_id for n in nodes}
        changed = False
        for n in nodes:
            slots = self.cfg.slots_per_node or n.slots
            for s in range(slots):
                if (n.node_id, s) not in self._servers:
                    srv = _Server(self._next_sid, n, s)
                    self._next_sid += 1
                    self._servers[(n.node_id, s)] = srv
                    changed = True
                    if self._actors:  # start its actor now; offered once it is ready
                        self._start_actor(srv, probe=True)
                    self._emit({"t": self._now_model(), "event": "server_add", "server": srv.sid,
                                "tier": n.tier, "compute": n.compute, "memory_gb": n.memory_gb,
                                "node": n.node_id, "slot": s})
        for srv in self._servers.values():
            if srv.alive and srv.node.node_id not in alive_ids:
                changed = True
                srv.alive = False
                self._remote.forget_node(srv.node.node_id)
                self._drop_actor(srv)
                if srv.task is not None:
                    self._lose(srv.task, f"node {srv.node.node_id[:12]} is gone")
                self._emit({"t": self._now_model(), "event": "server_fail", "server": srv.sid,
                            "node": srv.node.node_id})
        if changed:
            self._set_alive([s for s in self._servers.values() if s.alive])
            if self._blocked:  # a task that fit nowhere may fit a new node
                for t in self._blocked:
                    if t.state == READY:
                        heapq.heappush(self._ready, (t.key, t.gid, t))
                self._blocked.clear()

    def _set_alive(self, alive: list[_Server]) -> None:
        """The servers the policy sees (in this order), and their static encoder columns."""
        self._alive = alive
        self._snapshot_max_mem = max((s.node.memory_gb for s in alive), default=0.0)
        self._alive_pos = {id(s): i for i, s in enumerate(alive)}
        self._alive_memory = np.fromiter((s.node.memory_gb for s in alive), float, len(alive))
        # executor=actor: a server whose actor is starting is masked until it is ready
        self._offered = np.fromiter((s.offered for s in alive), bool, len(alive))
        self._alive_compute = np.fromiter((s.node.compute for s in alive), float, len(alive))
        self._features = ServerFeatures(len(alive), self.features)

    # ------------------------------------------------------------------ decisions
    def _view(self, t: _Task, now: float) -> tuple[TaskView, list[ServerView]]:
        """The task and the alive servers as the encoder's plain descriptions."""
        ts = self.cfg.time_scale if self.cfg.time_scale > 0 else 1.0
        views = []
        for s in self._alive:
            if s.task is None:
                rem, power = 0.0, s.node.idle_w
            else:  # busy: estimated time left, never 0 (0 means idle to the policy)
                rem, power = max((s.busy_until - now) / ts, 1e-3), s.node.busy_w
            views.append(ServerView(s.node.compute, s.node.memory_gb, rem, power,
                                    accepting=s.offered))
        fp = t.first_parent
        parent_slot = None if fp is None else self._alive_pos.get(id(fp.last_server))
        wf = t.wf
        # A finished parent whose server is gone: every server pays the transfer (as in the
        # simulator), hence has_parent.
        return TaskView(t.prim.compute_gflop, t.prim.memory_gb, t.prim.output_gb, len(t.children),
                        wf.done / len(wf.tasks), parent_slot,
                        fp.prim.output_gb if fp is not None else 0.0,
                        has_parent=fp is not None, ready_tasks=self._ready_count(t),
                        workflow_age_s=(now - wf.arrival_wall) / ts), views

    def _ready_count(self, t: _Task) -> int:
        """Ready tasks in the heap, ``t`` included (features.backlog; as the simulator, tasks a
        wait set aside in this round are not counted)."""
        return len({tk.gid for _, _, tk in self._ready if tk.state == READY} | {t.gid})

    def _observe(self, t: _Task, now: float) -> dict[str, np.ndarray]:
        """``encode(*self._view(t, now), mask_infeasible=True)``, computed from arrays kept per
        node-set change and one reused feature buffer (the scheduler thread's hot path; a test
        checks equality with ``encode``)."""
        ts = self.cfg.time_scale if self.cfg.time_scale > 0 else 1.0
        alive = self._alive
        n = len(alive)
        remaining = np.zeros(n)
        power = np.empty(n)
        for i, s in enumerate(alive):
            if s.task is None:
                power[i] = s.node.idle_w
            else:  # busy: estimated time left, never 0 (0 means idle to the policy)
                remaining[i] = max((s.busy_until - now) / ts, 1e-3)
                power[i] = s.node.busy_w
        feats = self._features
        feats.set_servers(self._alive_compute, self._alive_memory, power)
        fp = t.first_parent
        parent_slot = None if fp is None else self._alive_pos.get(id(fp.last_server))
        c = self.env.cluster
        transfer = 0.0 if fp is None else fp.prim.output_gb / c.bandwidth_gb_s + c.latency_s
        wf = t.wf
        prim = t.prim
        f = self.features
        task = encode_task(prim.compute_gflop, prim.memory_gb, len(t.children),
                           wf.done / len(wf.tasks), prim.output_gb, f)
        if f.backlog:
            task = with_backlog(task, self._ready_count(t), int(self._offered.sum()),
                                (now - wf.arrival_wall) / ts, f)
        return {
            "task": task,
            "servers": feats.render(remaining, 0.0, transfer, parent_slot),
            "action_mask": ((self._alive_memory >= prim.memory_gb) & self._offered
                            ).astype(np.float32),
        }

    def _dispatch(self) -> None:
        deferred: list[_Task] = []
        ready = self._ready
        while ready:
            t = ready[0][2]
            if t.state != READY or t.wf.failed:
                heapq.heappop(ready)
                continue
            if not any(s.task is None and s.offered for s in self._alive):
                break  # every pick would be a wait: do not ask the policy
            now = time.perf_counter()
            obs = self._observe(t, now)
            mask = obs["action_mask"]
            if not mask.any():
                if ((self._alive_memory >= t.prim.memory_gb) & ~self._offered).any():
                    heapq.heappop(ready)  # it fits only servers whose actors are starting
                    deferred.append(t)
                    continue
                # fits no live server: set aside until the node set changes
                heapq.heappop(ready)
                self._blocked.append(t)
                continue
            self.counters["decisions"] += 1
            a = int(self.policy.act(obs))
            if self._guard is not None:
                a = self._guarded(t, obs, a)
            srv = self._alive[a] if 0 <= a < len(self._alive) else None
            if srv is not None and srv.task is None and mask[a] > 0.5:
                heapq.heappop(ready)
                self._submit(t, srv, now)
                continue
            self.counters["waits"] += 1
            t.waits += 1
            if self.cfg.head_of_line_blocking:
                break
            heapq.heappop(ready)
            deferred.append(t)
        for t in deferred:
            heapq.heappush(ready, (t.key, t.gid, t))

    def _guarded(self, t: _Task, obs: dict[str, np.ndarray], a: int) -> int:
        """The guard's answer for the policy's pick ``a`` (policies.guard); a replacement is
        traced as a ``guard`` event."""
        final, why = self._guard.check(obs, a, t.waits)
        if why is None:
            return a
        alive = self._alive
        self._emit({"t": self._now_model(), "event": "guard", "task": t.gid,
                    "proposed": alive[a].sid if 0 <= a < len(alive) else None,
                    "chosen": alive[final].sid, "reason": why})
        return final

    def _submit(self, t: _Task, srv: _Server, now: float) -> None:
        call = t.call
        parent_ref = {id(p.call): p.value_ref for p in t.parents}
        args = [parent_ref[id(a)] if isinstance(a, Call) else a for a in call.args]
        kwargs = {k: parent_ref[id(v)] if isinstance(v, Call) else v for k, v in call.kwargs.items()}
        node = srv.node
        sleep_s = (t.prim.compute_gflop / node.compute * self.cfg.time_scale
                   if self.cfg.time_scale > 0 else 0.0)
        if self._actors:
            actor = srv.actor if srv.actor is not None else self._start_actor(srv)
            key, body = self._remote.body(t.prim.fn)
            if key not in srv.bodies:  # actor calls of one caller run in order: no wait needed
                actor.register.remote(key, body)
                srv.bodies.add(key)
            value_ref, status_ref = actor.run.remote(key, (node.node_id, sleep_s, 0.0),
                                                     *args, **kwargs)
        else:
            rf = self._remote.pinned(t.prim.fn, node.node_id, t.prim.name)
            value_ref, status_ref = rf.remote((node.node_id, sleep_s, 0.0), *args, **kwargs)
        t.value_ref = value_ref
        t.state = RUNNING
        t.server = srv
        t.token += 1
        srv.task = t
        srv.busy_until = now + sleep_s
        self._running[status_ref] = (t, t.token)
        self.counters["tasks_started"] += 1
        self._emit({"t": self._now_model(), "event": "start", "task": t.gid, "server": srv.sid,
                    "node": node.node_id})

    # ------------------------------------------------------------------ completions
    def _collect(self, ray: Any, timeout: float) -> None:
        if not self._running:
            return
        # One wait per round: other runs that finished meanwhile come back on the next rounds
        # at once (a second zero-timeout wait over every running ref cost ~0.3 ms per task on a
        # busy machine). The status refs are tiny and live in this process's memory store, so
        # there is nothing to fetch.
        done, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout, fetch_local=False)
        errors = _system_errors()
        for ref in done:
            t, token = self._running.pop(ref)
            if token != t.token or t.state != RUNNING:
                continue  # stale: the run was already declared lost
            try:
                node = ray.get(ref)
            except errors as e:
                srv = t.server
                if self._actors and srv is not None and not _lost_output(e):
                    self._drop_actor(srv)  # dead or suspect
                self._refresh(force=True)
                if self._actors and srv is not None and srv.alive and srv.actor is None:
                    # offered again once a new actor answers: the node may be dying while
                    # the GCS still lists it
                    self._start_actor(srv, probe=True)
                if t.state == RUNNING:  # the refresh did not already declare it lost
                    self._lose(t, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                               lost_output=_lost_output(e))
                continue
            except Exception as e:  # the primitive raised (or a placement check failed)
                self._free(t)
                self._fail(t.wf, e)
                continue
            self._finish(t, node)

    def _free(self, t: _Task) -> _Server | None:
        srv = t.server
        if srv is not None and srv.task is t:
            srv.task = None
            srv.idle_since = time.perf_counter()
        t.server = None
        return srv

    # ------------------------------------------------------------------ server actors
    def _start_actor(self, srv: _Server, probe: bool = False) -> Any:
        """Start ``srv``'s actor. With ``probe`` the server is not offered to the policy until the
        actor answers (a new node, or a restart after a failure: the node may be dying while
        the GCS still lists it); without, runs queue behind the actor's start."""
        srv.actor = self._remote.actor(srv.node.node_id)
        srv.bodies = set()
        srv.idle_since = time.perf_counter()
        self.counters["actors_started"] += 1
        if probe:
            srv.probe = srv.actor.__ray_ready__.remote()
            self._probes[srv.probe] = srv
            self._set_offered(srv, False)
        return srv.actor

    def _set_offered(self, srv: _Server, offered: bool) -> None:
        srv.offered = offered
        i = self._alive_pos.get(id(srv))
        if i is not None:
            self._offered[i] = offered

    def _retry_cold(self) -> None:
        now = time.perf_counter()
        due = [srv for srv in self._cold if now >= srv.retry_at]
        if not due:
            return
        self._cold = [srv for srv in self._cold if now < srv.retry_at]
        for srv in due:
            if srv.alive and srv.actor is None:
                self._start_actor(srv, probe=True)

    def _check_probes(self, ray: Any) -> None:
        """Servers whose starting actor answered are offered again. A failed start forces a
        node refresh (which drops a node that is gone) and is retried, still masked, after
        ``ACTOR_RETRY_S`` (a dying node fails every start until the GCS drops it)."""
        done, _ = ray.wait(list(self._probes), num_returns=len(self._probes), timeout=0,
                           fetch_local=False)
        failed = []
        for ref in done:
            srv = self._probes.pop(ref)
            if srv.probe is not ref:
                continue
            srv.probe = None
            try:
                ray.get(ref)
                self._set_offered(srv, True)
                srv.idle_since = time.perf_counter()  # the reaper counts from here
            except Exception as e:
                log.info("actor of server %d on node %s failed to start: %s", srv.sid,
                         srv.node.node_id[:12], type(e).__name__)
                srv.actor = None  # it never started; nothing to kill
                failed.append(srv)
        if failed:
            self._refresh(force=True)
            retry_at = time.perf_counter() + ACTOR_RETRY_S
            for srv in failed:
                if srv.alive and srv.actor is None:
                    srv.retry_at = retry_at
                    self._cold.append(srv)

    def _drop_actor(self, srv: _Server) -> None:
        """Kill ``srv``'s actor (its masking, if starting, is left to the caller)."""
        if srv.probe is not None:
            self._probes.pop(srv.probe, None)
            srv.probe = None
        if srv.actor is None:
            return
        import ray

        actor, srv.actor = srv.actor, None
        srv.bodies = set()
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead with its node
            pass

    def _stop_actors(self, timeout_s: float = 30.0) -> None:
        """Kill every server actor and wait (at most ``timeout_s``) until Ray reports them dead
        (their CPUs come back shortly after that, asynchronously)."""
        actors = [srv.actor for srv in self._servers.values() if srv.actor is not None]
        for srv in self._servers.values():
            self._drop_actor(srv)
        if not actors:
            return
        import ray

        probes = []
        for a in actors:
            try:
                probes.append(a.__ray_ready__.remote())
            except Exception:
                pass
        if probes:  # each fails once its actor is dead
            ray.wait(probes, num_returns=len(probes), timeout=timeout_s, fetch_local=False)

    def _reap(self) -> None:
        """Kill actors of servers idle for ``actor_idle_s``: an actor holds its CPU, and a node
        whose resources are in use is never idle to the autoscaler. Checked about once a second."""
        now = time.perf_counter()
        if now - self._last_reap < min(1.0, self.cfg.actor_idle_s):
            return
        self._last_reap = now
        for srv in self._alive:
            # an actor still starting is not idle: killing it would offer the server untested
            if srv.actor is not None and srv.task is None and srv.offered \
                    and now - srv.idle_since >= self.cfg.actor_idle_s:
                self._drop_actor(srv)
                self.counters["actors_reaped"] += 1

    def _finish(self, t: _Task, node: str) -> None:
        srv = self._free(t)
        now = time.perf_counter()
        t.state = DONE
        t.last_server = srv
        wf = t.wf
        wf.done += 1
        self.node_tasks[node] = self.node_tasks.get(node, 0) + 1
        first_time = wf.handle.task_finish_wall[t.idx] is None
        ev = {"t": self._now_model(), "event": "finish", "task": t.gid,
              "server": srv.sid if srv else -1, "node": node}
        if not first_time:
            ev["rerun"] = True  # its earlier output was lost with its node
        self._emit(ev)
        if wf.failed:
            return
        if first_time:
            wf.handle._task_done(t.idx, t.value_ref, node, now)
        else:  # a re-run of a task whose output was lost: only its ref changes
            wf.handle._refs[t.idx] = t.value_ref
            wf.handle.task_nodes[t.idx] = node
            wf.done -= 1  # it was counted already
        for c in t.children:
            if c.first_parent is None:
                c.first_parent = t
            c.waiting_for.discard(t.idx)
            if c.state == WAITING and not c.waiting_for:
                self._make_ready(c)
        if wf.done == len(wf.tasks):
            wf.handle._complete(now)

    def _lose(self, t: _Task, why: str, lost_output: bool = False) -> None:
        srv = self._free(t)
        self.counters["lost"] += 1
        t.attempts += 1
        t.wf.handle.task_attempts[t.idx] = t.attempts
        self._emit({"t": self._now_model(), "event": "lost", "task": t.gid,
                    "server": srv.sid if srv else -1, "node": srv.node.node_id if srv else None,
                    "reason": why})
        if t.attempts > self.cfg.max_retries:
            self._fail(t.wf, TaskLostError(
                f"task {t.idx} ({t.prim.name!r}) of workflow {t.wf.handle.id} was lost "
                f"{t.attempts} times (max_retries={self.cfg.max_retries}); last: {why}"))
            return
        if lost_output:  # a parent's result died with its node: run those parents again
            alive = {s.node.node_id for s in self._alive}
            for p in t.parents:
                if p.state in (READY, RUNNING):  # already running again for another child
                    t.waiting_for.add(p.idx)
                elif p.state == DONE and (p.last_server is None
                                          or p.last_server.node.node_id not in alive):
                    self.counters["rerun_parents"] += 1
                    self._emit({"t": self._now_model(), "event": "output_lost", "task": p.gid,
                                "node": p.last_server.node.node_id if p.last_server else None})
                    t.waiting_for.add(p.idx)
                    self._make_ready(p)
            if t.waiting_for:
                t.state = WAITING
                return
        self._make_ready(t)

    def _fail(self, wf: _Workflow, err: BaseException) -> None:
        if wf.failed:
            return
        wf.failed = True
        for t in wf.tasks:
            if t.state == READY:
                t.state = WAITING  # skipped when popped
        wf.handle._complete(time.perf_counter(), err)

    # ------------------------------------------------------------------ autoscaler hints
    def _hints(self) -> None:
        if not self.cfg.autoscale_hints:
            return
        now = time.perf_counter()
        backlog = [t for _, _, t in self._ready if t.state == READY] + \
                  [t for t in self._blocked if t.state == READY]
        idle = any(s.task is None for s in self._alive)
        if backlog and (not idle or self._blocked):
            if self._backlog_since is None:
                self._backlog_since = now
            if now - self._backlog_since >= self.cfg.backlog_s:
                self._request(backlog)
                self._backlog_since = now  # re-request at most every backlog_s
        else:
            self._backlog_since = None
            if self._hinted and not backlog:
                self._request([])

    def _request(self, backlog: list[_Task]) -> None:
        from ray.autoscaler.sdk import request_resources

        busy = sum(1 for s in self._alive if s.task is not None)
        bundles = [{SLOT_RESOURCE: 1.0}] * busy
        for t in backlog:
            b = {SLOT_RESOURCE: 1.0}
            if t.prim.memory_gb > self._snapshot_max_mem:
                b["scale_memory_gb"] = float(t.prim.memory_gb)
            bundles.append(b)
        bundles = bundles[: self.cfg.max_hint_bundles]
        request_resources(bundles=bundles)
        self._hinted = bool(bundles)
        self.counters["autoscale_requests"] += 1
        log.info("autoscaler hint: %d server bundles", len(bundles))


# ------------------------------------------------------------------------------------------------
# Ray's own placement, for comparison
# ------------------------------------------------------------------------------------------------

class RayDefaultRunner:
    """The same workflows as plain Ray tasks placed by Ray's default scheduler.

    For a fair comparison each task asks for what the model requires of a server: one
    ``scale_slot`` (so a server runs one primitive at a time, as under the scheduler), the same
    ``task_num_cpus`` as the scheduler's tasks, and, through a label selector on ``scale.tier``,
    only tiers whose memory fits the task. A workflow's tasks are
    all submitted on arrival with parents' results as object refs (Ray orders them); the emulated
    run time is ``compute_gflop / compute * time_scale`` with the compute of the node Ray chose.
    Ray retries a lost task up to ``max_retries`` times. Same handles and statistics as
    :class:`LiveScheduler`.
    """

    name = "ray-default"

    def __init__(self, env: EnvConfig | None = None, config: LiveConfig | dict | None = None):
        self.env = env or EnvConfig()
        self.cfg: LiveConfig = build(LiveConfig, config, "live") if not isinstance(
            config, LiveConfig) else config
        self._tiers = tuple(self.env.cluster.tiers)
        self._fns: dict[int, Any] = {}
        self._keep: list[Any] = []
        self._lock = threading.Lock()
        self._handles: list[WorkflowHandle] = []
        self._running: dict[Any, tuple[WorkflowHandle, int, Any]] = {}
        self._done_count: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.node_tasks: dict[str, int] = {}

    def _remote(self, fn: Callable[..., Any]) -> Any:
        rf = self._fns.get(id(fn))
        if rf is None:
            import ray

            rf = ray.remote(num_returns=2, num_cpus=self.cfg.task_num_cpus,
                            max_retries=self.cfg.max_retries)(_wrap_body(fn))
            self._fns[id(fn)] = rf
            self._keep.append(fn)
        return rf

    def start(self) -> "RayDefaultRunner":
        self._thread = threading.Thread(target=self._loop, name="scale-ray-default", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> "RayDefaultRunner":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def handles(self) -> list[WorkflowHandle]:
        with self._lock:
            return list(self._handles)

    def submit(self, workflow: Call | Sequence[Call] | WorkflowSpec | CollectedWorkflow,
               name: str = "") -> WorkflowHandle:
        if isinstance(workflow, CollectedWorkflow):
            wf = workflow
        elif isinstance(workflow, WorkflowSpec):
            wf = from_spec(workflow)
        else:
            wf = collect(workflow, name)
        selectors = []
        for i, t in enumerate(wf.spec.tasks):
            fit = [tier.name for tier in self._tiers if tier.memory_gb >= t.memory_gb]
            if not fit:
                raise WorkflowError(f"workflow {wf.spec.name!r}: task {i} ({t.name!r}) needs "
                                    f"memory_gb={t.memory_gb:g}, which fits no configured tier")
            selectors.append({TIER_LABEL: f"in({','.join(fit)})"})
        ts = self.cfg.time_scale
        with self._lock:
            h = WorkflowHandle(len(self._handles), wf, time.perf_counter())
            self._handles.append(h)
            value_refs: list[Any] = []
            for i, call in enumerate(wf.calls):
                ref_of = {id(wf.calls[p]): value_refs[p] for p in wf.spec.tasks[i].parents}
                args = [ref_of[id(a)] if isinstance(a, Call) else a for a in call.args]
                kwargs = {k: ref_of[id(v)] if isinstance(v, Call) else v
                          for k, v in call.kwargs.items()}
                prim = call.primitive
                v, s = self._remote(prim.fn).options(
                    resources={SLOT_RESOURCE: 1.0}, label_selector=selectors[i],
                    name=prim.name).remote((None, 0.0, prim.compute_gflop * ts), *args, **kwargs)
                value_refs.append(v)
                self._running[s] = (h, i, v)
            self._done_count[h.id] = 0
        return h

    def _loop(self) -> None:
        import ray

        try:
            while not self._stop.is_set():
                with self._lock:
                    refs = list(self._running)
                if not refs:
                    time.sleep(self.cfg.wait_s)
                    continue
                done, _ = ray.wait(refs, num_returns=1, timeout=self.cfg.wait_s)
                if not done:
                    continue
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                now = time.perf_counter()
                for ref in done:
                    with self._lock:
                        h, i, v = self._running.pop(ref)
                    if h.done():
                        continue
                    try:
                        node = ray.get(ref)
                    except Exception as e:
                        h._complete(now, e)
                        continue
                    h._task_done(i, v, node, now)
                    self.node_tasks[node] = self.node_tasks.get(node, 0) + 1
                    self._done_count[h.id] += 1
                    if self._done_count[h.id] == len(h.workflow.calls):
                        h._complete(now)
        except BaseException as e:
            log.exception("ray-default runner thread failed")
            self._error = e

    def drain(self, timeout: float | None = None, progress: Callable[[int, int], None] | None = None
              ) -> bool:
        """Wait until every submitted workflow finished; False on timeout."""
        return _drain(self, "the ray-default runner thread", timeout, progress)

    def summary(self) -> dict[str, Any]:
        out = summarize(self.handles(), self.cfg.time_scale)
        out["policy"] = self.name
        out["tasks_per_node"] = dict(self.node_tasks)
        return out


def _drain(runner: Any, what: str, timeout: float | None,
           progress: Callable[[int, int], None] | None) -> bool:
    """Poll ``runner.handles()`` until all are done (True) or ``timeout`` passes (False); raise
    if the runner's thread died (``runner._error``)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    while True:
        if runner._error is not None:
            raise RuntimeError(f"{what} died") from runner._error
        hs = runner.handles()
        left = sum(1 for h in hs if not h.done())
        if progress:
            progress(len(hs) - left, len(hs))
        if left == 0:
            return True
        if deadline is not None and time.perf_counter() > deadline:
            return False
        time.sleep(0.05)
