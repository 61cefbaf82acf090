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
from typing import TYPE_CHECKING, Any, Callable, Mapping

from envs.config import EnvConfig
from envs.demands import Request
from envs.snapshot import ServerState, workflow_state
from policies.lookahead import RoundChoices

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


class _Done:
    """A finished parent the request lists in a task's ``inputs``."""
    __slots__ = ("position", "output_gb", "order")

    def __init__(self, position: int, output_gb: float, order: int):
        self.position, self.output_gb, self.order = position, output_gb, order


class _RequestTasks:
    """One workflow of a ``/v1/schedule`` request as an ``envs.snapshot.TaskGraph``: its tasks
    (all unfinished) and, as finished parents, their ``inputs`` in the order given (the first is
    the transfer source). Raises RequestError for a running task without a known server."""

    def __init__(self, wf: Any, wi: int, pos: Mapping[str, int]):
        by_id = {t.id: t for t in wf.tasks}
        self.parents_of: dict[int, list] = {}
        self.first: dict[int, _Done | None] = {}
        self.server: dict[int, int | None] = {}
        for j, t in enumerate(wf.tasks):
            done = [_Done(pos.get(i.server, -1), i.output_gb, k) for k, i in enumerate(t.inputs)]
            self.parents_of[id(t)] = [by_id[p] for p in t.parents] + done
            self.first[id(t)] = done[0] if done else None
            self.server[id(t)] = _running_on(t, wi, j, pos) if t.running else None

    def sizes(self, t: Any) -> tuple[float, float, float]:
        if isinstance(t, _Done):
            return 0.0, 0.0, t.output_gb
        return t.compute_gflop, t.memory_gb, t.output_gb

    def demands(self, t: Any) -> tuple:
        """A request's task holds a slot and its memory (``envs.demands``)."""
        return Request(memory_gb=t.memory_gb).on_slot()

    def remaining_s(self, t: Any) -> None:
        return None  # a running task's time left is its server's (``remaining_s``)

    def parents(self, t: Any) -> list:
        return self.parents_of[id(t)]

    def first_parent(self, t: Any) -> "_Done | None":
        return self.first[id(t)]

    def done(self, t: Any) -> bool:
        return isinstance(t, _Done)

    def finish(self, t: _Done) -> float:
        return t.order

    def held_at(self, t: _Done) -> int:
        return t.position

    def running_on(self, t: Any) -> int | None:
        return self.server[id(t)]


def _running_on(t: Any, wi: int, j: int, pos: Mapping[str, int]) -> int:
    if t.server is None:
        raise RequestError(("body", "workflows", wi, "tasks", j, "server"),
                           "field required for a running task by the lookahead "
                           "policy (it simulates when the task finishes)", "missing")
    server = pos.get(t.server)
    if server is None:
        raise RequestError(("body", "workflows", wi, "tasks", j, "server"),
                           f"{t.server!r} is not a server of the request")
    return server


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
    # the request as it came (envs.snapshot.workflow_state); starts in the round replace it
    workflows = [workflow_state(wf.tasks, _RequestTasks(wf, wi, pos),
                                0.0 if now is None else max(now - wf.arrival_s, 0.0), wf.size)
                 for wi, wf in enumerate(req.workflows)]
    earlier = RoundChoices()  # this round's waits and defers, by (workflow, task) position

    table = servers.table

    def snapshot() -> list[ServerState]:
        return [ServerState(table.cpu_speed[i], table.memory_l[i],
                            float(table.busy_until[i]) if table.running[i] else 0.0,
                            table.idle_w[i], table.busy_w[i], table.accept_l[i])
                for i in range(table.n)]

    def ask(r: "ReadyRow") -> int:
        key = (r.wi, r.j)
        waiting, deferred = earlier.for_snapshot()
        choice = planner.plan(snapshot(), workflows, key, waiting, env=env, deferred=deferred)
        r.asked = True
        earlier.record(key, choice, planner.last_deferred, not table.fits_now(choice, r.demands))
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
