"""The workflow model every workload produces: :class:`WorkflowSpec`, a tuple of
:class:`TaskSpec` in topological order, each naming its parents by index into that tuple;
:func:`topological_spec` builds one from named nodes and edges and rejects cycles and unknown links
with a message naming the record. Also the :class:`WorkflowSource` protocol and
:class:`ListSource`, the source over a fixed list that the real-DAG loaders (``envs.loaders``)
return. numpy + stdlib; imports nothing else of ``envs`` (the loaders and ``envs.workload`` build on
it).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from . import order as orders


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
    kind: str = ""  # the primitive it calls (envs.runtime; default: from its name)
    hedge: bool = False  # may be backed up when it straggles (runtime.hedge: marked)
    # the Ray demands its options name beyond memory (envs.demands: CPU when given, GPU, custom
    # resources, the accelerator marker, label terms), sorted (resource, amount) pairs
    demands: tuple[tuple[str, float], ...] = ()
    # what its run and a hedged copy take over their planned time (None: drawn by the
    # simulator's run model; a live bench draws them once for live and twin alike)
    factors: tuple[float, float] | None = None


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
        return orders.hop_ranks(self.children())

    def upward_ranks(self, mean_compute: float, bandwidth_gb_s: float, latency_s: float) -> list[float]:
        """HEFT upward rank: mean run time plus the longest (transfer + rank) over children
        (:func:`envs.order.upward_ranks`)."""
        return orders.upward_ranks([t.compute_gflop for t in self.tasks],
                                  [t.output_gb for t in self.tasks], self.children(),
                                  mean_compute, bandwidth_gb_s, latency_s)


def kahn_order(children: Sequence[Sequence[int]]) -> list[int]:
    """Nodes ``0..n-1`` in a parents-first order (Kahn's algorithm: roots in index order, then
    children as their last parent is placed), from each node's children. Shorter than ``n``
    when the links hold a cycle (the nodes left out are on it or below it)."""
    n = len(children)
    indeg = [0] * n
    for kids in children:
        for c in kids:
            indeg[c] += 1
    order = [i for i in range(n) if indeg[i] == 0]
    for i in order:  # `order` grows while iterating
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                order.append(c)
    return order


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
        tasks.append(spec._replace(parents=tuple(sorted(pos[p] for p in parents[old])),
                                   name=spec.name or names[old]))
    return WorkflowSpec(tuple(tasks), name)


class WorkflowSource(Protocol):
    """Produces workflow templates; ``rng`` is the workload's own generator."""
    def next_workflow(self, rng: np.random.Generator) -> WorkflowSpec: ...


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
