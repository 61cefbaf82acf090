"""The live scheduler's records of a workflow and its tasks (scheduler-thread state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envs.decision import DONE, READY, RUNNING, WAITING  # noqa: F401 (the core's task states)

from .handles import WorkflowHandle
from .workflow import Call

if TYPE_CHECKING:
    from .nodes import LiveServer


class LiveTask:
    __slots__ = ("gid", "idx", "wf", "call", "key", "state", "waiting_for", "children", "parents",
                 "value_ref", "server", "token", "attempts", "first_parent", "last_server",
                 "waits", "rank", "started", "expected", "transfer_wall", "runs", "status",
                 "copy", "is_copy", "share", "work", "demands")

    def __init__(self, gid: int, idx: int, wf: "LiveWorkflow", call: Call):
        self.gid = gid
        self.idx = idx
        self.wf = wf
        self.call = call
        self.key: tuple = ()
        self.state = WAITING
        self.waiting_for: set[int] = set()
        self.children: list[LiveTask] = []
        self.parents: list[LiveTask] = []
        self.value_ref: Any = None
        self.server: LiveServer | None = None
        self.token = 0
        self.attempts = 0
        self.first_parent: LiveTask | None = None
        self.last_server: LiveServer | None = None  # where its result was produced
        self.waits = 0  # policy answers that did not start it (bounded by the guard)
        self.rank = 0.0  # within-workflow rank of its order key (envs.order)
        self.started = 0.0  # wall time of its latest start
        self.expected = 0.0  # wall s its declared compute implies on its latest server
        self.transfer_wall = 0.0  # wall s of its latest run's emulated input transfer
        self.runs = 0  # runs started, before a restart too (journal): the next run's attempt()
        self.status: Any = None  # the status ref of its latest run
        self.copy: Any = None  # the other run of a hedged task (scale_ray.live.runs._Run)
        self.is_copy = False  # its run is a hedged copy (the original is ``copy``)
        self.share = 0.0  # its fair-share start tag once placed (envs.fairshare)
        self.work = 0.0  # what placing it charges its tenant (resource-s; envs.fairshare)
        # what a run holds on its node (LivePlacement.demands_of: a slot, or its Ray request),
        # set when it is queued
        self.demands: tuple[tuple[str, float], ...] = ()

    @property
    def prim(self):
        return self.call.primitive

    @property
    def memory_gb(self) -> float:  # what the decision core's rules read
        return self.call.primitive.memory_gb

    @property
    def gpu(self) -> bool:  # GPU work (its node's GPU speed)
        return self.call.primitive.request.gpu > 0

    @property
    def compute(self) -> float:  # what the rules read (policies.heuristics)
        return self.call.primitive.compute_gflop

    @property
    def kind(self) -> str:  # what the run-time estimator learns under (as the simulator's)
        return self.call.primitive.kind


class LiveWorkflow:
    __slots__ = ("handle", "tasks", "done", "failed", "arrival_wall", "arrival", "wid", "level")

    def __init__(self, handle: WorkflowHandle, arrival_wall: float, arrival: float):
        self.handle = handle
        self.tasks: list[LiveTask] = []
        self.done = 0
        self.failed = False
        self.arrival_wall = arrival_wall
        self.arrival = arrival  # model seconds since the scheduler started (the order's time)
        self.wid = 0  # admission number (the order's tie breaker)
        self.level = 0.0  # its order level (envs.order: deadline, work left, attained service)
