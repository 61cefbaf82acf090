"""The paper's random DAG generator, Poisson arrivals, and the workload sources by name
(numpy + stdlib).

:func:`make_source` turns ``workload.source`` into a :class:`WorkflowSource`: ``random`` is the
paper's generator (:class:`RandomDagSource`), ``programs`` the agent-program generator
(``envs.program_source``); every other name is a real-DAG family or ``dags``,
from the registry of ``envs.loaders`` (:data:`envs.loaders.SOURCES`). The workflow model itself
(:class:`WorkflowSpec`, :class:`TaskSpec`, :func:`topological_spec`, :class:`ListSource`) lives in
``envs.workflow``; it is imported here for the modules that use it from ``envs.workload``.
"""

from __future__ import annotations

import copy

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .agents import AgentSource
from .config import DistConfig, WorkloadConfig
from .loaders import SOURCES as LOADER_SOURCES
from .program_source import ProgramSource
from .workflow import (ListSource, TaskSpec, WorkflowError, WorkflowSource, WorkflowSpec,
                       topological_spec)


def draw(dist: DistConfig, rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` values from a clipped normal / floored exponential / constant."""
    if dist.dist == "normal":
        v = rng.normal(dist.mean, dist.std, size) if dist.std > 0 else np.full(size, dist.mean)
    elif dist.dist == "exponential":
        v = rng.exponential(dist.mean, size) if dist.mean > 0 else np.zeros(size)
    else:
        v = np.full(size, dist.mean)
    return np.clip(v, dist.min, dist.max)


@dataclass
class RandomDagSource:
    """The paper's generator: 3-8 primitives; each non-first node gets one parent drawn from the
    earlier nodes plus each other earlier node with probability ``edge_prob``.

    Workflows are drawn in batches of ``batch`` (vectorised; the stream is still a deterministic
    function of the generator's seed).
    """
    cfg: WorkloadConfig
    batch: int = 32
    _buffer: list[WorkflowSpec] = field(default_factory=list, init=False, repr=False)

    def forget_drawn(self) -> None:
        """Drop the workflows drawn ahead: the next ones come from the generator's state."""
        self._buffer = []

    def next_workflow(self, rng: np.random.Generator) -> WorkflowSpec:
        if not self._buffer:
            self._buffer = self._generate(rng)[::-1]
        return self._buffer.pop()

    def _generate(self, rng: np.random.Generator) -> list[WorkflowSpec]:
        c = self.cfg
        k = self.batch
        sizes = rng.integers(c.min_tasks, c.max_tasks + 1, k).tolist()
        total, width = sum(sizes), max(sizes)
        compute = draw(c.compute_gflop, rng, total).tolist()
        memory = draw(c.memory_gb, rng, total).tolist()
        output = draw(c.output_gb, rng, total).tolist()
        first = (rng.random((k, width)) * np.arange(width)).astype(np.int64)
        extra = rng.random((k, width, width)) < c.edge_prob
        if width <= _PARENT_TABLE_WIDTH:
            # Parent sets as bitmasks (bit j: parent j), looked up in a table of index tuples:
            # the same DAGs as the loop below, several times faster.
            bits = extra @ _POW2[:width]
            bits |= _POW2[first]
            bits &= _POW2[:width] - 1  # only earlier nodes
            rows = bits.tolist()
            table = _parent_table()
        else:
            rows, table = None, None
            first_l, extra_l = first.tolist(), extra.tolist()
        out, pos = [], 0
        for w, n in enumerate(sizes):
            tasks = []
            for i in range(n):
                if rows is not None:
                    parents = table[rows[w][i]]
                else:
                    row = extra_l[w][i]
                    row[first_l[w][i]] = True
                    parents = tuple([j for j in range(i) if row[j]])
                tasks.append(TaskSpec(compute[pos], memory[pos], output[pos], parents))
                pos += 1
            out.append(WorkflowSpec(tuple(tasks), "random"))
        return out


_PARENT_TABLE_WIDTH = 12  # DAGs up to this many nodes use the lookup table (4096 tuples)
_POW2 = 1 << np.arange(_PARENT_TABLE_WIDTH, dtype=np.int64)
_PARENT_TABLE: list[tuple[int, ...]] = []


def _parent_table() -> list[tuple[int, ...]]:
    """Index tuples of every parent bitmask over ``_PARENT_TABLE_WIDTH`` nodes (built once)."""
    if not _PARENT_TABLE:
        w = _PARENT_TABLE_WIDTH
        _PARENT_TABLE.extend(tuple(j for j in range(w) if b >> j & 1) for b in range(1 << w))
    return _PARENT_TABLE


# Workload sources by ``workload.source``: the paper's generator and the loaders' families.
SOURCES: dict[str, Callable[[WorkloadConfig], WorkflowSource]] = {
    "random": RandomDagSource, "programs": ProgramSource, "agents": AgentSource,
    **LOADER_SOURCES,
}


def make_source(cfg: WorkloadConfig) -> WorkflowSource:
    """The workflow source named by ``cfg.source``."""
    if cfg.source not in SOURCES:
        raise WorkflowError(f"workload.source: unknown source {cfg.source!r}; "
                            f"known: {sorted(SOURCES)}")
    return SOURCES[cfg.source](cfg)


def sample_workflows(cfg: WorkloadConfig, n: int = 2000, seed: int = 0) -> Sequence[WorkflowSpec]:
    """What ``cfg``'s source offers: a list source's workflows, else ``n`` drawn from one
    generator of ``seed`` (what ``--load`` measures the mean work of)."""
    src = make_source(cfg)
    fixed = getattr(src, "workflows", None)
    if fixed:
        return fixed
    rng = np.random.default_rng(seed)
    return [src.next_workflow(rng) for _ in range(n)]


class ArrivalProcess:
    """Poisson arrivals at ``base_rate`` times a piecewise-constant multiplier, up to a horizon.

    Exact for piecewise-constant rates: an exponential gap that crosses a schedule boundary is
    redrawn from the boundary (memorylessness).
    """

    def __init__(self, base_rate: float, schedule: Sequence[tuple[float, float]], horizon_s: float,
                 rng: np.random.Generator, batch: int = 256):
        self.base_rate = base_rate
        self.schedule = list(schedule)
        self.horizon_s = horizon_s
        self.rng = rng
        self._batch = batch
        self._gaps: list[float] = []  # unit-rate exponential gaps, drawn in batches

    def copy(self, rng: np.random.Generator) -> "ArrivalProcess":
        """An independent copy drawing from ``rng`` (its gaps drawn ahead copied)."""
        out = copy.copy(self)
        out._gaps = list(self._gaps)
        out.rng = rng
        return out

    def forget_drawn(self) -> None:
        """Drop the gaps drawn ahead: the next ones come from the generator's state."""
        self._gaps = []

    def _unit_gap(self) -> float:
        if not self._gaps:
            self._gaps = self.rng.exponential(1.0, self._batch).tolist()[::-1]
        return self._gaps.pop()

    def _multiplier(self, t: float) -> tuple[float, float]:
        """(multiplier in force at t, time of the next change or inf)."""
        mult, nxt = 1.0, math.inf
        for ts, m in self.schedule:
            if ts <= t:
                mult = m
            else:
                nxt = ts
                break
        return mult, nxt

    def next_time(self, t: float) -> float | None:
        """Time of the next arrival after ``t``, or None when past the horizon."""
        while True:
            mult, nxt = self._multiplier(t)
            rate = self.base_rate * mult
            gap = self._unit_gap() / rate if rate > 0 else math.inf
            if t + gap < nxt:
                t = t + gap
                break
            if nxt == math.inf:
                return None
            t = nxt
        return t if t < self.horizon_s else None


# the workflow model (envs.workflow) is importable from here too, for the simulator and the live
# scheduler
__all__ = ["draw", "RandomDagSource", "SOURCES", "make_source", "ArrivalProcess", "ListSource",
           "TaskSpec", "WorkflowError", "WorkflowSource", "WorkflowSpec", "topological_spec"]
