"""Agent requests on Ray nodes (``workload.source: agents``; ``configs/env/agents.yaml``, every
number's source in docs/workloads.md): LLM calls ask for a GPU or a fraction of one (faster on
the bigger accelerator), tool calls for CPUs and memory.

One agent request is: a *plan* LLM call; a fan-out of tool calls; after each tool, with
probability ``reflect_p``, an LLM call that reads its result; a final *answer* LLM call that
depends on everything before it. Computes are in seconds on a speed-1 node (CPU work: any node
of the cluster; GPU work: the smaller accelerator), drawn from lognormals with the stated means.
Calls pass small messages: no output to transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .config_base import ConfigError, rng
from .demands import CPU, GPU
from .workflow import TaskSpec, WorkflowSpec

__all__ = ["AgentsConfig", "CallConfig", "AgentSource", "expected_gpu_seconds"]


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

    def __post_init__(self) -> None:
        if self.gpu_p and len(self.gpu_p) != len(self.gpu):
            raise ConfigError(f"gpu_p: {len(self.gpu_p)} probabilities for {len(self.gpu)} "
                              f"choices")
        if self.memory_gb[0] > self.memory_gb[1]:
            raise ConfigError(f"memory_gb: {list(self.memory_gb)} must be [lo, hi] with lo <= hi")


@dataclass(frozen=True)
class AgentsConfig:
    """The agent requests (module docstring): ``workload.agents``."""
    llm: CallConfig = field(default_factory=lambda: CallConfig(gpu=(1.0,)), metadata=rng(
        doc="LLM calls (plan, read, answer)"))
    tool: CallConfig = field(default_factory=CallConfig, metadata=rng(doc="tool calls"))
    fanout: tuple[int, int] = field(default=(1, 6), metadata=rng(ge=1, doc="tool calls per "
                                                                        "request, uniform"))
    reflect_p: float = field(default=0.5, metadata=rng(ge=0, le=1, doc="chance a tool's "
                                                                     "result is read by an LLM"))

    def __post_init__(self) -> None:
        if self.fanout[0] > self.fanout[1]:
            raise ConfigError(f"fanout: {list(self.fanout)} must be [lo, hi] with lo <= hi")


def _call(c: CallConfig, rng_: np.random.Generator, name: str, parents: tuple) -> TaskSpec:
    p = np.asarray(c.gpu_p, dtype=float) if c.gpu_p else None
    gpu = float(c.gpu[int(rng_.choice(len(c.gpu), p=None if p is None else p / p.sum()))])
    cpu = float(c.cpu[int(rng_.integers(0, len(c.cpu)))])
    mem = float(rng_.uniform(*c.memory_gb))
    # lognormal with mean compute_s: mu = ln(mean) - sigma^2 / 2
    comp = float(rng_.lognormal(math.log(c.compute_s) - c.sigma ** 2 / 2, c.sigma))
    named = ((CPU, cpu),) + (((GPU, gpu),) if gpu else ())
    return TaskSpec(max(comp, 1e-3), round(mem, 3), 0.0, parents, name, demands=named)


def sample_request(cfg: AgentsConfig, rng_: np.random.Generator) -> WorkflowSpec:
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
    return WorkflowSpec(tuple(tasks), "agents")


class AgentSource:
    """The workload source of ``workload.source: agents`` (``envs.workload.SOURCES``)."""

    def __init__(self, workload) -> None:
        self.cfg = workload.agents

    def next_workflow(self, rng_: np.random.Generator) -> WorkflowSpec:
        return sample_request(self.cfg, rng_)


def expected_gpu_seconds(cfg: AgentsConfig, rng_: np.random.Generator, samples: int = 4000
                         ) -> float:
    """Mean GPU-fraction x compute seconds (on a speed-1 GPU) per request, by sampling."""
    tot = 0.0
    for _ in range(samples):
        for t in sample_request(cfg, rng_).tasks:
            tot += dict(t.demands).get(GPU, 0.0) * t.compute_gflop
    return tot / samples
