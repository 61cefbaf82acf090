"""Ray Serve placement application (DESIGN.md §5): a policy behind HTTP and a deployment handle.

Routes (FastAPI ingress; OpenAPI docs at ``/docs``, schema at ``/openapi.json``):

* ``POST /v1/place`` — one task and the current servers -> chosen server id, every server's
  score, policy version. Requests are batched with ``@serve.batch`` (torch policies score a
  padded batch in one forward).
* ``POST /v1/schedule`` — workflows (their unfinished tasks) and the servers -> an assignment
  for every ready task that can start now, decided one at a time in the first-level order with
  each chosen server marked busy before the next decision, as in the simulator.
* ``GET /v1/policy`` — name, version, checksum, training size, algorithm, encoder settings.
* Health: Serve's ``/-/healthz`` and ``/-/routes``, plus ``check_health`` on the replica.

Run it: ``serve run configs/serve/placement.yaml`` or
``serve run serve_apps.placement:build_app policy=eft``. Application arguments
(:class:`PlacementArgs`) are fixed at deploy time; :class:`Tuning` is the deployment's
``user_config`` and can change while it serves: a new ``policy`` (artifact path or heuristic
name) is loaded completely before it replaces the old one, so no request fails or sees a
half-loaded policy.

Bad input is a 422 naming the field (``detail[].loc``), never a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import yaml
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve

from envs.config import ConfigError, build, rng
from policies import default_policy
from policies.guard import GuardConfig

from .decisions import (LoadedPolicy, PreparedPlace, RequestError, decide_batch, load,
                        place_answer, prepare_place, schedule)
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
             "fits, and a client that follows it waits forever (docs/results.md, greedy "
             "livelock); false: the paper's unmasked action space; none: as in the env config")))
    head_of_line_blocking: bool | None = field(default=None, metadata=rng(
        doc="/v1/schedule stops at the first wait; none: as in the env config"))
    seed: int | None = field(default=None, metadata=rng(ge=0, doc="RNG seed of random heuristics"))
    torch_threads: int = field(default=1, metadata=rng(ge=1, le=256, doc="torch intra-op threads"))
    workload_scale: float | None = field(default=None, metadata=rng(
        gt=0, le=1e6, doc="features.workload_scale of the workload served: its mean task compute "
                          "/ 4 GFLOP (docs/workloads.md); none: the policy's own (1 for the "
                          "shipped policies)"))
    guard: GuardConfig = field(default_factory=GuardConfig, metadata=rng(
        doc="policies.guard around a learned policy: {enabled, max_waits}; requests pass each "
            "task's waits so far"))
    tuning: Tuning = Tuning()


def parse_args(args: Mapping[str, Any] | None) -> PlacementArgs:
    """Validate builder args; strings from ``serve run key=value`` are parsed as YAML scalars."""
    data = dict(args or {})
    for k, v in list(data.items()):
        if isinstance(v, str) and k not in ("policy", "env_config"):
            data[k] = yaml.safe_load(v)
    return build(PlacementArgs, data, "args")


api = FastAPI(
    title="SCALE placement service",
    version="1",
    description="Chooses a server for a task (cross-attention pointer policy or a heuristic). "
                "Errors: 422 with `detail[].loc` naming the field.",
)

_ERRORS = {422: {"model": ErrorResponse, "description": "invalid input; detail names the field"}}


def _error(status: int, loc: list, msg: str, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": [{"loc": loc, "msg": msg, "type": kind}]})


@api.exception_handler(RequestError)
async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
    return _error(422, exc.loc, exc.msg, exc.kind)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own format, minus the echoed input (can be megabytes) and non-JSON ctx values.
    detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": detail})


@api.exception_handler(ValueError)
async def _value_error(_: Request, exc: ValueError) -> JSONResponse:
    # An internal check rejected what the schema let through: still the client's input.
    return _error(422, ["body"], str(exc), "value_error")


def _json(content: dict) -> Response:
    return Response(json.dumps(content, separators=(",", ":")).encode(), media_type="application/json")


@serve.deployment(max_ongoing_requests=64, health_check_period_s=10,
                  ray_actor_options={"num_cpus": 0.5})
@serve.ingress(api)
class PlacementService:
    """Loads the policy once per replica; see the module docstring for the routes."""

    def __init__(self, args: Mapping[str, Any] | PlacementArgs | None = None):
        from scale_ray.config import load_env

        self.args = args if isinstance(args, PlacementArgs) else parse_args(args)
        self.env = load_env(self.args.env_config)
        self.tuning = self.args.tuning
        self.lp: LoadedPolicy = self._load(self.args.policy)
        self.swaps = 0
        self._apply_batching(self.tuning)

    def _load(self, spec: str) -> LoadedPolicy:
        lp = load(spec, self.env, self.args.seed, self.args.mask_infeasible,
                  self.args.head_of_line_blocking, self.args.guard, self.args.workload_scale)
        if lp.batched:  # a torch policy (torch is imported only for those)
            from policies.artifact import set_inference_threads
            set_inference_threads(self.args.torch_threads)
        return lp

    def _apply_batching(self, t: Tuning) -> None:
        self._place_batch.set_max_batch_size(t.max_batch_size)
        self._place_batch.set_batch_wait_timeout_s(t.batch_wait_timeout_s)

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Apply a new ``user_config`` (:class:`Tuning`). A new policy is loaded off the event
        loop and fully before the reference is swapped; requests keep being served meanwhile."""
        t = build(Tuning, user_config or {}, "user_config")
        if t.policy is not None and t.policy != self.lp.spec:
            new = await asyncio.to_thread(self._load, t.policy)
            self.lp = new  # one reference: a request uses the policy it started with
            self.swaps += 1
            log.info("placement: now serving %s (version %s)", new.info["name"], new.info["version"])
        self.tuning = t
        self._apply_batching(t)

    def check_health(self) -> None:
        if self.lp is None:
            raise RuntimeError("no policy loaded")

    # ---------------------------------------------------------------- /v1/place
    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S)
    async def _place_batch(self, items: list[tuple[LoadedPolicy, PreparedPlace]]) -> list[dict]:
        out: list[dict | None] = [None] * len(items)
        groups: dict[int, list[int]] = {}
        for i, (lp, _) in enumerate(items):  # during a swap a batch may mix two policies
            groups.setdefault(id(lp), []).append(i)
        for idx in groups.values():
            lp = items[idx[0]][0]
            results = decide_batch(lp, [items[i][1].obs for i in idx])
            for i, (choice, scores) in zip(idx, results):
                out[i] = place_answer(lp, items[i][1], choice, scores)
        return out

    @api.post("/v1/place", response_model=PlaceResponse, responses=_ERRORS,
              summary="choose a server for one task")
    async def place(self, req: PlaceRequest) -> Response:
        lp = self.lp
        prep = prepare_place(req, lp, self.tuning.max_servers)
        return _json(await self._place_batch((lp, prep)))

    # ---------------------------------------------------------------- /v1/schedule
    @api.post("/v1/schedule", response_model=ScheduleResponse, responses=_ERRORS,
              summary="assign every ready task that can start now")
    async def schedule(self, req: ScheduleRequest) -> Response:
        t = self.tuning
        return _json(schedule(req, self.lp, t.max_servers, t.max_tasks))

    # ---------------------------------------------------------------- /v1/policy
    @api.get("/v1/policy", response_model=PolicyInfo, summary="the policy being served")
    async def policy(self) -> dict:
        return {**self.lp.info, "guard": self.lp.guard_info(), "loaded_at": self.lp.loaded_at,
                "swaps": self.swaps}

    # ---------------------------------------------------------------- handle API
    async def decide(self, request: Mapping[str, Any]) -> dict:
        """Python-handle entry: a /v1/place body (dict) -> the /v1/place answer (dict).
        Raises ``pydantic.ValidationError`` / ``RequestError`` on bad input."""
        req = PlaceRequest.model_validate(request)
        lp = self.lp
        return await self._place_batch((lp, prepare_place(req, lp, self.tuning.max_servers)))

    async def decide_schedule(self, request: Mapping[str, Any]) -> dict:
        """Python-handle entry for /v1/schedule."""
        return schedule(ScheduleRequest.model_validate(request), self.lp, self.tuning.max_servers,
                        self.tuning.max_tasks)


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
