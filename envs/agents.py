"""A workload that looks like agents on Ray (``configs/env/agents.yaml``; every number's source
in docs/workloads.md): a cluster of CPU nodes and GPU nodes of two accelerator types, and agent
workflows whose LLM calls ask for a GPU or a fraction of one (faster on the bigger accelerator)
and whose tool calls ask for CPUs and memory.

One agent request is: a *plan* LLM call; a fan-out of tool calls; after each tool, with
probability ``reflect_p``, an LLM call that reads its result; a final *answer* LLM call that
depends on everything before it. Computes are in seconds on a speed-1 node (CPU work: any node
of the cluster; GPU work: the smaller accelerator), drawn from lognormals with the stated means.

The config is validated like every other section (``envs.config_base.build``: unknown keys and
out-of-range values are refused, naming the key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .config_base import ConfigError, build, rng, to_dict
from .config_files import read_yaml, resolve_config_path
from .nodes import NodeSpec, check_demands
from .order import ORDERS


__all__ = ["AgentsConfig", "NodeTypeConfig", "AgentTask", "NodeEnvSpec", "load_agents",
           "load_agents_config", "node_specs", "sample_request"]


@dataclass(frozen=True)
class NodeTypeConfig:
    """One node shape of the cluster and its share of the nodes."""
    name: str = field(metadata=rng(doc="the shape's name (a tier)"))
    resources: dict[str, float] = field(metadata=rng(doc="Ray resources of one node: CPU, GPU, memory "
                                             "(GB), custom resources"))
    ratio: float = field(default=1.0, metadata=rng(gt=0, doc="share of the nodes (largest "
                                                           "remainder, as cluster.tiers)"))
    accelerator: str = field(default="", metadata=rng(doc="accelerator type of its GPUs "
                                                          "(Ray's accelerator_type)"))
    cpu_speed: float = field(default=1.0, metadata=rng(gt=0, doc="speed of CPU work"))
    gpu_speed: float = field(default=1.0, metadata=rng(gt=0, doc="speed of GPU work"))

    def __post_init__(self) -> None:
        try:
            check_demands(self.resources, f"nodes.{self.name}.resources")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.resources.get("CPU", 0) <= 0:
            raise ConfigError(f"nodes.{self.name}.resources.CPU: must be > 0")


@dataclass(frozen=True)
class CallConfig:
    """One kind of call: its demands (a choice per request) and its compute."""
    gpu: tuple[float, ...] = field(default=(0.0,), metadata=rng(ge=0, doc="GPU demand choices"))
    gpu_p: tuple[float, ...] = field(default=(), metadata=rng(ge=0, doc="their probabilities "
                                                                       "(empty: uniform)"))
    cpu: tuple[float, ...] = field(default=(1.0,), metadata=rng(gt=0, doc="CPU demand choices"))
    memory_gb: tuple[float, float] = field(default=(1.0, 1.0), metadata=rng(
        ge=0, doc="memory demand, uniform in [lo, hi] GB"))
    compute_s: float = field(default=1.0, metadata=rng(gt=0, doc="mean compute, seconds on a "
                                                               "speed-1 node"))
    sigma: float = field(default=0.5, metadata=rng(ge=0, le=3, doc="lognormal sigma of compute"))


@dataclass(frozen=True)
class AgentsConfig:
    """The agents-on-Ray setting (module docstring)."""
    nodes: tuple[NodeTypeConfig, ...] = field(metadata=rng(doc="the node shapes"))
    llm: CallConfig = field(default_factory=CallConfig, metadata=rng(doc="LLM calls"))
    tool: CallConfig = field(default_factory=CallConfig, metadata=rng(doc="tool calls"))
    fanout: tuple[int, int] = field(default=(1, 6), metadata=rng(ge=1, doc="tool calls per "
                                                                        "request, uniform"))
    reflect_p: float = field(default=0.5, metadata=rng(ge=0, le=1, doc="chance a tool's "
                                                                     "result is read by an LLM"))
    gpu_load: float = field(default=0.6, metadata=rng(gt=0, lt=1, doc="offered GPU load: "
                            "arrival rate x expected GPU-seconds / the cluster's GPU speed"))
    horizon_s: float = field(default=600.0, metadata=rng(gt=0, doc="arrivals stop here"))
    order: str = field(default="fifo", metadata=rng(doc="ready order (envs.order): fifo "
                       "(oldest request first), hop (longest path first), upward_rank (HEFT's), "
                       "edf, srpt or las; work in seconds at each kind's mean node speed"))
    edf_factor: float = field(default=2.0, metadata=rng(gt=0, doc="edf: deadline = arrival + "
                              "factor x the critical path on the fastest nodes"))
    preferred_head: bool = field(default=False, metadata=rng(doc="Ray default: the driver's "
                                 "node (node 0) is preferred, as Ray prefers the local node"))
    run_noise: float = field(default=0.0, metadata=rng(ge=0, le=3, doc="lognormal sigma of a "
                             "run's time around its planned one (mean 1, hidden from the rules; "
                             "envs/node_hedging.py); 0: runs take exactly their planned time"))
    hedge_quantile: float = field(default=0.0, metadata=rng(ge=0, lt=1, doc="0: no hedging; "
                                  "q: a run past the q-quantile of its time gets a backup copy "
                                  "on the fastest other node where it fits (envs/node_hedging.py)"))

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ConfigError("nodes: at least one node shape")
        if self.order not in ORDERS:
            raise ConfigError(f"order: {self.order!r} is not allowed; choose one of {list(ORDERS)}")
        if self.hedge_quantile > 0 and self.run_noise <= 0:
            raise ConfigError("hedge_quantile: hedging needs run_noise > 0 (without noise no run "
                              "is ever late)")
        if self.fanout[0] > self.fanout[1]:
            raise ConfigError(f"fanout: {list(self.fanout)} must be [lo, hi] with lo <= hi")
        for name, c in (("llm", self.llm), ("tool", self.tool)):
            if c.gpu_p and len(c.gpu_p) != len(c.gpu):
                raise ConfigError(f"{name}.gpu_p: {len(c.gpu_p)} probabilities for "
                                  f"{len(c.gpu)} choices")
            if c.memory_gb[0] > c.memory_gb[1]:
                raise ConfigError(f"{name}.memory_gb: [lo, hi] with lo <= hi")

    def counts(self, n: int) -> list[tuple[NodeTypeConfig, int]]:
        """Nodes per shape at ``n`` nodes (largest remainder, ties by name)."""
        total = sum(t.ratio for t in self.nodes)
        quotas = [n * t.ratio / total for t in self.nodes]
        counts = [int(math.floor(q)) for q in quotas]
        left = n - sum(counts)
        for k in sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - counts[k]),
                                                           self.nodes[k].name))[:left]:
            counts[k] += 1
        return list(zip(self.nodes, counts))


def load_agents(data: Mapping[str, Any]) -> AgentsConfig:
    """The validated config from a mapping (the YAML file's content)."""
    return build(AgentsConfig, data)


def load_agents_config(src: str | Mapping[str, Any],
                       overrides: Mapping[str, Any] | None = None) -> AgentsConfig:
    """An agents config from a YAML path (the repository's configs/ or any path) or a
    mapping (with ``file``: that file's keys, then the mapping's), with ``overrides`` of its
    top-level keys."""
    raw = dict(src) if isinstance(src, Mapping) else read_yaml(resolve_config_path(src))
    if "file" in raw:
        raw = read_yaml(resolve_config_path(raw.pop("file"))) | raw
    raw.update(overrides or {})
    return load_agents(raw)


@dataclass(frozen=True)
class NodeEnvSpec:
    """The env of a training run in Ray's resource model (``cluster_model: nodes``): the
    agents config and the training cluster's size (``envs.node_env`` builds it)."""
    agents: AgentsConfig
    nodes: int = 16

    def env_config(self, seed: int | None = None) -> dict[str, Any]:
        """``envs.node_env.NodeSelectEnv``'s config (RLlib's env_config)."""
        return {"agents": to_dict(self.agents), "nodes": self.nodes,
                **({"seed": seed} if seed is not None else {})}

    @classmethod
    def load(cls, agents: str | Mapping[str, Any], nodes: int) -> "NodeEnvSpec":
        return cls(load_agents_config(agents), nodes)


def node_specs(cfg: AgentsConfig, n: int) -> list[NodeSpec]:
    """The ``n`` nodes, shapes in config order."""
    out = []
    for t, c in cfg.counts(n):
        out += [NodeSpec(t.name, dict(t.resources), t.cpu_speed, t.gpu_speed, t.accelerator)
                for _ in range(c)]
    return out


class AgentTask:
    """One call of a request: demands, compute (seconds on a speed-1 node), parents; ``factors``:
    what its run and a hedged copy take over their planned time (None: drawn by the simulator,
    ``envs.node_hedging``; a live bench draws them once for live and twin alike)."""
    __slots__ = ("name", "demands", "compute", "parents", "factors")

    def __init__(self, name: str, demands: tuple, compute: float, parents: tuple[int, ...],
                 factors: tuple[float, float] | None = None):
        self.name, self.demands, self.compute, self.parents = name, demands, compute, parents
        self.factors = factors


def _call(c: CallConfig, rng_: np.random.Generator, name: str, parents: tuple) -> AgentTask:
    p = np.asarray(c.gpu_p, dtype=float) if c.gpu_p else None
    gpu = float(c.gpu[int(rng_.choice(len(c.gpu), p=None if p is None else p / p.sum()))])
    cpu = float(c.cpu[int(rng_.integers(0, len(c.cpu)))])
    mem = float(rng_.uniform(*c.memory_gb))
    # lognormal with mean compute_s: mu = ln(mean) - sigma^2 / 2
    comp = float(rng_.lognormal(math.log(c.compute_s) - c.sigma ** 2 / 2, c.sigma))
    d = {"CPU": cpu, "memory": round(mem, 3)}
    if gpu:
        d["GPU"] = gpu
    return AgentTask(name, tuple(sorted(d.items())), max(comp, 1e-3), parents)


def sample_request(cfg: AgentsConfig, rng_: np.random.Generator) -> list[AgentTask]:
    """One agent request, tasks in topological order (module docstring)."""
    tasks = [_call(cfg.llm, rng_, "plan", ())]
    ends = []
    for k in range(int(rng_.integers(cfg.fanout[0], cfg.fanout[1] + 1))):
        tasks.append(_call(cfg.tool, rng_, f"tool{k}", (0,)))
        last = len(tasks) - 1
        if rng_.random() < cfg.reflect_p:
            tasks.append(_call(cfg.llm, rng_, f"read{k}", (last,)))
            last = len(tasks) - 1
        ends.append(last)
    tasks.append(_call(cfg.llm, rng_, "answer", tuple(ends)))
    return tasks


def expected_gpu_seconds(cfg: AgentsConfig, rng_: np.random.Generator, samples: int = 4000
                         ) -> float:
    """Mean GPU-fraction x compute seconds (on a speed-1 GPU) per request, by sampling."""
    tot = 0.0
    for _ in range(samples):
        for t in sample_request(cfg, rng_):
            g = dict(t.demands).get("GPU", 0.0)
            tot += g * t.compute
    return tot / samples
