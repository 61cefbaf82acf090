"""The one model of the cluster: Ray's nodes and their resources (the paper's servers are
nodes of one slot).

A *node* (:class:`NodeSpec`) has a resource vector (``CPU``, ``GPU``, ``memory`` in GB, any
custom resource, ``accelerator_type:<name>`` as Ray advertises it: a marker of amount 1; and
``slot``: a server that runs one task at a time), a speed per kind of work (``cpu`` work; ``gpu``
work on its accelerator), labels, and its idle and busy power. A *task* demands a vector of the
same names (``envs.demands``: sorted ``(resource, amount)`` pairs) and a compute; it may start on
a node when its demands fit the node's free resources, holds them until it ends, and runs
``compute / speed`` seconds where ``speed`` is the node's speed for the task's kind (GPU work
when it asks for a GPU, else CPU work). Many tasks run on a node at once; there is no
interference model (none we know of is documented for Ray).

The paper's cluster is the special case of nodes ``{slot: 1, memory: M}`` whose tasks each
demand ``{slot: 1, memory: m}``: a server runs one task at a time, which fits when ``m <= M``.

GPUs are allocated as Ray allocates them (``ResourceInstanceSet`` in Ray's
``src/ray/common/scheduling``): a node's GPUs are instances of capacity 1; a fractional demand
(``num_gpus=0.5``) must fit inside one instance, a whole one takes that many whole free
instances. Two ``num_gpus=0.5`` tasks therefore share one GPU; a ``0.75`` and a ``0.5`` do not.
Of the instances that fit a fractional demand, the fullest is taken (best fit, so whole GPUs
stay free for whole demands). Label selectors (``label:key=expr`` demands, ``envs.demands``)
allow the nodes whose labels match.

:class:`NodeTable` is the decision core's table (``envs.decision``): ``n`` positions (a
simulator pads to the most nodes it may hold; an empty position accepts nothing), each node's
totals, free resources, GPU instances and running tasks with their expected ends (as deciders
see them: ``busy_until``, the end of its latest run). It answers the rules: :meth:`fits_now`
(the valid pick), :meth:`state` (could a task ever fit, does it fit now), :meth:`earliest_fit`,
:meth:`run_time`. Nodes of equal totals, speeds, power and labels share a *shape*; the table
keeps the idle accepting nodes of each shape as a bit set, so that "does it fit some node now"
and EFT's scan cost O(shapes), not O(nodes), on a cluster of idle and slot-full nodes (the
paper's); nodes partly used (running tasks, room left) are scanned.

Kept twice on purpose: ``busy_until`` and ``busy`` are numpy arrays for the encoder's vector
reads; everything else Python lists for the rules' scalar reads. Stdlib and numpy only.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .demands import (ACCEL_PREFIX, GPU, LABEL_PREFIX, MEMORY, SLOT, DemandError, check_amount,
                      selector_matches)

__all__ = ["NodeSpec", "NodeTable", "EPS", "NEVER", "LATER", "NOW"]

EPS = 1e-9
_MISSING = object()
CACHE_MAX = 1 << 16  # demand tuples a table keeps compiled (live: each task may have its own)
NEVER, LATER, NOW = 0, 1, 2  # NodeTable.state: no node could ever hold it / none can now / one can
# Stamps of a table's state, unique over every table of the process: a compiled demand caches
# what it found under a stamp, so a fork (which shares the compiled demands and starts with its
# original's stamps) reads the same answers until either of the two changes.
_STAMPS = itertools.count(1)


@dataclass(frozen=True)
class NodeSpec:
    """One node: its shape's name (a tier, a node type), Ray resources (``memory`` in GB;
    ``slot``: runs one task at a time), accelerator, speeds per kind of work, labels, and its
    idle and busy power (W; the paper's energy term)."""
    name: str
    resources: Mapping[str, float]
    cpu_speed: float = 1.0
    gpu_speed: float = 1.0
    accelerator: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    idle_w: float = 0.0
    busy_w: float = 0.0

    def __post_init__(self) -> None:
        for k, v in self.resources.items():
            check_amount(f"node {self.name!r}: resources.{k}", v, gpu=k == GPU)
        if not (self.cpu_speed > 0 and self.gpu_speed > 0):
            raise DemandError(f"node {self.name!r}: speeds must be > 0")

    def all_resources(self) -> dict[str, float]:
        """``resources`` plus the accelerator marker Ray adds (``accelerator_type:A100: 1``)."""
        out = {k: float(v) for k, v in self.resources.items()}
        if self.accelerator:
            out[ACCEL_PREFIX + self.accelerator] = 1.0
        return out

    @property
    def memory_gb(self) -> float:
        return float(self.resources.get(MEMORY, 0.0))

    def shape_key(self) -> tuple:
        """What makes two nodes interchangeable to the rules (the same name, which run-time
        estimates are keyed by; equal totals, speeds, power, labels)."""
        return (self.name, tuple(sorted(self.all_resources().items())), self.cpu_speed,
                self.gpu_speed, self.idle_w, self.busy_w, tuple(sorted(self.labels.items())))


class _Compiled:
    """A demand tuple against one table's resource index: the non-GPU pairs by index, the GPU
    amount, whether it is GPU work, the label terms (None: it has none), whether it takes a
    slot; and what the rules found for it under a table's stamps (``ever``: some accepting node
    could hold it; ``now``: one can now)."""
    __slots__ = ("pairs", "gpu", "gpu_work", "labels", "slot", "ever_at", "ever", "now_at",
                 "now")

    def __init__(self, pairs: list[tuple[int, float]], gpu: float,
                 labels: tuple[tuple[str, str], ...] | None, slot: bool):
        self.pairs, self.gpu, self.labels, self.slot = pairs, gpu, labels, slot
        self.gpu_work = gpu > 0
        self.ever_at = self.now_at = 0
        self.ever = self.now = False


class NodeTable:
    """The nodes, their free resources and what runs on them (module docstring).

    Args:
        nodes: the nodes at positions ``0..len(nodes)-1``.
        capacity: positions in all (default ``len(nodes)``); the rest are empty until
            :meth:`set_node`.
        shapes: further nodes that may join later (their resource names enter the index).
    """

    def __init__(self, nodes: Sequence[NodeSpec], capacity: int | None = None,
                 shapes: Iterable[NodeSpec] = ()):
        n = len(nodes) if capacity is None else capacity
        if n < len(nodes):
            raise ValueError(f"capacity: {n} positions for {len(nodes)} nodes")
        self.n = n
        names = sorted({k for nd in (*nodes, *shapes) for k in nd.all_resources()} - {GPU})
        self.names = names
        self.index = {k: i for i, k in enumerate(names)}
        self._mem_i = self.index.get(MEMORY)
        self._slot_i = self.index.get(SLOT)
        # the paper's cluster: every node a server of one slot and memory, nothing else; its
        # demands ((memory, m), (slot, 1)) are then answered from memory alone (:meth:`_plain_m`,
        # the same answers: tests/test_nodes.py), without compiling each task's own demand
        self._plain = set(names) <= {MEMORY, SLOT} and SLOT in names and not any(
            nd.labels or nd.accelerator or GPU in nd.resources for nd in (*nodes, *shapes))
        self._acc_mem = self._idle_mem = -1.0  # the most memory of an accepting / idle node,
        self._acc_at = self._idle_at = 0  # under these stamps (plain tables)
        self.specs: list[NodeSpec | None] = [None] * n
        self.ids: list[Any] = [None] * n  # the driver's id of each node (None: empty)
        self.total: list[list[float]] = [[0.0] * len(names) for _ in range(n)]
        self.free: list[list[float]] = [[0.0] * len(names) for _ in range(n)]
        self.gpus: list[list[float]] = [[] for _ in range(n)]  # free amount per GPU instance
        self._gpu_total: list[list[float]] = [[] for _ in range(n)]
        self.gpu_total = [0.0] * n
        self.has_gpu = [False] * n
        self.cpu_speed = [1.0] * n
        self.gpu_speed = [1.0] * n
        self.memory_l = [0.0] * n  # total memory (GB)
        self.idle_w = [0.0] * n
        self.busy_w = [0.0] * n
        self.present_l = [False] * n
        self.accept_l = [False] * n
        self.running: list[dict[Any, float]] = [{} for _ in range(n)]  # task -> expected end
        self.busy = np.zeros(n, dtype=bool)  # runs a task now
        self.busy_until = np.zeros(n)  # the expected end of its latest run (0: idle)
        # (task, node, its run at the node's speed) -> the run to plan with (live: the run-time
        # estimator's, learned per kind and node shape); None: compute / speed
        self.estimate: Callable[[Any, int, float], float] | None = None
        # per node, what each run holds: task -> (compiled demand, GPUs taken), or (None, its
        # memory) for a paper task on a plain server
        self.held: list[dict[Any, tuple]] = [{} for _ in range(n)]
        self._shape_of: dict[tuple, int] = {}
        self.shape = [-1] * n  # each position's shape (-1: empty)
        self.shape_nodes: list[NodeSpec] = []  # a node of each shape
        self._shape_total: list[tuple[list[float], list[float]]] = []  # its totals, GPUs
        self._idle: list[int] = []  # per shape: bit set of its accepting idle positions
        self._accepting: list[int] = []  # per shape: accepting positions
        self.partial: set[int] = set()  # accepting nodes running tasks with room perhaps left
        self._compiled: dict[tuple, _Compiled | None] = {}
        self._last_d: Any = None  # the demand compile() answered last, and its answer
        self._last_c: _Compiled | None = None
        self._set_stamp = next(_STAMPS)  # changes with the node set or accepting
        self._run_stamp = next(_STAMPS)  # and with every start and finish
        self.version = 0  # bumped at every change of the node set or of accepting
        # per observer (an encoder, :meth:`mirror_busy`): a column it keeps of each node's
        # value when idle / busy, written here when a node becomes busy or idle
        self._mirrors: dict[Any, tuple[np.ndarray, list[float], list[float]]] = {}
        for i, nd in enumerate(nodes):
            self.set_node(i, nd, i)

    # ---------------------------------------------------------------- the node set
    def set_node(self, i: int, spec: NodeSpec, node_id: Any = None, accepting: bool = True
                 ) -> None:
        """Node ``spec`` takes empty position ``i`` (idle)."""
        if self.present_l[i]:
            raise ValueError(f"position {i} already holds node {self.ids[i]!r}")
        r = spec.all_resources()
        unknown = sorted(set(r) - set(self.index) - {GPU})
        if unknown:
            raise ValueError(f"node {spec.name!r}: resources {unknown} were not declared to the "
                             f"table (NodeTable(shapes=...))")
        g = r.get(GPU, 0.0)
        if spec.labels or g or SLOT not in r:
            self._plain = False
        self.specs[i], self.ids[i] = spec, node_id
        self.total[i] = [r.get(k, 0.0) for k in self.names]
        self.free[i] = list(self.total[i])
        inst = [1.0] * int(round(g)) if g >= 1 else ([g] if g > 0 else [])
        self.gpus[i], self._gpu_total[i] = inst, list(inst)
        self.gpu_total[i] = float(sum(inst))
        self.has_gpu[i] = bool(inst)
        self.cpu_speed[i], self.gpu_speed[i] = spec.cpu_speed, spec.gpu_speed
        self.memory_l[i] = spec.memory_gb
        self.idle_w[i], self.busy_w[i] = spec.idle_w, spec.busy_w
        self.present_l[i] = True
        self.running[i], self.held[i] = {}, {}
        self.busy[i] = False
        self.busy_until[i] = 0.0
        key = spec.shape_key()
        s = self._shape_of.get(key)
        if s is None:
            s = self._shape_of[key] = len(self.shape_nodes)
            self.shape_nodes.append(spec)
            self._shape_total.append((self.total[i], self._gpu_total[i]))
            self._idle.append(0)
            self._accepting.append(0)
        self.shape[i] = s
        self.accept_l[i] = False
        self.set_accepting(i, accepting)

    def clear(self, i: int) -> None:
        """The node at position ``i`` leaves (its runs are the caller's: they are dropped)."""
        for task in list(self.running[i]):
            self.finish(task, i)
        self.set_accepting(i, False)
        self.present_l[i] = False
        self.specs[i] = self.ids[i] = None
        self.shape[i] = -1
        self.memory_l[i] = 0.0
        self.total[i] = [0.0] * len(self.names)
        self.free[i] = [0.0] * len(self.names)
        self.gpus[i], self._gpu_total[i] = [], []
        self.gpu_total[i] = 0.0
        self.has_gpu[i] = False
        self.busy_until[i] = 0.0
        self.version += 1

    def set_accepting(self, i: int, accepting: bool) -> None:
        """Whether node ``i`` takes new work (False: draining, or not started)."""
        accepting = bool(accepting) and self.present_l[i]
        if self.accept_l[i] != accepting:
            s, bit = self.shape[i], 1 << i
            self.accept_l[i] = accepting
            if accepting:
                self._accepting[s] += 1
                if self.running[i]:
                    self.partial.add(i)
                else:
                    self._idle[s] |= bit
            else:
                self._accepting[s] -= 1
                self._idle[s] &= ~bit
                self.partial.discard(i)
        self._set_stamp = self._run_stamp = next(_STAMPS)
        self.version += 1

    def positions(self) -> Iterator[int]:
        """The positions holding a node."""
        return (i for i in range(self.n) if self.present_l[i])

    def free_position(self) -> int:
        """The first empty position; -1 when every one holds a node."""
        return next((i for i in range(self.n) if not self.present_l[i]), -1)

    # ---------------------------------------------------------------- demands
    def compile(self, demands: tuple[tuple[str, float], ...]) -> _Compiled | None:
        """The demand in this table's terms; None when it names a resource no node has. The
        last demand asked about is answered by identity (the rules ask about one task's demands
        several times in a row); others from a bounded cache."""
        if demands is self._last_d:
            return self._last_c
        c = self._compiled.get(demands, _MISSING)
        if c is not _MISSING:
            self._last_d, self._last_c = demands, c
            return c
        index = self.index
        pairs = []
        slot = False
        for k, v in demands:  # the common case: every name a resource of the index
            j = index.get(k)
            if j is None:  # a GPU, a label, or a resource no node has
                c = self._compile(demands)
                break
            pairs.append((j, v))
            if k == SLOT:
                slot = True
        else:
            c = _Compiled(pairs, 0.0, None, slot)
        compiled = self._compiled
        if len(compiled) >= CACHE_MAX:  # a long-lived table, tasks of their own demands
            compiled.clear()
        compiled[demands] = c
        self._last_d, self._last_c = demands, c
        return c

    def _compile(self, demands: tuple[tuple[str, float], ...]) -> _Compiled | None:
        pairs, gpu, labels, slot = [], 0.0, [], False
        for k, v in demands:
            if k == GPU:
                gpu = v
            elif k.startswith(LABEL_PREFIX):
                key, _, expr = k[len(LABEL_PREFIX):].partition("=")
                labels.append((key, expr))
            elif k in self.index:
                pairs.append((self.index[k], v))
                slot = slot or k == SLOT
            elif v > 0:
                return None
        return _Compiled(pairs, gpu, tuple(labels) or None, slot)

    def _allows(self, c: _Compiled, i: int) -> bool:
        """Whether ``c``'s label selector allows node ``i``."""
        labels = self.specs[i].labels
        return all(selector_matches(k, e, labels) for k, e in c.labels)

    def _covers(self, have: list[float], gpus: list[float], c: _Compiled, i: int) -> bool:
        for j, v in c.pairs:
            if have[j] + EPS < v:
                return False
        if c.gpu and not _gpu_fits(gpus, c.gpu):
            return False
        return c.labels is None or self._allows(c, i)

    def missing(self, demands: tuple[tuple[str, float], ...]) -> str | None:
        """Why no present node could ever hold ``demands`` (the resource named, with its unit
        and the most any node has), or None when some node could."""
        nodes = list(self.positions())
        if any(self.fits_total(i, demands) for i in nodes):
            return None
        labels = [k for k, _ in demands if k.startswith(LABEL_PREFIX)]
        c = self.compile(demands)
        allowed = nodes if c is None or c.labels is None else [
            i for i in nodes if self._allows(c, i)]
        if labels and c is not None and not allowed:
            terms = ", ".join(f"{k[len(LABEL_PREFIX):].replace('=', ': ', 1)}" for k in labels)
            return f"label_selector {{{terms}}} (no node's labels match it)"
        resources = [(k, v) for k, v in demands if not k.startswith(LABEL_PREFIX)]
        best: dict[str, float] = {}
        for i in allowed:
            r = self.specs[i].all_resources()
            for k, _ in resources:
                best[k] = max(best.get(k, 0.0), r.get(k, 0.0))
        where = "any node" if len(allowed) == len(nodes) else "any node its label_selector allows"
        for k, v in resources:
            if best.get(k, 0.0) + EPS < v:
                unit = " GB" if k == MEMORY else ""
                return f"{k}={v:g}{unit} (the most {where} has: {best.get(k, 0.0):g}{unit})"
        return "the combination " + ", ".join(f"{k}={v:g}" for k, v in resources) + \
            f" (no single node {'it allows ' if labels else ''}has all of it)"

    # ---------------------------------------------------------------- the rules
    def fits_total(self, i: int, demands: tuple) -> bool:
        """Whether node ``i`` could ever hold ``demands`` (its totals)."""
        m = self._plain_m(demands)
        if m is not None:
            return self.present_l[i] and self.memory_l[i] + EPS >= m
        c = self.compile(demands)
        return (c is not None and self.present_l[i]
                and self._covers(self.total[i], self._gpu_total[i], c, i))

    def _plain_m(self, demands: tuple) -> float | None:
        """The memory of a paper task's demand ``((memory, m), (slot, 1))`` on a table of
        plain servers of one slot; None for any other demand or table."""
        if self._plain and len(demands) == 2:
            (k0, m), (k1, v1) = demands
            if k0 == MEMORY and k1 == SLOT and v1 == 1.0:
                return m
        return None

    def fits_now(self, i: int, demands: tuple) -> bool:
        """The valid pick: node ``i`` accepts work and its free resources cover ``demands``."""
        if not (0 <= i < self.n and self.accept_l[i]):
            return False
        m = self._plain_m(demands)
        if m is not None:  # a server of one slot: idle, and its memory holds the task
            return not self.running[i] and self.memory_l[i] + EPS >= m
        c = self.compile(demands)
        return c is not None and self._covers(self.free[i], self.gpus[i], c, i)

    def has_room(self, i: int, demands: tuple) -> bool:
        """Whether node ``i``'s free resources cover ``demands`` (accepting aside: a draining
        node's runs)."""
        c = self.compile(demands)
        return c is not None and self.present_l[i] and self._covers(self.free[i], self.gpus[i],
                                                                    c, i)

    def fitting(self, demands: tuple) -> list[int]:
        """The nodes where ``demands`` fit now, by position."""
        c = self.compile(demands)
        if c is None:
            return []
        return sorted(self._fits_now_iter(c))

    def _fits_now_iter(self, c: _Compiled) -> Iterator[int]:
        """The accepting nodes ``c`` fits now: every idle one of each shape that covers it, then
        the partly used ones with room."""
        for s, bits in enumerate(self._idle):
            if bits and self._shape_covers(s, c):
                while bits:
                    low = bits & -bits
                    i = low.bit_length() - 1
                    bits ^= low
                    if c.labels is None or self._allows(c, i):
                        yield i
        free, gpus = self.free, self.gpus
        for i in self.partial:
            if self._covers(free[i], gpus[i], c, i):
                yield i

    def _shape_covers(self, s: int, c: _Compiled) -> bool:
        """Whether an idle node of shape ``s`` covers ``c`` (its labels aside: those are the
        nodes')."""
        total, gpus = self._shape_total[s]
        for j, v in c.pairs:
            if total[j] + EPS < v:
                return False
        return not c.gpu or _gpu_fits(gpus, c.gpu)

    def idle_heads(self, demands: tuple, exclude: Iterable[int] = ()) -> list[int]:
        """The lowest idle accepting position of each shape that ``demands`` fit (its label
        selector allowing; ``exclude`` left out), then every partly used node they fit now: the
        nodes where EFT's pick can be (identical idle nodes tie; EFT takes the lowest)."""
        c = self.compile(demands)
        if c is None:
            return []
        xb = 0
        for i in exclude:
            xb |= 1 << i
        out = []
        for s, bits in enumerate(self._idle):
            if xb:
                bits &= ~xb
            if bits and self._shape_covers(s, c):
                if c.labels is None:
                    out.append((bits & -bits).bit_length() - 1)
                else:
                    while bits:
                        low = bits & -bits
                        i = low.bit_length() - 1
                        bits ^= low
                        if self._allows(c, i):
                            out.append(i)
                            break
        free, gpus = self.free, self.gpus
        out.extend(i for i in self.partial if not xb >> i & 1
                   and self._covers(free[i], gpus[i], c, i))
        return out

    def could_hold(self, demands: tuple) -> bool:
        """Whether some accepting node could ever hold ``demands`` (its totals)."""
        m = self._plain_m(demands)
        if m is not None:
            if self._acc_at != self._set_stamp:
                self._acc_mem = max((self._shape_total[s][0][self._mem_i] for s, k in
                                     enumerate(self._accepting) if k), default=-1.0)
                self._acc_at = self._set_stamp
            return self._acc_mem + EPS >= m
        c = self.compile(demands)
        if c is None:
            return False
        if c.ever_at != self._set_stamp:
            c.ever = self._ever_fits(c)
            c.ever_at = self._set_stamp
        return c.ever

    def fits_somewhere(self, demands: tuple) -> bool:
        """Whether some accepting node can start ``demands`` now."""
        m = self._plain_m(demands)
        if m is not None:  # (a plain server with a run has no slot left: none is partly used)
            if self._idle_at != self._run_stamp:
                self._idle_mem = max((self._shape_total[s][0][self._mem_i] for s, bits in
                                      enumerate(self._idle) if bits), default=-1.0)
                self._idle_at = self._run_stamp
            return self._idle_mem + EPS >= m
        c = self.compile(demands)
        if c is None:
            return False
        if c.now_at != self._run_stamp:
            c.now = self._any_fits_now(c)
            c.now_at = self._run_stamp
        return c.now

    def state(self, demands: tuple) -> int:
        """:data:`NEVER`: no accepting node could ever hold ``demands``; :data:`LATER`: one could,
        none can now; :data:`NOW`: one can now."""
        if not self.could_hold(demands):
            return NEVER
        return NOW if self.fits_somewhere(demands) else LATER

    def _any_fits_now(self, c: _Compiled) -> bool:
        idle = self._idle
        for s, bits in enumerate(idle):
            if bits and self._shape_covers(s, c):
                if c.labels is None:
                    return True
                while bits:
                    low = bits & -bits
                    bits ^= low
                    if self._allows(c, low.bit_length() - 1):
                        return True
        if self.partial:
            free, gpus, covers = self.free, self.gpus, self._covers
            for i in self.partial:
                if covers(free[i], gpus[i], c, i):
                    return True
        return False

    def _ever_fits(self, c: _Compiled) -> bool:
        if c.labels is None:  # the shapes with accepting nodes decide
            for s, count in enumerate(self._accepting):
                if count and self._shape_covers(s, c):
                    return True
            return False
        return any(self.accept_l[i] and self._covers(self.total[i], self._gpu_total[i], c, i)
                   for i in range(self.n))

    def full(self) -> bool:
        """Whether no accepting node can start anything now: none idle, none partly used (a
        cluster of slot nodes all busy). A round then sets every ready task aside at once."""
        return not self.partial and not any(self._idle)

    def overdue(self, t: float) -> list[int]:
        """The nodes with a run expected to end before ``t`` (a node of slots: its one run's
        end is ``busy_until``; other busy nodes are all listed for their runs to be checked)."""
        late = self.busy & (self.busy_until < t) if self._slot_i is not None else self.busy
        return np.flatnonzero(late).tolist()

    @property
    def has_slots(self) -> bool:
        """Whether some node runs one task at a time (the table knows the ``slot`` resource)."""
        return self._slot_i is not None

    # ---------------------------------------------------------------- state changes
    def start(self, i: int, task: Any, demands: tuple, until: float) -> None:
        """``task`` takes its demands on node ``i`` until ``until`` (expected)."""
        free = self.free[i]
        m = self._plain_m(demands)
        if m is not None:  # a paper task on a plain server: its memory and the slot
            free[self._mem_i] -= m
            free[self._slot_i] -= 1.0
            self.held[i][task] = (None, m)
            slot = True
        else:
            c = self.compile(demands)
            for j, v in c.pairs:
                free[j] -= v
            self.held[i][task] = (c, _gpu_take(self.gpus[i], c.gpu) if c.gpu else ())
            slot = c.slot
        run = self.running[i]
        run[task] = until
        if len(run) == 1:  # it was idle
            self.busy[i] = True
            self.busy_until[i] = until
            if self._mirrors:
                for col, _, busy in self._mirrors.values():
                    if i < len(busy):
                        col[i] = busy[i]
            if self.accept_l[i]:
                self._idle[self.shape[i]] &= ~(1 << i)
                if not (slot and free[self._slot_i] < 1.0 - EPS):  # a slot node: full now
                    self.partial.add(i)
        else:
            if until > self.busy_until[i]:
                self.busy_until[i] = until
            if slot and free[self._slot_i] < 1.0 - EPS:
                self.partial.discard(i)  # no slot left: nothing else starts here
        self._run_stamp = next(_STAMPS)

    def finish(self, task: Any, i: int) -> int:
        """``task``'s run on node ``i`` ended: its resources are free again; returns the node
        (-1: it held none there)."""
        h = self.held[i].pop(task, None)
        if h is None:
            return -1
        c, task_gpu = h
        free = self.free[i]
        if c is None:  # a paper task on a plain server (start): its memory and the slot
            free[self._mem_i] += task_gpu
            free[self._slot_i] += 1.0
        else:
            for j, v in c.pairs:
                free[j] += v
            if task_gpu:
                g = self.gpus[i]
                for k, v in task_gpu:
                    g[k] += v
        run = self.running[i]
        end = run.pop(task)
        if not run:
            self.busy[i] = False
            self.busy_until[i] = 0.0
            if self._mirrors:
                for col, idle, _ in self._mirrors.values():
                    if i < len(idle):
                        col[i] = idle[i]
            if self.accept_l[i]:
                self.partial.discard(i)
                self._idle[self.shape[i]] |= 1 << i
        else:
            if end >= self.busy_until[i]:
                self.busy_until[i] = max(run.values())
            if self.accept_l[i]:
                self.partial.add(i)
        self._run_stamp = next(_STAMPS)
        return i

    def expect(self, i: int, task: Any, until: float) -> None:
        """``task``'s run on node ``i`` is now expected to end at ``until`` (deciders' view of an
        overdue or early run)."""
        run = self.running[i]
        run[task] = until
        self.busy_until[i] = max(run.values())

    def mirror_busy(self, key: Any, col: np.ndarray, idle: list[float], busy: list[float]
                    ) -> None:
        """Keep ``col[i]`` at ``busy[i]`` while node ``i`` is busy, else at ``idle[i]``, from
        now on (its present values are the caller's; positions past ``len(idle)`` are not
        kept), for observer ``key`` (an encoder's column: written at each start and finish that
        changes :attr:`busy` rather than read from it at each observation; a later call with
        the same key replaces it)."""
        self._mirrors[key] = (col, idle, busy)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_mirrors"] = {}  # views into observers' arrays: a copy's observers register again
        return state

    def copy(self, remap: Callable[[Any, int], Any] | None = None) -> "NodeTable":
        """An independent table in this one's state, each run of a task on node ``i`` keyed by
        ``remap(task, i)`` (a planner's rollout; a hedged task's two runs may become two keys).
        The demand caches, the totals and the speeds are shared (they do not change with what
        runs)."""
        new = copy.copy(self)
        new._mirrors = {}  # its observers register themselves
        new.free = [list(f) for f in self.free]
        new.gpus = [list(g) for g in self.gpus]
        new.accept_l = list(self.accept_l)
        new.busy = self.busy.copy()
        new.busy_until = self.busy_until.copy()
        new._idle = list(self._idle)
        new._accepting = list(self._accepting)
        new.partial = set(self.partial)
        if remap is None:
            new.running = [dict(r) for r in self.running]
            new.held = [dict(h) for h in self.held]
        else:
            new.running = [{remap(t, i): end for t, end in r.items()}
                           for i, r in enumerate(self.running)]
            new.held = [{remap(t, i): v for t, v in h.items()} for i, h in enumerate(self.held)]
        # the node set may change in the copy (dynamics): its per-node lists are its own (a
        # node's totals are replaced, never written, so the inner lists are shared)
        for k in ("specs", "ids", "total", "_gpu_total", "gpu_total", "has_gpu", "cpu_speed",
                  "gpu_speed", "memory_l", "idle_w", "busy_w", "present_l", "shape",
                  "shape_nodes", "_shape_total"):
            setattr(new, k, list(getattr(self, k)))
        new._shape_of = dict(self._shape_of)
        return new

    # ---------------------------------------------------------------- what policies read
    def speed(self, i: int, demands: tuple) -> float:
        """Node ``i``'s speed for a task with ``demands`` (GPU work when it asks for a GPU)."""
        if self._plain:  # no GPUs
            return self.cpu_speed[i]
        c = self.compile(demands)
        return self.gpu_speed[i] if c is not None and c.gpu_work else self.cpu_speed[i]

    def run_time(self, i: int, task: Any) -> float:
        """``task``'s run on node ``i``: its compute over the node's speed for its kind, or what
        :attr:`estimate` makes of that."""
        run = task.compute / self.speed(i, task.demands)
        return run if self.estimate is None else self.estimate(task, i, run)

    def dominant_share(self, demands: tuple) -> float:
        """The largest fraction of an average node that ``demands`` hold, over the resources
        (resource-seconds weigh run time by it, as DRF weighs resources); 1 with no nodes."""
        nodes = [i for i in range(self.n) if self.present_l[i]]
        c = self.compile(demands)
        if not nodes or c is None:
            return 1.0
        share = 0.0
        for j, v in c.pairs:
            mean = sum(self.total[i][j] for i in nodes) / len(nodes)
            if mean > 0 and not self.names[j].startswith(ACCEL_PREFIX):
                share = max(share, v / mean)
        if c.gpu:
            mean = sum(self.gpu_total[i] for i in nodes) / len(nodes)
            share = max(share, c.gpu / mean if mean > 0 else 0.0)
        return share

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
        if self._plain_m(demands) is not None:  # a server of one slot: when its run ends
            return max(float(self.busy_until[i]), now)
        c = self.compile(demands)
        free = list(self.free[i])
        gpus = list(self.gpus[i])
        for task, end in sorted(self.running[i].items(), key=lambda kv: kv[1]):
            tc, tg = self.held[i][task]
            if tc is None:  # a paper task on a plain server (start)
                free[self._mem_i] += tg
                free[self._slot_i] += 1.0
                tg = ()
            else:
                for j, v in tc.pairs:
                    free[j] += v
            for k, v in tg:
                gpus[k] += v
            if self._covers(free, gpus, c, i):
                return max(end, now)
        return math.inf


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
