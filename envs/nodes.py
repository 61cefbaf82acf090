"""Ray's resource model for the decision core: nodes that run every task that fits.

A *node* has a resource vector (``CPU``, ``GPU``, ``memory`` in GB, any custom resource, and
``accelerator_type:<name>`` as Ray advertises it: a marker of amount 1) and a speed per kind of
work (``cpu`` work; ``gpu`` work on its accelerator). A *task* demands a vector of the same names
(``demands``: sorted ``(resource, amount)`` pairs, the form Ray's options become, see
:func:`demands_of`) and a compute; it may start on a node when its demands fit the node's free
resources, holds them until it ends, and runs ``compute / speed`` seconds where ``speed`` is the
node's speed for the task's kind (GPU work when it asks for a GPU, else CPU work). Many tasks run
on a node at once; there is no interference model (none we know of is documented for Ray).

GPUs are allocated as Ray allocates them (``ResourceInstanceSet`` in Ray's
``src/ray/common/scheduling``): a node's GPUs are instances of capacity 1; a fractional demand
(``num_gpus=0.5``) must fit inside one instance, a whole one takes that many whole free
instances. Two ``num_gpus=0.5`` tasks therefore share one GPU; a ``0.75`` and a ``0.5`` do not.
Of the instances that fit a fractional demand, the fullest is taken (best fit, so whole GPUs
stay free for whole demands).

The paper's model is the special case "each server a node with one slot": nodes ``{slot: 1}``
and every task demanding ``{slot: 1}`` (tests/test_nodes.py checks :class:`NodeTable` against
:class:`envs.decision.ServerTable` operation by operation).

:class:`NodeTable` is the server table of :class:`envs.decision.DecisionCore` in this model
(``pooled``): its ``fits_now`` replaces "idle and the memory fits". NumPy-free, stdlib only.

Label selectors (Ray's ``label_selector`` option, ``envs.node_labels``): a node has labels
(``NodeSpec.labels``; live: what Ray reports); a task's selector ``{key: expr}`` with ``expr`` one
of ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)`` is part of its demands as a pair
``("label:key=expr", 1)``, so it keys every cache as a resource does; a node fits such a task
only where every term matches its labels: ``in`` needs the key with one of the values, ``!``
(not in) fails only where the key has one of them (a node without the key matches), as Ray's
label scheduling does.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from .node_labels import LABEL_PREFIX, parse_selector, selector_demands, selector_matches

__all__ = ["NodeSpec", "NodeTable", "demands_of", "check_demands", "EPS"]

EPS = 1e-9
GPU = "GPU"
MEMORY = "memory"
ACCEL_PREFIX = "accelerator_type:"
CACHE_MAX = 1 << 16  # demand tuples a table keeps compiled (live: each task may have its own)
def demands_of(num_cpus: float = 1.0, num_gpus: float = 0.0, memory_gb: float = 0.0,
               resources: Mapping[str, float] | None = None,
               accelerator_type: str | None = None,
               label_selector: Mapping[str, str] | None = None) -> tuple[tuple[str, float], ...]:
    """A task's demands from Ray's task options (``memory`` in GB here, bytes in Ray), as sorted
    ``(resource, amount)`` pairs with zero amounts left out. ``accelerator_type`` becomes a
    demand of 0.001 of ``accelerator_type:<name>``, as Ray does; each ``label_selector`` term a
    pair ``("label:key=expr", 1)``."""
    d: dict[str, float] = {}
    for k, v in (("CPU", num_cpus), (GPU, num_gpus), (MEMORY, memory_gb)):
        if v:
            d[k] = float(v)
    for k, v in (resources or {}).items():
        if k in ("CPU", GPU, MEMORY):
            raise ValueError(f"resources: {k!r} is set by its own option (num_cpus, num_gpus, "
                             f"memory), not in resources")
        if v:
            d[k] = float(v)
    if accelerator_type:
        d[ACCEL_PREFIX + accelerator_type] = 0.001
    d.update(selector_demands(parse_selector(label_selector)))
    check_demands(d)
    return tuple(sorted(d.items()))


def check_demands(d: Mapping[str, float], where: str = "demands") -> None:
    """Ray's rules for a task's resource request: finite amounts >= 0; a GPU demand above 1 is
    a whole number (``num_gpus=1.5`` is refused by Ray too). Raises ValueError naming the
    resource."""
    for k, v in d.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}.{k}: must be a finite number >= 0, got {v!r}")
    g = d.get(GPU, 0.0)
    if g > 1 and abs(g - round(g)) > EPS:
        raise ValueError(f"{where}.GPU: a demand above 1 must be a whole number (Ray's rule), "
                         f"got {g!r}")


@dataclass(frozen=True)
class NodeSpec:
    """One node: its resources (``memory`` in GB), accelerator, speeds, and the shape name."""
    name: str
    resources: Mapping[str, float]
    cpu_speed: float = 1.0
    gpu_speed: float = 1.0
    accelerator: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def all_resources(self) -> dict[str, float]:
        """``resources`` plus the accelerator marker Ray adds (``accelerator_type:A100: 1``)."""
        out = {k: float(v) for k, v in self.resources.items()}
        if self.accelerator:
            out[ACCEL_PREFIX + self.accelerator] = 1.0
        return out


class _Compiled:
    """A demand tuple against one table's resource index: the non-GPU pairs by index, the GPU
    amount, the kind of work, and the nodes its label selector allows (None: any)."""
    __slots__ = ("pairs", "gpu", "gpu_work", "memory", "allowed")

    def __init__(self, pairs: list[tuple[int, float]], gpu: float, memory: float,
                 allowed: frozenset[int] | None = None):
        self.allowed = allowed
        self.pairs = pairs
        self.gpu = gpu
        self.gpu_work = gpu > 0
        self.memory = memory


class NodeTable:
    """The nodes' totals, free resources and GPU instances, and the tasks running on each
    (their expected ends). The decision core reads it through ``pooled``, ``n``, ``accept_l``,
    ``caps`` (not None: demands are checked), ``max_accept_mem``, :meth:`fits_now` and
    :meth:`_demand_state`."""

    pooled = True

    def __init__(self, nodes: Sequence[NodeSpec]):
        self.nodes = list(nodes)
        self.n = len(self.nodes)
        names = sorted({k for nd in self.nodes for k in nd.all_resources()} - {GPU})
        self.names = names
        self.index = {k: i for i, k in enumerate(names)}
        self.total: list[list[float]] = []
        self.free: list[list[float]] = []
        self.gpus: list[list[float]] = []  # free amount per GPU instance
        for nd in self.nodes:
            r = nd.all_resources()
            g = r.get(GPU, 0.0)
            if g > 1 and abs(g - round(g)) > EPS:
                raise ValueError(f"node {nd.name!r}: GPU must be a whole number, got {g!r}")
            self.total.append([r.get(k, 0.0) for k in names])
            self.free.append([r.get(k, 0.0) for k in names])
            self.gpus.append([1.0] * int(round(g)) if g >= 1 else ([g] if g > 0 else []))
        self.cpu_speed = [nd.cpu_speed for nd in self.nodes]
        self.gpu_speed = [nd.gpu_speed for nd in self.nodes]
        self.has_gpu = [bool(g) for g in self.gpus]
        # (task, node, its run at the node's speed) -> the run to plan with (live: the run-time
        # estimator's, learned per kind and node shape); None: compute / speed
        self.estimate: Callable[[Any, int, float], float] | None = None
        self.accept_l = [True] * self.n
        self.running: list[dict[Any, float]] = [{} for _ in range(self.n)]  # task -> end
        # task -> {node: (compiled demand, GPU taken)} (a hedged task runs on two nodes)
        self._held: dict[Any, dict[int, tuple]] = {}
        self._gpu_total = [list(g) for g in self.gpus]
        self.gpu_total = [float(sum(g)) for g in self.gpus]  # GPUs per node (read-only)
        self.caps: list = []  # not None: the core checks every task's demands
        self._compiled: dict[tuple, _Compiled | None] = {}
        self._state: dict[tuple, int] = {}  # demand -> _demand_state, until the next change
        self._ever: dict[tuple, bool] = {}  # demand -> an accepting node could ever hold it
        self._bound: tuple[list[float], float, int] | None = None  # see _free_bound
        mem = self.index.get(MEMORY)
        self._mem_i = mem
        self.max_accept_mem = max((t[mem] for t in self.total), default=0.0) if mem is not None \
            else 0.0

    # ---------------------------------------------------------------- demands
    def compile(self, demands: tuple[tuple[str, float], ...]) -> _Compiled | None:
        """The demand in this table's terms; None when it names a resource no node has."""
        try:
            return self._compiled[demands]
        except KeyError:
            pass
        pairs, gpu, mem, ok = [], 0.0, 0.0, True
        allowed: frozenset[int] | None = None
        for k, v in demands:
            if k == GPU:
                gpu = v
            elif k.startswith(LABEL_PREFIX):  # a label selector term: the nodes it allows
                key, _, expr = k[len(LABEL_PREFIX):].partition("=")
                match = frozenset(i for i, nd in enumerate(self.nodes)
                                  if selector_matches(key, expr, nd.labels))
                allowed = match if allowed is None else allowed & match
            elif k in self.index:
                pairs.append((self.index[k], v))
                if k == MEMORY:
                    mem = v
            elif v > 0:
                ok = False
        c = _Compiled(pairs, gpu, mem, allowed) if ok else None
        if len(self._compiled) >= CACHE_MAX:  # a long-lived table, tasks of their own demands
            self._compiled.clear()
            self._ever.clear()
        self._compiled[demands] = c
        return c

    def missing(self, demands: tuple[tuple[str, float], ...]) -> str | None:
        """Why no node could ever hold ``demands`` (the resource named, with the most any node
        has), or None when some node could."""
        if any(self.fits_total(i, demands) for i in range(self.n)):
            return None
        labels = [k for k, _ in demands if k.startswith(LABEL_PREFIX)]
        c = self.compile(demands)
        if labels and c is not None and not c.allowed:
            terms = ", ".join(f"{k[len(LABEL_PREFIX):].replace('=', ': ', 1)}" for k in labels)
            return f"label_selector {{{terms}}} (no node's labels match it)"
        resources = [(k, v) for k, v in demands if not k.startswith(LABEL_PREFIX)]
        nodes = range(self.n) if c is None or c.allowed is None else sorted(c.allowed)
        best: dict[str, float] = {}
        for i in nodes:
            r = self.nodes[i].all_resources()
            for k, _ in resources:
                best[k] = max(best.get(k, 0.0), r.get(k, 0.0))
        where = "any node" if len(nodes) == self.n else "any node its label_selector allows"
        for k, v in resources:
            if best.get(k, 0.0) + EPS < v:
                return f"{k}={v:g} (the most {where} has: {best.get(k, 0.0):g})"
        return "the combination " + ", ".join(f"{k}={v:g}" for k, v in resources) + \
            f" (no single node {'it allows ' if labels else ''}has all of it)"

    # ---------------------------------------------------------------- the rules
    def fits_total(self, i: int, demands: tuple) -> bool:
        """Whether node ``i`` could ever hold ``demands`` (its totals)."""
        c = self.compile(demands)
        return c is not None and _covers(self.total[i], self._gpu_total[i], c, i)

    def fits_now(self, i: int, demands: tuple) -> bool:
        """The valid pick: node ``i`` accepts work and its free resources cover ``demands``."""
        if not (0 <= i < self.n and self.accept_l[i]):
            return False
        c = self.compile(demands)
        return c is not None and _covers(self.free[i], self.gpus[i], c, i)

    def fitting(self, demands: tuple) -> list[int]:
        """The nodes where ``demands`` fit now (:meth:`fits_now` over all nodes, the demand
        compiled once)."""
        c = self.compile(demands)
        if c is None:
            return []
        acc, free, gpus = self.accept_l, self.free, self.gpus
        return [i for i in range(self.n) if acc[i] and _covers(free[i], gpus[i], c, i)]

    def _demand_state(self, demands: tuple, memory_gb: float = 0.0) -> int:
        """0: no accepting node could ever hold it; 1: one could, none can now; 2: one can now
        (cached until the next start, finish or accepting change). A demand beyond the most any
        accepting node has free (:meth:`_free_bound`) is 1 without a scan of the nodes: a
        backlog of tasks that do not fit costs O(resources) each, not O(nodes)."""
        s = self._state.get(demands)
        if s is not None:
            return s
        ever = self._ever.get(demands)
        if ever is None:
            ever = self._ever[demands] = any(
                self.accept_l[i] and self.fits_total(i, demands) for i in range(self.n))
        c = self.compile(demands)
        if not ever or c is None:
            s = 0
        else:  # inlined: this runs for every task a backlog sets aside
            best, part, whole = self._bound or self._free_bound()
            s = 2
            for j, v in c.pairs:
                if best[j] + EPS < v:
                    s = 1
                    break
            if s == 2 and c.gpu and not (part + EPS >= c.gpu if c.gpu < 1.0 - EPS
                                         else whole >= int(round(c.gpu))):
                s = 1
            if s == 2:
                acc, free, gpus = self.accept_l, self.free, self.gpus
                if not any(acc[i] and _covers(free[i], gpus[i], c, i) for i in range(self.n)):
                    s = 1
                    self._bound = None  # it was loose (after starts): exact again next time
        self._state[demands] = s
        return s

    def _free_bound(self) -> tuple[list[float], float, int]:
        """Over accepting nodes: at least the most free of each resource, the largest free part
        of one GPU, the most whole free GPUs: a necessary test of fitting now. Exact when
        computed; a start leaves it as it was (an upper bound still), a finish raises it to the
        node's free, a scan that finds no node where it passed drops it (computed again).
        O(nodes x resources) per computation, so not after every start and finish."""
        if self._bound is None:
            best = [0.0] * len(self.names)
            part, whole = 0.0, 0
            for i in range(self.n):
                if not self.accept_l[i]:
                    continue
                for j, v in enumerate(self.free[i]):
                    if v > best[j]:
                        best[j] = v
                g = self.gpus[i]
                if g:
                    part = max(part, max(g))
                    whole = max(whole, sum(1 for f in g if f >= 1.0 - EPS))
            self._bound = (best, part, whole)
        return self._bound

    # ---------------------------------------------------------------- state changes
    def start(self, i: int, task: Any, demands: tuple, until: float) -> None:
        """``task`` takes its demands on node ``i`` until ``until`` (expected)."""
        c = self.compile(demands)
        free = self.free[i]
        for j, v in c.pairs:
            free[j] -= v
        if c.gpu:
            task_gpu = _gpu_take(self.gpus[i], c.gpu)
        else:
            task_gpu = ()
        self.running[i][task] = until
        self._held.setdefault(task, {})[i] = (c, task_gpu)
        self._state.clear()  # the bound stays: an upper bound still

    def finish(self, task: Any, i: int | None = None) -> int:
        """``task``'s run on node ``i`` (None: its only one) ended: its resources are free
        again; returns the node (-1: it held none there, e.g. it started before the table was
        rebuilt without its node)."""
        holds = self._held.get(task)
        if not holds:
            return -1
        if i is None:
            i = next(iter(holds))
        elif i not in holds:
            return -1
        c, task_gpu = holds.pop(i)
        if not holds:
            del self._held[task]
        free = self.free[i]
        for j, v in c.pairs:
            free[j] += v
        g = self.gpus[i]
        for k, v in task_gpu:
            g[k] += v
        del self.running[i][task]
        self._state.clear()
        if self._bound is not None and self.accept_l[i]:  # only node i has more free now
            best, part, whole = self._bound
            for j, v in enumerate(free):
                if v > best[j]:
                    best[j] = v
            if g:
                self._bound = (best, max(part, max(g)),
                               max(whole, sum(1 for f in g if f >= 1.0 - EPS)))
        return i

    def copy(self, remap: Callable[[Any, int], Any]) -> "NodeTable":
        """An independent table in this one's state, each run of a task on node ``i`` keyed
        by ``remap(task, i)`` (a planner's rollout, ``envs.node_sim``; a hedged task's two runs
        may become two keys). The demand caches, the totals and the speeds are shared (they do
        not change with what runs)."""
        new = copy.copy(self)
        new.free = [list(f) for f in self.free]
        new.gpus = [list(g) for g in self.gpus]
        new.accept_l = list(self.accept_l)
        new.running = [{remap(t, i): end for t, end in r.items()}
                       for i, r in enumerate(self.running)]
        held: dict[Any, dict[int, tuple]] = {}
        for t, h in self._held.items():
            for i, v in h.items():
                held.setdefault(remap(t, i), {})[i] = v
        new._held = held
        new._state = dict(self._state)
        new._ever = {}  # (depends on accept_l, now the copy's)
        b = self._bound
        new._bound = None if b is None else (list(b[0]), b[1], b[2])
        return new

    def set_accepting(self, i: int, accepting: bool) -> None:
        self.accept_l[i] = accepting
        self._state.clear()
        self._ever.clear()
        self._bound = None

    # ---------------------------------------------------------------- what policies read
    def speed(self, i: int, demands: tuple) -> float:
        """Node ``i``'s speed for a task with ``demands`` (GPU work when it asks for a GPU)."""
        c = self.compile(demands)
        return self.gpu_speed[i] if c is not None and c.gpu_work else self.cpu_speed[i]

    def dominant_share(self, demands: tuple) -> float:
        """The largest fraction of an average node that ``demands`` hold, over the resources
        (a tenant's fair share counts run time x this: resource-seconds, as DRF weighs
        resources); 1 with no nodes."""
        if not self.n:
            return 1.0
        c = self.compile(demands)
        if c is None:
            return 1.0
        share = 0.0
        for j, v in c.pairs:
            mean = sum(t[j] for t in self.total) / self.n
            if mean > 0 and not self.names[j].startswith(ACCEL_PREFIX):
                share = max(share, v / mean)
        if c.gpu:
            mean = sum(sum(g) for g in self._gpu_total) / self.n
            share = max(share, c.gpu / mean if mean > 0 else 0.0)
        return share

    def run_time(self, i: int, task: Any) -> float:
        """``task``'s run on node ``i``: its compute over the node's speed for its kind, or what
        :attr:`estimate` makes of that."""
        run = task.compute / self.speed(i, task.demands)
        return run if self.estimate is None else self.estimate(task, i, run)

    def utilization(self, i: int, names: Iterable[str] = ("CPU", MEMORY)) -> float:
        """Ray's critical resource utilization of node ``i``: the highest used fraction over
        ``names`` (Ray: CPU, memory, object store memory)."""
        best = 0.0
        for k in names:
            j = self.index.get(k)
            if j is None or self.total[i][j] <= 0:
                continue
            u = 1.0 - self.free[i][j] / self.total[i][j]
            if u > best:
                best = u
        return best

    def earliest_fit(self, i: int, demands: tuple, now: float) -> float:
        """When node ``i`` will first have room for ``demands`` if its running tasks end when
        expected (``now`` when it fits now; ``inf`` when it never will)."""
        if self.fits_now(i, demands):
            return now
        if not (self.accept_l[i] and self.fits_total(i, demands)):
            return math.inf
        c = self.compile(demands)
        free = list(self.free[i])
        gpus = list(self.gpus[i])
        for task, end in sorted(self.running[i].items(), key=lambda kv: kv[1]):
            tc, tg = self._held[task][i]
            for j, v in tc.pairs:
                free[j] += v
            for k, v in tg:
                gpus[k] += v
            if _covers(free, gpus, c, i):
                return max(end, now)
        return math.inf


def _covers(have: list[float], gpus: list[float], c: _Compiled, i: int) -> bool:
    """Whether node ``i``, with ``have`` (by resource index) and the GPU instances ``gpus``,
    covers ``c`` (and its label selector allows node ``i``)."""
    if c.allowed is not None and i not in c.allowed:
        return False
    for j, v in c.pairs:
        if have[j] + EPS < v:
            return False
    return _gpu_fits(gpus, c.gpu) if c.gpu else True


def _gpu_fits(instances: list[float], amount: float) -> bool:
    if amount < 1.0 - EPS:
        return any(f + EPS >= amount for f in instances)
    need = int(round(amount))
    return sum(1 for f in instances if f >= 1.0 - EPS) >= need


def _gpu_take(instances: list[float], amount: float) -> tuple[tuple[int, float], ...]:
    """Take ``amount`` GPU from ``instances`` (Ray's rule, module docstring); what was taken
    from which instance."""
    if amount < 1.0 - EPS:
        best = min((k for k, f in enumerate(instances) if f + EPS >= amount),
                   key=lambda k: (instances[k], k))
        instances[best] -= amount
        return ((best, amount),)
    need = int(round(amount))
    took = []
    for k, f in enumerate(instances):
        if need and f >= 1.0 - EPS:
            instances[k] = 0.0
            took.append((k, f))
            need -= 1
    return tuple(took)
