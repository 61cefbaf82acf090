"""``/v1/schedule`` with the ``lookahead`` planner (``policies.lookahead``): the decision core's
round asks the planner, which simulates the request (``envs.snapshot``) instead of scoring an
observation.

Each ask builds the snapshot of the request as the round has changed it so far: tasks started
earlier in the round run on their servers, and tasks that chose to wait keep the busy server
they wait for reserved in the rollouts. A running task must name its ``server`` (the planner
simulates when it finishes and its children become ready). The planner is not a learned policy:
no guard; it waits only for a busy server that would finish the task before the best idle one.
Nothing is remembered between requests (a task's reservation lasts one round).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from envs.config import EnvConfig
from envs.snapshot import ServerState, TaskState, WorkflowState

from .schemas import RequestError, ScheduleRequest

if TYPE_CHECKING:
    from .decisions import LoadedPolicy, RequestServers
    from .schedule import ReadyRow


def planner_env(lp: "LoadedPolicy") -> EnvConfig:
    """The planner's env with the encoder settings the service decides with."""
    enc = lp.encoder
    env: EnvConfig = lp.policy.env
    mdp = replace(env.mdp, mask_infeasible=enc.mask_infeasible,
                  head_of_line_blocking=enc.head_of_line_blocking,
                  transfer_delays_start=enc.transfer_delays_start,
                  ask_only_startable=enc.ask_only_startable, order=enc.order,
                  edf_factor=enc.edf_factor)
    cluster = replace(env.cluster, bandwidth_gb_s=enc.bandwidth_gb_s, latency_s=enc.latency_s)
    return replace(env, mdp=mdp, cluster=cluster, features=enc.features)


def planner_ask(req: ScheduleRequest, lp: "LoadedPolicy", servers: "RequestServers"
                ) -> tuple[Callable[["ReadyRow"], int], Callable[["ReadyRow", int], None]]:
    """(ask, started) for :meth:`envs.decision.DecisionCore.run_round`: ``ask(ready) -> server
    position`` plans on the snapshot; ``started(ready, position)`` records a start (call it
    from the round's start callback). Raises RequestError for a running task without its
    server."""
    env = planner_env(lp)
    planner = lp.policy.fresh()  # one per request: requests run in parallel worker threads
    pos = servers.position
    now = req.now_s
    workflows: list[WorkflowState] = []  # the request as it came; starts in the round replace it
    for wi, wf in enumerate(req.workflows):
        index = {t.id: j for j, t in enumerate(wf.tasks)}
        tasks = []
        for j, t in enumerate(wf.tasks):
            server = None
            if t.running:
                if t.server is None:
                    raise RequestError(("body", "workflows", wi, "tasks", j, "server"),
                                       "field required for a running task by the lookahead "
                                       "policy (it simulates when the task finishes)", "missing")
                server = pos.get(t.server)
                if server is None:
                    raise RequestError(("body", "workflows", wi, "tasks", j, "server"),
                                       f"{t.server!r} is not a server of the request")
            tasks.append(TaskState(t.compute_gflop, t.memory_gb, t.output_gb,
                                   tuple(index[p] for p in t.parents),
                                   tuple((pos.get(i.server, -1), i.output_gb) for i in t.inputs),
                                   server))
        age = 0.0 if now is None else max(now - wf.arrival_s, 0.0)
        workflows.append(WorkflowState(tuple(tasks), age, wf.size))
    waiting: dict[tuple[int, int], int] = {}

    def snapshot() -> list[ServerState]:
        return [ServerState(servers.compute_l[i], servers.memory_l[i],
                            float(servers.busy_until[i]) if servers.busy_l[i] else 0.0,
                            servers.power_l[i], servers.busy_power_l[i], servers.accept_l[i])
                for i in range(len(servers))]

    def ask(r: "ReadyRow") -> int:
        key = (r.wi, r.j)
        choice = planner.decide(snapshot(), workflows, key, waiting, env=env)
        r.asked = True
        if servers.busy_l[choice]:
            waiting[key] = choice
        return choice

    def record(r: "ReadyRow", choice: int) -> None:
        wi, j = r.wi, r.j
        wf = workflows[wi]
        tasks = wf.tasks[:j] + (replace(wf.tasks[j], server=choice),) + wf.tasks[j + 1:]
        workflows[wi] = replace(wf, tasks=tasks)

    return ask, record


def probe_request() -> ScheduleRequest:
    """The small request a planner decides before it serves (``schedule.try_policy``)."""
    return ScheduleRequest.model_validate({
        "workflows": [{"id": "w", "tasks": [
            {"id": "a", "compute_gflop": 4.0, "memory_gb": 4.0},
            {"id": "b", "compute_gflop": 4.0, "memory_gb": 4.0, "parents": ["a"]}]}],
        "servers": [{"id": "a", "compute": 1.0, "memory_gb": 8.0},
                    {"id": "b", "compute": 4.0, "memory_gb": 80.0, "remaining_s": 1.0}],
        "now_s": 0.0})
