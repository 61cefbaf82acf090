"""The placement service's decisions, without Ray: loading a policy with its encoder settings,
building observations with the decision core's server table (``envs.decision``, the one
encoder), ``place`` (one task) and ``schedule`` (one placement round of the decision core over
the request's ready tasks: the simulator's rules at one instant).

The Serve deployment (``serve_apps.placement``) calls these; the benchmark times them in process.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from envs.config import EnvConfig, FeatureConfig, load_env_config, to_dict
from envs.decision import READY, DecisionCore, Rules, ServerTable, task_vector
from envs import order as orders
from envs.workflow import kahn_order
from policies import HEURISTICS, Policy, get_policy
from policies.guard import Guard, GuardConfig, make_guard
from policies.lookahead import has_state_protocol

from .planning import planner_ask, probe_request
from .schemas import PlaceRequest, RequestError, ScheduleRequest, Server

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- policy loading
@dataclass(frozen=True)
class EncoderSettings:
    """Everything besides the policy that shapes a decision (from the env config / artifact)."""
    features: FeatureConfig
    bandwidth_gb_s: float
    latency_s: float
    mask_infeasible: bool
    transfer_delays_start: bool
    head_of_line_blocking: bool
    order: str  # envs.order
    edf_factor: float = 2.0
    ask_only_startable: bool = False  # /v1/schedule: a task no server can start waits unasked

    def to_dict(self) -> dict[str, Any]:
        return {"features": to_dict(self.features), "bandwidth_gb_s": self.bandwidth_gb_s,
                "latency_s": self.latency_s, "mask_infeasible": self.mask_infeasible,
                "transfer_delays_start": self.transfer_delays_start,
                "head_of_line_blocking": self.head_of_line_blocking, "order": self.order,
                "edf_factor": self.edf_factor,
                "ask_only_startable": self.ask_only_startable}


@dataclass(frozen=True)
class LoadedPolicy:
    """A policy ready to serve. Swapped as one reference, so a request sees one consistent set."""
    spec: str
    policy: Policy
    encoder: EncoderSettings
    info: dict[str, Any]
    batched: bool          # scores a padded batch in one call (torch policies)
    argmax_act: bool       # act(obs) == argmax(scores(obs)): one call gives both
    guard: Guard | None = None  # policies.guard around a learned policy (None: heuristic / off)
    loaded_at: float = field(default_factory=time.time)
    # decisions run in worker threads (serve_apps.placement): the guard's check and its counters
    # are updated under this lock, so the counters are exact
    guard_lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def guard_info(self) -> dict[str, Any]:
        """``/v1/policy``'s guard section: settings and this replica's overrides per reason."""
        if self.guard is None:
            return {"enabled": False}
        g = self.guard
        with self.guard_lock:  # one consistent snapshot of the counters
            return {"enabled": True, "max_waits": g.config.max_waits, "checked": g.checked,
                    **g.summary()}


def env_for_artifact(spec: str, env: EnvConfig) -> EnvConfig:
    """The env config an artifact was trained with when its policy.json records one
    (``env`` key), else ``env``."""
    from policies import ARTIFACTS_DIR, shipped_policies

    path = ARTIFACTS_DIR / spec if spec in shipped_policies() else Path(spec)
    meta_file = path / "policy.json"
    if not meta_file.is_file():
        return env
    meta = json.loads(meta_file.read_text())
    if not isinstance(meta.get("env"), dict):
        return env
    recorded = meta["env"]
    if isinstance(recorded.get("mdp"), dict) and "first_level" in recorded["mdp"]:
        # written before mdp.order: the order it trained under is not imposed (envs.order)
        recorded = {**recorded, "mdp": {k: v for k, v in recorded["mdp"].items()
                                        if k != "first_level"}}
    return load_env_config(recorded)


def load(spec: str, env: EnvConfig, seed: int | None = None, mask_infeasible: bool | None = None,
         head_of_line_blocking: bool | None = None, guard: GuardConfig | None = None,
         workload_scale: float | None = None) -> LoadedPolicy:
    """Load ``spec`` (heuristic name, shipped artifact name or artifact path) fully.

    Features come from the artifact's ``policy.json`` (a heuristic: from ``env``); bandwidth,
    latency and the decision switches from the artifact's recorded env config or ``env``;
    ``mask_infeasible`` / ``head_of_line_blocking`` override the env's switches when given.
    A learned policy answers through ``policies.guard`` (``guard``; default on).
    ``workload_scale`` replaces ``features.workload_scale`` (the typical task size of the
    workload served relative to the paper's; docs/workloads.md).
    """
    if spec not in HEURISTICS:
        env = env_for_artifact(spec, env)
    policy = get_policy(spec, env, seed)
    features = getattr(policy, "features", None) or env.features
    if workload_scale is not None:
        features = replace(features, workload_scale=workload_scale)
    mdp = env.mdp
    encoder = EncoderSettings(
        features=features, bandwidth_gb_s=env.cluster.bandwidth_gb_s, latency_s=env.cluster.latency_s,
        mask_infeasible=mdp.mask_infeasible if mask_infeasible is None else mask_infeasible,
        transfer_delays_start=mdp.transfer_delays_start,
        head_of_line_blocking=(mdp.head_of_line_blocking if head_of_line_blocking is None
                               else head_of_line_blocking),
        order=orders.resolve(mdp.order, policy.order, spec, orders.SERVING_ORDER),
        edf_factor=mdp.edf_factor, ask_only_startable=mdp.ask_only_startable)
    d = policy.describe()
    info = {"name": str(d.get("name") or policy.name), "spec": spec,
            "algorithm": str(d.get("algorithm") or "unknown"), "version": str(d.get("version") or "0"),
            "checksum": d.get("checksum"), "train_servers": d.get("train_servers"),
            "module": d.get("module"), "order": encoder.order,
            "backend": str(getattr(policy, "backend", "builtin")),
            "encoder": encoder.to_dict()}
    batched = hasattr(policy, "net")  # policies.artifact.TorchPolicy: one forward for a batch
    argmax_act = batched or type(policy).act is Policy.act
    g = make_guard(policy, guard, features, mdp.transfer_delays_start)
    return LoadedPolicy(spec, policy, encoder, info, batched, argmax_act, g)


# ------------------------------------------------------------------------------- observations
class RequestServers(ServerTable):
    """One request's servers in the decision core's server table (``envs.decision``), with
    their ids. Mutable: /v1/schedule marks chosen servers busy. The clock is the request's
    instant (0): a server's remaining time is its busy-until time."""

    def __init__(self, servers: Sequence[Server], enc: EncoderSettings, max_servers: int,
                 loc: tuple = ("body", "servers")):
        n = len(servers)
        if n > max_servers:
            raise RequestError(loc, f"{n} servers is more than the limit of {max_servers} per request")
        super().__init__(n, enc.features)
        self.ids = [s.id for s in servers]
        self.position = {sid: i for i, sid in enumerate(self.ids)}
        if len(self.position) != n:
            seen: set = set()
            for i, sid in enumerate(self.ids):
                if sid in seen:
                    raise RequestError((*loc, i, "id"), f"duplicate server id {sid!r}; ids must be unique")
                seen.add(sid)
        def col(values: list) -> np.ndarray:  # fromiter on a list: ~3x faster than rows of tuples
            return np.fromiter(values, dtype=np.float64, count=n)

        self.power_l = [s.power_w for s in servers]
        self.busy_power_l = [s.power_w if s.busy_power_w is None else s.busy_power_w
                             for s in servers]
        self.set_servers(col([s.compute for s in servers]), col([s.memory_gb for s in servers]),
                         col(self.power_l), col(self.busy_power_l),
                         np.fromiter([s.accepting for s in servers], dtype=bool, count=n),
                         col([s.remaining_s for s in servers]))

    def __len__(self) -> int:
        return len(self.ids)

    def max_accepting_memory(self) -> float:
        m = self.memory[self.accepting]
        return float(m.max()) if m.size else -math.inf


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task's encoder inputs; ``parent_slot``: -1 = no finished parent, -2 = parent on a server
    not in the request (every server pays the transfer), else the server's position."""
    compute_gflop: float
    memory_gb: float
    output_gb: float
    successors: int
    completion_ratio: float
    parent_slot: int
    parent_output_gb: float
    ready_tasks: int = 1          # features.backlog only
    workflow_age_s: float = 0.0   # features.backlog only


def observe(task: TaskRow, servers: RequestServers, enc: EncoderSettings) -> dict[str, np.ndarray]:
    """The observation ``envs.encoding.encode`` gives for these descriptions, computed by the
    decision core's server table as in the simulator (tests check equality with ``encode``)."""
    f = enc.features
    transfer = 0.0
    if task.parent_slot != -1:
        transfer = task.parent_output_gb / enc.bandwidth_gb_s + enc.latency_s
    vec = task_vector(f, task.compute_gflop, task.memory_gb, task.successors,
                      task.completion_ratio, task.output_gb, task.ready_tasks,
                      int(servers.accepting.sum()) if f.backlog else 0, task.workflow_age_s)
    return servers.observe(vec, 0.0, transfer, task.parent_slot if task.parent_slot >= 0 else None,
                           task.memory_gb, enc.mask_infeasible)


def decide(lp: LoadedPolicy, obs: dict[str, np.ndarray]) -> tuple[int, np.ndarray]:
    """(chosen index, scores) of one observation."""
    scores = lp.policy.scores(obs)
    choice = int(np.argmax(scores)) if lp.argmax_act else int(lp.policy.act(obs))
    return choice, scores


def decide_batch(lp: LoadedPolicy, observations: list[dict[str, np.ndarray]]
                 ) -> list[tuple[int, np.ndarray]]:
    """Decisions for several observations: one padded forward for torch policies, else a loop.
    Padded servers carry mask 0, so they never attend and are never chosen."""
    if not lp.batched or len(observations) == 1:
        return [decide(lp, o) for o in observations]
    b = len(observations)
    n_max = max(o["servers"].shape[0] for o in observations)
    task = np.stack([o["task"] for o in observations])
    servers = np.zeros((b, n_max, observations[0]["servers"].shape[1]), dtype=np.float32)
    mask = np.zeros((b, n_max), dtype=np.float32)
    for i, o in enumerate(observations):
        n = o["servers"].shape[0]
        servers[i, :n] = o["servers"]
        mask[i, :n] = o["action_mask"]
    scores = lp.policy.scores({"task": task, "servers": servers, "action_mask": mask})
    out = []
    for i, o in enumerate(observations):
        s = scores[i, :o["servers"].shape[0]]
        out.append((int(np.argmax(s)), s))
    return out


def guarded(lp: LoadedPolicy, obs: dict[str, np.ndarray], choice: int, waits: int,
            ids: Sequence[Any]) -> tuple[int, dict | None]:
    """(the choice to answer, the guard note or None): ``choice`` checked by the policy's guard
    (``policies.guard``) given the task's ``waits`` so far; ``ids``: the request's server ids."""
    if lp.guard is None:
        return choice, None
    with lp.guard_lock:  # Guard.check counts; decisions may run in several threads
        final, why = lp.guard.check(obs, choice, waits)
    if why is None:
        return choice, None
    return final, {"reason": why, "proposed": ids[choice] if 0 <= choice < len(ids) else None}


def json_scores(scores: np.ndarray) -> list[float | None]:
    """Scores for JSON: masked (-inf) and non-finite entries become null."""
    lo, hi = -math.inf, math.inf
    return [x if lo < x < hi else None for x in scores.tolist()]  # also maps NaN to null


# ------------------------------------------------------------------------------- /v1/place
@dataclass(frozen=True)
class PreparedPlace:
    obs: dict[str, np.ndarray]
    servers: RequestServers
    memory_gb: float
    waits: int = 0


def prepare_place(req: PlaceRequest, lp: LoadedPolicy, max_servers: int) -> PreparedPlace:
    """Validate beyond the schema and build the observation."""
    if has_state_protocol(lp.policy):
        raise RequestError(("body", "task"), f"policy {lp.info['name']!r} plans on whole "
                           f"workflows and running tasks, not one task: use /v1/schedule")
    servers = RequestServers(req.servers, lp.encoder, max_servers)
    t = req.task
    if servers.max_accepting_memory() < t.memory_gb:
        raise RequestError(("body", "task", "memory_gb"),
                           f"{t.memory_gb} GB fits no accepting server (largest: "
                           f"{_fmt_mem(servers.max_accepting_memory())})", "no_fit")
    if t.parent_server is None:
        slot = -1
    else:
        slot = servers.position.get(t.parent_server, -2)
    ready_tasks, age = 1, 0.0
    if lp.encoder.features.backlog:
        for name in ("ready_tasks", "workflow_age_s"):
            if getattr(t, name) is None:
                raise RequestError(("body", "task", name), _BACKLOG_MISSING, "missing")
        ready_tasks, age = t.ready_tasks, t.workflow_age_s
    row = TaskRow(t.compute_gflop, t.memory_gb, t.output_gb, t.successors, t.completion_ratio,
                  slot, t.parent_output_gb, ready_tasks, age)
    return PreparedPlace(observe(row, servers, lp.encoder), servers, t.memory_gb, t.waits)


def place_answer(lp: LoadedPolicy, prep: PreparedPlace, choice: int, scores: np.ndarray) -> dict:
    """The /v1/place answer for the policy's ``choice``, after its guard."""
    choice, note = guarded(lp, prep.obs, choice, prep.waits, prep.servers.ids)
    return {"server": prep.servers.ids[choice], "index": choice,
            "valid": prep.servers.can_start(choice, prep.memory_gb),
            "scores": json_scores(scores), "policy": lp.info["name"],
            "policy_version": lp.info["version"], "guard": note}


def place(req: PlaceRequest, lp: LoadedPolicy, max_servers: int) -> dict:
    """POST /v1/place without batching (the handle path and tests)."""
    prep = prepare_place(req, lp, max_servers)
    choice, scores = decide(lp, prep.obs)
    return place_answer(lp, prep, choice, scores)


_BACKLOG_MISSING = ("field required: this policy was trained with features.backlog=true (it "
                    "reads ready tasks per server and workflow age)")


def _fmt_mem(m: float) -> str:
    return f"{m} GB" if math.isfinite(m) else "no server is accepting"


# ------------------------------------------------------------------------------- /v1/schedule
@dataclass(slots=True)
class _Ready:
    """A ready task of the request, as the decision core's queue holds it."""
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


def _workflow_ranks(wi: int, wf, ordering: str, mean_compute: float, enc: EncoderSettings
                    ) -> tuple[list[int], list[float]]:
    """(successor counts, the order's rank) of a workflow's listed tasks; validates the DAG."""
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
    order = kahn_order(children)
    if len(order) != n:
        placed = set(order)
        bad = next(j for j in range(n) if j not in placed)
        raise RequestError((*loc, bad, "parents"), f"the parents of workflow {wf.id!r} form a cycle")
    # envs.order's ranks want children after parents: renumber in Kahn order
    pos = {j: i for i, j in enumerate(order)}
    kids = [[pos[c] for c in children[j]] for j in order]
    tasks = [wf.tasks[j] for j in order]
    r = orders.ranks(ordering, [t.compute_gflop for t in tasks], [t.output_gb for t in tasks], kids,
                     mean_compute, enc.bandwidth_gb_s, enc.latency_s)
    rank = [0.0] * n
    for i, j in enumerate(order):
        rank[j] = r[i]
    return [len(c) for c in children], rank, kids, tasks


def prepare_schedule(req: ScheduleRequest, lp: LoadedPolicy, max_servers: int, max_tasks: int
                     ) -> tuple[RequestServers, list[_Ready]]:
    """Validate the request and list its ready tasks in the encoder's order (``envs.order``:
    the simulator's key, then workflow and task position)."""
    servers = RequestServers(req.servers, lp.encoder, max_servers)
    total = sum(len(w.tasks) for w in req.workflows)
    if total > max_tasks:
        raise RequestError(("body", "workflows"),
                           f"{total} tasks is more than the limit of {max_tasks} per request")
    wf_ids: set = set()
    enc = lp.encoder
    acc = servers.accepting
    mean_compute = orders.mean_compute(servers.compute[acc].tolist() if acc.any()
                                       else servers.compute.tolist())
    max_mem = servers.max_accepting_memory()
    fastest = float(servers.compute[acc].max()) if acc.any() else float(servers.compute.max())
    backlog = enc.features.backlog
    if backlog and req.now_s is None:
        raise RequestError(("body", "now_s"), _BACKLOG_MISSING, "missing")
    ready: list[_Ready] = []
    for wi, wf in enumerate(req.workflows):
        if wf.id in wf_ids:
            raise RequestError(("body", "workflows", wi, "id"), f"duplicate workflow id {wf.id!r}")
        wf_ids.add(wf.id)
        size = len(wf.tasks) if wf.size is None else wf.size
        if size < len(wf.tasks):
            raise RequestError(("body", "workflows", wi, "size"),
                               f"{size} is smaller than the {len(wf.tasks)} listed tasks")
        successors, rank, kids, listed = _workflow_ranks(wi, wf, enc.order, mean_compute, enc)
        level = orders.level_of_listed(enc.order, wf.arrival_s, wf.attained_s,
                                       [t.compute_gflop for t in listed], kids, mean_compute,
                                       fastest, enc.edf_factor)
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
                                   f"{_fmt_mem(max_mem)})", "no_fit")
            inputs = [(servers.position.get(i.server, -2), i.output_gb) for i in t.inputs]
            if inputs:
                slot, out = inputs[0]
            else:
                slot, out = -1, 0.0
            row = TaskRow(t.compute_gflop, t.memory_gb, t.output_gb, successors[j], ratio, slot,
                          out, workflow_age_s=age)
            key = orders.task_key(enc.order, rank[j], wf.arrival_s, wi, level) + (wi, j)
            ready.append(_Ready(key, wf, t, row, inputs, t.waits, wi, j))
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
    planned = has_state_protocol(lp.policy)
    if planned:  # the lookahead planner simulates the request (serve_apps.planning)
        plan, record = planner_ask(req, lp, servers)
    core = DecisionCore(servers, Rules(enc.head_of_line_blocking, enc.ask_only_startable,
                                       enc.mask_infeasible))
    for i, r in enumerate(ready):  # already in ready-task order; the position breaks no ties
        core.queue.push(r.key, i, r)
    backlog = enc.features.backlog
    assignments: list[dict] = []
    unassigned: list[dict] = []

    def ask(r: _Ready) -> int:
        if planned:
            return plan(r)
        # features.backlog: the tasks still ready are this one and those behind it (as in the
        # simulator, a task a wait set aside is not counted again)
        row = replace(r.row, ready_tasks=len(core.queue)) if backlog else r.row
        obs = observe(row, servers, enc)
        choice, _ = decide(lp, obs)
        choice, r.note = guarded(lp, obs, choice, r.waits, servers.ids)
        r.asked = True
        return choice

    def start(r: _Ready, choice: int) -> None:
        exec_s = r.row.compute_gflop / servers.compute_l[choice]
        delay = 0.0
        if enc.transfer_delays_start:
            delay = max((out / enc.bandwidth_gb_s + enc.latency_s
                         for slot, out in r.inputs if slot != choice), default=0.0)
        servers.start(choice, delay + exec_s)
        if planned:
            record(r, choice)
        assignments.append({"workflow": r.wf.id, "task": r.task.id,
                            "server": servers.ids[choice], "index": choice, "guard": r.note})

    def waited(r: _Ready, reason: str) -> None:
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
    if has_state_protocol(lp.policy):
        out = schedule(probe_request(), lp, 2, 2)
        if len(out["assignments"]) + len(out["unassigned"]) != 1:
            raise ValueError(f"policy {lp.spec!r} answered {out} for one ready task")
        return
    req = PlaceRequest.model_validate({
        "task": {"compute_gflop": 4.0, "memory_gb": 4.0, "ready_tasks": 1, "workflow_age_s": 0.0},
        "servers": [{"id": "a", "compute": 1.0, "memory_gb": 8.0},
                    {"id": "b", "compute": 4.0, "memory_gb": 80.0, "remaining_s": 1.0}]})
    choice, _ = decide(lp, prepare_place(req, lp, 2).obs)
    if not 0 <= choice < 2:
        raise ValueError(f"policy {lp.spec!r} answered index {choice} for 2 servers")
