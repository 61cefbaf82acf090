"""Workflow model, the paper's random DAG generator, and Poisson arrivals (numpy + stdlib).

A workflow is a :class:`WorkflowSpec`: a tuple of :class:`TaskSpec` in topological order, each
naming its parents by index into that tuple. Generators and the real-DAG loaders
(``envs.loaders``) all produce this one shape; :func:`topological_spec` builds it from named nodes
and edges and rejects cycles and unknown links with a message naming the record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from .config import DistConfig, WorkloadConfig


class WorkflowError(ValueError):
    """A workflow description is invalid (cycle, unknown link, bad resource value)."""


class TaskSpec(NamedTuple):
    """One primitive: resource demands and parent indices (all smaller than its own index).

    Immutable (a NamedTuple: cheap to create in the simulator's hot path)."""
    compute_gflop: float
    memory_gb: float
    output_gb: float
    parents: tuple[int, ...] = ()
    name: str = ""
    estimated: bool = False  # resources come from a profile, not a measurement


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """A DAG of primitives in topological order."""
    tasks: tuple[TaskSpec, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.tasks:
            raise WorkflowError(f"workflow {self.name!r}: has no tasks")
        isfinite = math.isfinite
        for i, t in enumerate(self.tasks):
            if t.parents and (min(t.parents) < 0 or max(t.parents) >= i):
                bad = next(p for p in t.parents if not 0 <= p < i)
                raise WorkflowError(f"workflow {self.name!r}: task {i} ({t.name!r}) has parent "
                                    f"{bad}, which is not an earlier task (indices 0..{i - 1})")
            c, m, o = t.compute_gflop, t.memory_gb, t.output_gb
            try:
                ok = c > 0 and m >= 0 and o >= 0 and isfinite(c + m + o)
            except TypeError:
                ok = False
            if not ok:
                for fname, v, lo in (("compute_gflop", c, "> 0"), ("memory_gb", m, ">= 0"),
                                     ("output_gb", o, ">= 0")):
                    good = isinstance(v, (int, float)) and isfinite(v) and (v > 0 if lo == "> 0" else v >= 0)
                    if not good:
                        raise WorkflowError(f"workflow {self.name!r}: task {i} ({t.name!r}) field "
                                            f"{fname} must be a finite number {lo}, got {v!r}")

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.tasks]
        for i, t in enumerate(self.tasks):
            for p in t.parents:
                out[p].append(i)
        return out

    def hop_ranks(self) -> list[int]:
        """Longest hop-count path from each task to a sink (a sink has rank 0)."""
        kids = self.children()
        rank = [0] * len(self.tasks)
        for i in range(len(self.tasks) - 1, -1, -1):
            if kids[i]:
                rank[i] = 1 + max(rank[c] for c in kids[i])
        return rank

    def upward_ranks(self, mean_compute: float, bandwidth_gb_s: float, latency_s: float) -> list[float]:
        """HEFT upward rank: mean run time plus the longest (transfer + rank) over children."""
        kids = self.children()
        rank = [0.0] * len(self.tasks)
        for i in range(len(self.tasks) - 1, -1, -1):
            t = self.tasks[i]
            comm = t.output_gb / bandwidth_gb_s + latency_s
            rank[i] = t.compute_gflop / mean_compute + max(
                (comm + rank[c] for c in kids[i]), default=0.0)
        return rank


def topological_spec(name: str, nodes: Mapping[str, TaskSpec], edges: Iterable[tuple[str, str]],
                     where: str = "") -> WorkflowSpec:
    """Build a :class:`WorkflowSpec` from named nodes and (parent, child) edges.

    Nodes keep their input order where the edges allow (Kahn's algorithm, stable). Raises
    :class:`WorkflowError` naming ``where`` and the record for links to unknown nodes and cycles.
    """
    label = f"{where}: " if where else ""
    names = list(nodes)
    index = {n: i for i, n in enumerate(names)}
    parents: list[list[int]] = [[] for _ in names]
    for src, dst in edges:
        if src not in index:
            raise WorkflowError(f"{label}workflow {name!r}: edge ({src!r} -> {dst!r}) names unknown node {src!r}")
        if dst not in index:
            raise WorkflowError(f"{label}workflow {name!r}: edge ({src!r} -> {dst!r}) names unknown node {dst!r}")
        if src == dst:
            raise WorkflowError(f"{label}workflow {name!r}: self-loop on node {src!r}")
        if index[src] not in parents[index[dst]]:
            parents[index[dst]].append(index[src])
    indeg = [len(p) for p in parents]
    kids: list[list[int]] = [[] for _ in names]
    for i, ps in enumerate(parents):
        for p in ps:
            kids[p].append(i)
    import heapq
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for c in kids[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(names):
        stuck = sorted(names[i] for i, d in enumerate(indeg) if d > 0)
        raise WorkflowError(f"{label}workflow {name!r}: contains a cycle through nodes {stuck[:10]}")
    pos = {old: new for new, old in enumerate(order)}
    tasks = []
    for old in order:
        spec = nodes[names[old]]
        tasks.append(TaskSpec(spec.compute_gflop, spec.memory_gb, spec.output_gb,
                              tuple(sorted(pos[p] for p in parents[old])),
                              spec.name or names[old], spec.estimated))
    return WorkflowSpec(tuple(tasks), name)


def draw(dist: DistConfig, rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` values from a clipped normal / floored exponential / constant."""
    if dist.dist == "normal":
        v = rng.normal(dist.mean, dist.std, size) if dist.std > 0 else np.full(size, dist.mean)
    elif dist.dist == "exponential":
        v = rng.exponential(dist.mean, size) if dist.mean > 0 else np.zeros(size)
    else:
        v = np.full(size, dist.mean)
    return np.clip(v, dist.min, dist.max)


class WorkflowSource(Protocol):
    """Produces workflow templates; ``rng`` is the workload's own generator."""
    def next_workflow(self, rng: np.random.Generator) -> WorkflowSpec: ...


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


@dataclass
class ListSource:
    """Samples (with replacement) or replays (in order, cycling) a fixed list of workflows."""
    workflows: Sequence[WorkflowSpec]
    order: str = "sample"
    _next: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.workflows:
            raise WorkflowError("workload: the workflow list is empty")

    def next_workflow(self, rng: np.random.Generator) -> WorkflowSpec:
        if self.order == "replay":
            wf = self.workflows[self._next % len(self.workflows)]
            self._next += 1
            return wf
        return self.workflows[int(rng.integers(0, len(self.workflows)))]


# Real-DAG families register a factory here (envs.loaders does it on import).
SOURCES: dict[str, Callable[[WorkloadConfig], WorkflowSource]] = {
    "random": RandomDagSource,
}


def make_source(cfg: WorkloadConfig) -> WorkflowSource:
    """The workflow source named by ``cfg.source``."""
    if cfg.source not in SOURCES:
        try:  # real-DAG families live in envs.loaders, imported lazily
            from . import loaders  # noqa: F401
        except ImportError:
            pass
    if cfg.source not in SOURCES:
        raise WorkflowError(f"workload.source: unknown source {cfg.source!r}; "
                            f"known: {sorted(SOURCES)}")
    return SOURCES[cfg.source](cfg)


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
