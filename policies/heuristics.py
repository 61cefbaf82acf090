"""Classic placement heuristics and Ray's own placement, on the table of nodes (docs/simulator.md).

Each reads a decision's :class:`policies.base.State`: the table (``envs.nodes.NodeTable``), the
task, the clock, where its inputs are. "Fits now" is the valid pick (its demands fit the node's
free resources; on the paper's servers of one slot: idle and the memory fits); "fits" is "could
ever hold it" (an accepting node whose totals cover it). When no node fits the task now, every
pick is a wait; the heuristics then wait for the node where it could start first
(:func:`soonest`), except random, which waits on a random node that fits.

EFT is one rule, :func:`eft_pick` with its key :func:`finish_key`: among the nodes the task fits
now, the least finish (the run there, plus the transfer when transfers delay starts), ties to
the node holding its input (no transfer), then the smaller memory, then the lower position.
Identical idle nodes tie, so it looks at the lowest idle node of each shape only
(``NodeTable.idle_heads``): O(shapes), not O(nodes), on the paper's cluster. The lookahead
planner's fast rollouts (``policies.fast_rollout``) apply the same key.

Ray's placement (``ray``): its default (hybrid) policy as its raylet runs it
(``hybrid_scheduling_policy.cc`` in Ray's ``src/ray/raylet/scheduling/policy/``): a task without
GPU demand is first tried on nodes without GPUs (``scheduler_avoid_gpu_nodes``); among the
nodes it fits now, each scores its critical utilization (the highest used fraction of CPU and
memory; below the spread threshold 0.5 the score is 0), nodes are ordered by score then node id,
and one of the best ``max(1, int(0.2 x nodes))`` is drawn uniformly
(``scheduler_top_k_fraction``). The id order is :func:`ray_node_order` of the nodes' Ray ids
when they are known (a live cluster's twin), else a random order per episode, as Ray's ids are.
Speed-blind. Differences from a real Ray cluster: one central queue (a task is placed when some
node fits it, not queued at a busy raylet, which grants in its scheduling classes' hash order),
the preferred (local) node only with ``ray_head``, no object-store term, no reuse of a leased
worker for the next task of its scheduling class. results/resource_model/README.md measures them.
"""

from __future__ import annotations

import math
from typing import Callable, Collection

import numpy as np

from envs.config import EnvConfig
from envs.demands import CPU, MEMORY

from .base import Policy, State

__all__ = ["HEURISTICS", "make_heuristic", "eft_pick", "eft_heads", "finish_key", "finish_s",
           "soonest", "Heuristic", "ray_node_order", "RayHybrid", "MAX_WAITS"]

MAX_WAITS = 20  # eft_wait: a task's waits before EFT places it
SPREAD_THRESHOLD = 0.5
TOP_K_FRACTION = 0.2
RESERVE_CPU = 2.0
RESERVE_GB = 8.0


def finish_s(state: State, i: int, run_s: float) -> float:
    """The task's finish on node ``i`` where it runs ``run_s``, from its start there: the run,
    plus the transfer of its input when transfers delay starts."""
    if state.transfer_delays and i != state.parent:
        return run_s + state.transfer_s
    return run_s


def finish_key(state: State, i: int, run_s: float) -> float:
    """EFT's key of node ``i`` where the task runs ``run_s``, lower is better: the finish
    (:func:`finish_s`), ties to no transfer (the input's node), then the smaller memory."""
    t_s = 0.0 if i == state.parent else state.transfer_s
    return run_s + (t_s if state.transfer_delays else 0.0) + (
        1e-6 * t_s + 1e-9 * state.table.memory_l[i])


def fits_ever(state: State) -> list[int]:
    """The accepting nodes that could ever hold the task, by position."""
    t, d = state.table, state.task.demands
    return [i for i in range(t.n) if t.accept_l[i] and t.fits_total(i, d)]


def soonest(state: State, exclude: Collection[int] = ()) -> int:
    """The node where the task could start first if runs end when expected (a wait), the lower
    position on a tie (``exclude`` left out); -1 when none ever could."""
    t, d, now = state.table, state.task.demands, state.now
    best, arg = math.inf, -1
    for i in fits_ever(state):
        if i in exclude:
            continue
        s = t.earliest_fit(i, d, now)
        if s < best:
            best, arg = s, i
    return arg


def eft_heads(state: State, exclude: Collection[int] = ()) -> list[int]:
    """The nodes where EFT's pick can be (module docstring): the lowest idle node of each shape
    the task fits now, its input's node when it fits now there, the partly used nodes it fits
    (``exclude`` left out)."""
    table, d = state.table, state.task.demands
    p = state.parent
    if p < 0 or p in exclude:
        return table.idle_heads(d, exclude)
    heads = table.idle_heads(d, (*exclude, p))  # each shape's lowest idle node but the input's
    if table.fits_now(p, d):
        heads.append(p)
    return heads


def eft_pick(state: State, exclude: Collection[int] = ()) -> int:
    """EFT (module docstring) among the nodes not in ``exclude``; :func:`soonest` when the task
    fits none of them now; with nothing there but ``exclude``, EFT over them all (they are
    reserved for other tasks: the planner's)."""
    table, task = state.table, state.task
    heads = eft_heads(state, exclude)
    if not heads:
        s = soonest(state, exclude)
        if s < 0:
            return eft_pick(state) if exclude else 0
        return s
    best, arg = math.inf, -1
    for i in heads:
        k = finish_key(state, i, table.run_time(i, task))
        if k < best or (k == best and i < arg):
            best, arg = k, i
    return arg


def _eft_among(state: State, allow: Callable[[int], bool]) -> tuple[float, list[int]]:
    """The least run among the nodes the task fits now and ``allow`` allows, and those nodes
    (ties within 1e-12)."""
    table, task = state.table, state.task
    best, arg = math.inf, []
    for i in table.fitting(task.demands):
        if not allow(i):
            continue
        run = table.run_time(i, task)
        if run < best - 1e-12:
            best, arg = run, [i]
        elif run <= best + 1e-12:
            arg.append(i)
    return best, arg


def _no_gpu(state: State) -> bool:
    return not state.task.gpu if hasattr(state.task, "gpu") else not any(
        k == "GPU" for k, _ in state.task.demands)


class Heuristic(Policy):
    """A rule on the table; ``rng``: its own draws (seeded by :meth:`reset`)."""

    def __init__(self, seed: int | None = None):
        self._seed = seed
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(self._seed if seed is None else seed)


class RandomFeasible(Heuristic):
    """Uniformly random among the nodes the task fits now; a random node it fits when none."""
    name = "random"

    def decide(self, state: State) -> int:
        pool = state.table.fitting(state.task.demands) or fits_ever(state) or [0]
        return pool[int(self.rng.integers(0, len(pool)))]


class RoundRobin(Heuristic):
    """The next node the task fits now after the last one chosen, by position."""
    name = "round-robin"

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._last = -1

    def decide(self, state: State) -> int:
        fit = state.table.fitting(state.task.demands)
        if fit:
            n, last = state.table.n, self._last
            a = min(fit, key=lambda i: (i - last - 1) % n)
        else:
            a = max(soonest(state), 0)
        self._last = a
        return a


class LeastLoaded(Heuristic):
    """The node it fits with the least remaining busy time; ties at random. With one task per
    server this is a random idle server while any is idle."""
    name = "least-loaded"

    def decide(self, state: State) -> int:
        t, now = state.table, state.now
        cand = fits_ever(state)
        if not cand:
            return 0
        load = [max(float(t.busy_until[i]) - now, 0.0) if t.running[i] else 0.0 for i in cand]
        low = min(load)
        best = [i for i, x in zip(cand, load) if x == low]
        return best[int(self.rng.integers(0, len(best)))]


class FastestIdle(Heuristic):
    """The fastest node the task fits now; ties to the smallest memory."""
    name = "fastest-idle"

    def decide(self, state: State) -> int:
        t, d = state.table, state.task.demands
        fit = t.fitting(d)
        if not fit:
            return max(soonest(state), 0)
        return max(fit, key=lambda i: (t.speed(i, d) - 1e-6 * t.memory_l[i], -i))


class EarliestFinish(Heuristic):
    """EFT (module docstring). Never waits while a node fits the task now."""
    name = "eft"

    def decide(self, state: State) -> int:
        return eft_pick(state)


class Heft(EarliestFinish):
    """HEFT-style: tasks ordered by upward rank (the order), placed by EFT."""
    name = "heft"
    order = "upward_rank"


class EarliestFinishWait(Heuristic):
    """EFT-wait: any node it fits, busy ones counted from when it could start there; picking a
    busy one is a wait (it shows what waiting costs under the paper's semantics). A diagnostic:
    it waits as long as a busy node promises the earlier finish, with no bound on one task's
    waits (the guard bounds a learned policy's, ``policies.guard``)."""
    name = "eft-wait"

    def decide(self, state: State) -> int:
        t, task, now = state.table, state.task, state.now
        best, arg = math.inf, 0
        for i in fits_ever(state):
            t_s = 0.0 if i == state.parent else state.transfer_s
            k = (t.earliest_fit(i, task.demands, now) - now + t.run_time(i, task)
                 + (t_s if state.transfer_delays else 0.0) + 1e-9 * t.memory_l[i])
            if k < best:
                best, arg = k, i
        return arg


class BoundedEftWait(EarliestFinishWait):
    """``eft_wait``: EFT-wait, but a task that waited :data:`MAX_WAITS` times gets EFT's pick
    (the rule for Ray nodes, where a round asks every waiting task again at each event: the
    unbounded diagnostic can spend an episode's decisions waiting)."""
    name = "eft_wait"

    def decide(self, state: State) -> int:
        if state.task.waits >= MAX_WAITS:
            return eft_pick(state)
        return super().decide(state)


class GpuRule(Heuristic):
    """EFT, but a task that asks for no GPU goes to a GPU node only when no node without a GPU
    fits it now."""
    name = "gpu_rule"

    def decide(self, state: State) -> int:
        if _no_gpu(state):
            _, arg = _eft_among(state, lambda i: not state.table.has_gpu[i])
            if arg:
                return arg[0]
        return eft_pick(state)


class Reserve(Heuristic):
    """EFT, but a task that asks for no GPU may take a GPU node's CPU and memory only while
    ``RESERVE_CPU`` CPUs and ``RESERVE_GB`` GB stay free per free GPU of that node."""
    name = "reserve"

    def decide(self, state: State) -> int:
        table = state.table
        if _no_gpu(state):
            dd = dict(state.task.demands)
            ci, mi = table.index.get(CPU), table.index.get(MEMORY)

            def keeps(i: int) -> bool:
                if not table.has_gpu[i]:
                    return True
                free_gpus = sum(table.gpus[i])
                cpu_left = table.free[i][ci] - dd.get(CPU, 0.0) if ci is not None else math.inf
                mem_left = table.free[i][mi] - dd.get(MEMORY, 0.0) if mi is not None else math.inf
                return cpu_left >= free_gpus * RESERVE_CPU and mem_left >= free_gpus * RESERVE_GB
            _, arg = _eft_among(state, keeps)
            if arg:
                return arg[0]
        return eft_pick(state)


def _left_share(table, i: int, demands: tuple) -> float:
    """The largest free fraction of any resource node ``i`` keeps after taking ``demands``."""
    c = table.compile(demands)
    taken = dict(c.pairs)
    best = 0.0
    for j, tot in enumerate(table.total[i]):
        if tot > 0:
            best = max(best, (table.free[i][j] - taken.get(j, 0.0)) / tot)
    return best


class EftBestFit(Heuristic):
    """EFT; ties broken by the least free share left (pack)."""
    name = "eft_bestfit"

    def decide(self, state: State) -> int:
        _, arg = _eft_among(state, lambda i: True)
        if not arg:
            return max(soonest(state), 0)
        return min(arg, key=lambda i: (_left_share(state.table, i, state.task.demands), i))


class EftSpread(Heuristic):
    """EFT; ties broken by the lowest critical utilization (spread: live, it keeps Ray's workers
    warm where EFT's lowest-position ties pack runs onto few nodes)."""
    name = "eft_spread"

    def decide(self, state: State) -> int:
        _, arg = _eft_among(state, lambda i: True)
        if not arg:
            return max(soonest(state), 0)
        return min(arg, key=lambda i: (state.table.utilization(i), i))


_M64 = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995  # libstdc++'s hash_bytes.cc, 64-bit size_t
_SEED = 0xC70F6907  # the seed std::hash<std::string> passes


def _std_hash(data: bytes) -> int:
    """``(int64_t) std::hash<std::string>`` of ``data`` as libstdc++ computes it
    (``_Hash_bytes``: MurmurHash64A over 8-byte words, the tail little-endian)."""

    def mix(v: int) -> int:
        return v ^ (v >> 47)

    n = len(data)
    whole = n & ~7
    h = (_SEED ^ (n * _MUL)) & _M64
    for p in range(0, whole, 8):
        h ^= (mix((int.from_bytes(data[p:p + 8], "little") * _MUL) & _M64) * _MUL) & _M64
        h = (h * _MUL) & _M64
    if n & 7:
        h = ((h ^ int.from_bytes(data[whole:], "little")) * _MUL) & _M64
    h = mix((mix(h) * _MUL) & _M64)
    return h - (1 << 64) if h >> 63 else h


def ray_node_order(node_ids: list[str]) -> list[int]:
    """The indices of ``node_ids`` (Ray's hex node ids) in the order Ray's hybrid policy breaks
    ties between nodes of equal score: ascending ``scheduling::NodeID``, which is the signed
    ``std::hash<std::string>`` of the binary id (``scheduling_ids.cc``; ``GetBestNode`` in
    ``hybrid_scheduling_policy.cc`` sorts by it before its stable sort by score)."""
    try:
        keys = [_std_hash(bytes.fromhex(h)) for h in node_ids]
    except (TypeError, ValueError):
        raise ValueError(f"ray_node_order: node ids must be hex strings, got {node_ids!r}"
                         ) from None
    return sorted(range(len(node_ids)), key=keys.__getitem__)


class RayHybrid(Heuristic):
    """Ray's default placement (module docstring); ``preferred``: the driver's node position;
    ``order``: the node positions in Ray's id order (:func:`ray_node_order`; None: a random
    order per episode)."""
    name = "ray"

    def __init__(self, seed: int | None = None, preferred: int | None = None,
                 order: list[int] | None = None):
        self.preferred = preferred
        if order is not None and sorted(order) != list(range(len(order))):
            raise ValueError(f"RayHybrid order: {order!r} is not a permutation of node indices")
        self.fixed = None if order is None else [int(i) for i in order]
        super().__init__(seed)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._order: list[int] | None = None  # this episode's node-id order

    def decide(self, state: State) -> int:
        table = state.table
        order = self._order
        if order is None or len(order) != table.n:
            order = self.fixed if self.fixed is not None else [
                int(i) for i in self.rng.permutation(table.n)]
            if len(order) != table.n:
                raise ValueError(f"RayHybrid order: {len(order)} node indices for a table of "
                                 f"{table.n} nodes")
            self._order = order
        if _no_gpu(state):
            i = self._schedule(state, order, lambda i: not table.has_gpu[i])
            if i >= 0:
                return i
        i = self._schedule(state, order, None)
        return i if i >= 0 else max(soonest(state), 0)

    def _schedule(self, state: State, order: list[int],
                  allow: Callable[[int], bool] | None) -> int:
        table, d = state.table, state.task.demands
        avail = []
        for rank, i in enumerate(order):
            if (allow is None or allow(i)) and table.fits_now(i, d):
                u = table.utilization(i)
                avail.append((u if u >= SPREAD_THRESHOLD else 0.0, rank, i))
        if not avail:
            return -1
        avail.sort()
        p = self.preferred
        if p is not None and any(i == p for _, _, i in avail):
            u = table.utilization(p)
            if (u if u >= SPREAD_THRESHOLD else 0.0) <= avail[0][0]:
                return p
        k = max(1, int(table.n * TOP_K_FRACTION))
        return avail[int(self.rng.integers(0, min(k, len(avail))))][2]


class RayHead(RayHybrid):
    """Ray's placement preferring the driver's node (position 0), as Ray prefers the local
    node."""
    name = "ray_head"

    def __init__(self, seed: int | None = None, order: list[int] | None = None):
        super().__init__(seed, preferred=0, order=order)


HEURISTICS: dict[str, type[Heuristic]] = {
    cls.name: cls for cls in (RandomFeasible, RoundRobin, LeastLoaded, FastestIdle, EarliestFinish,
                              EarliestFinishWait, BoundedEftWait, Heft, GpuRule, Reserve,
                              EftBestFit, EftSpread,
                              RayHybrid, RayHead)
}


def make_heuristic(name: str, env: EnvConfig | None = None, seed: int | None = None) -> Policy:
    """A heuristic by name."""
    if name not in HEURISTICS:
        raise ValueError(f"unknown heuristic {name!r}; choose one of {sorted(HEURISTICS)}")
    return HEURISTICS[name](seed)
