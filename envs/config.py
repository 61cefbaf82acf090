"""Typed, validated configuration for the simulator (stdlib only).

Every configuration section of the project is a frozen dataclass whose fields carry their allowed
range in ``field(metadata=...)``. :func:`build` turns a plain mapping (from YAML) into such a
dataclass, recursively, and rejects unknown keys, wrong types and out-of-range values with a
:class:`ConfigError` that names the dotted key path (``env.workload.arrival_rate_16``) and the
allowed range. Nothing mutates a config after it is built; :func:`replace` derives a new one.

The simulator's own tree (:class:`EnvConfig`) lives here; training/serve/live configs in
``scale_ray.config`` use the same :func:`build`.
"""

from __future__ import annotations

import math
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .config_base import (ConfigError, build, merge, replace, rng, to_dict)  # noqa: F401
from . import dag_formats
from .agents import AgentsConfig
from .arrival_curves import ArrivalCurveConfig
from .demands import MEMORY, SLOT
from .nodes import NodeSpec
from .runtime import RuntimeConfig
from .sizing import SizingConfig
from .timing import Network

# --------------------------------------------------------------------------------------------
# The simulator's configuration tree
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DistConfig:
    """A clipped normal (``dist: normal``) or floored exponential (``dist: exponential``)."""
    dist: Literal["normal", "exponential", "constant"] = field(default="normal", metadata=rng(
        doc="normal (clipped to [min, max]), exponential (floored at min) or constant (always "
            "mean)"))
    mean: float = field(default=1.0, metadata=rng(ge=0, doc="the mean (constant: the value)"))
    std: float = field(default=0.0, metadata=rng(ge=0, doc="standard deviation (normal only)"))
    min: float = field(default=0.0, metadata=rng(ge=0, doc="lower clip"))
    max: float | None = field(default=None, metadata=rng(gt=0, doc="upper clip; none: unbounded"))

    def __post_init__(self) -> None:
        if self.max is not None and self.min > self.max:
            raise ConfigError(f"min ({self.min}) must not exceed max ({self.max})")


@dataclass(frozen=True)
class TierConfig:
    """One node shape and its share of the cluster: a server of one slot (paper Table 1: its
    speed and memory) or, with ``resources``, a Ray node that runs every task that fits."""
    name: str = field(metadata=rng(doc="tier name, unique (live: the node's scale.tier label)"))
    compute: float = field(default=1.0, metadata=rng(
        gt=0, doc="compute capacity C, GFLOP/s: the speed of CPU work"))
    memory_gb: float | None = field(default=None, metadata=rng(
        gt=0, doc="memory capacity M, GB (a node with resources: its memory resource)"))
    idle_w: float = field(default=0.0, metadata=rng(ge=0, doc="idle power, W"))
    busy_w: float = field(default=0.0, metadata=rng(ge=0, doc="busy power, W"))
    ratio: float = field(default=1.0, metadata=rng(ge=0, doc="share of the cluster (any scale)"))
    count: int | None = field(default=None, metadata=rng(ge=0, doc="explicit count; overrides ratio"))
    resources: dict[str, float] | None = field(default=None, metadata=rng(
        doc="Ray resources of one node (CPU, GPU, memory in GB, custom): it runs every task whose "
            "demands fit what is free; none: a server of one slot (the paper's)"))
    accelerator: str = field(default="", metadata=rng(
        doc="accelerator type of its GPUs (Ray's accelerator_type)"))
    gpu_speed: float | None = field(default=None, metadata=rng(
        gt=0, doc="speed of GPU work (default: compute)"))
    price_per_hour: float = field(default=0.0, metadata=rng(
        ge=0, le=1e6, doc="what one node costs per hour, billed by the second (cluster sizing: "
                          "docs/autoscale.md)"))
    launch_s: DistConfig | None = field(default=None, metadata=rng(
        doc="seconds from asking for a node to its joining (cluster sizing; billed from the "
            "ask); none: at once"))
    min_nodes: int = field(default=0, metadata=rng(
        ge=0, le=100_000, doc="cluster sizing: never fewer nodes of this tier"))
    max_nodes: int | None = field(default=None, metadata=rng(
        ge=0, le=100_000, doc="cluster sizing: never more nodes of this tier (none: no bound; "
                              "a sizer needs a bound on every tier or env.n_max)"))

    def __post_init__(self) -> None:
        if self.max_nodes is not None and self.min_nodes > self.max_nodes:
            raise ConfigError(f"cluster.tiers.{self.name}.min_nodes: {self.min_nodes} exceeds "
                              f"max_nodes ({self.max_nodes})")
        if self.resources is None:
            if self.memory_gb is None:
                raise ConfigError(f"cluster.tiers.{self.name}.memory_gb: required for a server "
                                  f"of one slot (or give the tier resources)")
            return
        try:
            spec = self.spec()
        except ValueError as e:
            raise ConfigError(f"cluster.tiers.{self.name}.{e}") from None
        if spec.resources.get("CPU", 0) <= 0:
            raise ConfigError(f"cluster.tiers.{self.name}.resources.CPU: must be > 0")
        if self.memory_gb is not None and self.memory_gb != spec.memory_gb:
            raise ConfigError(f"cluster.tiers.{self.name}.memory_gb: {self.memory_gb} differs "
                              f"from resources.memory ({spec.memory_gb}); give one")

    def __hash__(self) -> int:  # resources is a dict: hashed as its sorted items
        return hash((self.name, self.compute, self.memory_gb, self.idle_w, self.busy_w,
                     self.ratio, self.count, None if self.resources is None else
                     tuple(sorted(self.resources.items())), self.accelerator, self.gpu_speed,
                     self.price_per_hour, self.launch_s, self.min_nodes, self.max_nodes))

    @property
    def slotted(self) -> bool:
        """A server of one slot (no ``resources``): one task at a time."""
        return self.resources is None

    def spec(self) -> NodeSpec:
        """The node of this tier (``envs.nodes``)."""
        if self.resources is None:
            res = {SLOT: 1.0, MEMORY: float(self.memory_gb)}
        else:
            res = {k: float(v) for k, v in self.resources.items()}
            if self.memory_gb is not None:
                res.setdefault(MEMORY, float(self.memory_gb))
        return NodeSpec(self.name, res, self.compute, self.gpu_speed or self.compute,
                        self.accelerator, {}, self.idle_w, self.busy_w)


def _default_tiers() -> tuple[TierConfig, ...]:
    return (TierConfig("small", 1.0, 8.0, 30.0, 100.0, 2.0),
            TierConfig("medium", 2.0, 32.0, 50.0, 200.0, 5.0),
            TierConfig("large", 4.0, 80.0, 80.0, 400.0, 1.0))


@dataclass(frozen=True)
class ClusterConfig:
    """Server tiers and the cluster size. Counts come from ``ratio`` (largest remainder) unless a
    tier sets ``count``; with explicit counts for every tier, ``servers`` must equal their sum."""
    servers: int = field(default=16, metadata=rng(ge=1, le=100_000, doc="initial server count N"))
    tiers: tuple[TierConfig, ...] = field(default_factory=_default_tiers, metadata=rng(
        doc="server tiers (paper Table 1: small, medium, large)"))
    bandwidth_gb_s: float = field(default=10.0, metadata=rng(gt=0, doc="network bandwidth B"))
    latency_s: float = field(default=0.01, metadata=rng(ge=0, doc="base network latency L"))
    billing_min_s: float = field(default=60.0, metadata=rng(
        ge=0, le=86_400, doc="a node is billed at least this long (cloud VMs: 60 s)"))

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("cluster.tiers: at least one tier is required")
        if len({t.slotted for t in self.tiers}) > 1:
            raise ConfigError("cluster.tiers: either every tier is a server of one slot (no "
                              "resources) or every tier gives its Ray resources")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"cluster.tiers: tier names must be unique, got {names}")
        counts = [t.count for t in self.tiers]
        if all(c is not None for c in counts):
            if sum(counts) != self.servers:
                raise ConfigError(f"cluster.servers: {self.servers} differs from the explicit tier "
                                  f"counts, which sum to {sum(counts)}")
        elif sum(t.ratio for t in self.tiers if t.count is None) <= 0:
            raise ConfigError("cluster.tiers: tiers without a count need a positive total ratio")
        if sum(c for c in counts if c is not None) > self.servers:
            raise ConfigError(f"cluster.servers: {self.servers} is smaller than the explicit tier counts")
        for t in self.tiers:
            n = self.tier_counts()[t.name]
            if t.max_nodes is not None and n > t.max_nodes:
                raise ConfigError(f"cluster.tiers.{t.name}.max_nodes: {t.max_nodes} is below the "
                                  f"tier's initial count ({n})")

    @property
    def slotted(self) -> bool:
        """Servers of one slot (the paper's), not Ray nodes with resources."""
        return self.tiers[0].slotted

    @property
    def network(self) -> Network:
        """The network (``envs.timing``)."""
        return Network(self.bandwidth_gb_s, self.latency_s)

    def nodes(self) -> list[NodeSpec]:
        """The nodes of ``servers``: each tier's node, ``tier_counts`` times, tiers in order."""
        counts = self.tier_counts()
        return [t.spec() for t in self.tiers for _ in range(counts[t.name])]

    def tier(self, name: str) -> TierConfig:
        for t in self.tiers:
            if t.name == name:
                return t
        raise ConfigError(f"unknown tier {name!r}; tiers: {[t.name for t in self.tiers]}")

    def tier_counts(self) -> dict[str, int]:
        """Servers per tier at ``self.servers``: explicit counts first, the rest split by ratio
        with the largest-remainder method (2:5:1 at 16 -> 4, 10, 2; at 48 -> 12, 30, 6)."""
        fixed = {t.name: t.count for t in self.tiers if t.count is not None}
        rest = self.servers - sum(fixed.values())
        free = [t for t in self.tiers if t.count is None]
        total = sum(t.ratio for t in free)
        quotas = [(t.name, rest * t.ratio / total) for t in free] if free else []
        counts = {name: int(math.floor(q)) for name, q in quotas}
        left = rest - sum(counts.values())
        order = sorted(quotas, key=lambda nq: (-(nq[1] - math.floor(nq[1])), nq[0]))
        for name, _ in order[:left]:
            counts[name] += 1
        counts.update(fixed)
        return {t.name: counts[t.name] for t in self.tiers}


@dataclass(frozen=True)
class ToolProfileConfig:
    """Estimated demands of one kind of primitive (a modality or tool kind) with no measurement."""
    kind: str = field(metadata=rng(doc="modality / tool kind, e.g. text, image, api, pegasus_job"))
    compute_gflop: float = field(metadata=rng(gt=0, doc="compute demand, GFLOP"))
    memory_gb: float = field(metadata=rng(ge=0, doc="memory demand, GB"))
    output_gb: float = field(metadata=rng(ge=0, doc="output handed to each child, GB"))


@dataclass(frozen=True)
class ResourceMappingConfig:
    """How real DAG files become demands (envs.loaders; values in configs/env/workloads/base.yaml).

    Measured traces: compute_gflop = runtime_s x CPU fraction x reference_gflop_per_core_s.
    Structure-only sources: the profile of the primitive's kind (``profiles``, else ``default``).
    """
    reference_gflop_per_core_s: float = field(metadata=rng(
        gt=0, doc="GFLOP/s of one core of the traced machines"))
    min_compute_gflop: float = field(metadata=rng(
        gt=0, doc="floor for measured compute (a zero-runtime task still takes a decision)"))
    max_memory_gb: float = field(metadata=rng(
        gt=0, doc="measured memory is clipped to this (the largest tier must fit every task)"))
    default: ToolProfileConfig = field(metadata=rng(doc="the profile of a kind not in profiles"))
    profiles: tuple[ToolProfileConfig, ...] = field(default=(), metadata=rng(
        doc="estimated demands per primitive kind (unique kinds)"))
    aux_prefixes: tuple[str, ...] = field(default=(), metadata=rng(
        doc="node-name prefixes of Pegasus auxiliary jobs (kind pegasus_aux)"))

    def __post_init__(self) -> None:
        kinds = [p.kind for p in self.profiles]
        if len(set(kinds)) != len(kinds):
            raise ConfigError(f"resources.profiles: kinds must be unique, got {kinds}")

    def profile(self, kind: str) -> ToolProfileConfig:
        """The profile of ``kind``, or the default profile."""
        for p in self.profiles:
            if p.kind == kind:
                return p
        return self.default


# Formats of workload.dag_format: the registry's (envs.dag_formats), detected from a file's
# content by envs.loaders.dags, or "auto".
DagFormat = Literal[("auto", *dag_formats.NAMES)]  # type: ignore[valid-type]
DAG_FORMATS: tuple[str, ...] = typing.get_args(DagFormat)


@dataclass(frozen=True)
class ProgramsConfig:
    """The agent-program generator (``workload.source: programs``, envs/program_source.py):
    ReAct loops, plan-and-execute fan-outs that may re-plan, and routers that branch. Assumed
    shapes and sizes (docs/workloads.md), not measured."""
    react: float = field(default=0.5, metadata=rng(ge=0, doc="weight of ReAct loops"))
    plan: float = field(default=0.3, metadata=rng(ge=0, doc="weight of plan-and-execute programs"))
    branch: float = field(default=0.2, metadata=rng(ge=0, doc="weight of routers that branch"))
    react_steps_mean: float = field(default=4.0, metadata=rng(
        ge=1, le=100, doc="mean think-act steps of a ReAct loop (geometric, at least 1)"))
    max_steps: int = field(default=20, metadata=rng(ge=1, le=1000, doc="most ReAct steps"))
    fanout_min: int = field(default=2, metadata=rng(ge=1, le=1000, doc="fewest parallel calls "
                                                    "of a plan's fan-out"))
    fanout_max: int = field(default=6, metadata=rng(ge=1, le=1000, doc="most parallel calls of "
                                                    "a plan's fan-out (uniform)"))
    replan_prob: float = field(default=0.5, metadata=rng(
        ge=0, le=1, doc="a plan re-plans after a fan-out with this probability (another fan-out)"))
    max_replans: int = field(default=2, metadata=rng(ge=0, le=100, doc="most re-plans of a plan"))
    llm_gflop: DistConfig = field(default=DistConfig("normal", 6.0, 2.0, 1.0), metadata=rng(
        doc="a model call's compute, GFLOP"))
    tool_gflop: DistConfig = field(default=DistConfig("normal", 2.0, 1.0, 0.5), metadata=rng(
        doc="a tool call's compute, GFLOP"))

    def __post_init__(self) -> None:
        if self.react + self.plan + self.branch <= 0:
            raise ConfigError("workload.programs: react, plan and branch weights are all 0; "
                              "give at least one a positive weight")
        if self.fanout_min > self.fanout_max:
            raise ConfigError(f"workload.programs.fanout_min ({self.fanout_min}) exceeds "
                              f"fanout_max ({self.fanout_max})")


@dataclass(frozen=True)
class WorkloadConfig:
    """Workflow arrivals and the random DAG generator (docs/simulator.md)."""
    source: str = field(default="random", metadata=rng(
        doc="'random' for the paper's generator, 'programs' for agent programs "
            "(envs/program_source.py), 'agents' for agent requests on Ray nodes "
            "(envs/agents.py), or a real-DAG family name (envs.loaders)"))
    order: Literal["sample", "replay"] = field(default="sample", metadata=rng(
        doc="real-DAG sources: 'sample' draws workflows with replacement, 'replay' takes them in "
            "file order"))
    arrival_rate_16: float = field(default=1.0, metadata=rng(
        gt=0, le=1e4, doc="lambda16: workflows/s at 16 servers; lambda(N) = lambda16 * N / 16"))
    rate_schedule: tuple[tuple[float, float], ...] = field(default=(), metadata=rng(
        ge=0, doc="[[t_s, multiplier], ...]: piecewise-constant rate multiplier from t_s on"))
    curve: ArrivalCurveConfig = field(default_factory=ArrivalCurveConfig, metadata=rng(
        doc="a time-varying rate (envs/arrival_curves.py): none (the default, the constant "
            "rate), diurnal (a sinusoid with bursts) or trace (a per-minute count file); "
            "rate_schedule multiplies it"))
    horizon_s: float = field(default=200.0, metadata=rng(gt=0, le=1e7, doc="arrivals stop here"))
    min_tasks: int = field(default=3, metadata=rng(
        ge=1, le=10_000, doc="fewest tasks of a generated workflow (uniform in [min_tasks, "
                             "max_tasks])"))
    max_tasks: int = field(default=8, metadata=rng(
        ge=1, le=10_000, doc="most tasks of a generated workflow"))
    edge_prob: float = field(default=0.3, metadata=rng(ge=0, le=1, doc="extra-parent probability"))
    compute_gflop: DistConfig = field(default=DistConfig("normal", 4.0, 2.0, 1.0), metadata=rng(
        doc="a generated task's compute demand, GFLOP"))
    memory_gb: DistConfig = field(default=DistConfig("normal", 8.0, 6.0, 0.5, 64.0), metadata=rng(
        doc="a generated task's memory demand, GB"))
    output_gb: DistConfig = field(default=DistConfig("exponential", 0.5, 0.0, 0.01), metadata=rng(
        doc="a generated task's output handed to each child, GB"))
    resources: ResourceMappingConfig | None = field(default=None, metadata=rng(
        doc="demand mapping of the real-DAG families (required by them; see docs/workloads.md)"))
    dags: tuple[str, ...] = field(default=(), metadata=rng(
        doc="source 'dags': DAG files or directories (searched recursively), any supported format"))
    dag_format: DagFormat = field(default="auto", metadata=rng(
        doc="source 'dags': 'auto' detects each file's format from its content, or force one"))
    programs: ProgramsConfig = field(default_factory=ProgramsConfig, metadata=rng(
        doc="source 'programs': the agent-program generator's shapes and sizes"))
    agents: AgentsConfig = field(default_factory=AgentsConfig, metadata=rng(
        doc="source 'agents': agent requests on Ray nodes (envs/agents.py)"))
    gpu_load: float | None = field(default=None, metadata=rng(
        gt=0, lt=1, doc="the offered GPU load: the arrival rate that keeps this share of the "
                        "cluster's GPU speed busy (replaces arrival_rate_16; needs GPU work and "
                        "nodes with GPUs)"))
    on_invalid: Literal["raise", "skip"] | None = field(default=None, metadata=rng(
        doc="an invalid record or file: 'raise' aborts naming it, 'skip' skips and counts it "
            "(logged at WARNING); default: the family's own rule ('raise' for 'dags')"))

    def __post_init__(self) -> None:
        if self.source == "dags" and not self.dags:
            raise ConfigError("workload.dags: name at least one DAG file or directory for "
                              "workload.source 'dags'")
        if self.min_tasks > self.max_tasks:
            raise ConfigError(f"workload.min_tasks ({self.min_tasks}) exceeds max_tasks ({self.max_tasks})")
        times = [t for t, _ in self.rate_schedule]
        if times != sorted(times):
            raise ConfigError("workload.rate_schedule: times must be increasing")
        if self.curve.kind == "trace":
            if self.gpu_load is not None:
                raise ConfigError("workload.gpu_load: a trace curve (workload.curve.kind: trace) "
                                  "sets the rate itself (count / 60 x curve.scale); unset one")
            end = self.curve.trace_s()
            if not self.curve.repeat and self.horizon_s > end:
                raise ConfigError(f"workload.horizon_s: {self.horizon_s} s passes the end of "
                                  f"workload.curve.path {self.curve.path} ({end:g} s); shorten "
                                  f"it or set workload.curve.repeat: true")


@dataclass(frozen=True)
class ServerEventConfig:
    """A scheduled change of the server set."""
    t: float = field(metadata=rng(ge=0, doc="simulated time, s"))
    kind: Literal["add", "remove", "fail"] = field(metadata=rng(
        doc="add servers, remove them (drain: they leave when idle) or fail them (their running "
            "tasks are lost)"))
    tier: str | None = field(default=None, metadata=rng(
        doc="the servers' tier (required for add; remove/fail: choose among this tier)"))
    count: int = field(default=1, metadata=rng(
        ge=1, le=100_000, doc="servers added, removed or failed"))
    server: int | None = field(default=None, metadata=rng(ge=0, doc="server id (remove/fail)"))


@dataclass(frozen=True)
class DynamicsConfig:
    """Servers that join, leave or fail (scheduled and random; all policy-independent)."""
    events: tuple[ServerEventConfig, ...] = field(default=(), metadata=rng(
        doc="scheduled server changes (ServerEventConfig)"))
    fail_rate_per_server_s: float = field(default=0.0, metadata=rng(
        ge=0, le=10, doc="random failures per server per s (Poisson)"))
    rejoin_after_s: float | None = field(default=None, metadata=rng(
        ge=0, doc="a failed server's replacement (same tier) joins after this delay"))
    join_rate_s: float = field(default=0.0, metadata=rng(ge=0, le=1e4, doc="random joins per s"))
    leave_rate_s: float = field(default=0.0, metadata=rng(ge=0, le=1e4, doc="random leaves per s"))


@dataclass(frozen=True)
class RewardConfig:
    """Paper eq. 2: w1 exp(-T_exec/T0) - w2 T_comm/T0c - w3 E/E0; invalid -> invalid_penalty."""
    w1: float = field(default=1.0, metadata=rng(
        ge=0, doc="weight of the execution term exp(-T_exec / T0)"))
    w2: float = field(default=0.5, metadata=rng(
        ge=0, doc="weight of the communication term T_comm / T0c"))
    w3: float = field(default=0.0, metadata=rng(ge=0, doc="weight of the energy term E / E0"))
    t0_s: float = field(default=2.0, metadata=rng(gt=0, doc="T0: execution time scale, s"))
    t0c_s: float = field(default=0.1, metadata=rng(gt=0, doc="T0c: communication time scale, s"))
    e0_j: float = field(default=1000.0, metadata=rng(gt=0, doc="E0: energy scale, J"))
    invalid_penalty: float = field(default=-0.1, metadata=rng(
        le=0, doc="the reward of a wait (an invalid pick)"))
    kind: Literal["paper", "response"] = field(default="paper", metadata=rng(
        doc="'response' adds -wait_penalty_per_s * (tasks waiting) * elapsed time (beyond the paper)"))
    wait_penalty_per_s: float = field(default=0.01, metadata=rng(
        ge=0, doc="kind response: penalty per waiting task per simulated s"))


@dataclass(frozen=True)
class MdpConfig:
    """Decision semantics (paper §4.1) and the switches beyond it."""
    wait_dt_s: float = field(default=0.1, metadata=rng(gt=0, le=100, doc="clock advance on a wait"))
    mask_infeasible: bool = field(default=False, metadata=rng(
        doc="the action mask also hides servers the task's memory does not fit (paper: only absent "
            "and draining servers)"))
    advance_to_next_event: bool = field(default=False, metadata=rng(
        doc="a wait moves the clock to the next event, not by wait_dt_s (realistic.yaml and live: "
            "true)"))
    transfer_delays_start: bool = field(default=False, metadata=rng(
        doc="a task starts once its parents' outputs arrived from other servers (max of d/B + L); "
            "false: transfers count in the reward only"))
    head_of_line_blocking: bool = field(default=True, metadata=rng(
        doc="a wait holds the whole ready set until the clock moves (the paper); false: only that "
            "task is set aside"))
    ask_only_startable: bool = field(default=False, metadata=rng(
        doc="beyond the paper: when no server can start the task now (every action would be a "
            "wait), wait without asking the policy, as the live scheduler does"))
    order: Literal["hop", "upward_rank", "fifo", "edf", "srpt", "las"] | None = field(
        default=None, metadata=rng(
            doc="the order ready tasks are placed in (envs/order.py): hop (the paper's), "
                "upward_rank (HEFT), fifo (oldest workflow first), edf, srpt, las; unset: what "
                "the policy needs, else hop (the live library, Serve and the service: fifo)"))
    submission: Literal["dag", "program", "per_call"] = field(default="dag", metadata=rng(
        doc="what the order may read of a workflow (envs/programs.py): dag, the whole DAG at "
            "arrival (the paper's); program, each call once it exists, as a call of its program "
            "(edf's bound and srpt's work estimated from finished programs); per_call, each call "
            "alone, a one-task workflow arriving when it is ready"))
    edf_factor: float = field(default=2.0, metadata=rng(
        ge=0, le=1000, doc="order edf: deadline = arrival + this x the critical-path lower bound"))
    first_level: Literal["hop", "upward_rank"] | None = field(default=None, metadata=rng(
        doc="deprecated alias of order (warns)"))
    node_look: int = field(default=64, metadata=rng(
        ge=0, le=10**9, doc="a placement round sets aside at most this many ready tasks that fit "
                            "no node now, the rest wait for the next round (envs/decision.py: a "
                            "round's cost stays bounded under any backlog); 0: no bound"))
    max_decisions: int = field(default=2_000_000, metadata=rng(ge=1, doc="truncation cap"))
    max_time_factor: float = field(default=10.0, metadata=rng(
        ge=1, doc="truncate when the clock passes horizon_s * this factor"))

    def __post_init__(self) -> None:
        if self.first_level is not None:  # the deprecated alias: becomes order
            warnings.warn("mdp.first_level is deprecated: use mdp.order", FutureWarning,
                          stacklevel=2)
            if self.order is not None and self.order != self.first_level:
                raise ConfigError(f"mdp.first_level: {self.first_level!r} contradicts mdp.order: "
                                  f"{self.order!r}; set only mdp.order")
            object.__setattr__(self, "order", self.first_level)
            object.__setattr__(self, "first_level", None)


@dataclass(frozen=True)
class FeatureConfig:
    """Fixed normalisation constants (never depend on N or on batch statistics)."""
    compute_gflop: float = field(default=10.0, metadata=rng(
        gt=0, doc="GFLOP per unit of the task compute feature"))
    memory_gb: float = field(default=64.0, metadata=rng(
        gt=0, doc="GB per unit of the task memory feature"))
    successors: float = field(default=8.0, metadata=rng(
        gt=0, doc="children per unit of the successors feature"))
    output_gb: float = field(default=1.0, metadata=rng(gt=0, doc="paper: unnormalised (1.0)"))
    server_compute: float = field(default=4.0, metadata=rng(
        gt=0, doc="GFLOP/s per unit of the server compute feature"))
    server_memory_gb: float = field(default=80.0, metadata=rng(
        gt=0, doc="GB per unit of the server memory feature"))
    remaining_s: float = field(default=10.0, metadata=rng(
        gt=0, doc="s per unit of the remaining busy time (and workflow age) feature"))
    power_w: float = field(default=400.0, metadata=rng(gt=0, doc="W per unit of the power feature"))
    transfer_s: float = field(default=1.0, metadata=rng(
        gt=0, doc="s per unit of the transfer time feature"))
    clip: float = field(default=100.0, metadata=rng(gt=0, doc="features are clipped to [0, clip]"))
    backlog: bool = field(default=False, metadata=rng(
        doc="beyond the paper: two more task features that expose backlog and waiting, the ready "
            "tasks per accepting server (/ backlog_per_server) and the age of the task's "
            "workflow, now - arrival (/ remaining_s); the live scheduler computes them from its "
            "state, Serve from request fields (ready_tasks, workflow_age_s / now_s)"))
    backlog_per_server: float = field(default=1.0, metadata=rng(
        gt=0, doc="ready tasks per accepting server per unit of the backlog feature"))
    workload_scale: float = field(default=1.0, metadata=rng(
        gt=0, le=1e6, doc="beyond the paper: time-like features (task compute, remaining busy "
                          "time, workflow age) are divided by this on top of their constants, "
                          "so a workload whose tasks are k times the paper's (mean 4 GFLOP) "
                          "looks like the paper's to a trained policy: set k = mean task "
                          "compute / 4 GFLOP (`scale-ray workloads stats` prints it; "
                          "docs/workloads.md); 1 = the paper's units"))

    @property
    def compute_unit(self) -> float:
        """GFLOP per unit of the task compute feature (``compute_gflop * workload_scale``)."""
        return self.compute_gflop * self.workload_scale

    @property
    def time_unit(self) -> float:
        """Seconds per unit of the remaining-time and workflow-age features."""
        return self.remaining_s * self.workload_scale


@dataclass(frozen=True)
class EnvConfig:
    """The whole simulator/environment configuration."""
    cluster: ClusterConfig = field(default=ClusterConfig(), metadata=rng(
        doc="servers: tiers, size, network (ClusterConfig)"))
    workload: WorkloadConfig = field(default=WorkloadConfig(), metadata=rng(
        doc="workflow arrivals and their DAGs (WorkloadConfig)"))
    dynamics: DynamicsConfig = field(default=DynamicsConfig(), metadata=rng(
        doc="servers that join, leave or fail (DynamicsConfig)"))
    reward: RewardConfig = field(default=RewardConfig(), metadata=rng(
        doc="the per-decision reward (RewardConfig; paper eq. 2)"))
    mdp: MdpConfig = field(default=MdpConfig(), metadata=rng(
        doc="decision semantics: waits, masks, order, truncation (MdpConfig)"))
    features: FeatureConfig = field(default=FeatureConfig(), metadata=rng(
        doc="the observation's fixed normalisation (FeatureConfig)"))
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig, metadata=rng(
        doc="run times: noise, heavy tail, hints, the online estimator, hedging (envs/runtime.py)"))
    objective: Literal["workflow", "task"] = field(default="workflow", metadata=rng(
        doc="what better means (envs/objective.py): workflow response, or the paper's mean task "
            "response; the response reward and the lookahead planner read it"))
    n_max: int | None = field(default=None, metadata=rng(
        ge=1, le=100_000, doc="observation padding; default: enough for the run's servers"))
    sizing: SizingConfig = field(default_factory=SizingConfig, metadata=rng(
        doc="who sizes the cluster and against which SLO (envs/sizing.py, docs/autoscale.md); "
            "static: nobody (the default)"))
    encoder: Literal["paper", "nodes"] = field(default="paper", metadata=rng(
        doc="what a learned policy sees (envs/encoding.py): paper, the paper's task and server "
            "features; nodes, each node's run, start, fit and free resources for the task"))

    def __post_init__(self) -> None:
        names = {t.name for t in self.cluster.tiers}
        for i, ev in enumerate(self.dynamics.events):
            if ev.tier is not None and ev.tier not in names:
                raise ConfigError(f"dynamics.events[{i}].tier: unknown tier {ev.tier!r}; "
                                  f"tiers: {sorted(names)}")
            if ev.kind == "add" and ev.tier is None:
                raise ConfigError(f"dynamics.events[{i}].tier: required for kind 'add'")
        if self.n_max is not None and self.n_max < self.cluster.servers:
            raise ConfigError(f"n_max: {self.n_max} is smaller than cluster.servers "
                              f"({self.cluster.servers})")
        for tier in self.sizing.ray.min_workers:
            if tier not in names:
                raise ConfigError(f"sizing.ray.min_workers.{tier}: unknown tier; tiers: "
                                  f"{sorted(names)}")
        if self.sizing.policy != "static" and self.n_max is None and any(
                t.max_nodes is None for t in self.cluster.tiers):
            raise ConfigError("sizing.policy: a sizer needs cluster.tiers[*].max_nodes on every "
                              "tier (or env.n_max) to bound the cluster")

    @property
    def padded_servers(self) -> int:
        """Observation width: n_max, or the servers plus every scheduled/random addition bound."""
        if self.n_max is not None:
            return self.n_max
        if self.sizing.policy != "static":  # a sizer may grow every tier to its bound
            return max(self.cluster.servers, sum(t.max_nodes for t in self.cluster.tiers))
        extra = sum(ev.count for ev in self.dynamics.events if ev.kind == "add")
        return self.cluster.servers + extra + (self.cluster.servers if (
            self.dynamics.rejoin_after_s is not None or self.dynamics.join_rate_s > 0) else 0)

    def with_servers(self, servers: int) -> "EnvConfig":
        """The same setting at another cluster size (tier mix scales by ratio)."""
        n_max = None if self.n_max is None else max(self.n_max, servers)
        return replace(self, cluster={"servers": servers}, n_max=n_max)


def load_env_config(data: Mapping[str, Any] | None) -> EnvConfig:
    """Build an :class:`EnvConfig` from a mapping (the ``env`` section of a YAML file)."""
    return build(EnvConfig, data or {}, "env")
