"""The placement service's decisions, without Ray: loading a policy with its encoder settings,
a request's servers as the one table of nodes (``envs.nodes``: servers of one slot), a decision
as a policy sees it (:class:`RequestState`, ``policies.base.State``: heuristics read the table,
a trained network the paper observation, ``envs.encoding``) and ``place`` (one task);
``schedule`` (a placement round over a request's ready tasks) is in :mod:`serve_apps.schedule`.

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
from envs.demands import MEMORY, SLOT
from envs.encoding import PaperEncoder, ServerView, TaskFacts, slot_table
from envs import order as orders
from envs.programs import require_dag
from envs.timing import Network
from policies import HEURISTICS, Policy, get_policy
from policies.guard import Guard, GuardConfig
from policies.base import ObservationPolicy, is_planner

from .schemas import PlaceRequest, RequestError, Server

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

    @property
    def network(self) -> Network:
        return Network(self.bandwidth_gb_s, self.latency_s)

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
    policy = get_policy(spec, env, seed, guard)
    features = getattr(policy, "features", None) or env.features
    if workload_scale is not None:
        features = replace(features, workload_scale=workload_scale)
    mdp = require_dag(env, "the placement service").mdp
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
    if getattr(policy, "encoder", "paper") != "paper":
        raise ValueError(f"policy {spec!r}: trained on the nodes encoder (Ray's nodes); the "
                         f"placement service describes servers of one slot (the paper's "
                         f"features): serve it in the scheduler service instead")
    batched = hasattr(policy, "net")  # policies.artifact.TorchPolicy: one forward for a batch
    argmax_act = batched or (isinstance(policy, ObservationPolicy)
                             and type(policy).act is ObservationPolicy.act)
    return LoadedPolicy(spec, policy, encoder, info, batched, argmax_act,
                        getattr(policy, "guard", None))


# ------------------------------------------------------------------------------- decisions
class RequestServers:
    """One request's servers as the one table of nodes (``envs.nodes``: servers of one slot; a
    busy one runs a placeholder until its ``remaining_s``), with their ids. Mutable:
    /v1/schedule takes a started task's slot. The clock is the request's instant (0)."""

    def __init__(self, servers: Sequence[Server], enc: EncoderSettings, max_servers: int,
                 loc: tuple = ("body", "servers")):
        n = len(servers)
        if n > max_servers:
            raise RequestError(loc, f"{n} servers is more than the limit of {max_servers} per request")
        self.ids = [s.id for s in servers]
        self.position = {sid: i for i, sid in enumerate(self.ids)}
        if len(self.position) != n:
            seen: set = set()
            for i, sid in enumerate(self.ids):
                if sid in seen:
                    raise RequestError((*loc, i, "id"), f"duplicate server id {sid!r}; ids must be unique")
                seen.add(sid)
        self.table = slot_table([ServerView(s.compute, s.memory_gb, s.remaining_s, s.power_w,
                                            s.accepting, s.busy_power_w) for s in servers])
        self.encoder = PaperEncoder(enc.features, n, enc.mask_infeasible)

    def __len__(self) -> int:
        return len(self.ids)

    def max_accepting_memory(self) -> float:
        t = self.table
        return max((t.memory_l[i] for i in range(t.n) if t.accept_l[i]), default=-math.inf)


@dataclass(slots=True)
class TaskRow:
    """A task of a request as a policy reads it; ``parent_slot``: -1 = no finished parent, -2 =
    parent on a server not in the request (every server pays the transfer), else the server's
    position. ``waits``: how often it was answered with a wait so far (the guard's budget)."""
    compute_gflop: float
    memory_gb: float
    output_gb: float
    successors: int
    completion_ratio: float
    parent_slot: int
    parent_output_gb: float
    ready_tasks: int = 1          # features.backlog only
    workflow_age_s: float = 0.0   # features.backlog only
    waits: int = 0
    gpu = False

    @property
    def compute(self) -> float:
        return self.compute_gflop

    @property
    def demands(self) -> tuple:
        """What it holds on a server of one slot (``envs.demands``)."""
        m = self.memory_gb
        return ((MEMORY, m), (SLOT, 1.0)) if m > 0 else ((SLOT, 1.0),)


class RequestState:
    """One decision of the placement service (``policies.base.State``): the request's table, the
    task, the request's instant (0), its input's server and transfer."""

    __slots__ = ("servers", "table", "task", "now", "parent", "transfer_s", "transfer_delays")

    def __init__(self, servers: RequestServers, task: TaskRow, enc: EncoderSettings):
        self.servers, self.table, self.task, self.now = servers, servers.table, task, 0.0
        self.parent = task.parent_slot if task.parent_slot >= 0 else -1
        self.transfer_s = (enc.network.transfer_s(task.parent_output_gb)
                           if task.parent_slot != -1 else 0.0)
        self.transfer_delays = enc.transfer_delays_start

    def observe(self) -> dict[str, np.ndarray]:
        t = self.task
        facts = TaskFacts(t.compute_gflop, t.memory_gb, t.successors, t.completion_ratio,
                          t.output_gb, self.transfer_s, self.parent, t.ready_tasks,
                          t.workflow_age_s)
        return self.servers.encoder.observe(self.table, t, facts, 0.0)

    def simulator(self) -> Any:
        raise RuntimeError("a planner plans a whole /v1/schedule request (serve_apps.planning)")


def decide(lp: LoadedPolicy, state: RequestState) -> tuple[int, np.ndarray | None]:
    """(chosen index, scores: a trained network's, None for a rule) of one decision, before
    the guard."""
    policy = lp.policy
    if not isinstance(policy, ObservationPolicy):
        return int(policy.decide(state)), None
    obs = state.observe()
    scores = policy.scores(obs)
    choice = int(np.argmax(scores)) if lp.argmax_act else int(policy.act(obs))
    return choice, scores


def decide_batch(lp: LoadedPolicy, states: list[RequestState]
                 ) -> list[tuple[int, np.ndarray | None]]:
    """Decisions for several states: one padded forward for torch policies, else one by one.
    Padded servers carry mask 0, so they never attend and are never chosen."""
    if not lp.batched or len(states) == 1:
        return [decide(lp, s) for s in states]
    observations = [s.observe() for s in states]
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


def guarded(lp: LoadedPolicy, state: RequestState, choice: int) -> tuple[int, dict | None]:
    """(the choice to answer, the guard note or None): ``choice`` checked by the policy's guard
    (``policies.guard``) given the task's waits so far."""
    if lp.guard is None:
        return choice, None
    with lp.guard_lock:  # Guard.check counts; decisions may run in several threads
        final, why = lp.guard.check(state, choice)
    if why is None:
        return choice, None
    ids = state.servers.ids
    return final, {"reason": why, "proposed": ids[choice] if 0 <= choice < len(ids) else None}


def json_scores(scores: np.ndarray) -> list[float | None]:
    """Scores for JSON: masked (-inf) and non-finite entries become null."""
    lo, hi = -math.inf, math.inf
    return [x if lo < x < hi else None for x in scores.tolist()]  # also maps NaN to null


# ------------------------------------------------------------------------------- /v1/place
def prepare_place(req: PlaceRequest, lp: LoadedPolicy, max_servers: int) -> RequestState:
    """Validate beyond the schema: the decision's state."""
    if is_planner(lp.policy):
        raise RequestError(("body", "task"), f"policy {lp.info['name']!r} plans on whole "
                           f"workflows and running tasks, not one task: use /v1/schedule")
    servers = RequestServers(req.servers, lp.encoder, max_servers)
    t = req.task
    if servers.max_accepting_memory() < t.memory_gb:
        raise RequestError(("body", "task", "memory_gb"),
                           f"{t.memory_gb} GB fits no accepting server (largest: "
                           f"{fmt_mem(servers.max_accepting_memory())})", "no_fit")
    if t.parent_server is None:
        slot = -1
    else:
        slot = servers.position.get(t.parent_server, -2)
    ready_tasks, age = 1, 0.0
    if lp.encoder.features.backlog:
        for name in ("ready_tasks", "workflow_age_s"):
            if getattr(t, name) is None:
                raise RequestError(("body", "task", name), BACKLOG_MISSING, "missing")
        ready_tasks, age = t.ready_tasks, t.workflow_age_s
    row = TaskRow(t.compute_gflop, t.memory_gb, t.output_gb, t.successors, t.completion_ratio,
                  slot, t.parent_output_gb, ready_tasks, age, t.waits)
    return RequestState(servers, row, lp.encoder)


def place_answer(lp: LoadedPolicy, state: RequestState, choice: int,
                 scores: np.ndarray | None) -> dict:
    """The /v1/place answer for the policy's ``choice``, after its guard."""
    choice, note = guarded(lp, state, choice)
    return {"server": state.servers.ids[choice], "index": choice,
            "valid": state.table.fits_now(choice, state.task.demands),
            "scores": None if scores is None else json_scores(scores), "policy": lp.info["name"],
            "policy_version": lp.info["version"], "guard": note}


def place(req: PlaceRequest, lp: LoadedPolicy, max_servers: int) -> dict:
    """POST /v1/place without batching (the handle path and tests)."""
    state = prepare_place(req, lp, max_servers)
    choice, scores = decide(lp, state)
    return place_answer(lp, state, choice, scores)


BACKLOG_MISSING = ("field required: this policy was trained with features.backlog=true (it "
                    "reads ready tasks per server and workflow age)")


def fmt_mem(m: float) -> str:
    return f"{m} GB" if math.isfinite(m) else "no server is accepting"
