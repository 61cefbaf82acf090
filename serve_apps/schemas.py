"""Request and response models of the placement service (pydantic 2, strict).

Every model is strict (``"1.5"`` is not a number, ``true`` is not a number) and forbids unknown
fields, so a typo is a 422 naming the field rather than a silently ignored key. Numbers must be
finite and non-negative (server compute and memory, and task compute, strictly positive).
Limits that can change at run time (servers and tasks per request) are checked by the service,
not here; their violations, and input that passes the schema but makes no sense, raise
:class:`RequestError` (a 422 naming the field, like the schema's own errors).
"""

from __future__ import annotations

from typing import Annotated, Literal, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StringConstraints

Id = Union[StrictInt, Annotated[str, StringConstraints(min_length=1, max_length=200)]]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Ratio = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=1_000_000)]
PosCount = Annotated[StrictInt, Field(ge=1, le=1_000_000)]

_STRICT = ConfigDict(extra="forbid", strict=True)


class RequestError(ValueError):
    """Input that passed the schema but makes no sense (duplicate ids, nothing fits, too many
    servers...). ``loc`` is the field path, as in FastAPI's 422 answers."""

    def __init__(self, loc: Sequence[str | int], msg: str, kind: str = "value_error",
                 status: int = 422, headers: dict[str, str] | None = None):
        super().__init__(f"{'.'.join(map(str, loc))}: {msg}")
        self.loc = list(loc)
        self.msg = msg
        self.kind = kind
        self.status = status  # 422; 401/403 who asks, 429 a quota, 503 nothing can run now
        self.headers = headers or {}

    def __reduce__(self):  # (it crosses from the scheduler actor to a door)
        return (type(self), (self.loc, self.msg, self.kind, self.status, self.headers),
                self.__dict__)


class Server(BaseModel):
    """One server as the scheduler sees it now."""
    model_config = _STRICT

    id: Id = Field(description="unique within the request (string or integer)")
    compute: PosFloat = Field(description="compute capacity C, GFLOP/s")
    memory_gb: PosFloat = Field(description="memory capacity M, GB")
    remaining_s: NonNegFloat = Field(0.0, description="time until its current task finishes; 0 = idle")
    power_w: NonNegFloat = Field(0.0, description="current power draw, W")
    busy_power_w: NonNegFloat | None = Field(
        None, description="draw while busy (used by /v1/schedule once a task is placed); default power_w")
    accepting: StrictBool = Field(True, description="false: draining, never chosen")


class PlaceTask(BaseModel):
    """The task to place (paper §4.1.1 task features plus where its input data lies)."""
    model_config = _STRICT

    compute_gflop: PosFloat = Field(description="compute demand, GFLOP")
    memory_gb: NonNegFloat = Field(description="memory demand, GB")
    output_gb: NonNegFloat = Field(0.0, description="output data volume, GB")
    successors: Count = Field(0, description="number of child tasks in its workflow")
    completion_ratio: Ratio = Field(0.0, description="finished share of its workflow's tasks")
    parent_server: Id | None = Field(
        None, description="server holding its first finished parent's output (an id not in "
                          "`servers` means elsewhere: every server pays the transfer)")
    parent_output_gb: NonNegFloat = Field(0.0, description="output size of that parent, GB")
    ready_tasks: PosCount | None = Field(
        None, description="ready tasks now, this one included; required by a policy trained "
                          "with features.backlog, ignored by others")
    workflow_age_s: NonNegFloat | None = Field(
        None, description="now minus its workflow's arrival, s; required by a policy trained "
                          "with features.backlog, ignored by others")
    waits: Count = Field(0, description="how often this task was answered with a server that "
                                        "could not start it (a wait) so far; the guard of a "
                                        "learned policy bounds it (docs/serving.md)")


class PlaceRequest(BaseModel):
    """POST /v1/place: one task and the current servers (any number up to the limit)."""
    model_config = _STRICT

    task: PlaceTask
    servers: list[Server] = Field(min_length=1)


class GuardNote(BaseModel):
    """The guard replaced the learned policy's answer (policies.guard)."""
    reason: Literal["infeasible", "wait_budget", "slower_wait"] = Field(
        description="infeasible: the task cannot use that server; wait_budget: the task has "
                    "waited max_waits times while a server it fits is idle; slower_wait: the "
                    "busy server would finish it later than the best idle one")
    proposed: Id | None = Field(description="the server the policy chose (null: none in the request)")


class PlaceResponse(BaseModel):
    server: Id = Field(description="id of the chosen server")
    index: int = Field(description="position of the chosen server in the request")
    valid: bool = Field(description="the task can start there now (accepting, idle, fits); "
                                    "false means the policy would rather wait")
    scores: list[float | None] | None = Field(
        description="a trained policy's score per server, higher is better, null = masked; "
                    "null for a rule (a heuristic scores no server)")
    policy: str
    policy_version: str
    guard: GuardNote | None = Field(None, description="set when the guard replaced the "
                                                      "policy's answer with EFT's")


class Input(BaseModel):
    """A finished parent's output: where it lies and how large it is."""
    model_config = _STRICT

    server: Id = Field(description="server the parent ran on (may no longer be in `servers`)")
    output_gb: NonNegFloat


class ScheduleTask(BaseModel):
    """An unfinished task of a workflow. Ready = not running and no listed parent."""
    model_config = _STRICT

    id: Id = Field(description="unique within its workflow")
    compute_gflop: PosFloat
    memory_gb: NonNegFloat
    output_gb: NonNegFloat = 0.0
    parents: list[Id] = Field([], description="unfinished parents (ids of listed tasks); "
                                              "finished parents are left out")
    inputs: list[Input] = Field([], description="finished parents in the order they finished "
                                                "(the first is the transfer source)")
    running: StrictBool = Field(False, description="already started (not ready)")
    server: Id | None = Field(None, description="the server running it (a running task); "
                                                "required by the lookahead policy, which "
                                                "simulates when it finishes")
    waits: Count = Field(0, description="waits of this task so far (see PlaceTask.waits)")


class Workflow(BaseModel):
    """A workflow's unfinished tasks (all of them: the critical-path order needs the DAG below
    each ready task)."""
    model_config = _STRICT

    id: Id
    arrival_s: NonNegFloat = Field(0.0, description="arrival time (the fifo and edf orders, "
                                                    "and the tie-break of the others)")
    attained_s: NonNegFloat = Field(0.0, description="order las: run seconds its finished tasks "
                                                     "took (its attained service)")
    size: Count | None = Field(None, description="total task count including finished ones; "
                                                 "default: the listed tasks")
    tasks: list[ScheduleTask] = Field(min_length=1)


class ScheduleRequest(BaseModel):
    """POST /v1/schedule: workflows with ready tasks, and the servers."""
    model_config = _STRICT

    workflows: list[Workflow] = Field(min_length=1)
    servers: list[Server] = Field(min_length=1)
    now_s: NonNegFloat | None = Field(
        None, description="the current time on the arrival_s clock (workflow age = now_s - "
                          "arrival_s); required by a policy trained with features.backlog")


class Assignment(BaseModel):
    workflow: Id
    task: Id
    server: Id
    index: int = Field(description="position of the server in the request")
    guard: GuardNote | None = Field(None, description="set when the guard replaced the answer")


class Unassigned(BaseModel):
    workflow: Id
    task: Id
    reason: Literal["wait", "blocked"] = Field(
        description="wait: the policy picked a busy server; blocked: behind a wait "
                    "(head-of-line blocking)")
    guard: GuardNote | None = Field(None, description="set when the guard replaced the answer")


class ScheduleResponse(BaseModel):
    assignments: list[Assignment] = Field(description="in decision (first-level) order")
    unassigned: list[Unassigned]
    policy: str
    policy_version: str


class SwapError(BaseModel):
    """A ``user_config`` change this replica did not apply; the policy before it keeps serving."""
    message: str = Field(description="why (missing path, checksum mismatch, invalid setting...)")
    time: float = Field(description="when it failed (Unix time, s)")
    spec: str | None = Field(description="the policy that failed to load (user_config.policy)")


class PolicyInfo(BaseModel):
    name: str
    spec: str = Field(description="what was loaded: heuristic name, shipped name or artifact path")
    algorithm: str
    version: str
    checksum: str | None
    train_servers: int | None
    module: str | None
    order: str = Field(description="the order ready tasks are placed in (mdp.order)")
    backend: str = Field(description="how decisions are computed: numpy or torch for a trained "
                                     "network, builtin for a heuristic")
    encoder: dict
    guard: dict = Field(description="the guard's settings (enabled, max_waits) and the overrides "
                                    "this replica made, per reason; enabled is false for heuristics")
    gate: dict | None = Field(None, description="the policy's measurement against EFT "
                                                "(serve_apps.gate; scale-ray eval --gate)")
    loaded_at: float
    swaps: int
    last_swap_error: SwapError | None = Field(
        None, description="the last user_config change that failed (the previous policy and "
                          "settings stay in force); null after a change that succeeded")


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    detail: list[ErrorItem] | str
