"""Ray Serve placement application (docs/serving.md): a policy behind HTTP and a deployment handle.

Routes (FastAPI ingress; OpenAPI docs at ``/docs``, schema at ``/openapi.json``):

* ``POST /v1/place`` — one task and the current servers -> chosen server id, every server's
  score, policy version. Requests are batched with ``@serve.batch`` (torch policies score a
  padded batch in one forward).
* ``POST /v1/schedule`` — workflows (their unfinished tasks) and the servers -> an assignment
  for every ready task that can start now, decided one at a time in the first-level order with
  each chosen server marked busy before the next decision, as in the simulator.
* ``GET /v1/policy`` — name, version, checksum, training size, algorithm, encoder settings.
* Health: Serve's ``/-/healthz`` and ``/-/routes``, plus ``check_health`` on the replica.

Decisions (``/v1/schedule``, and the ``/v1/place`` server table, encoder and batched forward) run
in worker threads, never on the replica's event loop: a bounded pool of ``decision_threads`` for
``/v1/schedule`` and one thread of its own for ``/v1/place``, so neither a burst of large
schedules nor any one request stalls the health check, ``/v1/policy`` or ``/v1/place``.

Run it: ``serve run configs/serve/placement.yaml`` or
``serve run serve_apps.placement:build_app policy=eft``. Application arguments
(:class:`PlacementArgs`) are fixed at deploy time; :class:`Tuning` is the deployment's
``user_config`` and can change while it serves: a new ``policy`` (artifact path or heuristic
name) is loaded completely, checksum verified, and tried on one decision before it replaces the
old one, so no request fails or sees a half-loaded policy. A change that fails (missing path,
corrupt artifact, invalid setting) is not applied: the previous policy keeps serving,
``reconfigure`` does not raise (raising would stop the replica), and ``GET /v1/policy`` reports
``last_swap_error`` (also logged at WARNING). Only the application's own ``policy`` argument is
loaded without a fallback: a bad one fails the deploy.

Bad input is a 4xx naming the field or the limit (``serve_apps.errors``), never a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

from envs.config import ConfigError, build, rng
from envs.config_files import load_env
from policies import default_policy
from policies.guard import GuardConfig

from . import apidocs, errors, ready
from .decisions import (LoadedPolicy, RequestState, decide_batch, load, place_answer,
                        prepare_place)
from .gate import PolicyGate, admit
from .policy_holder import PolicyHolder
from .schedule import schedule, try_policy
from .errors import DEFAULT_MAX_BODY_BYTES, parse_body
from .schemas import (ErrorResponse, PlaceRequest, PlaceResponse, PolicyInfo, ScheduleRequest,
                      ScheduleResponse)

log = logging.getLogger("ray.serve")

DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_BATCH_WAIT_S = 0.0


@dataclass(frozen=True)
class Tuning:
    """Run-time settings (the deployment's ``user_config``; changing them restarts nothing)."""
    policy: str | None = field(default=None, metadata=rng(
        doc="swap to this heuristic name / shipped artifact / artifact dir; none: keep the current"))
    max_batch_size: int = field(default=DEFAULT_MAX_BATCH_SIZE, metadata=rng(
        ge=1, le=1024, doc="/v1/place requests per batch (keep <= max_ongoing_requests)"))
    batch_wait_timeout_s: float = field(default=DEFAULT_BATCH_WAIT_S, metadata=rng(
        ge=0, le=1, doc="how long a batch waits to fill"))
    max_servers: int = field(default=4096, metadata=rng(ge=1, le=1_000_000, doc="per request"))
    max_tasks: int = field(default=1024, metadata=rng(ge=1, le=1_000_000,
                                                      doc="listed tasks per /v1/schedule request"))
    max_body_bytes: int = field(default=DEFAULT_MAX_BODY_BYTES, metadata=rng(
        ge=1024, le=1 << 30, doc="request body cap; a larger body is a 413 (4 MiB holds a "
                                 "max_servers=4096 /v1/place body about 10 times)"))


@dataclass(frozen=True)
class PlacementArgs:
    """Application arguments (``serve run ... key=value`` or ``args:`` in the YAML)."""
    policy: str = field(default_factory=default_policy, metadata=rng(
        doc="heuristic name, shipped artifact name or artifact directory"))
    env_config: str | None = field(default=None, metadata=rng(
        doc="env YAML for encoder settings (bandwidth, latency, switches; an artifact's "
            "policy.json features win); default configs/env/paper.yaml"))
    mask_infeasible: bool | None = field(default=True, metadata=rng(
        doc=("mask servers whose memory cannot hold the task (default; the live scheduler does "
             "the same): a policy that picks one would answer 'wait' for a server that never "
             "fits, and a client that follows it waits forever (results/paper/README.md, greedy "
             "livelock); false: the paper's unmasked action space; none: as in the env config")))
    head_of_line_blocking: bool | None = field(default=None, metadata=rng(
        doc="/v1/schedule stops at the first wait; none: as in the env config"))
    seed: int | None = field(default=None, metadata=rng(ge=0, doc="RNG seed of random heuristics"))
    torch_threads: int = field(default=1, metadata=rng(ge=1, le=256, doc="torch intra-op threads"))
    decision_threads: int = field(default=2, metadata=rng(
        ge=1, le=64, doc="worker threads for /v1/schedule decisions (a bounded pool; more "
                         "requests queue); /v1/place has one thread of its own"))
    workload_scale: float | None = field(default=None, metadata=rng(
        gt=0, le=1e6, doc="features.workload_scale of the workload served: its mean task compute "
                          "/ 4 GFLOP (docs/workloads.md); none: the policy's own (1 for the "
                          "shipped policies)"))
    guard: GuardConfig = field(default_factory=GuardConfig, metadata=rng(
        doc="policies.guard around a learned policy: {enabled, max_waits}; requests pass each "
            "task's waits so far"))
    policy_gate: PolicyGate = field(default_factory=PolicyGate, metadata=rng(
        doc="a learned policy serves only if scale-ray eval --gate measured it within "
            "tolerance of EFT (serve_apps.gate): {tolerance, force}"))
    tuning: Tuning = field(default=Tuning(), metadata=rng(doc="placement knobs (Tuning)"))


def builder_args(cls: type, args: Mapping[str, Any] | None, strings: tuple[str, ...]) -> Any:
    """Validate an application's builder args as ``cls``; strings from ``serve run key=value``
    are parsed as YAML scalars, except the keys in ``strings`` (paths and names)."""
    data = dict(args or {})
    for k, v in list(data.items()):
        if isinstance(v, str) and k not in strings:
            data[k] = yaml.safe_load(v)
    return build(cls, data, "args")


def parse_args(args: Mapping[str, Any] | None) -> PlacementArgs:
    """Validate builder args (:func:`builder_args`)."""
    return builder_args(PlacementArgs, args, ("policy", "env_config"))


api = FastAPI(
    title="SCALE placement service",
    version="1",
    description="Chooses a server for a task (cross-attention pointer policy or a heuristic). "
                "Errors: 422 with `detail[].loc` naming the field; 413 for a body larger than "
                "`max_body_bytes`.",
    docs_url=None, redoc_url=None,
)
errors.install(api)
apidocs.install(api)  # /docs with local assets (no CDN)

_ERRORS = {422: {"model": ErrorResponse, "description": "invalid input; detail names the field"},
           413: {"model": ErrorResponse, "description": "body larger than max_body_bytes"}}
_BODIES = (PlaceRequest, ScheduleRequest)


def resolved_annotations(fn: Callable) -> Callable:
    """Resolve the string annotations (``from __future__ import annotations``) now. Serve ships
    the deployment class to the replica by value, with only the globals its code names; FastAPI
    there would not find ``Request``, which appears in annotations only, and would take
    ``request`` for a query parameter."""
    fn.__annotations__ = typing.get_type_hints(fn)
    return fn


apidocs.add_models(api, _BODIES)  # the request models (the routes read raw bodies)


def dumps_compact(content: dict) -> bytes:
    return json.dumps(content, separators=(",", ":")).encode()


def json_response(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _schedule_job(body: bytes | Mapping, lp: LoadedPolicy, t: Tuning,
                  content_type: str | None = None) -> dict:
    """Parse (an HTTP body) or validate (a handle's dict), then decide: all off the loop."""
    req = (parse_body(body, ScheduleRequest, content_type) if isinstance(body, bytes)
           else ScheduleRequest.model_validate(body))
    return schedule(req, lp, t.max_servers, t.max_tasks)


def _schedule_json(body: bytes, lp: LoadedPolicy, t: Tuning, content_type: str | None) -> bytes:
    return dumps_compact(_schedule_job(body, lp, t, content_type))


def _prepare_job(body: bytes | Mapping, lp: LoadedPolicy, max_servers: int,
                 content_type: str | None = None) -> RequestState:
    req = (parse_body(body, PlaceRequest, content_type) if isinstance(body, bytes)
           else PlaceRequest.model_validate(body))
    return prepare_place(req, lp, max_servers)


def _decide_items(items: list[tuple[LoadedPolicy, RequestState]]) -> list[dict]:
    """A /v1/place batch's answers: one padded forward per policy (during a swap a batch may
    mix two)."""
    out: list[dict | None] = [None] * len(items)
    groups: dict[int, list[int]] = {}
    for i, (lp, _) in enumerate(items):
        groups.setdefault(id(lp), []).append(i)
    for idx in groups.values():
        lp = items[idx[0]][0]
        results = decide_batch(lp, [items[i][1] for i in idx])
        for i, (choice, scores) in zip(idx, results):
            out[i] = place_answer(lp, items[i][1], choice, scores)
    return out


@serve.deployment(max_ongoing_requests=64, health_check_period_s=10,
                  ray_actor_options={"num_cpus": 0.5})
@serve.ingress(api)
class PlacementService:
    """Loads the policy once per replica; see the module docstring for the routes."""

    def __init__(self, args: Mapping[str, Any] | PlacementArgs | None = None):
        self.args = args if isinstance(args, PlacementArgs) else parse_args(args)
        self.env = load_env(self.args.env_config)
        self.tuning = self.args.tuning
        # no fallback: a bad policy argument fails the deploy (serve_apps.policy_holder)
        self.holder = PolicyHolder(self._load, self.args.policy, "placement",
                                   lambda lp: f"{lp.info['name']} (version {lp.info['version']})",
                                   log)
        self._schedule_pool = ThreadPoolExecutor(self.args.decision_threads,
                                                 thread_name_prefix="placement-schedule")
        self._place_pool = ThreadPoolExecutor(1, thread_name_prefix="placement-place")
        self._apply(self.tuning)
        ready.announce(log, "SCALE placement service",
                       "POST /v1/place, /v1/schedule; API docs at /docs")

    def _load(self, spec: str) -> LoadedPolicy:
        gate = admit(spec, self.args.policy_gate, log)  # PolicyRefused: not loaded at all
        lp = load(spec, self.env, self.args.seed, self.args.mask_infeasible,
                  self.args.head_of_line_blocking, self.args.guard, self.args.workload_scale)
        lp = replace(lp, info={**lp.info, "gate": gate})
        if lp.batched:  # a torch policy (torch is imported only for those)
            from policies.artifact import set_inference_threads
            set_inference_threads(self.args.torch_threads)
        try_policy(lp)
        return lp

    @property
    def lp(self) -> LoadedPolicy:
        """The current policy (one reference: a request uses the one it started with)."""
        return self.holder.current

    def _apply(self, t: Tuning) -> None:
        self._place_batch.set_max_batch_size(t.max_batch_size)
        self._place_batch.set_batch_wait_timeout_s(t.batch_wait_timeout_s)
        errors.LIMITS.max_body_bytes = t.max_body_bytes

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Apply a new ``user_config`` (:class:`Tuning`). A new policy is loaded and tried off
        the event loop, fully, before the reference is swapped; requests keep being served
        meanwhile. A change that fails is not applied and never raises (Serve would stop the
        replica): the old policy keeps serving and ``last_swap_error`` says why."""
        async with self.holder.lock:  # one reconfigure at a time
            raw = dict(user_config or {})
            try:
                t = build(Tuning, raw, "user_config")
            except ConfigError as e:
                return self.holder.failed(str(e), raw.get("policy"))
            await self.holder.swap(t.policy)  # a failed swap keeps the current policy
            self.tuning = t
            self._apply(t)  # the other settings are valid either way

    def check_health(self) -> None:
        if self.lp is None:
            raise RuntimeError("no policy loaded")

    async def _off_loop(self, pool: ThreadPoolExecutor, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    # ---------------------------------------------------------------- /v1/place
    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S)
    async def _place_batch(self, items: list[tuple[LoadedPolicy, RequestState]]) -> list[dict]:
        return await self._off_loop(self._place_pool, _decide_items, items)

    async def _place(self, body: bytes | Mapping, content_type: str | None = None) -> dict:
        lp = self.lp  # the policy this request uses from start to end, whatever swaps meanwhile
        prep = await self._off_loop(self._place_pool, _prepare_job, body, lp,
                                    self.tuning.max_servers, content_type)
        return await self._place_batch((lp, prep))

    @api.post("/v1/place", response_model=PlaceResponse, responses=_ERRORS,
              openapi_extra=apidocs.body(PlaceRequest), summary="choose a server for one task")
    @resolved_annotations
    async def place(self, request: Request) -> Response:
        body = await request.body()  # capped by errors.BodyCap; parsed in the worker thread
        return json_response(dumps_compact(await self._place(body, request.headers.get("content-type"))))

    # ---------------------------------------------------------------- /v1/schedule
    @api.post("/v1/schedule", response_model=ScheduleResponse, responses=_ERRORS,
              openapi_extra=apidocs.body(ScheduleRequest),
              summary="assign every ready task that can start now")
    @resolved_annotations
    async def schedule(self, request: Request) -> Response:
        body = await request.body()
        return json_response(await self._off_loop(self._schedule_pool, _schedule_json, body, self.lp,
                                          self.tuning, request.headers.get("content-type")))

    # ---------------------------------------------------------------- /v1/policy
    @api.get("/v1/policy", response_model=PolicyInfo, summary="the policy being served")
    async def policy(self) -> dict:
        lp = self.lp
        return {**lp.info, "guard": lp.guard_info(), "loaded_at": lp.loaded_at,
                **self.holder.report()}

    # ---------------------------------------------------------------- handle API
    async def decide(self, request: Mapping[str, Any]) -> dict:
        """Python-handle entry: a /v1/place body (dict) -> the /v1/place answer (dict).
        Raises ``pydantic.ValidationError`` / ``RequestError`` on bad input."""
        return await self._place(request)

    async def decide_schedule(self, request: Mapping[str, Any]) -> dict:
        """Python-handle entry for /v1/schedule."""
        return await self._off_loop(self._schedule_pool, _schedule_job, request, self.lp,
                                    self.tuning)

    def __del__(self) -> None:
        for pool in (getattr(self, "_schedule_pool", None), getattr(self, "_place_pool", None)):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


def application(args: Mapping[str, Any] | None = None, **deployment_options: Any) -> serve.Application:
    """The bound application; ``deployment_options`` go to ``PlacementService.options`` (e.g.
    ``num_replicas``, ``logging_config``). The initial ``user_config`` is ``args.tuning``."""
    try:
        pa = parse_args(args)
    except ConfigError as e:
        raise ValueError(f"placement app: {e}") from None
    opts = {"user_config": asdict(pa.tuning), **deployment_options}
    # Tuning travels only as user_config: changing it reconfigures replicas in place.
    fixed = {k: v for k, v in asdict(pa).items() if k != "tuning"}
    return PlacementService.options(**opts).bind(fixed)


def build_app(args: Mapping[str, Any]) -> serve.Application:
    """Application builder for ``serve run`` (``args``: :class:`PlacementArgs` as a mapping). A
    ``user_config`` in the serve YAML's ``deployments`` section replaces ``args.tuning``."""
    return application(args)


__all__ = ["PlacementService", "PlacementArgs", "Tuning", "application", "build_app", "parse_args", "api"]
