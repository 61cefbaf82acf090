"""The scheduler service's workflow documents: what ``POST /v1/workflows`` accepts and what
``GET /v1/workflows/{id}`` answers (serve_apps.scheduler).

A submitted workflow is the live DAG format (docs/live.md) with, per task, the function to run::

    {"name": "report",
     "tasks": [{"name": "fetch", "compute_gflop": 2, "memory_gb": 4,
                "primitive": "mypkg.tools:fetch", "args": ["https://..."]},
               {"name": "sum", "compute_gflop": 8, "parents": ["fetch"],
                "primitive": "mypkg.tools:summarize", "kwargs": {"words": 100}}]}

* ``primitive``: ``module:function``, only a function its module marks
  ``@primitive(http=True)`` and the service's ``primitives`` allow-list names (an entry
  ``module:*``: every marked public function of that module; serve_apps.tools); without it
  the task gets the emulated body (it sleeps ``compute_gflop / compute * time_scale`` s and
  returns ``index + 1 + sum(parent values)``).
* the function is called as ``fn(*args, *parent_values, **kwargs)``, parent values in the order
  of ``parents``; ``args``/``kwargs`` are JSON values.
* results are returned as JSON (a value JSON cannot hold is answered as its ``repr``).
* Ray's demands (``num_cpus``, ``num_gpus``, ``memory`` in bytes, ``resources``,
  ``accelerator_type``, ``label_selector``), validated as ``@ray.remote`` options are: the task goes only to a server
  that has them (a task no server has is a 422 naming what is missing) and its Ray task asks
  Ray for them; a marked tool's own options are the defaults.

Every field is checked strictly (unknown keys, wrong types, out-of-range numbers, cycles, unknown
parents, names outside the allow-list): a 422 naming the field.
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections import Counter
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from envs.demands import DemandError, parse_options
from envs.loaders.livedag import LIMITS as DAG_LIMITS
from envs.loaders.livedag import parse_dag_workflow
from envs.workflow import WorkflowError
from scale_ray.live.handles import WorkflowHandle, root_cause
from scale_ray.live.programs import StepResult
from scale_ray.live.workflow import (RAY_OPTIONS, Call, CollectedWorkflow, Primitive,
                                     emulated_body, expected_emulated_values)

from .decisions import RequestError
from .tools import AllowList, JsonOnly, json_violation  # noqa: F401 - their old home

_STRICT = ConfigDict(extra="forbid", strict=True)
Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
ImportPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                                              max_length=300)]
_GFLOP_MAX = DAG_LIMITS["compute_gflop"][1]
_GB_MAX = DAG_LIMITS["memory_gb"][1]


class WorkflowTaskIn(BaseModel):
    """One task of a submitted workflow."""
    model_config = _STRICT

    name: Name
    compute_gflop: Annotated[float, Field(gt=0, le=_GFLOP_MAX, allow_inf_nan=False)] = Field(
        description="compute demand, GFLOP (sets the emulated run time and the policy's view)")
    memory_gb: Annotated[float, Field(ge=0, le=_GB_MAX, allow_inf_nan=False)] = 0.0
    output_gb: Annotated[float, Field(ge=0, le=_GB_MAX, allow_inf_nan=False)] = 0.0
    parents: list[Name] = Field(default_factory=list, max_length=10_000)
    kind: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        None, description="the primitive it calls, what the run-time estimator learns under "
                          "(live.estimator: online); default: the name without an instance "
                          "number (search_3 -> search)")
    hedge: StrictBool = Field(False, description="a straggling run may get a backup copy on an "
                                                 "idle server, the first result wins "
                                                 "(live.hedge: marked); only for a body that is "
                                                 "safe to run twice")
    primitive: ImportPath | None = Field(
        None, description="module:function from the service's allow-list; none: emulated body")
    args: list[Any] = Field(default_factory=list, max_length=1000)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    # Ray's task demands, as @ray.remote / .options() takes them (Primitive.ray_options): the
    # task goes only to a server that has them, and its Ray task asks Ray for them
    num_cpus: Annotated[float, Field(ge=0, le=1e4, allow_inf_nan=False)] | None = Field(
        None, description="Ray's num_cpus for the task")
    num_gpus: Annotated[float, Field(ge=0, le=1e3, allow_inf_nan=False)] | None = Field(
        None, description="Ray's num_gpus (fractions share a GPU, as in Ray)")
    memory: Annotated[float, Field(ge=0, le=_GB_MAX * 1e9, allow_inf_nan=False)] | None = Field(
        None, description="Ray's memory demand in bytes (the task's memory_gb is the larger of "
                          "the two)")
    resources: dict[Name, Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]] | None = \
        Field(None, max_length=32, description="Ray custom resources, name -> amount")
    accelerator_type: Annotated[str, StringConstraints(min_length=1, max_length=100)] | None = \
        Field(None, description="Ray's accelerator_type (e.g. A100)")
    label_selector: dict[Annotated[str, StringConstraints(min_length=1, max_length=317)],
                         Annotated[str, StringConstraints(min_length=1, max_length=400)]] | None = \
        Field(None, max_length=16, description="Ray's label_selector: label key -> value, !value, "
                                               "in(a,b) or !in(a,b) (Ray's resource model)")

    def ray_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RAY_DEMANDS if getattr(self, k) is not None}

    def memory_need_gb(self) -> float:
        """The memory the task needs (GB): the larger of memory_gb and Ray's memory."""
        return max(self.memory_gb, (self.memory or 0.0) / 1e9)


# Ray's options a request may state: the demands (a runtime_env is code: never over HTTP)
RAY_DEMANDS = tuple(o for o in RAY_OPTIONS if o != "runtime_env")
_EXAMPLE = {"name": "report", "tasks": [
    {"name": "fetch", "compute_gflop": 2, "memory_gb": 4, "args": ["https://example.org"]},
    {"name": "summarize", "compute_gflop": 8, "parents": ["fetch"], "num_cpus": 1,
     "kwargs": {"words": 100}}]}  # Ray demands any cluster has: "Try it out" works on CPUs


class WorkflowIn(BaseModel):
    """``POST /v1/workflows`` body."""
    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"examples": [_EXAMPLE]})

    name: Name = "workflow"
    tasks: list[WorkflowTaskIn] = Field(min_length=1)
    program: Name | None = Field(None, description=(
        "the id of an earlier workflow of this tenant: this one is the next step of the same "
        "agent program and is ordered as part of that request (its arrival; "
        "scale_ray/live/programs.py); unknown or another tenant's: 404"))


class AppendIn(BaseModel):
    """``POST /v1/workflows/{id}/tasks`` body: the next calls of the agent program workflow
    ``id`` is a step of."""
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"name": "act", "tasks": [{"name": "search", "compute_gflop": 2,
                                   "parents": ["plan"]}], "close": True}]})

    name: Name = "step"
    tasks: list[WorkflowTaskIn] = Field(default_factory=list, description=(
        "tasks with new names; ``parents`` may name tasks of this body or outputs (tasks "
        "without children in their step) of the program's earlier steps, finished or not"))
    close: StrictBool = Field(False, description="no more steps: the program ends when its "
                                                 "steps are done; a later append is a 409")


def emulate(wf: CollectedWorkflow, payload: bytes, shown_gflop: float | None,
            noise_sigma: float) -> CollectedWorkflow:
    """The service's :class:`~serve_apps.scheduler_config.Emulation` on an accepted workflow (its
    primitives, in place): ``shown_gflop`` (hints: none) replaces every declared compute in what
    the scheduler sees, which then only sets the emulated run; ``noise_sigma`` multiplies each
    emulated run (and a hedged copy, its own draw) by LogNormal(mean 1, sigma), drawn from the
    submitted bytes, so a resume (the journal keeps them) draws the same. A primitive shared by
    several calls gets no noise (its runs would share one draw)."""
    if shown_gflop is None and noise_sigma <= 0:
        return wf
    n = len(wf.calls)
    f = np.ones(2 * n)
    if noise_sigma > 0:
        rng = np.random.default_rng([zlib.crc32(payload), n])
        f = rng.lognormal(-noise_sigma * noise_sigma / 2.0, noise_sigma, 2 * n)
    uses = Counter(id(c.primitive) for c in wf.calls)
    done: set[int] = set()
    for i, c in enumerate(wf.calls):
        p = c.primitive
        if id(p) in done:
            continue
        done.add(id(p))
        if p.emulate and uses[id(p)] == 1:
            p.run_gflop, p.copy_gflop = p.run_gflop * float(f[i]), p.copy_gflop * float(f[n + i])
        if shown_gflop is not None:
            p.compute_gflop = shown_gflop
    return wf


def to_workflow(req: WorkflowIn | AppendIn, allow: AllowList, max_tasks: int,
                earlier: dict[str, StepResult] | None = None) -> CollectedWorkflow:
    """The validated request as calls; a bad DAG is a :class:`RequestError` naming the field.
    ``earlier``: parents outside the request (an append's: tasks of earlier steps), passed to
    their children as :class:`~scale_ray.live.programs.StepResult` arguments."""
    earlier = earlier or {}
    if len(req.tasks) > max_tasks:
        raise RequestError(("body", "tasks"), f"{len(req.tasks)} tasks; this service accepts at "
                                              f"most max_tasks={max_tasks} per workflow", "too_long")
    recs = {t.name: (i, t) for i, t in enumerate(req.tasks)}
    bodies = {i: allow.resolve(t.primitive, ("body", "tasks", i, "primitive"))
              for i, t in enumerate(req.tasks) if t.primitive is not None}
    try:
        spec = parse_dag_workflow({"name": req.name, "tasks": [
            t.model_dump(include={"name", "compute_gflop", "output_gb", "hedge"})
            | {"memory_gb": t.memory_need_gb(), "parents": [p for p in t.parents
                                                           if p not in earlier]}
            | ({"kind": t.kind} if t.kind else {})
            for t in req.tasks]}, 0, "request")
    except WorkflowError as e:
        raise RequestError(("body", "tasks"), str(e), "invalid_dag") from None
    index = {t.name: k for k, t in enumerate(spec.tasks)}
    calls: list[Call] = []
    emulated = True
    for k, ts in enumerate(spec.tasks):
        i, rec = recs[ts.name]
        # parent values in the order the request lists the parents
        parent_calls = [calls[index[p]] if p in index else earlier[p]
                        for p in dict.fromkeys(rec.parents)]
        fn = bodies.get(i)
        # the marked tool's own Ray options and emulation, the request's demands over them
        options = {**(fn.ray_options if fn is not None else {}), **rec.ray_options()}
        try:
            prim = Primitive(emulated_body if fn is None else fn, ts.compute_gflop,
                             ts.memory_gb, ts.output_gb, ts.name, ray_options=options,
                             emulate=fn is None or fn.emulate, kind=ts.kind or None,
                             hedge=ts.hedge)
        except WorkflowError as e:
            raise RequestError(("body", "tasks", i, *_option_at_fault(rec.ray_options())),
                               str(e), "invalid_task") from None
        if fn is None:
            calls.append(Call(prim, (k, *parent_calls), {}))
        else:
            emulated = False
            calls.append(Call(prim, (*rec.args, *parent_calls), rec.kwargs))
    sinks = tuple(i for i, kids in enumerate(spec.children()) if not kids)
    return CollectedWorkflow(spec, tuple(calls), sinks, tuple(expected_emulated_values(spec))
                             if emulated and not earlier else None)


def _option_at_fault(options: dict[str, Any]) -> tuple[str, ...]:
    """The request's Ray option that Ray's rules refuse (``envs.demands``), as the tail of a
    422's ``loc``; none when each is fine alone."""
    for key, value in options.items():
        try:
            parse_options({key: value})
        except DemandError:
            return (key,)
    return ()


# ------------------------------------------------------------------------------- answers
#: a workflow's states as ``GET /v1/workflows/{id}`` shows them: ``queued`` (no task has
#: started), ``running`` (a task started; until the last one ends), then one of the three ends
STATES = ("queued", "running", "completed", "failed", "cancelled")


def state(h: WorkflowHandle) -> str:
    """One of :data:`STATES`."""
    if not h.done():
        started = any(s is not None for s in h.task_start_wall)
        return "running" if started or any(f is not None for f in h.task_finish_wall) \
            else "queued"
    if h.error is None:
        return "completed"
    return "cancelled" if type(h.error).__name__ == "WorkflowCancelled" else "failed"


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it (non-finite floats and other objects: their ``repr``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: jsonable(v) for k, v in value.items()}
    return repr(value)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDR = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.\-]+){2,}/?")
_HEXID = re.compile(r"\b[0-9a-f]{24,}\b")
_PID = re.compile(r"\bpid=\d+")


def clean_error(err: BaseException) -> str:
    """``Type: message`` of the root cause, one line, without ANSI codes, paths, addresses,
    PIDs or Ray ids: what HTTP clients see of a failed workflow."""
    cause = root_cause(err)
    text = _ANSI.sub("", str(cause)).strip().splitlines()
    line = text[-1] if text and type(cause) is not type(err) else (text[0] if text else "")
    for pat, sub in ((_ADDR, "<addr>"), (_PATH, "<path>"), (_HEXID, "<id>"), (_PID, "pid=<pid>")):
        line = pat.sub(sub, line)
    return f"{type(cause).__name__}: {line[:500]}"


def task_state(h: WorkflowHandle, i: int) -> str:
    """Task ``i``'s state: ``pending`` (not started), ``running``, ``completed``, or
    ``not_run`` (its workflow ended without it: failed or cancelled)."""
    if h.task_finish_wall[i] is not None:
        return "completed"
    if h.done():
        return "not_run"
    return "running" if h.task_start_wall[i] is not None else "pending"


def record(wid: str, h: WorkflowHandle, t0: float, time_scale: float,
           epoch: float | None = None) -> dict[str, Any]:
    """``GET /v1/workflows/{id}`` without the result: the state (:data:`STATES`), per task its
    state, node (from its start on), start and end, the error.

    Times: ``*_at`` are Unix times (s); ``*_s`` durations: ``response_s`` from the submission,
    ``run_s`` from a task's (latest) start to its end; ``submitted_s`` / ``finished_s`` are
    seconds since the service's scheduler started, at ``scheduler_started_at``. ``t0``: that
    start on this process's ``perf_counter`` clock; ``epoch``: Unix time minus
    ``perf_counter`` (default: now's)."""
    if epoch is None:
        epoch = time.time() - time.perf_counter()
    spec = h.workflow.spec
    fin, start = h.task_finish_wall, h.task_start_wall

    def at(wall: float | None) -> float | None:
        return None if wall is None else wall + epoch

    return {
        "id": wid, "name": h.name, "state": state(h),
        "submitted_at": at(h.submitted_wall), "finished_at": at(h.finished_wall),
        "response_s": h.response_s,
        "scheduler_started_at": t0 + epoch,
        "submitted_s": h.submitted_wall - t0,
        "finished_s": None if h.finished_wall is None else h.finished_wall - t0,
        "error": None if h.error is None else clean_error(h.error),
        "tasks": [{"name": t.name or f"t{i}", "state": task_state(h, i), "node": h.task_nodes[i],
                   "started_at": at(start[i]), "finished_at": at(fin[i]),
                   "run_s": None if fin[i] is None or start[i] is None else fin[i] - start[i],
                   "response_s": None if fin[i] is None else fin[i] - h.submitted_wall,
                   "finished_s": None if fin[i] is None else fin[i] - t0,
                   "attempts": h.task_attempts[i]} for i, t in enumerate(spec.tasks)],
        "time_scale": time_scale,
        "program": None if h.program is None else program_record(h.program),
    }


def program_record(prog: Any) -> dict[str, Any]:
    """The agent program of a workflow, as ``GET /v1/workflows/{id}`` shows it: its id (its
    first step's), its steps' ids (the last 1,000), ``state`` ``open`` (a step may still be
    added: ``close`` it) or ``closed``, how many steps are done, and ``response_s``: its start
    to its last step's end once every step submitted is done (while open, a later step
    extends it: ``final`` says whether it can still grow)."""
    handles = list(prog.handles)
    steps = [h.jid for h in handles]
    done = [h for h in handles if h.done()]
    ends = [h.finished_wall for h in done if h.finished_wall is not None]
    all_done = bool(handles) and len(done) == len(handles)
    return {"id": steps[0] if steps else None, "steps": steps[-1000:], "closed": prog.closed,
            "state": "closed" if prog.closed else "open", "steps_done": len(done),
            "response_s": max(ends) - prog.started_wall if all_done and ends else None,
            "final": bool(prog.closed and all_done)}
