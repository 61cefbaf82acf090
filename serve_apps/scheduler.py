"""The cluster's scheduler as a Ray Serve application that every agent job shares (docs/serving.md).

**One writer, many doors.** The scheduler's state (servers, placement, fair share, sizing,
workflows, quotas, journal, metrics) lives in one named, detached, restartable Ray actor,
``scale:scheduler-<app>`` (:mod:`serve_apps.scheduler_core`). The replicas of this deployment
are stateless doors (``num_replicas`` 1 or more): each authenticates a request (tenant tokens
are read by the doors only), answers HTTP and the Python handle, and forwards the request to the
actor. While the actor restarts (a crash, its scheduler thread died, its node was lost) every
door answers **503** with ``Retry-After`` (the Python client retries); the restarted actor
resumes every accepted workflow from its journal. A door killed costs only its in-flight
requests' retries. Agents reach it two ways:

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

The policy is hot-swappable (``user_config.policy``: every door forwards its ``user_config`` to
the actor, again to a restarted one; a failed swap keeps the old policy and is reported in
``GET /v1/cluster`` ``last_swap_error``). Autoscaler hints: ``live.autoscale_hints``.

**Durable** (``live.storage``, default ``session``: the Ray session directory of the actor's
node; :mod:`scale_ray.live.journal`): every accepted workflow and every primitive's result are
journaled before they count; a restarted actor (or a redeploy with new args, which replaces the
actor) resumes every unfinished workflow under its old id (at-least-once for what was running;
``scale_ray.live.attempt()``). Submits are idempotent (``Idempotency-Key``, the client's
``key``). A **410** / :class:`scale_ray.client.WorkflowLost` remains for what the journal cannot
restore.

Run it: ``serve run configs/serve/scheduler.yaml``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from ray import serve

from envs.config import ConfigError

from . import apidocs, errors, ready
from .decisions import RequestError
from .placement import dumps_compact, json_response, resolved_annotations
from .refusals import refused
from .registry import UnknownWorkflow, unknown_handler
from .scheduler_config import SECRET_VARS, SchedulerArgs, SchedulerTuning, parse_args
from .scheduler_core import NAMESPACE, SchedulerCore, actor_name, scheduler_actor
from .tenants import Tenants, load_tokens
from .workflow_api import AppendIn, WorkflowIn

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


RETRY_AFTER_S = 2  # a door's Retry-After while the scheduler actor restarts
PING_S, PING_TIMEOUT_S = 1.0, 5.0  # a door asks the actor this often; no answer this long: down


def restarting(why: str) -> RequestError:
    """The 503 every door answers while the scheduler actor restarts (the Python client
    retries it; ``kind`` ``restarting``)."""
    return RequestError(("scheduler",), f"the scheduler actor is restarting ({why}); retry "
                        f"after {RETRY_AFTER_S} s", "restarting", status=503,
                        headers={"Retry-After": str(RETRY_AFTER_S)})


class LocalLink:
    """A door's scheduler in its own process (tests: a :class:`SchedulerCore` built by hand)."""
    same_process = True

    def __init__(self, core: SchedulerCore):
        self.core = core

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(self.core, method)(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    def tell(self, method: str, *args: Any) -> None:
        getattr(self.core, method)(*args)

    def configure(self, user_config: dict) -> None:
        pass


class ActorLink:
    """A door's way to the scheduler actor: every call forwarded, the actor's own refusals
    raised as themselves, and a :func:`restarting` 503 while it does not answer: a call that
    found it dead, or a heartbeat (every :data:`PING_S`) unanswered for :data:`PING_TIMEOUT_S`.
    A restarted actor (a new incarnation) is sent this door's ``user_config`` again; one that
    is gone for good (killed) is made again by ``make``."""
    same_process = False

    def __init__(self, make: Callable[[], Any], timeout_s: float = 600.0):
        import ray

        self._make = make
        self.handle = make()
        self.user_config: dict | None = None
        self._sent: tuple[str, dict] | None = None  # (incarnation, config) it last took
        self.up = True
        self.info = ray.get(self.handle.ping.remote(), timeout=timeout_s)  # its init failed: raise
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="scheduler-door-watch", daemon=True).start()

    def configure(self, user_config: dict) -> None:
        """This door's ``user_config`` (Serve's reconfigure): sent now and to every restart."""
        import ray

        self.user_config = dict(user_config)
        ray.get(self.handle.reconfigure.remote(self.user_config), timeout=600)
        self._sent = (self.info["incarnation"], self.user_config)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray.exceptions as rex

        if not self.up:
            raise restarting("it did not answer the last heartbeat")
        try:
            return await getattr(self.handle, method).remote(*args, **kwargs)
        except rex.RayTaskError as e:  # the actor's own exception (a refusal): as itself
            raise (e.cause if isinstance(e.cause, Exception) else e) from None
        except (rex.RayActorError, rex.ActorUnavailableError) as e:
            self.up = False
            raise restarting(type(e).__name__) from None

    def tell(self, method: str, *args: Any) -> None:
        getattr(self.handle, method).remote(*args)  # fire and forget

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        """The heartbeat, and a standing call (``hold``) that fails the moment the actor dies:
        from then on every call here is a 503 until a heartbeat is answered again."""
        import ray
        import ray.exceptions as rex

        dead, standing = 0, None
        while not self._stop.is_set():
            if standing is None:
                self._stop.wait(PING_S)
            elif ray.wait([standing], timeout=PING_S)[0]:  # it returned: the actor died
                standing, self.up = None, False
                continue
            try:
                info = ray.get(self.handle.ping.remote(), timeout=PING_TIMEOUT_S)
            except rex.GetTimeoutError:
                self.up = False
                continue
            except (rex.RayActorError, rex.ActorUnavailableError):
                self.up = False
                dead += 1
                if dead >= 3:  # gone for good (not restarting): make it again
                    try:
                        self.handle, dead, standing = self._make(), 0, None
                    except Exception:  # noqa: BLE001 - try again next beat
                        log.exception("scheduler door: could not start the scheduler actor")
                continue
            dead = 0
            self.info = info
            if self.user_config is not None and self._sent != (info["incarnation"],
                                                                self.user_config):
                try:  # a restarted actor: this door's user_config again
                    config = self.user_config
                    ray.get(self.handle.reconfigure.remote(config), timeout=600)
                    self._sent = (info["incarnation"], config)
                except Exception:  # noqa: BLE001 - next beat
                    continue
            if standing is None:
                standing = self.handle.hold.remote()
            self.up = True


class _CountAtCore:
    """A door's ``metrics`` for :func:`serve_apps.refusals.refused`: a refusal the door answered
    is counted where the metrics live, the scheduler actor (with its audit line's count when
    the actor is another process)."""

    def __init__(self, link: LocalLink | ActorLink):
        self.link = link

    def refused(self, tenant: str, reason: str) -> None:
        self.link.tell("note_refusal", tenant, reason, not self.link.same_process)


@serve.deployment(num_replicas=1, max_ongoing_requests=1000, health_check_period_s=2,
                  ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class SchedulerService:
    """A door of the scheduler service; see the module docstring."""

    def __init__(self, args: Mapping[str, Any] | None = None):
        import ray

        self.args = args if isinstance(args, SchedulerArgs) else parse_args(args)
        self.tenants = Tenants(load_tokens(plaintext=self.args.plaintext_tokens))
        for var in SECRET_VARS:  # read once; nothing this door starts inherits them
            os.environ.pop(var, None)
        app = serve.get_replica_context().app_name
        fixed = {k: v for k, v in asdict(self.args).items() if k != "tuning"}
        node = ray.get_runtime_context().get_node_id()
        self.actor = f"{NAMESPACE}:{actor_name(app)}"
        self.link: LocalLink | ActorLink = ActorLink(
            lambda: scheduler_actor(app, fixed, self.args.tuning, node))
        self.metrics = _CountAtCore(self.link)
        log.info("scheduler door: scheduler actor %s (incarnation %s)", self.actor,
                 self.link.info["incarnation"])
        ready.announce(log, "SCALE scheduler service", "POST /v1/workflows; API docs at /docs")

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """A new ``user_config`` (:class:`SchedulerTuning`): the body cap here, the rest in the
        scheduler actor (a failed policy swap is its ``last_swap_error``, never raised)."""
        raw = dict(user_config or {})
        try:
            errors.LIMITS.max_body_bytes = SchedulerTuning(
                **{k: v for k, v in raw.items() if k == "max_body_bytes"}).max_body_bytes
        except (TypeError, ValueError):
            pass  # the actor reports the bad config
        await asyncio.to_thread(self.link.configure, raw)

    def __del__(self) -> None:
        link = getattr(self, "link", None)
        if isinstance(link, ActorLink):
            link.stop()

    # ---------------------------------------------------------------- helpers
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
        return tenant

    async def _call(self, tenant: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of the scheduler actor; a 503 of this door counted as ``tenant``'s."""
        try:
            return await self.link.call(method, *args, **kwargs)
        except RequestError as e:
            raise refused(self.metrics, tenant, e)

    # ---------------------------------------------------------------- HTTP
    @api.post("/v1/workflows", status_code=201, summary="submit a workflow (a DAG)",
              openapi_extra=apidocs.body(WorkflowIn))
    @resolved_annotations
    async def post_workflow(self, request: Request) -> Response:
        tenant = self._tenant(request)
        accepted = await self._call(tenant, "accept", tenant, await request.body(),
                                    request.headers.get("content-type"),
                                    request.headers.get("idempotency-key"))
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
        accepted = await self._call(tenant, "append", wid, tenant, await request.body(),
                                    request.headers.get("content-type"),
                                    request.headers.get("idempotency-key"))
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
        if not 0 <= wait_s <= 60:
            raise refused(self.metrics, tenant, RequestError(
                ("query", "wait_s"), f"must be in [0, 60], got {wait_s}"))
        return _respond(await self._call(tenant, "record", wid, tenant, wait_s, result))

    @api.delete("/v1/workflows/{wid}", summary="cancel a workflow")
    @resolved_annotations
    async def delete_workflow(self, request: Request, wid: str) -> Response:
        tenant = self._tenant(request)
        return _respond(await self._call(tenant, "cancel", wid, tenant))

    @api.get("/v1/cluster", summary="servers, busy, queue, policy")
    @resolved_annotations
    async def get_cluster(self, request: Request) -> Response:
        tenant = self._tenant(request)
        return _respond(await self._call(tenant, "cluster", tenant, True))

    @api.get("/metrics", summary="the scheduler's Prometheus series (ray_scale_scheduler_*)",
             response_class=PlainTextResponse)
    @resolved_annotations
    async def get_metrics(self, request: Request) -> Response:
        """The ``ray_scale_scheduler_*`` series as Ray's metrics agent exports them on the
        scheduler actor's node (:func:`serve_apps.metrics.node_target`), in Prometheus' text
        format: a scrape target that carries only the scheduler's series. Ray exports a new
        value about 10 s after it changed."""
        tenant = self._tenant(request)
        return PlainTextResponse(await self._call(tenant, "metrics_text"),
                                 media_type="text/plain; version=0.0.4")

    # ---------------------------------------------------------------- handle API
    # (``tenant``: the calling Ray job's, ``job:<id>``, unless the client names one); a 503
    # while the actor restarts is raised as the RequestError (kind ``restarting``) the client
    # retries
    async def submit(self, payload: bytes, name: str = "", tenant: str = "job:?",
                     key: str | None = None, program: str | None = None) -> dict:
        """``scale_ray.client.submit`` (:meth:`SchedulerCore.submit`)."""
        return await self._call(tenant, "submit", payload, name, tenant, key, program)

    async def wait(self, wid: str, timeout_s: float, tenant: str = "job:?") -> dict:
        return await self._call(tenant, "wait", wid, timeout_s, tenant)

    async def values(self, wid: str, tenant: str = "job:?") -> Any:
        return await self._call(tenant, "values", wid, tenant)

    async def exception(self, wid: str, tenant: str = "job:?") -> bytes | None:
        return await self._call(tenant, "exception", wid, tenant)

    async def cancel(self, wid: str, tenant: str = "job:?") -> dict:
        return await self._call(tenant, "cancel", wid, tenant)

    async def close_program(self, wid: str, tenant: str = "job:?") -> dict:
        return await self._call(tenant, "close_program", wid, tenant)

    async def cluster(self, tenant: str = "job:?") -> dict:
        out = await self._call(tenant, "cluster", tenant, False)
        import ray

        ctx = ray.get_runtime_context()
        return {**out, "door_actor": ctx.get_actor_name(), "door_worker_id": ctx.get_worker_id(),
                "door_node": ctx.get_node_id()}

def application(args: Mapping[str, Any] | None = None, **deployment_options: Any) -> serve.Application:
    """The bound application (``deployment_options`` go to ``SchedulerService.options``:
    ``num_replicas`` is the number of doors, any number; the scheduler actor is one)."""
    try:
        sa = parse_args(args)
    except ConfigError as e:
        raise ValueError(f"scheduler app: {e}") from None
    opts = {"user_config": asdict(sa.tuning), **deployment_options}
    fixed = {k: v for k, v in asdict(sa).items() if k != "tuning"}
    return SchedulerService.options(**opts).bind(fixed)


def build_app(args: Mapping[str, Any]) -> serve.Application:
    """Application builder for ``serve run`` (``args``: :class:`SchedulerArgs` as a mapping)."""
    return application(args)


__all__ = ["SchedulerService", "SchedulerArgs", "SchedulerTuning", "SchedulerCore", "LocalLink",
           "ActorLink", "application", "build_app", "parse_args", "api", "restarting",
           "RETRY_AFTER_S"]


def local_door(core: SchedulerCore, tenants: Tenants) -> Any:
    """A door over ``core`` in this process, without Serve (tests drive its routes with
    FastAPI's TestClient, ``serve.get_replica_context().servable_object`` set to it)."""
    door = object.__new__(SchedulerService.func_or_class)
    door.tenants, door.link = tenants, LocalLink(core)
    door.metrics = _CountAtCore(door.link)
    return door
