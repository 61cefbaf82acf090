"""The cluster's scheduler as a Ray Serve application that every agent job shares (docs/serving.md).

One replica owns the cluster's scale servers: it runs one :class:`scale_ray.live.LiveScheduler`
and places every submitted workflow's primitives as Ray tasks with its policy, whoever submitted
them. Agents reach it two ways:

* HTTP (FastAPI ingress; OpenAPI at ``/docs``):
  ``POST /v1/workflows`` a DAG (``serve_apps.workflow_api``: the live DAG format, primitives named
  ``module:function`` from the ``primitives`` allow-list, or emulated bodies) -> ``{"id"}``;
  ``GET /v1/workflows/{id}[?wait_s=S]`` state, per-task node and times, result or error;
  ``DELETE /v1/workflows/{id}`` cancel (an agent program's first step: every step);
  ``GET /v1/cluster`` servers, busy, queue, policy.
* Python, from any Ray job on the cluster: ``scale_ray.client.submit(call)`` through a
  DeploymentHandle; the job's own ``@primitive`` functions travel by value (cloudpickle) and run
  as Ray tasks placed by the service. No allow-list there: a Ray job can run any code anyway.

Tenants (``serve_apps.tenants``): every request is a tenant's (a bearer token whose hash the
tokens file holds, or loopback-only without tokens; a handle call is its Ray job's); a tenant
sees and cancels only its own workflows; quotas answer 429; submits, cancels and every refusal
are audited and counted (``serve_apps.refusals``).

The policy is hot-swappable (``user_config.policy``, as the placement app: loaded and tried off
the event loop, a failed swap keeps the old policy and is reported in ``GET /v1/cluster``
``last_swap_error``). Autoscaler hints: ``live.autoscale_hints``.

**Durable** (``live.storage``, default ``session``: the Ray session directory of the replica's
node; :mod:`scale_ray.live.journal`): every accepted workflow (its document, or the pickled calls
of a handle submit) and every primitive's result are journaled before they count. A new replica
(restart, health-check replacement, redeploy of args or code) resumes every unfinished workflow
under its old id: finished primitives are not run again, running ones run again (at-least-once;
``scale_ray.live.attempt()``). Submits are idempotent (``Idempotency-Key`` header, the client's
``key``). A **410** / :class:`scale_ray.client.WorkflowLost` remains for what the journal cannot
restore: ``storage: off``, an unreadable submission entry, a workflow whose primitives the new
allow-list or code no longer has (``GET /v1/cluster`` ``journal.unrestorable`` says which).

Run it: ``serve run configs/serve/scheduler.yaml``. Exactly one replica (two would double-book
the servers): :func:`application` refuses ``num_replicas`` other than 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, Callable, Iterator, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from ray import serve

from envs.config import ConfigError, build
from envs.config_files import load_env
from scale_ray.live import LiveScheduler
from scale_ray.live.handles import WorkflowHandle
from scale_ray.live.raydag import as_collected

from . import apidocs, errors, ready
from .decisions import RequestError, load
from .gate import admit
from .policy_holder import PolicyHolder
from .schedule import try_policy
from .errors import parse_body
from .placement import dumps_compact, json_response, resolved_annotations
from .scheduler_config import SECRET_VARS, SchedulerArgs, SchedulerTuning, parse_args
from .tenants import IdSigner, Tenants, audit, load_tokens
from .bounds import check_args, check_tasks
from .durable import JournalView, check_key, rebuild
from .metrics import ServiceMetrics, node_target, scheduler_series
from .refusals import refused
from .registry import UnknownWorkflow, Workflows, quarantined, unknown_handler
from .workflow_api import (AllowList, AppendIn, WorkflowIn, emulate, jsonable, record,
                           root_cause, state, to_workflow)

log = logging.getLogger("ray.serve")


api = FastAPI(title="SCALE scheduler service", version="1",
              description="Places every submitted workflow's primitives as Ray tasks with one "
                          "policy. Errors: 422 naming the field (also a task no server could ever "
                          "run), 503 when the scheduler has no server at all, 413 for a large "
                          "body, 404 for an unknown id, 410 for a workflow lost with a restarted "
                          "replica.", docs_url=None, redoc_url=None)


def _refused_early(err: Exception) -> None:
    """A refusal answered before a route knew the tenant (a 413, 408, a query parameter the
    schema rejects): audited and counted as tenant ``?``."""
    try:
        metrics = serve.get_replica_context().servable_object.metrics
    except Exception:  # noqa: BLE001 - no replica (yet): the audit line and its count only
        metrics = None
    refused(metrics, "?", err)


errors.install(api, on_refusal=_refused_early)
apidocs.install(api)  # /docs with local assets (no CDN)
apidocs.add_models(api, [WorkflowIn, AppendIn])  # the bodies (read as bytes)


api.add_exception_handler(UnknownWorkflow, unknown_handler)


def _respond(content: Any) -> Response:
    return json_response(dumps_compact(content))


@serve.deployment(num_replicas=1, max_ongoing_requests=1000, health_check_period_s=2,
                  ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class SchedulerService:
    """One LiveScheduler behind HTTP and a handle; see the module docstring."""

    def __init__(self, args: Mapping[str, Any] | SchedulerArgs | None = None):
        self.started_at = time.time()  # (GET /v1/cluster: a restart's resume, step by step)
        self.args = args if isinstance(args, SchedulerArgs) else parse_args(args)
        self.env = load_env(self.args.env_config)
        self.tuning = self.args.tuning
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
        self.tenants = Tenants(load_tokens(plaintext=self.args.plaintext_tokens))
        for var in SECRET_VARS:  # read once; nothing this replica starts inherits them
            os.environ.pop(var, None)
        self.ids = IdSigner(self.incarnation)
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="scheduler-io")
        # (fair share and the journal are on unless the config says otherwise: parse_args)
        self.sched = LiveScheduler(policy, self.env, self.args.live,
                                   trace=self._write_trace if self._trace_file else None).start()
        self.t0 = self.sched.clock_origin
        self.epoch = time.time() - time.perf_counter()  # records' *_at: Unix times
        # a primitive's body continues its own agent program (scale_ray.client.program())
        app = serve.get_replica_context().app_name
        self.sched.runs.step_context = lambda h: (h.jid, h.tenant, app)
        errors.LIMITS.max_body_bytes = self.tuning.max_body_bytes
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
        log.info("scheduler service %s: %d servers, policy %s, journal %s: %d workflows resumed "
                 "(%d unfinished), %d unrestorable", self.incarnation, len(self.sched.alive_servers),
                 policy.name, getattr(self.sched.durable.journal, "uri", "off"),
                 len(self.resumed), sum(not h.done() for h in self.resumed),
                 len(self.sched.durable.unrestorable))
        ready.announce(log, "SCALE scheduler service",
                       "POST /v1/workflows; API docs at /docs")

    def _load(self, spec: str) -> Any:
        self.gates[spec] = admit(spec, self.args.policy_gate, log)  # PolicyRefused: not loaded
        lp = load(spec, self.env, mask_infeasible=True, guard=self.args.live.guard)
        try_policy(lp)
        return lp.policy

    def _write_trace(self, ev: dict) -> None:
        self._trace_file.write(json.dumps({**ev, "service": self.incarnation, "wall": time.time()},
                                          default=float) + "\n")

    # ---------------------------------------------------------------- lifecycle
    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """A new ``user_config`` (:class:`SchedulerTuning`); a failed policy swap keeps the
        current policy, never raises, and is reported as ``last_swap_error``."""
        async with self.holder.lock:
            raw = dict(user_config or {})
            try:
                t = build(SchedulerTuning, raw, "user_config")
            except ConfigError as e:
                return self.holder.failed(str(e), raw.get("policy"))
            self.tuning = t
            errors.LIMITS.max_body_bytes = t.max_body_bytes
            # the new policy decides from the scheduler thread's next round on
            await self.holder.swap(t.policy, lambda new: asyncio.wrap_future(
                self.sched.set_policy(new)))

    def check_health(self) -> None:
        if self.sched.thread_error is not None:  # Serve replaces the replica
            raise RuntimeError(f"the scheduler thread died: {self.sched.thread_error!r}")

    def __del__(self) -> None:
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

    def _tenant(self, request: Request) -> str:
        """The request's tenant (serve_apps.tenants; the header compared as bytes); a 401 / 403
        otherwise, audited with tenant ``?`` and never the token."""
        host = request.client.host if request.client else None
        tenant, status, why = self.tenants.authenticate(request.headers.get("authorization"),
                                                       host)
        if tenant is None:
            kind = "unauthorized" if status == 401 else "forbidden"
            raise refused(self.metrics, "?", RequestError(("header", "authorization"), why, kind,
                                                          status=status), detail=why,
                          client=host or "")
        from .registry import HTTP_CALLER
        HTTP_CALLER.set(True)  # (this request's task only: _cluster shows it counts only)
        return tenant

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
            raise refused(self.metrics, tenant, e) from None

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

    async def _record(self, wid: str, tenant: str, wait_s: float, with_result: bool) -> dict:
        h = self.registry.lookup(wid, tenant)
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
        return await self._off_loop(make)

    async def _cluster(self, tenant: str) -> dict:
        """``GET /v1/cluster`` (an HTTP tenant: counts only, ``registry.tenant_view``) and the
        handle's ``cluster()`` (a Ray job: the snapshot with the servers' nodes, the replica's
        ids and the journal's storage, which Ray's state API shows it anyway). Either way
        another tenant's running task shows as ``{"tenant": "other"}``."""
        import ray

        from .registry import HTTP_CALLER, mask_tasks, tenant_view

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
        if HTTP_CALLER.get():
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
        return {**snap, "servers": servers, "policy_spec": self.holder.spec,
                "policy_gate": self.gates.get(self.holder.spec),
                **self.holder.report(), "tenant": tenant,
                "scheduler_node": ray.get_runtime_context().get_node_id(),
                "metrics_target": self.metrics_target,  # Prometheus: this node's export port
                "replica_actor": ray.get_runtime_context().get_actor_name(),
                "replica_worker_id": ray.get_runtime_context().get_worker_id(),
                "workflows": counts,
                "other_tenants": {"unfinished_workflows": others},
                "journal": await self._off_loop(self.journal.view, tenant),
                "resumed": {"replica_started": self.started_at, "policy_loaded": self.holder.loaded_at,
                            "scheduler_started": self.scheduler_at, "at": self.resumed_at,
                            "workflows": resumed},
                "uptime_s": uptime}

    # ---------------------------------------------------------------- HTTP
    @api.post("/v1/workflows", status_code=201, summary="submit a workflow (a DAG)",
              openapi_extra=apidocs.body(WorkflowIn))
    @resolved_annotations
    async def post_workflow(self, request: Request) -> Response:
        tenant = self._tenant(request)
        body = await request.body()
        ct = request.headers.get("content-type")
        t = self.tuning

        def accept() -> dict:
            req = parse_body(body, WorkflowIn, ct)
            self._check_bounds(req, tenant)
            wf = emulate(to_workflow(req, self.allow, t.max_tasks), body, *self._doc)
            return self.registry.accept(wf, tenant, "json", body, key, {"content_type": ct},
                                        req.program)
        with self._refusals(tenant):
            key = check_key(request.headers.get("idempotency-key"))
            accepted = await self._off_loop(accept)
        out = _respond(accepted)
        out.status_code = 200 if accepted.get("duplicate") else 201
        return out

    @api.post("/v1/workflows/{wid}/tasks", status_code=201,
              summary="append the next calls of an agent program (parents may name earlier "
                      "steps' outputs), or close it", openapi_extra=apidocs.body(AppendIn))
    @resolved_annotations
    async def post_tasks(self, request: Request, wid: str) -> Response:
        """A step of the program workflow ``wid`` belongs to (registry ``Workflows.append``;
        docs/agents.md); a step waiting on a running earlier step is ``waiting_for`` it."""
        tenant = self._tenant(request)
        body = await request.body()
        ct = request.headers.get("content-type")

        def accept() -> dict:
            req = parse_body(body, AppendIn, ct)
            self._check_bounds(req, tenant)
            return self.registry.append(wid, tenant, req, body, key, {"content_type": ct},
                                        lambda earlier: emulate(to_workflow(
                                            req, self.allow, self.tuning.max_tasks, earlier),
                                            body, *self._doc))
        with self._refusals(tenant):
            key = check_key(request.headers.get("idempotency-key"))
            accepted = await self._off_loop(accept)
        out = _respond(accepted)
        out.status_code = 200 if accepted.get("duplicate") or "id" not in accepted else 201
        return out

    @api.get("/v1/workflows/{wid}", summary="state, per-task node and times, result or error")
    @resolved_annotations
    async def get_workflow(self, request: Request, wid: str, wait_s: float = 0.0,
                           result: bool = True) -> Response:
        """``result=false``: the state only (polling); the result is not fetched, so the
        journal keeps it (a fetched result is compacted away after a restart)."""
        tenant = self._tenant(request)
        with self._refusals(tenant):
            if not 0 <= wait_s <= 60:
                raise RequestError(("query", "wait_s"), f"must be in [0, 60], got {wait_s}")
            return _respond(await self._record(wid, tenant, wait_s, result))

    @api.delete("/v1/workflows/{wid}", summary="cancel a workflow")
    @resolved_annotations
    async def delete_workflow(self, request: Request, wid: str) -> Response:
        return _respond(await self._cancel(wid, self._tenant(request)))

    @api.get("/v1/cluster", summary="servers, busy, queue, policy")
    @resolved_annotations
    async def get_cluster(self, request: Request) -> Response:
        return _respond(await self._cluster(self._tenant(request)))

    @api.get("/metrics", summary="the scheduler's Prometheus series (ray_scale_scheduler_*)",
             response_class=PlainTextResponse)
    @resolved_annotations
    async def get_metrics(self, request: Request) -> Response:
        """The ``ray_scale_scheduler_*`` series as Ray's metrics agent exports them on this
        replica's node (:func:`serve_apps.metrics.node_target`), in Prometheus' text format:
        a scrape target that carries only the scheduler's series. Ray exports a new value
        about 10 s after it changed."""
        import httpx

        self._tenant(request)

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
        return PlainTextResponse(await self._off_loop(scrape),
                                 media_type="text/plain; version=0.0.4")

    # ---------------------------------------------------------------- handle API
    # (``tenant``: the calling Ray job's, ``job:<id>``, unless the client names one)
    async def submit(self, payload: bytes, name: str = "", tenant: str = "job:?",
                     key: str | None = None, program: str | None = None) -> dict:
        """``scale_ray.client.submit``: a cloudpickled Call / list of Calls / WorkflowSpec;
        ``key``: its idempotency key (a retried submit returns the first one's workflow);
        ``program``: the earlier workflow whose agent program it continues."""
        from ray import cloudpickle

        try:
            key = check_key(key)
            def accept() -> dict:
                wf = as_collected(cloudpickle.loads(payload), name=name)
                self._check_bounds(wf, tenant)
                return self.registry.accept(emulate(wf, payload, *self._doc), tenant, "pickle",
                                            payload, key, None, program)
            return await self._off_loop(accept)
        except RequestError as e:  # the client raises it as NoServers / Unschedulable / quota
            refused(self.metrics, tenant, e)
            return {"refused": e.kind, "message": e.msg,
                    "retry_after_s": self.tuning.retry_after_s if e.status == 429 else None}

    async def wait(self, wid: str, timeout_s: float, tenant: str = "job:?") -> dict:
        """The record once done or after ``timeout_s``; an unknown id is ``state`` ``lost``
        (its replica is gone) or ``unknown``."""
        try:
            return await self._record(wid, tenant, timeout_s, False)
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

    async def cancel(self, wid: str, tenant: str = "job:?") -> dict:
        return await self._cancel(wid, tenant)

    async def close_program(self, wid: str, tenant: str = "job:?") -> dict:
        """``scale_ray.client.ServiceProgram.close``: the HTTP append with ``close: true`` and
        no tasks (journaled as that); a refusal comes back as ``refused`` and its reason."""
        req = AppendIn(close=True)
        try:
            return await self._off_loop(self.registry.append, wid, tenant, req, b"", None, {},
                                        None)
        except (RequestError, UnknownWorkflow) as e:  # the client raises it (closed: 409)
            refused(self.metrics, tenant, e)
            return {"refused": e.kind, "message": e.msg}

    async def _cancel(self, wid: str, tenant: str) -> dict:
        """Cancel workflow ``wid``; the first step of an agent program cancels the program,
        every step it has (``Workflows.cancel``): ``steps_cancelled`` counts the others that
        were still running."""
        steps = await self._off_loop(self.registry.cancel, wid, tenant)
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

    @contextlib.contextmanager
    def _refusals(self, tenant: str) -> Iterator[None]:
        """Every refusal raised inside is audited and counted as ``tenant``'s (once:
        serve_apps.refusals)."""
        try:
            yield
        except (RequestError, RequestValidationError, UnknownWorkflow) as e:
            refused(self.metrics, tenant, e)
            raise

    async def cluster(self, tenant: str = "job:?") -> dict:
        return await self._cluster(tenant)


def application(args: Mapping[str, Any] | None = None, **deployment_options: Any) -> serve.Application:
    """The bound application (``deployment_options`` go to ``SchedulerService.options``)."""
    try:
        sa = parse_args(args)
    except ConfigError as e:
        raise ValueError(f"scheduler app: {e}") from None
    if deployment_options.get("num_replicas", 1) != 1:
        raise ValueError("scheduler app: num_replicas must be 1 (one replica owns the cluster's "
                         "servers; two would double-book them)")
    opts = {"user_config": asdict(sa.tuning), **deployment_options}
    fixed = {k: v for k, v in asdict(sa).items() if k != "tuning"}
    return SchedulerService.options(**opts).bind(fixed)


def build_app(args: Mapping[str, Any]) -> serve.Application:
    """Application builder for ``serve run`` (``args``: :class:`SchedulerArgs` as a mapping)."""
    return application(args)


__all__ = ["SchedulerService", "SchedulerArgs", "SchedulerTuning", "application", "build_app",
           "parse_args", "api"]
