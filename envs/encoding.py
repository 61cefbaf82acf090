"""What a learned policy sees of a decision: two encoders of the one table (``envs.nodes``),
shared by the simulator, the gym env, Serve and the live runtime (``env.encoder``).

**paper** (paper §4.1.1, :class:`PaperEncoder`). Task features (5): compute demand, memory
demand, number of successors, completion ratio of its workflow, output data volume. Node
features (5 each): compute capacity (CPU speed), memory capacity, remaining time of its runs,
current power draw, estimated transfer delay from the node holding the task's first finished
parent. All are divided by fixed constants from :class:`envs.config.FeatureConfig` (never by N
or batch statistics) and clipped to [0, clip]; compute and remaining time also by
``workload_scale``. Beyond the paper, ``features.backlog`` appends two task columns: ready tasks
per accepting node and the workflow's age. The mask: accepting nodes (with
``mdp.mask_infeasible``, those that could ever hold the task).

**nodes** (:class:`NodeEncoder`). Task features (:data:`NODE_TASK_FEATURES`): its compute
(seconds at speed 1), CPU, GPU and memory demands, whether it is GPU work, its workflow's
completion ratio and age, its children. Node features (:data:`NODE_FEATURES`), for this task on
each node: its run there, how long until it fits there (0: now; ``CLIP``: never), whether it
fits now, the node's free CPU, GPU and memory fractions, its speed for the task's kind, the
tasks it runs, whether it has a GPU. The mask: the nodes the task fits now. Waits are left out
of its action space: a wait costs no time at its step, so under a per-step discount a policy
learns to put costs off by waiting (a first run of configs/train/scale_nodes.yaml did: no
episode ended in 62,000 steps), and EFT, which never waits, is not beaten by waiting there.

A driver describes the task it places with :class:`TaskFacts`; the encoder reads the rest from
the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from .config import FeatureConfig
from .demands import CPU, GPU, MEMORY, SLOT, Request
from .nodes import NodeSpec, NodeTable
from .timing import Network

TASK_FEATURES = ("compute_gflop", "memory_gb", "successors", "completion_ratio", "output_gb")
SERVER_FEATURES = ("compute", "memory_gb", "remaining_s", "power_w", "transfer_s")
TASK_DIM = len(TASK_FEATURES)
SERVER_DIM = len(SERVER_FEATURES)
# beyond the paper (features.backlog): appended to the task vector (see backlog_features)
BACKLOG_FEATURES = ("ready_per_server", "workflow_age_s")
NODE_TASK_FEATURES = ("compute_s", "cpu", "gpu", "memory_gb", "gpu_work", "completion_ratio",
                      "request_age_s", "children")
NODE_FEATURES = ("run_s", "start_in_s", "fits_now", "free_cpu", "free_gpu", "free_memory",
                 "speed", "running", "has_gpu")
NODE_TASK_DIM, NODE_DIM = len(NODE_TASK_FEATURES), len(NODE_FEATURES)
CLIP = 10.0  # the nodes encoder's clip
TIME_UNIT_S = 10.0  # seconds (agents.yaml: calls of 3-4 s at speed 1, requests of 10-30 s)
CPU_UNIT = 16.0  # CPUs (agents.yaml's largest node)
MEMORY_UNIT_GB = 64.0
SPEED_UNIT = 4.0
RUNNING_UNIT = 16.0
CHILDREN_UNIT = 8.0
# The clip ufunc without np.clip's Python-level dispatch (about 3 us per call saved).
_clip_ufunc = getattr(np, "_core", getattr(np, "core", None)).umath.clip


class TaskFacts(NamedTuple):
    """The task being placed as a driver describes it: the compute deciders see, its memory,
    successors and its workflow's completion ratio as the driver shows them, its output, the
    transfer from its first finished parent (0: none) and that parent's node (-1: none or
    gone; every node then pays the transfer when ``transfer_s`` > 0), ready tasks now (this one
    included), its workflow's age."""
    compute: float
    memory_gb: float
    successors: int = 0
    completion: float = 0.0
    output_gb: float = 0.0
    transfer_s: float = 0.0
    parent: int = -1
    ready_tasks: int = 1
    age_s: float = 0.0


def task_dim(f: FeatureConfig) -> int:
    """Width of the paper task vector under ``f`` (5, or 7 with ``features.backlog``)."""
    return TASK_DIM + (len(BACKLOG_FEATURES) if f.backlog else 0)


def backlog_features(ready_tasks: int, accepting_servers: int, workflow_age_s: float,
                     f: FeatureConfig) -> tuple[float, float]:
    """The two ``features.backlog`` task columns: ready tasks (the one being placed included)
    per accepting node (/ ``backlog_per_server``), and the age of the task's workflow,
    now - arrival (/ ``time_unit``); both clipped to [0, clip]."""
    per_server = ready_tasks / max(accepting_servers, 1)
    return (min(per_server / f.backlog_per_server, f.clip),
            min(max(workflow_age_s, 0.0) / f.time_unit, f.clip))


def encode_task(compute_gflop: float, memory_gb: float, successors: float,
                completion_ratio: float, output_gb: float, f: FeatureConfig) -> np.ndarray:
    """The paper's task feature vector (5,) float32."""
    c = f.clip
    # min(max(v, 0.0), c) written as comparisons (the hot path of every decision; the same
    # value for every float, NaN and -0.0 included)
    a = compute_gflop / f.compute_unit
    b = memory_gb / f.memory_gb
    d = successors / f.successors
    e = completion_ratio
    g = output_gb / f.output_gb
    return np.array((c if a > c else (0.0 if a < 0.0 else a),
                     c if b > c else (0.0 if b < 0.0 else b),
                     c if d > c else (0.0 if d < 0.0 else d),
                     c if e > c else (0.0 if e < 0.0 else e),
                     c if g > c else (0.0 if g < 0.0 else g)), dtype=np.float32)


class PaperEncoder:
    """The paper's observation of a decision on a table (module docstring). The static columns
    (compute, memory, presence) are rebuilt when the table's node set changes; remaining time,
    power and transfer are rendered at each call from the table's arrays."""

    def __init__(self, f: FeatureConfig, n: int, mask_infeasible: bool) -> None:
        self.f, self.n, self.mask_infeasible = f, n, mask_infeasible
        self._version = None
        self._table: NodeTable | None = None  # the table the static columns are of
        # Contiguous scratch rows for the time-dependent columns: a ufunc writing straight into
        # a strided column of the (n, 5) matrix costs about 1 us at N = 48, a contiguous one
        # about 0.4 us, and one strided assignment 0.2 us. Same dtype and operation order as
        # writing into the column, so the result is bit-identical.
        self._rem = np.empty(n, dtype=np.float32)
        self._rem64 = np.empty(n, dtype=np.float64)
        self._transfer = np.empty(n, dtype=np.float32)
        self._inv_rem = 1.0 / f.time_unit
        self._transfer_unit = f.transfer_s
        self._clip = float(f.clip)

    def spaces_dims(self) -> tuple[int, int]:
        """(task width, node width)."""
        return task_dim(self.f), SERVER_DIM

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_table"] = None  # a copy rebuilds its columns (and registers with its table)
        return state

    def copy(self) -> "PaperEncoder":
        """An independent encoder (its scratch rows and static cache its own)."""
        out = PaperEncoder(self.f, self.n, self.mask_infeasible)
        return out

    def _static(self, table: NodeTable) -> None:
        """(Re)build the static columns from the table's node set."""
        f, n = self.f, self.n
        m = np.zeros((n, SERVER_DIM), dtype=np.float32)  # column 3: the idle power
        present = np.zeros(n, dtype=np.float32)
        busy = np.zeros(n, dtype=np.float32)
        accept = np.zeros(n, dtype=bool)
        for i in range(min(n, table.n)):
            if not table.present_l[i]:
                continue
            m[i, 0] = min(table.cpu_speed[i] / f.server_compute, f.clip)
            m[i, 1] = min(table.memory_l[i] / f.server_memory_gb, f.clip)
            m[i, 3] = min(table.idle_w[i] / f.power_w, f.clip)
            busy[i] = min(table.busy_w[i] / f.power_w, f.clip)
            present[i] = 1.0
            accept[i] = table.accept_l[i]
        idle = m[:, 3].tolist()
        np.copyto(m[:, 3], busy, where=table.busy[:n] if table.n != n else table.busy)
        # the table keeps column 3 (the power: busy or idle) up to date from now on
        k = min(n, table.n)
        table.mirror_busy(self, m[:, 3], idle[:k], busy.tolist()[:k])
        self._matrix, self._present, self._busy_pf = m, present, busy
        self._accept, self._accept_f = accept, accept.astype(np.float32)
        self._n_accept = int(accept.sum())
        self._memory = np.array([table.memory_l[i] if i < table.n else 0.0 for i in range(n)])
        # the table's arrays as long as n rows (a table's arrays are never replaced)
        self._busy_until = table.busy_until[:n] if table.n != n else table.busy_until
        self._version, self._table = table.version, table

    def task_vector(self, t: TaskFacts, accepting: int) -> np.ndarray:
        """The task's features (with the backlog columns when ``features.backlog``)."""
        f = self.f
        vec = encode_task(t.compute, t.memory_gb, t.successors, t.completion, t.output_gb, f)
        if f.backlog:
            vec = np.append(vec, backlog_features(t.ready_tasks, accepting, t.age_s, f)
                            ).astype(np.float32)
        return vec

    def observe(self, table: NodeTable, task: Any, facts: TaskFacts, now: float
                ) -> dict[str, np.ndarray]:
        """The observation of placing ``task`` (its ``demands``), described by ``facts``, at
        model time ``now``."""
        if table.version != self._version or table is not self._table:
            self._static(table)
        f = self.f
        if f.backlog:
            vec = self.task_vector(facts, self._n_accept)
        else:  # task_vector, inlined (hot path)
            vec = encode_task(facts.compute, facts.memory_gb, facts.successors, facts.completion,
                              facts.output_gb, f)
        out = self._matrix.copy()
        rem = self._rem  # remaining busy time: (busy_until - now) / time_unit, clipped
        np.subtract(self._busy_until, now, out=self._rem64)
        rem[:] = self._rem64
        np.multiply(rem, self._inv_rem, out=rem)
        _clip_ufunc(rem, 0.0, self._clip, out=rem)
        out[:, 2] = rem  # (column 3, the power, is kept by the table: NodeTable.mirror_busy)
        if facts.transfer_s:
            x = facts.transfer_s / self._transfer_unit
            np.multiply(self._present, x if x < self._clip else self._clip, out=self._transfer)
            out[:, 4] = self._transfer
        if facts.parent >= 0:
            out[facts.parent, 4] = 0.0
        if not self.mask_infeasible:
            return {"task": vec, "servers": out, "action_mask": self._accept_f.copy()}
        fit = self._memory >= facts.memory_gb
        fit &= self._accept
        d = task.demands
        if not table.has_slots or not (d and len(d) <= 2 and d[-1][0] == SLOT and (
                len(d) == 1 or d[0][0] == MEMORY)):
            # demands beyond a slot and memory: the table decides, node by node
            for i in np.flatnonzero(fit).tolist():
                fit[i] = table.fits_total(i, d)
        return {"task": vec, "servers": out, "action_mask": fit.astype(np.float32)}

    def empty(self) -> dict[str, np.ndarray]:
        """The observation once there is nothing to decide: zeros."""
        return {"task": np.zeros(task_dim(self.f), np.float32),
                "servers": np.zeros((self.n, SERVER_DIM), np.float32),
                "action_mask": np.zeros(self.n, np.float32)}


class NodeEncoder:
    """The nodes observation of a decision on a table (module docstring)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._nodes = np.zeros((n, NODE_DIM), dtype=np.float32)

    def spaces_dims(self) -> tuple[int, int]:
        return NODE_TASK_DIM, NODE_DIM

    def copy(self) -> "NodeEncoder":
        return NodeEncoder(self.n)

    def observe(self, table: NodeTable, task: Any, facts: TaskFacts, now: float
                ) -> dict[str, np.ndarray]:
        d = dict(task.demands)
        x = np.array([facts.compute / TIME_UNIT_S, d.get(CPU, 0.0) / CPU_UNIT, d.get(GPU, 0.0),
                      d.get(MEMORY, 0.0) / MEMORY_UNIT_GB, float(GPU in d), facts.completion,
                      facts.age_s / TIME_UNIT_S, facts.successors / CHILDREN_UNIT],
                     dtype=np.float32)
        vec = np.minimum(np.maximum(x, 0.0), CLIP, out=x)
        out = self._nodes
        mask = self.render(table, task, now, out)
        return {"task": vec, "servers": out.copy(), "action_mask": mask}

    def render(self, table: NodeTable, task: Any, now: float, out: np.ndarray) -> np.ndarray:
        """Each node's features for ``task`` into ``out`` (the padding rows zeroed); the mask."""
        out[:] = 0.0
        mask = np.zeros(out.shape[0], dtype=np.float32)
        demands = task.demands
        i_cpu, i_mem = table.index.get(CPU), table.index.get(MEMORY)
        for i in range(min(table.n, out.shape[0])):
            if not table.present_l[i]:
                continue
            row = out[i]
            total, free = table.total[i], table.free[i]
            row[3] = free[i_cpu] / total[i_cpu] if i_cpu is not None and total[i_cpu] > 0 else 0.0
            g_total = table.gpu_total[i]
            row[4] = sum(table.gpus[i]) / g_total if g_total > 0 else 0.0
            row[5] = free[i_mem] / total[i_mem] if i_mem is not None and total[i_mem] > 0 else 0.0
            row[6] = table.speed(i, demands) / SPEED_UNIT
            row[7] = len(table.running[i]) / RUNNING_UNIT
            row[8] = float(table.has_gpu[i])
            start = table.earliest_fit(i, demands, now)
            if math.isinf(start):
                row[0] = row[1] = CLIP
                continue
            row[0] = table.run_time(i, task) / TIME_UNIT_S
            row[1] = (start - now) / TIME_UNIT_S
            if start <= now:
                row[2] = mask[i] = 1.0
        np.minimum(np.maximum(out, 0.0, out=out), CLIP, out=out)
        return mask

    def empty(self) -> dict[str, np.ndarray]:
        return {"task": np.zeros(NODE_TASK_DIM, np.float32),
                "servers": np.zeros((self.n, NODE_DIM), np.float32),
                "action_mask": np.zeros(self.n, np.float32)}


def encoder_dims(name: str, f: FeatureConfig) -> tuple[int, int]:
    """(task width, node width) of the observation of encoder ``name``."""
    return (NODE_TASK_DIM, NODE_DIM) if name == "nodes" else (task_dim(f), SERVER_DIM)


def make_encoder(name: str, f: FeatureConfig, n: int, mask_infeasible: bool
                 ) -> PaperEncoder | NodeEncoder:
    """The encoder named by ``env.encoder``."""
    if name == "nodes":
        return NodeEncoder(n)
    return PaperEncoder(f, n, mask_infeasible)


# ------------------------------------------------------------------ plain descriptions (Serve)
@dataclass(frozen=True, slots=True)
class ServerView:
    """One server of one slot as a request describes it (``/v1/place``, ``/v1/schedule``)."""
    compute: float
    memory_gb: float
    remaining_s: float = 0.0  # time until its current task finishes (0 = idle)
    power_w: float = 0.0  # its current draw (busy: its busy power)
    accepting: bool = True    # alive and not draining
    busy_w: float | None = None  # its busy power (default: power_w)


@dataclass(frozen=True, slots=True, eq=False)
class _Placeholder:
    """A run the description does not name (a busy server's)."""
    demands: tuple


def slot_table(servers: Sequence[ServerView], extra: Sequence[str] = ()) -> NodeTable:
    """A table of servers of one slot from plain descriptions at model time 0: a busy server
    (``remaining_s`` > 0) runs a placeholder until then. ``extra``: further resource names."""
    specs = []
    for k, s in enumerate(servers):
        # power_w is the draw now: its busy draw when busy, else its idle draw (busy_w, or the
        # same, once a task starts there)
        busy_w = s.power_w if s.remaining_s > 0 or s.busy_w is None else s.busy_w
        specs.append(NodeSpec("server", {SLOT: 1.0, MEMORY: float(s.memory_gb)}, s.compute,
                              s.compute, "", {}, s.power_w, busy_w))
    extra_specs = [NodeSpec("extra", {e: 1.0}) for e in extra]
    table = NodeTable(specs, shapes=extra_specs)
    for k, s in enumerate(servers):
        if not s.accepting:
            table.set_accepting(k, False)
        if s.remaining_s > 0:
            table.start(k, _Placeholder(_SLOT), _SLOT, s.remaining_s)
    return table


_SLOT = ((SLOT, 1.0),)


@dataclass(frozen=True, slots=True)
class TaskView:
    """What the policy needs to know about the task being placed (a request's description)."""
    compute_gflop: float
    memory_gb: float
    output_gb: float = 0.0
    successors: int = 0
    completion_ratio: float = 0.0
    parent_server: int | None = None  # index into the server list of the first finished parent
    parent_output_gb: float = 0.0     # data that parent produced
    has_parent: bool | None = None    # a finished parent exists (default: parent_server given);
    # True with parent_server None means the parent's server is gone: transfer from everywhere
    ready_tasks: int = 1
    workflow_age_s: float = 0.0

    def demands(self) -> tuple:
        return Request(memory_gb=self.memory_gb).on_slot()


@dataclass(frozen=True, slots=True, eq=False)
class _Task:
    """A described task as policies read it."""
    compute: float
    memory_gb: float
    demands: tuple
    waits: int = 0


class Described:
    """One decision from plain descriptions (:class:`TaskView`, :class:`ServerView`) at model
    time 0, as a ``policies.base.State``: any policy decides on it, a trained one on
    :meth:`observe` (the paper encoder). ``n_pad`` pads the node axis (mask 0); ``waits``: how
    often the task waited before (the guard's budget)."""

    def __init__(self, task: TaskView, servers: Sequence[ServerView], f: FeatureConfig,
                 bandwidth_gb_s: float = 10.0, latency_s: float = 0.01,
                 mask_infeasible: bool = True, n_pad: int | None = None,
                 transfer_delays: bool = False, waits: int = 0) -> None:
        n = len(servers)
        self.n_pad = n if n_pad is None else n_pad
        if self.n_pad < n:
            raise ValueError(f"n_pad: {self.n_pad} is smaller than the number of servers ({n})")
        self.table = _padded(slot_table(servers), self.n_pad)
        has_parent = (task.parent_server is not None if task.has_parent is None
                      else task.has_parent)
        self.transfer_s = (Network(bandwidth_gb_s, latency_s).transfer_s(task.parent_output_gb)
                           if has_parent else 0.0)
        self.parent = -1 if task.parent_server is None else task.parent_server
        self.transfer_delays = transfer_delays
        self.now = 0.0
        self.task = _Task(task.compute_gflop, task.memory_gb, task.demands(), waits)
        self.facts = TaskFacts(task.compute_gflop, task.memory_gb, task.successors,
                               task.completion_ratio, task.output_gb, self.transfer_s,
                               self.parent, task.ready_tasks, task.workflow_age_s)
        self.f, self.mask_infeasible = f, mask_infeasible

    def observe(self) -> dict[str, np.ndarray]:
        enc = PaperEncoder(self.f, self.n_pad, self.mask_infeasible)
        return enc.observe(self.table, self.task, self.facts, 0.0)

    def simulator(self) -> Any:
        raise RuntimeError("a described decision has no simulator (planners need workflows)")


def encode(task: TaskView, servers: Sequence[ServerView], f: FeatureConfig,
           bandwidth_gb_s: float = 10.0, latency_s: float = 0.01, mask_infeasible: bool = True,
           n_pad: int | None = None) -> dict[str, np.ndarray]:
    """The paper observation ``{task, servers, action_mask}`` from plain descriptions: the same
    computation as the simulator's (:class:`PaperEncoder` on :func:`slot_table`). ``n_pad``
    pads the server axis with zero rows (mask 0); default ``len(servers)``."""
    return Described(task, servers, f, bandwidth_gb_s, latency_s, mask_infeasible,
                     n_pad).observe()


def _padded(table: NodeTable, n: int) -> NodeTable:
    """``table`` seen through ``n`` >= its positions (the encoder reads only the first n)."""
    if n == table.n:
        return table
    pad = NodeTable([], capacity=n, shapes=table.shape_nodes)
    for i in table.positions():
        pad.set_node(i, table.specs[i], i, table.accept_l[i])
    for i in range(table.n):
        for t, end in table.running[i].items():
            pad.start(i, t, t.demands, end)
    return pad
