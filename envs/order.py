"""The order in which ready tasks are placed (``mdp.order``): one strategy object per order, the
only place keys are built, for the simulator, ``/v1/schedule``, the live runtime and the
scheduler service.

Every driver makes one :class:`Order` (:func:`make`) and asks it for the keys of a workflow's
tasks when the workflow arrives (:meth:`Order.arrive`) and for the workflow's new level when one
of its tasks finishes (:meth:`Order.on_finish`, dynamic orders only); it pushes ready tasks on
the decision core's :class:`envs.decision.ReadyQueue` under their key (smallest first, then the
task id). The orders:

=============  ===================================================================  ==========
order          key (smaller first)                                                   changes
=============  ===================================================================  ==========
``hop``        longest hop-count path to a sink first, then workflow arrival        never
               (the paper's; interleaves the first tasks of every workflow)
``upward_rank`` HEFT's upward rank (work at the mean speed + transfers) first, then  never
               arrival
``fifo``       oldest workflow first (arrival, workflow id), then longest hop path  never
``edf``        deadline ``arrival + edf_factor x critical-path lower bound``         never
               first, then as ``fifo``
``srpt``       least remaining work of the workflow (its unfinished tasks' work at  on finish
               the mean speed) first, then as ``fifo``
``las``        least attained service of the workflow (run seconds of its finished  on finish
               tasks; Autellix's PLAS: needs no run-time estimate) first, then as
               ``fifo``
=============  ===================================================================  ==========

A key is a tuple: ``(-rank, arrival)`` (``hop``, ``upward_rank``: the paper's exact key),
``(arrival, workflow, -rank)`` (``fifo``), else ``(level, arrival, workflow, -rank)`` with the
workflow's *level* (its deadline, remaining work or attained service). A dynamic order's level
moves when a task finishes; the driver then pushes the workflow's ready tasks again under their
new keys (the queue drops an entry whose key is no longer its task's), so nothing is rebuilt at
a decision.

Work is priced by :class:`Costs`, the cluster as an order sees it: a task's work is its compute
at the mean speed of the nodes that do its kind of work (GPU work: the nodes with GPUs), its
*fast* time the compute at the fastest node its memory fits (the critical-path lower bound), a
transfer the network's ``output / bandwidth + latency`` (``envs.timing``). All in model seconds.

NumPy-free, stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable, NamedTuple, Sequence

from .timing import Network

ORDERS = ("hop", "upward_rank", "fifo", "edf", "srpt", "las")
#: the order the simulator uses when neither the config nor the policy names one (the paper's)
PAPER_ORDER = "hop"
#: the order of the live runtime, the scheduler service and Serve when their env config names
#: none (measured: docs/simulator.md, "The order of ready tasks")
SERVING_ORDER = "fifo"


class OrderConflict(ValueError):
    """The config and a policy need different orders."""


def resolve(configured: str | None, needed: str | None, policy: str = "the policy",
            default: str = PAPER_ORDER) -> str:
    """The order to run: ``configured`` (``mdp.order``), else what the policy ``needs`` (HEFT:
    ``upward_rank``), else ``default``. Raises :class:`OrderConflict` naming both when the
    config and the policy disagree (nothing is overridden silently)."""
    if needed is None or configured == needed:
        return configured or default
    if configured is None:
        return needed
    raise OrderConflict(
        f"policy {policy!r} needs mdp.order={needed!r}, but the config sets mdp.order="
        f"{configured!r}; pass --set mdp.order={needed} or choose another policy")


def split_spec(spec: str) -> tuple[str, str | None]:
    """``POLICY@ORDER`` (``eft@fifo``) -> ``("eft", "fifo")``: one policy under another order
    (eval, the live benches); a spec without a known order suffix -> ``(spec, None)``."""
    base, sep, order = spec.rpartition("@")
    if sep and order in ORDERS:
        return base, order
    return spec, None


def mean_compute(computes: Iterable[float]) -> float:
    """The mean of ``computes`` (speeds, each node counted once); 1.0 when there is none."""
    total, n = 0.0, 0
    for c in computes:
        total += c
        n += 1
    return total / n if n else 1.0


def hop_ranks(children: Sequence[Sequence[int]]) -> list[int]:
    """Longest hop count to a sink per task; ``children[i]`` lists task i's children, every
    child after its parent (topological positions)."""
    n = len(children)
    ranks = [0] * n
    for i in range(n - 1, -1, -1):
        r = 0
        for c in children[i]:
            if ranks[c] + 1 > r:
                r = ranks[c] + 1
        ranks[i] = r
    return ranks


def speed_for(memory_gb: float, servers: Sequence[tuple[float, float]]) -> float:
    """The speed of the fastest of ``servers`` (``(speed, memory GB)``, fastest first) whose
    memory holds ``memory_gb``; the fastest when none does."""
    for speed, mem in servers:
        if mem >= memory_gb:
            return speed
    return servers[0][0]


def by_speed(servers: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """``(speed, memory GB)`` pairs fastest first (ties: the larger memory first)."""
    return tuple(sorted(servers, key=lambda s: (-s[0], -s[1])))


@dataclass(frozen=True)
class Costs:
    """The cluster as an order prices work (module docstring). ``mean_cpu``/``mean_gpu``: mean
    speed of the nodes doing CPU / GPU work; ``fastest``: ``(speed, memory GB)`` of CPU work,
    fastest first; ``fastest_gpu``: the fastest GPU work."""
    mean_cpu: float = 1.0
    mean_gpu: float = 1.0
    fastest: tuple[tuple[float, float], ...] = ((1.0, math.inf),)
    fastest_gpu: float = 1.0
    network: Network = field(default_factory=Network)

    @classmethod
    def of(cls, nodes: Iterable[tuple[float, float, float, bool]],
           network: Network | None = None) -> "Costs":
        """From ``(cpu speed, gpu speed, memory GB, has a GPU)`` per node (each counted once)."""
        nodes = list(nodes)
        gpu = [g for _, g, _, has in nodes if has]
        return cls(mean_compute(c for c, _, _, _ in nodes), mean_compute(gpu),
                   by_speed((c, m) for c, _, m, _ in nodes) or ((1.0, math.inf),),
                   max(gpu, default=1.0), network or Network())

    def work_s(self, compute: float, gpu: bool = False) -> float:
        """A task's work: its compute at the mean speed of its kind of work."""
        return compute / (self.mean_gpu if gpu else self.mean_cpu)

    def fast_s(self, compute: float, memory_gb: float, gpu: bool = False) -> float:
        """A task's run on the fastest node its memory fits (the critical-path bound's)."""
        return compute / (self.fastest_gpu if gpu else speed_for(memory_gb, self.fastest))

    def lower_bound_s(self, compute: Sequence[float], memory_gb: Sequence[float],
                      gpu: Sequence[bool], parents: Sequence[Sequence[int]]) -> float:
        """A workflow's critical-path lower bound, the one definition (the simulator's
        slowdown, ``edf``'s deadline): the longest chain of :meth:`fast_s`, no transfers; tasks
        in topological order (``parents[i]`` before ``i``)."""
        longest = [0.0] * len(compute)
        fastest, fastest_gpu = self.fastest, self.fastest_gpu
        for i, ps in enumerate(parents):
            before = 0.0
            for p in ps:
                if longest[p] > before:
                    before = longest[p]
            if gpu[i]:
                speed = fastest_gpu
            else:  # speed_for, inlined (every arrival)
                m = memory_gb[i]
                speed = fastest[0][0]
                for s, mem in fastest:
                    if mem >= m:
                        speed = s
                        break
            longest[i] = compute[i] / speed + before
        return max(longest, default=0.0)


class Graph(NamedTuple):
    """One workflow's tasks as an order reads them, in topological positions: compute (what
    deciders see), memory GB, output GB, whether each is GPU work, children and parents."""
    compute: Sequence[float]
    memory_gb: Sequence[float]
    output_gb: Sequence[float]
    gpu: Sequence[bool]
    children: Sequence[Sequence[int]]
    parents: Sequence[Sequence[int]]


class Keyed(NamedTuple):
    """What :meth:`Order.arrive` gives a workflow: its level, its tasks' ranks and keys."""
    level: float
    ranks: list[float]
    keys: list[tuple]


class Order:
    """One driver's ready-task order (module docstring); :func:`make` builds one by name."""

    name: ClassVar[str] = ""
    #: whether a finish moves its workflow's level (the driver then re-keys its ready tasks)
    dynamic: ClassVar[bool] = False
    #: what the level reads: the critical-path bound (``edf``), the remaining work (``srpt``)
    needs_bound: ClassVar[bool] = False
    needs_work: ClassVar[bool] = False
    IMMUTABLE = True  # never written after construction: a simulator's fork shares it

    def __init__(self, edf_factor: float = 2.0) -> None:
        self.edf_factor = edf_factor

    def __repr__(self) -> str:
        return f"Order({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.edf_factor == self.edf_factor)

    def __hash__(self) -> int:
        return hash((self.name, self.edf_factor))

    # ------------------------------------------------------------------ the rule
    def ranks(self, g: Graph, costs: Costs) -> list[float]:
        """The within-workflow rank of each task (the hop count unless the order says)."""
        return hop_ranks(g.children)

    def level(self, arrival: float, bound_s: Callable[[], float],
              work_s: Callable[[], float], attained_s: float = 0.0) -> float:
        """A workflow's level at ``arrival``: from its critical-path bound, its remaining work
        or its attained service (each read only by the order that needs it); 0 here."""
        return 0.0

    def key(self, rank: float, arrival: float, workflow: object, level: float) -> tuple:
        """The key of a task of ``rank`` in a workflow that arrived at ``arrival`` (``workflow``:
        its id, the tie breaker; one type per driver) at ``level``."""
        return (level, arrival, workflow, -rank)

    def on_finish(self, level: float, work_s: float, run_s: float) -> float:
        """The workflow's level after one of its tasks (``work_s`` of work, ran ``run_s``
        seconds) finished; the same for a static order."""
        return level

    # ------------------------------------------------------------------ for drivers
    def arrive(self, g: Graph, arrival: float, workflow: object, costs: Costs,
               attained_s: float = 0.0) -> Keyed:
        """A workflow arriving (or described) at ``arrival``: its level, ranks and keys."""
        def bound() -> float:
            return costs.lower_bound_s(g.compute, g.memory_gb, g.gpu, g.parents)

        def work() -> float:
            return sum(costs.work_s(c, gp) for c, gp in zip(g.compute, g.gpu))

        ranks = self.ranks(g, costs)
        level = self.level(arrival, bound, work, attained_s)
        key = self.key
        return Keyed(level, ranks, [key(r, arrival, workflow, level) for r in ranks])


class Hop(Order):
    name = "hop"

    def key(self, rank: float, arrival: float, workflow: object, level: float) -> tuple:
        return (-rank, arrival)


class UpwardRank(Hop):
    """HEFT's upward rank: the work plus the largest (transfer + rank) of the children."""
    name = "upward_rank"

    def ranks(self, g: Graph, costs: Costs) -> list[float]:
        n = len(g.children)
        ranks = [0.0] * n
        transfer = costs.network.transfer_s
        for i in range(n - 1, -1, -1):
            comm = transfer(g.output_gb[i])
            ranks[i] = costs.work_s(g.compute[i], g.gpu[i]) + max(
                (comm + ranks[c] for c in g.children[i]), default=0.0)
        return ranks


class Fifo(Order):
    name = "fifo"

    def key(self, rank: float, arrival: float, workflow: object, level: float) -> tuple:
        return (arrival, workflow, -rank)


class Edf(Order):
    name = "edf"
    needs_bound = True

    def level(self, arrival, bound_s, work_s, attained_s=0.0) -> float:
        return arrival + self.edf_factor * bound_s()


class Srpt(Order):
    name = "srpt"
    dynamic = True
    needs_work = True

    def level(self, arrival, bound_s, work_s, attained_s=0.0) -> float:
        return work_s()

    def on_finish(self, level: float, work_s: float, run_s: float) -> float:
        return level - work_s


class Las(Order):
    name = "las"
    dynamic = True

    def level(self, arrival, bound_s, work_s, attained_s=0.0) -> float:
        return attained_s

    def on_finish(self, level: float, work_s: float, run_s: float) -> float:
        return level + run_s


_ORDERS: dict[str, type[Order]] = {c.name: c for c in (Hop, UpwardRank, Fifo, Edf, Srpt, Las)}


def make(name: str | None = None, edf_factor: float = 2.0) -> Order:
    """The order named ``name`` (default: the paper's); unknown names raise naming the choices."""
    try:
        return _ORDERS[name or PAPER_ORDER](edf_factor)
    except KeyError:
        raise ValueError(f"order: {name!r} is not allowed; choose one of {list(ORDERS)}") from None
