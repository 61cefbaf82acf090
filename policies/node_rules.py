"""Placement rules in Ray's resource model (``envs.nodes``): each is a function
``(table, task, now, rng) -> node`` over a :class:`envs.nodes.NodeTable`; a pick the task does not
fit now is a wait (the decision core defers the task to the next event).

* ``eft``: earliest finish among the nodes it fits now (run time = compute / the node's speed for
  its kind of work); ties: the lowest index.
* ``eft_wait``: earliest finish among every node it will fit, waiting for running tasks to end
  (their expected ends); waits only while that node's expected start is in the future, at most
  ``MAX_WAITS`` times (then ``eft``: the guard against waiting without bound).
* ``gpu_rule``: ``eft``, but a task that asks for no GPU goes to a GPU node only when no node
  without a GPU fits it now.
* ``reserve``: ``eft``, but a task that asks for no GPU may take a GPU node's CPU and memory only
  while ``RESERVE_CPU`` CPUs and ``RESERVE_GB`` GB stay free per free GPU of that node (else
  ``eft``).
* ``eft_bestfit`` / ``eft_spread``: ``eft``; ties broken by the least dominant free share left
  (pack) / the lowest critical utilization (spread).
* ``ray``: Ray's default (hybrid) policy as its raylet runs it (``hybrid_scheduling_policy.cc``
  in Ray's ``src/ray/raylet/scheduling/policy/``): a task without GPU demand is first tried on
  nodes without GPUs (``scheduler_avoid_gpu_nodes``); among the nodes it fits now, each scores its
  critical utilization (the highest used fraction of CPU and memory; below the spread threshold
  0.5 the score is 0), nodes are ordered by score then node id, and one of the best
  ``max(1, int(0.2 x nodes))`` is drawn uniformly (``scheduler_top_k_fraction``). The id order
  is :func:`ray_node_order` of the nodes' Ray ids when they are known (a live cluster's twin),
  else a random order per episode, as Ray's ids are. Speed-blind. Differences from a real Ray
  cluster: one central queue (a task is placed when some node fits it, not queued at a busy
  raylet, which grants in its scheduling classes' hash order), the preferred (local) node only
  with ``preferred_head``, no object-store term, no reuse of a leased worker for the next task
  of its scheduling class (agents.yaml's calls each ask for their own memory, so each is its
  own class and Ray reuses none). results/resource_model/README.md measures these.
* ``random``: uniform among the nodes it fits now.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from envs.nodes import NodeTable

__all__ = ["NODE_POLICIES", "node_policy", "ray_node_order", "RayHybrid", "MAX_WAITS",
           "RESERVE_CPU", "RESERVE_GB"]

MAX_WAITS = 20
RESERVE_CPU = 2.0
RESERVE_GB = 8.0
SPREAD_THRESHOLD = 0.5
TOP_K_FRACTION = 0.2
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


def _finish_scan(table: NodeTable, task, allow: Callable[[int], bool] | None = None
                 ) -> tuple[float, list[int]]:
    """The least run time among the nodes ``task`` fits now (and ``allow``), and those nodes."""
    best, arg = math.inf, []
    for i in table.fitting(task.demands):
        if allow is not None and not allow(i):
            continue
        run = table.run_time(i, task)
        if run < best - 1e-12:
            best, arg = run, [i]
        elif run <= best + 1e-12:
            arg.append(i)
    return best, arg


def eft(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    _, arg = _finish_scan(table, task)
    return arg[0] if arg else -1


def eft_wait(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    if task.waits >= MAX_WAITS:
        return eft(table, task, now, rng)
    d = task.demands
    run, fit = _finish_scan(table, task)  # the nodes it fits now first: a bound to beat
    best, arg = (now + run, fit[0]) if fit else (math.inf, -1)
    for i in range(table.n):
        r = table.run_time(i, task)
        if now + r >= best - 1e-12:  # starts no earlier than now: cannot beat the best
            continue
        s = table.earliest_fit(i, d, now)
        if s + r < best - 1e-12:
            best, arg = s + r, i
    return arg


def _no_gpu(table: NodeTable, task) -> bool:
    c = table.compile(task.demands)
    return c is not None and not c.gpu_work


def gpu_rule(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    if _no_gpu(table, task):
        _, arg = _finish_scan(table, task, lambda i: not table.has_gpu[i])
        if arg:
            return arg[0]
    return eft(table, task, now, rng)


def reserve(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    if _no_gpu(table, task):
        dd = dict(task.demands)
        ci, mi = table.index.get("CPU"), table.index.get("memory")

        def keeps(i: int) -> bool:
            if not table.has_gpu[i]:
                return True
            free_gpus = sum(table.gpus[i])
            cpu_left = table.free[i][ci] - dd.get("CPU", 0.0) if ci is not None else math.inf
            mem_left = table.free[i][mi] - dd.get("memory", 0.0) if mi is not None else math.inf
            return cpu_left >= free_gpus * RESERVE_CPU and mem_left >= free_gpus * RESERVE_GB
        _, arg = _finish_scan(table, task, keeps)
        if arg:
            return arg[0]
    return eft(table, task, now, rng)


def _left_share(table: NodeTable, i: int, task) -> float:
    """The largest free fraction of any resource node ``i`` keeps after taking ``task``."""
    c = table.compile(task.demands)
    taken = dict(c.pairs)
    best = 0.0
    for j, tot in enumerate(table.total[i]):
        if tot > 0:
            best = max(best, (table.free[i][j] - taken.get(j, 0.0)) / tot)
    return best


def eft_bestfit(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    _, arg = _finish_scan(table, task)
    return min(arg, key=lambda i: (_left_share(table, i, task), i)) if arg else -1


def eft_spread(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    _, arg = _finish_scan(table, task)
    return min(arg, key=lambda i: (table.utilization(i), i)) if arg else -1


def random_fit(table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
    fit = table.fitting(task.demands)
    return fit[int(rng.integers(0, len(fit)))] if fit else -1


class RayHybrid:
    """Ray's default placement (module docstring); ``preferred``: the driver's node index;
    ``order``: the node indices in Ray's id order (:func:`ray_node_order`; None: a random order
    per episode)."""

    def __init__(self, preferred: int | None = None, order: list[int] | None = None):
        self.preferred = preferred
        if order is not None and sorted(order) != list(range(len(order))):
            raise ValueError(f"RayHybrid order: {order!r} is not a permutation of node indices")
        self.order = None if order is None else [int(i) for i in order]
        self._ids: dict[int, list[int]] = {}  # id(table) -> the node-id order of its episode

    def __call__(self, table: NodeTable, task, now: float, rng: np.random.Generator) -> int:
        order = self._ids.get(id(table))
        if order is None or len(order) != table.n:
            order = self.order if self.order is not None else [
                int(i) for i in rng.permutation(table.n)]
            if len(order) != table.n:
                raise ValueError(f"RayHybrid order: {len(order)} node indices for a table of "
                                 f"{table.n} nodes")
            self._ids = {id(table): order}
        if _no_gpu(table, task):
            i = self._schedule(table, task, order, rng, lambda i: not table.has_gpu[i])
            if i >= 0:
                return i
        return self._schedule(table, task, order, rng, None)

    def _schedule(self, table: NodeTable, task, order: list[int], rng: np.random.Generator,
                  allow: Callable[[int], bool] | None) -> int:
        avail = []
        for rank, i in enumerate(order):
            if (allow is None or allow(i)) and table.fits_now(i, task.demands):
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
        return avail[int(rng.integers(0, min(k, len(avail))))][2]


NODE_POLICIES: dict[str, Callable[[], Callable]] = {
    "eft": lambda: eft,
    "eft_wait": lambda: eft_wait,
    "gpu_rule": lambda: gpu_rule,
    "reserve": lambda: reserve,
    "eft_bestfit": lambda: eft_bestfit,
    "eft_spread": lambda: eft_spread,
    "ray": lambda: RayHybrid(),
    "ray_head": lambda: RayHybrid(preferred=0),
    "random": lambda: random_fit,
}


def node_policy(name: str) -> Callable:
    """A fresh policy by name (``NODE_POLICIES``); unknown names raise naming the choices."""
    try:
        return NODE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"node policy {name!r}: choose one of {sorted(NODE_POLICIES)}") from None
