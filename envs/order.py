"""The order in which ready tasks are placed (``mdp.order``): one module for the simulator, the
node simulator, ``/v1/schedule``, the live library and the scheduler service.

Every driver owns an :class:`Order`, keys a ready task with :meth:`Order.key` and pushes it on
the decision core's :class:`envs.decision.ReadyQueue` (smallest key first, then the task id).
The orders:

=============  ===================================================================  ==========
order          key (smaller first)                                                   changes
=============  ===================================================================  ==========
``hop``        longest hop-count path to a sink first, then workflow arrival        never
               (the paper's; interleaves the first tasks of every workflow)
``upward_rank`` HEFT's upward rank (run time at :func:`mean_compute` + transfers)    never
               first, then arrival
``fifo``       oldest workflow first (arrival, workflow id), then longest hop path  never
``edf``        deadline ``arrival + edf_factor x critical-path lower bound``         never
               first, then as ``fifo``
``srpt``       least remaining estimated work of the workflow (its unfinished        on finish
               tasks' GFLOP / :func:`mean_compute`) first, then as ``fifo``
``las``        least attained service of the workflow (run seconds of its finished  on finish
               tasks; Autellix's PLAS: needs no run-time estimate) first, then as
               ``fifo``
=============  ===================================================================  ==========

A key is a tuple ``(level, arrival, workflow, -rank)`` (``fifo``: ``(arrival, workflow,
-rank)``; ``hop`` / ``upward_rank``: ``(-rank, arrival)``, the paper's exact key). ``level``
is the workflow's deadline, remaining work or attained service. *Dynamic* orders (``srpt``,
``las``) change a workflow's level when one of its tasks finishes; the driver then pushes its
ready tasks again with fresh keys (:meth:`Order.finished`): the queue drops an entry whose key
is no longer its task's key, so nothing is rebuilt at a decision.

:class:`Order` holds the rules (rank, level, key, level after a finish); each driver owns one
and calls it, in model seconds.

NumPy-free, stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

ORDERS = ("hop", "upward_rank", "fifo", "edf", "srpt", "las")
DYNAMIC = frozenset({"srpt", "las"})
#: orders whose key ends with the longest hop path inside the workflow
_HOP_TIE = frozenset({"hop", "fifo", "edf", "srpt", "las"})
#: the order the simulator uses when neither the config nor the policy names one (the paper's)
PAPER_ORDER = "hop"
#: the order of the live library, the scheduler service and Serve when their env config names
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
    """The one mean-compute definition (upward ranks, ``srpt``'s work estimate, the planner):
    the mean GFLOP/s over the servers (each server counts once; 1.0 when there is none)."""
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


def upward_ranks(compute_gflop: Sequence[float], output_gb: Sequence[float],
                 children: Sequence[Sequence[int]], mean_gflop_s: float, bandwidth_gb_s: float,
                 latency_s: float) -> list[float]:
    """HEFT's upward rank: run time at ``mean_gflop_s`` plus the largest (transfer + rank) of
    the children; topological positions as in :func:`hop_ranks`."""
    n = len(children)
    ranks = [0.0] * n
    for i in range(n - 1, -1, -1):
        comm = output_gb[i] / bandwidth_gb_s + latency_s
        ranks[i] = compute_gflop[i] / mean_gflop_s + max(
            (comm + ranks[c] for c in children[i]), default=0.0)
    return ranks


def speed_for(memory_gb: float, servers: Sequence[tuple[float, float]]) -> float:
    """GFLOP/s of the fastest of ``servers`` (``(GFLOP/s, memory GB)``, fastest first) whose
    memory holds ``memory_gb``; the fastest when none does."""
    for speed, mem in servers:
        if mem >= memory_gb:
            return speed
    return servers[0][0]


def by_speed(servers: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``(GFLOP/s, memory GB)`` pairs fastest first (ties: the larger memory first)."""
    return sorted(servers, key=lambda s: (-s[0], -s[1]))


def lower_bound_s(compute_gflop: Sequence[float], memory_gb: Sequence[float],
                  parents: Sequence[Sequence[int]], servers: Sequence[tuple[float, float]]
                  ) -> float:
    """A workflow's critical-path lower bound, the one definition (the simulator's slowdown,
    ``edf``'s deadline in the simulator, the live scheduler and ``/v1/schedule``): the longest
    chain of run times, each task on the fastest server whose memory holds it
    (:func:`speed_for`), no transfers. Tasks in topological order (``parents[i]`` before
    ``i``); ``servers`` fastest first (:func:`by_speed`)."""
    longest = [0.0] * len(compute_gflop)
    for i, ps in enumerate(parents):
        before = 0.0
        for p in ps:
            if longest[p] > before:
                before = longest[p]
        longest[i] = compute_gflop[i] / speed_for(memory_gb[i], servers) + before
    return max(longest, default=0.0)


@dataclass(frozen=True)
class Order:
    """One driver's ready-task order (``mdp.order`` with its ``edf_factor``): the within-workflow
    rank, the workflow's level, a task's key and the level after a finish, in one place for the
    simulator, the node simulator, the live scheduler and ``/v1/schedule``. Times are model
    seconds in every driver (the live scheduler converts wall time first)."""

    name: str = PAPER_ORDER
    edf_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.name not in ORDERS:
            raise ValueError(f"order: {self.name!r} is not allowed; choose one of {list(ORDERS)}")

    @property
    def dynamic(self) -> bool:
        """Whether a finish moves its workflow's level (``srpt``, ``las``): the driver then
        re-keys the workflow's unfinished tasks."""
        return self.name in DYNAMIC

    def ranks(self, compute_gflop: Sequence[float], output_gb: Sequence[float],
              children: Sequence[Sequence[int]], mean_gflop_s: float, bandwidth_gb_s: float,
              latency_s: float) -> list[float]:
        """The within-workflow rank the key uses (HEFT's upward rank for ``upward_rank``, else
        the hop count); tasks in topological positions (:func:`hop_ranks`)."""
        if self.name == "upward_rank":
            return upward_ranks(compute_gflop, output_gb, children, mean_gflop_s,
                                bandwidth_gb_s, latency_s)
        return hop_ranks(children)

    def level(self, arrival: float, compute_gflop: Sequence[float], memory_gb: Sequence[float],
              parents: Sequence[Sequence[int]], servers: Sequence[tuple[float, float]],
              mean_gflop_s: float, attained_s: float = 0.0) -> float:
        """A workflow's level from its unfinished tasks (all of them when it arrives):
        ``edf`` arrival + factor x their critical-path lower bound (:func:`lower_bound_s` on
        ``servers``, fastest first), ``srpt`` their estimated work (GFLOP / ``mean_gflop_s``),
        ``las`` the service ``attained_s`` so far; 0 for the static orders."""
        if self.name == "edf":
            return arrival + self.edf_factor * lower_bound_s(compute_gflop, memory_gb, parents,
                                                             servers)
        if self.name == "srpt":
            return sum(compute_gflop) / mean_gflop_s
        if self.name == "las":
            return attained_s
        return 0.0

    def key(self, rank: float, arrival: float, workflow: object, level: float) -> tuple:
        """The ready-queue key of a task of ``rank`` in a workflow that arrived at ``arrival``
        (``workflow``: its id, a tie breaker of one type per driver) at ``level``."""
        name = self.name
        if name == "hop" or name == "upward_rank":
            return (-rank, arrival)
        if name == "fifo":
            return (arrival, workflow, -rank)
        return (level, arrival, workflow, -rank)

    def finished(self, level: float, compute_gflop: float, run_s: float,
                 mean_gflop_s: float) -> float:
        """The workflow's level after one of its tasks (``compute_gflop``, ran ``run_s``
        seconds) finished: ``srpt`` loses the task's estimated work, ``las`` gains its run
        time; the others keep it."""
        if self.name == "srpt":
            return level - compute_gflop / mean_gflop_s
        if self.name == "las":
            return level + run_s
        return level
