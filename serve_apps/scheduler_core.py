"""The scheduler service's one writer: the scheduler actor (docs/serving.md, "One writer, many
doors").

:class:`SchedulerCore` owns everything that must exist once per cluster: the
:class:`scale_ray.live.LiveScheduler` (servers, placement, fair share, sizing), the workflow
registry (tenants' workflows, quotas), the journal and the metrics. It runs as one named,
detached, restartable Ray actor (:func:`scheduler_actor`, ``scale:scheduler-<app>``); the Serve
replicas (:mod:`serve_apps.scheduler`) are stateless doors that authenticate and forward every
request here. A restarted actor resumes every accepted workflow from its journal.

Every method takes plain values (the tenant already authenticated by a door, the request's
body bytes) and raises :class:`~serve_apps.schemas.RequestError` /
:class:`~serve_apps.registry.UnknownWorkflow` for a refusal, audited and counted here once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from fastapi.exceptions import RequestValidationError

from envs.config import ConfigError, build
from envs.config_files import load_env
from scale_ray.live import LiveScheduler
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.raydag import as_collected

from . import errors
from .bounds import check_args, check_tasks
from .decisions import RequestError, load
from .durable import JournalView, check_key, rebuild
from .errors import parse_body
from .gate import admit
from .metrics import ServiceMetrics, node_target, scheduler_series
from .policy_holder import PolicyHolder
from .refusals import refused
from .registry import UnknownWorkflow, Workflows, mask_tasks, quarantined, tenant_view
from .schedule import try_policy
from .scheduler_config import SECRET_VARS, SchedulerArgs, SchedulerTuning
from .tenants import IdSigner, audit, count_audit
from .workflow_api import (AllowList, AppendIn, WorkflowIn, emulate, jsonable, record,
                           root_cause, state, to_workflow)

log = logging.getLogger("ray.serve")

NAMESPACE = "scale"  # the scheduler actor's Ray namespace
ORPHAN_EXIT_S = 60.0  # the actor exits when no door has asked for this long (the app is gone)


def actor_name(app: str) -> str:
    return f"scheduler-{app}"


def args_digest(args: Mapping[str, Any]) -> str:
    """What makes two doors' scheduler the same one: their fixed args (``user_config`` is
    sent on its own and changes nothing here)."""
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()[:16]


class SchedulerCore:
    """One LiveScheduler, its workflows, journal and metrics; see the module docstring."""

    def __init__(self, args: SchedulerArgs, tuning: SchedulerTuning, app: str = "scheduler",
                 digest: str = ""):
        self.started_at = time.time()  # (GET /v1/cluster: a restart's resume, step by step)
        self.args, self.tuning, self.app, self.digest = args, tuning, app, digest
        for var in SECRET_VARS:  # tokens are the doors' business; no worker inherits them
            os.environ.pop(var, None)
        self.env = load_env(self.args.env_config)
        self.allow = AllowList(self.args.primitives)
        emu = self.args.emulation  # workflows: what the scheduler is shown, emulated noise
        self._doc = (self.env.runtime.default_gflop if emu.hints == "none" else None,
                     emu.noise_sigma)
        self.incarnation = uuid.uuid4().hex[:8]
        # no fallback: a bad policy argument fails the deploy (serve_apps.policy_holder), and
        # so does a learned one the gate refuses (serve_apps.gate)
        self.gates: dict[str, dict] = {}
        self.holder = PolicyHolder(self._load, self.args.policy, "scheduler", lambda p: p.name,
                                   log)
        policy = self.holder.current
        self._trace_file = open(self.args.trace, "a", buffering=1) if self.args.trace else None
        self.ids = IdSigner(self.incarnation)
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="scheduler-io")
        # (fair share and the journal are on unless the config says otherwise: parse_args)
        self.sched = LiveScheduler(policy, self.env, self.args.live,
                                   trace=self._write_trace if self._trace_file else None).start()
        self.t0 = self.sched.clock_origin
        self.epoch = time.time() - time.perf_counter()  # records' *_at: Unix times
        # a primitive's body continues its own agent program (scale_ray.client.program())
        self.sched.runs.step_context = lambda h: (h.jid, h.tenant, app)
        self.scheduler_at = time.time()
        self.journal = JournalView(self.sched)
        self.metrics = ServiceMetrics(self)  # ray.util.metrics (serve_apps.metrics)
        self.metrics_target = node_target()  # where Ray exports them (GET /metrics reads it)
        self.registry = Workflows(self.sched, lambda: self.tuning, self.ids, self.metrics,
                                  self._pool, self.incarnation)
        self.metrics.start()
        self.resumed = self.sched.resume(lambda sub: rebuild(sub, self.allow, self.tuning,
                                                             *self._doc))
        for h in self.resumed:
            self.registry.register(h.jid, h, h.tenant)
        self.resumed_at = time.time()
        log.info("scheduler actor %s: %d servers, policy %s, journal %s: %d workflows resumed "
                 "(%d unfinished), %d unrestorable", self.incarnation,
                 len(self.sched.alive_servers), policy.name,
                 getattr(self.sched.durable.journal, "uri", "off"), len(self.resumed),
                 sum(not h.done() for h in self.resumed), len(self.sched.durable.unrestorable))

    def _load(self, spec: str) -> Any:
        self.gates[spec] = admit(spec, self.args.policy_gate, log)  # PolicyRefused: not loaded
        lp = load(spec, self.env, mask_infeasible=True, guard=self.args.live.guard)
        try_policy(lp)
        return lp.policy

    def _write_trace(self, ev: dict) -> None:
        self._trace_file.write(json.dumps({**ev, "service": self.incarnation, "wall": time.time()},
                                          default=float) + "\n")

    # ---------------------------------------------------------------- lifecycle
    async def ping(self) -> dict:
        """A door's heartbeat: who answers (a restart is a new ``incarnation``)."""
        return {"incarnation": self.incarnation, "digest": self.digest,
                "tuning_policy": self.holder.spec}

    async def hold(self) -> None:
        """A door's standing call: never answers; it fails when this actor dies, which is how
        a door knows at once (serve_apps.scheduler.ActorLink)."""
        await asyncio.Event().wait()

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """A new ``user_config`` (:class:`SchedulerTuning`); a failed policy swap keeps the
        current policy, never raises, and is reported as ``last_swap_error``. Every door sends
        it (at its start, on a change, to a restarted actor): the same config twice is one."""
        async with self.holder.lock:
            raw = dict(user_config or {})
            try:
                t = build(SchedulerTuning, raw, "user_config")
            except ConfigError as e:
                return self.holder.failed(str(e), raw.get("policy"))
            self.tuning = t
            # the new policy decides from the scheduler thread's next round on
            await self.holder.swap(t.policy, lambda new: asyncio.wrap_future(
                self.sched.set_policy(new)))

    def thread_error(self) -> BaseException | None:
        return self.sched.thread_error

    def shutdown(self) -> None:
        if getattr(self, "metrics", None) is not None:
            self.metrics.stop()
        sched = getattr(self, "sched", None)
        if sched is not None:
            sched.shutdown(timeout=5)
        if getattr(self, "_trace_file", None) is not None:
            self._trace_file.close()

    # ---------------------------------------------------------------- helpers
    async def _off_loop(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _refusal(self, tenant: str, err: BaseException) -> BaseException:
        return refused(self.metrics, tenant, err)

    def _check_bounds(self, wf: WorkflowIn | AppendIn | Any, tenant: str) -> None:
        """The per-task caps (serve_apps.bounds) of a request (``WorkflowIn``, ``AppendIn``: its
        fields and JSON arguments) or of a handle submit's calls; a 422 naming the field,
        audited."""
        servers = list(self.sched.alive_servers)
        slowest = min((s.node.compute for s in servers), default=None)
        t = self.tuning
        try:
            if isinstance(wf, (WorkflowIn, AppendIn)):
                for i, task in enumerate(wf.tasks):
                    check_args(("body", "tasks", i), task.args, task.kwargs, t)
                tasks = [(("body", "tasks", i), x.compute_gflop, x.memory_need_gb())
                         for i, x in enumerate(wf.tasks)]
            else:
                tasks = [(("tasks", i), c.primitive.compute_gflop, c.primitive.memory_gb)
                         for i, c in enumerate(wf.calls)]
            check_tasks(tasks, t, slowest, self.sched.cfg.time_scale)
        except RequestError as e:
            raise self._refusal(tenant, e) from None

    async def _guarded(self, tenant: str, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` off the event loop; a refusal it raises is audited and counted once."""
        try:
            return await self._off_loop(fn, *args)
        except (RequestError, UnknownWorkflow, RequestValidationError) as e:
            raise self._refusal(tenant, e)

    async def _await_done(self, h: WorkflowHandle, timeout_s: float) -> bool:
        if h.done() or timeout_s <= 0:
            return h.done()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        h.add_done_callback(lambda _: loop.call_soon_threadsafe(
            lambda: fut.done() or fut.set_result(True)))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            pass
        return h.done()

    def _values(self, h: WorkflowHandle) -> Any:
        import ray

        refs = [h.result_refs[i] for i in h.workflow.outputs]
        if any(r is None for r in refs):
            raise UnknownWorkflow(f"the result of workflow {h.name!r} expired (result_ttl_s="
                                  f"{self.tuning.result_ttl_s:g} s after it finished)", gone=True)
        vals = ray.get(refs)
        return vals[0] if len(vals) == 1 else vals


    # ---------------------------------------------------------------- the requests
    async def accept(self, tenant: str, body: bytes, content_type: str | None,
                     key: str | None) -> dict:
        """``POST /v1/workflows``: ``{"id"}`` (``duplicate`` for a retried key)."""
        t = self.tuning

        def accept() -> dict:
            k = check_key(key)
            req = parse_body(body, WorkflowIn, content_type)
            self._check_bounds(req, tenant)
            wf = emulate(to_workflow(req, self.allow, t.max_tasks), body, *self._doc)
            return self.registry.accept(wf, tenant, "json", body, k,
                                        {"content_type": content_type}, req.program)
        return await self._guarded(tenant, accept)

    async def append(self, wid: str, tenant: str, body: bytes, content_type: str | None,
                     key: str | None) -> dict:
        """``POST /v1/workflows/{wid}/tasks``: a step of ``wid``'s agent program (registry
        ``Workflows.append``; docs/agents.md)."""
        def accept() -> dict:
            k = check_key(key)
            req = parse_body(body, AppendIn, content_type)
            self._check_bounds(req, tenant)
            return self.registry.append(wid, tenant, req, body, k,
                                        {"content_type": content_type},
                                        lambda earlier: emulate(to_workflow(
                                            req, self.allow, self.tuning.max_tasks, earlier),
                                            body, *self._doc))
        return await self._guarded(tenant, accept)

    async def record(self, wid: str, tenant: str, wait_s: float, with_result: bool,
                     counted: bool = True) -> dict:
        """``GET /v1/workflows/{wid}``: once done or after ``wait_s`` (``counted``: an unknown
        id is a refusal of ``tenant``)."""
        try:
            h = self.registry.lookup(wid, tenant)
        except UnknownWorkflow as e:
            raise self._refusal(tenant, e) if counted else e
        await self._await_done(h, wait_s)

        def make() -> dict:  # per-task lists: off the event loop for large workflows
            rec = record(wid, h, self.t0, self.sched.cfg.time_scale, self.epoch)
            if with_result and rec["state"] == "completed":
                if any(h.result_refs[i] is None for i in h.workflow.outputs):
                    rec["result"], rec["result_expired"] = None, True
                else:
                    rec["result"] = jsonable(self._values(h))
                    self.sched.durable.compact(h)  # fetched: the journal keeps its record only
            return rec
        return await self._guarded(tenant, make)

    async def cancel(self, wid: str, tenant: str = "job:?") -> dict:
        """Cancel workflow ``wid``; the first step of an agent program cancels the program,
        every step it has (``Workflows.cancel``): ``steps_cancelled`` counts the others that
        were still running."""
        steps = await self._guarded(tenant, self.registry.cancel, wid, tenant)
        # the last step first: a held step is cancelled before the step it waits on fails it
        futures = [self.sched.cancel(h) for h in reversed(steps)][::-1]
        ran = [bool(await asyncio.wrap_future(f)) for f in futures]
        audit("cancel", tenant, wid, was_running=ran[0],
              **({"steps_cancelled": sum(ran[1:])} if len(steps) > 1 else {}))
        out = {"id": wid, "cancelled": ran[0], "state": state(steps[0])}
        if quarantined(steps[0]):
            out["deleted"] = True  # (registry: a quarantined workflow is deleted)
        prog = steps[0].program
        if prog is not None and prog.handles[0] is steps[0]:
            out["steps_cancelled"] = sum(ran[1:])
        return out

    async def cluster(self, tenant: str = "job:?", http: bool = False) -> dict:
        """``GET /v1/cluster`` (``http``: counts only, ``registry.tenant_view``) and the
        handle's ``cluster()`` (a Ray job: the snapshot with the servers' nodes, the actor's
        ids and the journal's storage, which Ray's state API shows it anyway). Either way
        another tenant's running task shows as ``{"tenant": "other"}``."""
        import ray

        snap = await asyncio.wrap_future(self.sched.status())
        items = self.registry.items()
        owner = self.registry.owner
        mine = {k: h for k, h in items if owner.get(k) == tenant}
        counts: dict[str, int] = {}
        for h in mine.values():
            s = state(h)
            counts[s] = counts.get(s, 0) + 1
        others = sum(1 for k, h in items if k not in mine and not h.done())
        servers = mask_tasks(snap["servers"], {id(h): k for k, h in mine.items()},
                             self.sched.handles())
        resumed = sum(1 for h in self.resumed if owner.get(h.jid) == tenant)
        uptime = time.perf_counter() - self.t0
        if http:
            describe = getattr(self.holder.current, "describe", None)
            policy = {"name": snap["policy"], "swaps": self.holder.swaps,
                      "version": (describe() if callable(describe) else {}).get("version"),
                      "last_swap_failed": self.holder.last_swap_error is not None}
            queued = sum(sum(1 for f in h.task_finish_wall if f is None)
                         for h in mine.values() if not h.done())
            journal = self.journal.tenant_counts(
                sum(1 for h in mine.values() if h.jid is not None),
                lambda wid: self.ids.check(wid, tenant) != "unknown")
            return tenant_view(snap, servers, tenant, counts, queued, others, policy, journal,
                               resumed, uptime)
        ctx = ray.get_runtime_context()
        return {**snap, "servers": servers, "policy_spec": self.holder.spec,
                "policy_gate": self.gates.get(self.holder.spec),
                **self.holder.report(), "tenant": tenant,
                "incarnation": self.incarnation,
                "scheduler_node": ctx.get_node_id(),
                "scheduler_actor": f"{NAMESPACE}:{actor_name(self.app)}",
                "scheduler_pid": os.getpid(),
                "scheduler_worker_id": ctx.get_worker_id(),
                "scheduler_log": getattr(self, "log_file", None),
                "metrics_target": self.metrics_target,  # Prometheus: this node's export port
                "workflows": counts,
                "other_tenants": {"unfinished_workflows": others},
                "journal": await self._off_loop(self.journal.view, tenant),
                "resumed": {"actor_started": self.started_at,
                            "policy_loaded": self.holder.loaded_at,
                            "scheduler_started": self.scheduler_at, "at": self.resumed_at,
                            "workflows": resumed},
                "uptime_s": uptime}

    async def metrics_text(self) -> str:
        """``GET /metrics``: the ``ray_scale_scheduler_*`` series as Ray's metrics agent
        exports them on this actor's node (:func:`serve_apps.metrics.node_target`)."""
        import httpx

        def scrape() -> str:
            target = self.metrics_target
            if target is None:
                raise RequestError(("metrics",), "Ray reports no metrics export port for "
                                   "this node", "no_metrics", status=503)
            try:
                return scheduler_series(httpx.get(f"http://{target}/metrics", timeout=5).text)
            except httpx.HTTPError as e:
                raise RequestError(("metrics",), f"the node's metrics endpoint {target} did "
                                   f"not answer ({type(e).__name__})", "no_metrics",
                                   status=503) from None
        return await self._off_loop(scrape)

    def note_refusal(self, tenant: str, kind: str, audit_line: bool = True) -> None:
        """A refusal a door answered itself (401/403, 413, 408, a bad query, a 503): counted
        here, where the metrics live, with its audit line's count (``audit_line``: the door
        wrote the line in another process)."""
        self.metrics.refused(tenant, kind)
        if audit_line:
            count_audit("refuse", kind)

    # ---------------------------------------------------------------- the Python handle's
    # (``tenant``: the calling Ray job's, ``job:<id>``, unless the client names one)
    async def submit(self, payload: bytes, name: str = "", tenant: str = "job:?",
                     key: str | None = None, program: str | None = None) -> dict:
        """``scale_ray.client.submit``: a cloudpickled Call / list of Calls / WorkflowSpec;
        ``key``: its idempotency key (a retried submit returns the first one's workflow);
        ``program``: the earlier workflow whose agent program it continues."""
        from ray import cloudpickle

        try:
            k = check_key(key)

            def accept() -> dict:
                wf = as_collected(cloudpickle.loads(payload), name=name)
                self._check_bounds(wf, tenant)
                return self.registry.accept(emulate(wf, payload, *self._doc), tenant, "pickle",
                                            payload, k, None, program)
            return await self._off_loop(accept)
        except RequestError as e:  # the client raises it as NoServers / Unschedulable / quota
            self._refusal(tenant, e)
            return {"refused": e.kind, "message": e.msg,
                    "retry_after_s": self.tuning.retry_after_s if e.status == 429 else None}

    async def wait(self, wid: str, timeout_s: float, tenant: str = "job:?") -> dict:
        """The record once done or after ``timeout_s``; an unknown id is ``state`` ``lost``
        (its actor is gone) or ``unknown``."""
        try:
            return await self.record(wid, tenant, timeout_s, False, counted=False)
        except UnknownWorkflow as e:
            return {"id": wid, "state": "lost" if e.gone else "unknown", "error": e.msg}

    async def values(self, wid: str, tenant: str = "job:?") -> Any:
        """The output values (Python objects) of a completed workflow."""
        h = self.registry.lookup(wid, tenant)
        out = await self._off_loop(self._values, h)
        await self._off_loop(self.sched.durable.compact, h)  # fetched: the journal keeps its record only
        return out

    async def exception(self, wid: str, tenant: str = "job:?") -> bytes | None:
        """The failed workflow's root-cause exception, cloudpickled (None when it did not fail
        or the exception does not pickle): the Python client raises it as its own type."""
        from ray import cloudpickle

        h = self.registry.lookup(wid, tenant)
        if h.error is None:
            return None
        try:
            return cloudpickle.dumps(root_cause(h.error))
        except Exception:  # noqa: BLE001 - an unpicklable exception: the client gets the text
            return None

    async def close_program(self, wid: str, tenant: str = "job:?") -> dict:
        """``scale_ray.client.ServiceProgram.close``: the HTTP append with ``close: true`` and
        no tasks (journaled as that); a refusal comes back as ``refused`` and its reason."""
        req = AppendIn(close=True)
        try:
            return await self._off_loop(self.registry.append, wid, tenant, req, b"", None, {},
                                        None)
        except (RequestError, UnknownWorkflow) as e:  # the client raises it (closed: 409)
            self._refusal(tenant, e)
            return {"refused": e.kind, "message": e.msg}


class SchedulerActor(SchedulerCore):
    """:class:`SchedulerCore` as the named Ray actor: it exits for a restart when its scheduler
    thread dies (Ray starts it again; it resumes from the journal), and for good when no door
    has asked for :data:`ORPHAN_EXIT_S` (its application was deleted)."""

    def __init__(self, args: SchedulerArgs, tuning: SchedulerTuning, app: str, digest: str):
        self.log_file = _log_to_file(app)
        super().__init__(args, tuning, app, digest)
        self._heard = time.monotonic()
        threading.Thread(target=self._watch, name="scheduler-watch", daemon=True).start()

    async def ping(self) -> dict:
        self._heard = time.monotonic()
        return await super().ping()

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            if self.sched.thread_error is not None:
                log.error("scheduler actor %s: the scheduler thread died (%r); restarting",
                          self.incarnation, self.sched.thread_error)
                import ray
                # a crash: Ray restarts the actor (max_restarts=-1)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
                return
            if time.monotonic() - self._heard > ORPHAN_EXIT_S:
                log.info("scheduler actor %s: no door for %.0f s; exiting", self.incarnation,
                         ORPHAN_EXIT_S)
                self.shutdown()
                import ray
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return


def _log_to_file(app: str) -> str | None:
    """The actor's ``ray.serve`` records (its log and the audit lines) in
    ``<Ray logs>/serve/scheduler-<app>.log`` (every incarnation appends), as a Serve replica
    writes its own; the path, or None without a Ray session."""
    try:
        import ray

        ctx = ray.get_runtime_context()
        logs = os.path.join(ctx.get_temp_dir(), ctx.get_session_name(), "logs")
    except Exception:  # noqa: BLE001 - not in a Ray worker (a test): Python's own handlers
        return None
    path = os.path.join(logs, "serve", f"scheduler-{app}.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "%(levelname)s %(asctime)s scheduler-actor %(process)d -- %(message)s"))
    logger = logging.getLogger("ray.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return path


def scheduler_actor(app: str, args: Mapping[str, Any], tuning: SchedulerTuning,
                    node_id: str | None) -> Any:
    """The scheduler actor of application ``app``: the running one if its args are ``args``,
    else a new one (an actor of other args is killed first: a redeploy with new args). Named
    ``scale:scheduler-<app>``, detached, restarted by Ray without limit, 0 CPUs, kept on
    ``node_id`` (the first door's) while that node lives: its journal is there
    (``live.storage: session``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .scheduler_config import parse_args

    digest = args_digest(args)
    name = actor_name(app)
    try:
        old = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        old = None
    if old is not None:
        try:
            if ray.get(old.ping.remote(), timeout=600)["digest"] == digest:
                return old
        except ray.exceptions.RayActorError:
            pass
        ray.kill(old, no_restart=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the name is free once the old one is gone
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.1)
    opts: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "lifetime": "detached",
                            "get_if_exists": True, "max_restarts": -1, "max_task_retries": 0,
                            "num_cpus": 0, "max_concurrency": 1000}
    if node_id is not None:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    return ray.remote(SchedulerActor).options(**opts).remote(parse_args(args), tuning, app,
                                                             digest)


__all__ = ["SchedulerCore", "SchedulerActor", "scheduler_actor", "NAMESPACE", "actor_name",
           "args_digest", "ORPHAN_EXIT_S"]
