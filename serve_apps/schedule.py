"""``POST /v1/schedule`` without Ray: one placement round of the decision core
(``envs.decision``) over the request's ready tasks, the simulator's rules at one instant; and
:func:`try_policy`, the check a policy passes before it serves.

The Serve deployment (``serve_apps.placement``) calls these; the benchmark times them in process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from envs import order as orders
from envs.decision import READY, DecisionCore, Rules
from envs.workflow import kahn_order
from policies.base import is_planner

from .decisions import (BACKLOG_MISSING, LoadedPolicy, RequestServers,
                        RequestState, TaskRow, decide, fmt_mem, guarded, prepare_place)
from .planning import planner_ask, probe_request
from .schemas import PlaceRequest, RequestError, ScheduleRequest

# ------------------------------------------------------------------------------- /v1/schedule
@dataclass(slots=True, eq=False)
class ReadyRow:
    """A ready task of the request, as the decision core's queue holds it (the table keys its
    runs by identity)."""
    key: tuple
    wf: Any
    task: Any
    row: TaskRow
    inputs: list  # [(position or -2, output_gb)] of finished parents
    waits: int = 0  # the request's count; a wait in this round adds one
    wi: int = 0  # its workflow's and its own position in the request
    j: int = 0
    state: int = READY
    asked: bool = False  # the policy was asked (a wait it chose carries the guard's note)
    note: dict | None = None  # the guard's note on the policy's pick

    @property
    def memory_gb(self) -> float:
        return self.row.memory_gb

    @property
    def demands(self) -> tuple:  # what it holds on a server of one slot (the core's rules)
        return self.row.demands


def _workflow_keys(wi: int, wf, order: orders.Order, costs: orders.Costs
                   ) -> tuple[list[int], list[float], float]:
    """(successor counts, the order's rank per listed task, the workflow's level) in the request's
    task positions; validates the DAG."""
    loc = ("body", "workflows", wi, "tasks")
    index: dict = {}
    for j, t in enumerate(wf.tasks):
        if t.id in index:
            raise RequestError((*loc, j, "id"), f"duplicate task id {t.id!r} in workflow {wf.id!r}")
        index[t.id] = j
    n = len(wf.tasks)
    children: list[list[int]] = [[] for _ in range(n)]
    for j, t in enumerate(wf.tasks):
        for k, p in enumerate(t.parents):
            pj = index.get(p)
            if pj is None:
                raise RequestError((*loc, j, "parents", k),
                                   f"unknown task {p!r}: list unfinished parents only, and every "
                                   f"unfinished task of the workflow")
            if pj == j:
                raise RequestError((*loc, j, "parents", k), f"task {t.id!r} is its own parent")
            if j not in children[pj]:
                children[pj].append(j)
        if t.running and t.parents:
            raise RequestError((*loc, j, "running"),
                               f"task {t.id!r} is running but lists unfinished parents")
    topo = kahn_order(children)
    if len(topo) != n:
        placed = set(topo)
        bad = next(j for j in range(n) if j not in placed)
        raise RequestError((*loc, bad, "parents"), f"the parents of workflow {wf.id!r} form a cycle")
    # envs.order wants children after parents: renumber in Kahn order
    pos = {j: i for i, j in enumerate(topo)}
    kids = [[pos[c] for c in children[j]] for j in topo]
    tasks = [wf.tasks[j] for j in topo]
    parents: list[list[int]] = [[] for _ in tasks]  # in Kahn positions
    for i, cs in enumerate(kids):
        for c in cs:
            parents[c].append(i)
    keyed = order.arrive(orders.Graph([t.compute_gflop for t in tasks],
                                      [t.memory_gb for t in tasks],
                                      [t.output_gb for t in tasks], [False] * n, kids, parents),
                         wf.arrival_s, wi, costs, wf.attained_s)
    rank = [0.0] * n
    for i, j in enumerate(topo):
        rank[j] = keyed.ranks[i]
    return [len(c) for c in children], rank, keyed.level


def prepare_schedule(req: ScheduleRequest, lp: LoadedPolicy, max_servers: int, max_tasks: int
                     ) -> tuple[RequestServers, list[ReadyRow]]:
    """Validate the request and list its ready tasks in the encoder's order (``envs.order``:
    the simulator's key, then workflow and task position)."""
    servers = RequestServers(req.servers, lp.encoder, max_servers)
    total = sum(len(w.tasks) for w in req.workflows)
    if total > max_tasks:
        raise RequestError(("body", "workflows"),
                           f"{total} tasks is more than the limit of {max_tasks} per request")
    wf_ids: set = set()
    enc = lp.encoder
    order = orders.make(enc.order, enc.edf_factor)
    table = servers.table
    acc = [i for i in range(table.n) if table.accept_l[i]] or list(range(table.n))
    costs = orders.Costs.of(((table.cpu_speed[i], table.cpu_speed[i], table.memory_l[i], False)
                             for i in acc), enc.network)  # no server accepts: every one
    max_mem = servers.max_accepting_memory()
    backlog = enc.features.backlog
    if backlog and req.now_s is None:
        raise RequestError(("body", "now_s"), BACKLOG_MISSING, "missing")
    ready: list[ReadyRow] = []
    for wi, wf in enumerate(req.workflows):
        if wf.id in wf_ids:
            raise RequestError(("body", "workflows", wi, "id"), f"duplicate workflow id {wf.id!r}")
        wf_ids.add(wf.id)
        size = len(wf.tasks) if wf.size is None else wf.size
        if size < len(wf.tasks):
            raise RequestError(("body", "workflows", wi, "size"),
                               f"{size} is smaller than the {len(wf.tasks)} listed tasks")
        successors, rank, level = _workflow_keys(wi, wf, order, costs)
        ratio = (size - len(wf.tasks)) / size
        if req.now_s is not None and req.now_s < wf.arrival_s:
            raise RequestError(("body", "workflows", wi, "arrival_s"),
                               f"{wf.arrival_s} is after now_s={req.now_s}")
        age = req.now_s - wf.arrival_s if backlog else 0.0
        for j, t in enumerate(wf.tasks):
            if t.running or t.parents:
                continue
            if t.memory_gb > max_mem:
                raise RequestError(("body", "workflows", wi, "tasks", j, "memory_gb"),
                                   f"{t.memory_gb} GB fits no accepting server (largest: "
                                   f"{fmt_mem(max_mem)})", "no_fit")
            inputs = [(servers.position.get(i.server, -2), i.output_gb) for i in t.inputs]
            if inputs:
                slot, out = inputs[0]
            else:
                slot, out = -1, 0.0
            row = TaskRow(t.compute_gflop, t.memory_gb, t.output_gb, successors[j], ratio, slot,
                          out, workflow_age_s=age)
            key = order.key(rank[j], wf.arrival_s, wi, level) + (wi, j)
            ready.append(ReadyRow(key, wf, t, row, inputs, t.waits, wi, j))
    ready.sort(key=lambda r: r.key)
    return servers, ready


def schedule(req: ScheduleRequest, lp: LoadedPolicy, max_servers: int, max_tasks: int) -> dict:
    """POST /v1/schedule: one placement round of the decision core (``envs.decision``) at this
    instant, the simulator's rules.

    Each ready task in ready-task order gets the policy's pick (with ``mdp.ask_only_startable``
    a task that no server can start now waits without asking, as in the simulator); a valid
    pick (accepting, idle, fits) starts the task there and marks the server busy (remaining time
    = transfer delay when transfers delay starts + compute / capacity; power = busy power)
    before the next decision. A pick that cannot start now is a wait: the task stays
    unassigned, and with head-of-line blocking (the paper's setting) every task behind it too.
    """
    servers, ready = prepare_schedule(req, lp, max_servers, max_tasks)
    enc = lp.encoder
    planned = is_planner(lp.policy)
    if planned:  # the lookahead planner simulates the request (serve_apps.planning)
        plan, record = planner_ask(req, lp, servers)
    table = servers.table
    core = DecisionCore(table, Rules(enc.head_of_line_blocking, enc.ask_only_startable,
                                     enc.mask_infeasible))
    for i, r in enumerate(ready):  # already in ready-task order; the position breaks no ties
        core.queue.push(r.key, i, r)
    backlog = enc.features.backlog
    assignments: list[dict] = []
    unassigned: list[dict] = []

    def ask(r: ReadyRow) -> int:
        if planned:
            return plan(r)
        # features.backlog: the tasks still ready are this one and those behind it (as in the
        # simulator, a task a wait set aside is not counted again)
        row = replace(r.row, ready_tasks=len(core.queue) if backlog else r.row.ready_tasks,
                      waits=r.waits)
        state = RequestState(servers, row, enc)
        choice, _ = decide(lp, state)
        choice, r.note = guarded(lp, state, choice)
        r.asked = True
        return choice

    def start(r: ReadyRow, choice: int) -> None:
        exec_s = r.row.compute_gflop / table.cpu_speed[choice]
        delay = 0.0
        if enc.transfer_delays_start:
            delay = enc.network.start_delay(r.inputs, choice)
        table.start(choice, r, r.demands, delay + exec_s)
        if planned:
            record(r, choice)
        assignments.append({"workflow": r.wf.id, "task": r.task.id,
                            "server": servers.ids[choice], "index": choice, "guard": r.note})

    def waited(r: ReadyRow, reason: str) -> None:
        entry = {"workflow": r.wf.id, "task": r.task.id, "reason": reason}
        if r.asked:  # the policy's own wait
            entry["guard"] = r.note
        unassigned.append(entry)

    core.run_round(ask, start, waited)  # unassigned comes out in ready-task order
    return {"assignments": assignments, "unassigned": unassigned, "policy": lp.info["name"],
            "policy_version": lp.info["version"]}


def try_policy(lp: LoadedPolicy) -> None:
    """One decision on a two-server request: a policy that loads but cannot decide (wrong
    shapes, a broken module) fails here, before it serves. Not counted by the guard.
    A planner plans one small /v1/schedule request instead."""
    if is_planner(lp.policy):
        out = schedule(probe_request(), lp, 2, 2)
        if len(out["assignments"]) + len(out["unassigned"]) != 1:
            raise ValueError(f"policy {lp.spec!r} answered {out} for one ready task")
        return
    req = PlaceRequest.model_validate({
        "task": {"compute_gflop": 4.0, "memory_gb": 4.0, "ready_tasks": 1, "workflow_age_s": 0.0},
        "servers": [{"id": "a", "compute": 1.0, "memory_gb": 8.0},
                    {"id": "b", "compute": 4.0, "memory_gb": 80.0, "remaining_s": 1.0}]})
    choice, _ = decide(lp, prepare_place(req, lp, 2))
    if not 0 <= choice < 2:
        raise ValueError(f"policy {lp.spec!r} answered index {choice} for 2 servers")
